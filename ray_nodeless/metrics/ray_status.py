"""The provider's recent decisions in `ray status`: a labelled block of the last N events in the one free-text place
`ray status` prints after its report (compat.ray_status.StatusSlot: Ray's "autoscaling error" slot, v1 and v2).

What `ray status` then ends with:

    ray-nodeless: recent decisions (not an error; newest last; all: ray-nodeless status CLUSTER_YAML --events)
      2026-12-02T00:41:07Z capacity_error     gpu_worker: capacity error InsufficientInstanceCapacity on ...
      2026-12-02T00:41:07Z fallback           gpu_worker: fell back to g4dn.xlarge/us-west-2b/spot after ...

The slot is Ray's for real errors, so the block never replaces text that is not ours (`merged`): a v1 monitor that
dies writes its error over the whole slot (the real error wins); text we did not write is kept and the block goes
after it. Bounded: `max_events` lines of at most `MAX_LINE` characters, at most `MAX_BYTES` in all. Every driver
prints the slot once as a warning when it connects (Ray's behaviour for that key): `provider.ray_status_events: 0`
turns the block off.
"""
from __future__ import annotations

import collections
import datetime
import logging
import threading
from typing import Any, Iterable

from ray_nodeless.metrics.events import Event

logger = logging.getLogger(__name__)

HEADER = "ray-nodeless: recent decisions (not an error; newest last; all: ray-nodeless status CLUSTER_YAML --events)"
SEPARATOR = "\n\n"
MAX_LINE = 240
MAX_BYTES = 4096


def line(e: Event) -> str:
    when = datetime.datetime.fromtimestamp(e.ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    text = f"  {when} {e.kind:18} {' '.join(e.message.split())}"
    return text if len(text) <= MAX_LINE else text[:MAX_LINE - 3] + "..."


def render(events: Iterable[Event], max_bytes: int = MAX_BYTES) -> str:
    """The block: the header and one line per event, oldest first, dropping the oldest past `max_bytes`."""
    lines = [line(e) for e in events]
    while lines and len("\n".join([HEADER, *lines]).encode()) > max_bytes:
        lines.pop(0)
    return "\n".join([HEADER, *lines])


def merged(current: str | None, block: str) -> str:
    """The slot's new text: our block in place of our previous one, after whatever else the slot holds."""
    if not current or current.startswith(HEADER):
        return block
    i = current.find(SEPARATOR + HEADER)
    if i >= 0:
        return current[:i] + SEPARATOR + block
    return current.rstrip("\n") + SEPARATOR + block


class RayStatusBlock:
    """The last `max_events` decisions, written to `slot` (read, merge, write) after each one, by a writer thread of
    its own: a GCS call can block for many seconds (Ray's client waits up to about 40 s for an unreachable GCS)
    and must never hold up the launch that recorded the event. A burst of events is one write; a failing slot is
    logged once per failure streak and retried at the next event. `background=False` writes in the caller."""

    def __init__(self, slot: Any, max_events: int, background: bool = True):
        self.slot = slot
        self.background = background
        self._events: collections.deque[Event] = collections.deque(maxlen=max_events)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._io = threading.Lock()
        self._wanted = 0          # generations: the events added so far / written (or tried) so far
        self._done = 0
        self._thread: threading.Thread | None = None
        self._failing = False

    def seed(self, events: Iterable[Event]) -> None:
        """Start from the head's log (a restarted monitor: v1 cleared the slot before building the provider)."""
        events = list(events)
        if events:
            self._added(events)

    def add(self, event: Event) -> None:
        self._added([event])

    def text(self) -> str:
        with self._lock:
            return render(list(self._events))

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until everything added so far was written (or tried); False if `timeout_s` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._done >= self._wanted, timeout_s)

    def _added(self, events: list[Event]) -> None:
        with self._cond:
            self._events.extend(events)
            self._wanted += 1
            if self.background and self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ray-nodeless-status", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        if not self.background:
            self._write(self._wanted)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._done < self._wanted)
                target = self._wanted
            self._write(target)

    def _write(self, target: int) -> None:
        with self._io:        # one read-merge-write at a time (background=False: the launchers' threads)
            with self._lock:
                block = render(list(self._events))
            try:
                current = self.slot.read()
                new = merged(current, block)
                if new != current:
                    self.slot.write(new)
                self._failing = False
            except Exception as e:      # the GCS unreachable: `ray status` misses it; the log and metrics have it
                if not self._failing:
                    logger.warning("events: cannot write the ray status block: %s", e)
                self._failing = True
        with self._cond:
            self._done = max(self._done, target)
            self._cond.notify_all()
