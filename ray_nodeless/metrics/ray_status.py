"""The provider's recent decisions in `ray status`, opt-in (`provider.ray_status_events: N`, default 0: off): a
labelled block of the last N events of the cluster's current run in the one free-text place `ray status` prints
after its report (compat.ray_status.StatusSlot: Ray's "autoscaling error" slot, v1 and v2).

What `ray status` then ends with:

    ray-nodeless: recent decisions (not an error; newest last; all: ray-nodeless status CLUSTER_YAML --events)
      2026-12-02T00:41:07Z capacity_error     gpu_worker: capacity error InsufficientInstanceCapacity on ...
      2026-12-02T00:41:07Z fallback           gpu_worker: fell back to g4dn.xlarge/us-west-2b/spot after ...

Off by default because the slot is meant for a dead autoscaler: every driver prints it once as a warning when it
connects (Ray's behaviour for that key), and the dashboard returns it as `autoscaling_error`. Off, nothing reads or
writes the slot.

Scoped to the run: the head's log outlives the cluster (`ray down` then `ray up` of the same name finds it), so only
events from the run's start on are shown (`StatusSlot.run_started`: the Ray session's start; a slot that cannot
say: this monitor's start). The scope is learnt at the first write, in the writer thread (a GCS call).

The slot is Ray's for real errors, so the block never replaces text that is not ours (`merged`): a v1 monitor that
dies writes its error over the whole slot (the real error wins); text we did not write is kept and the block goes
after it. Bounded: `max_events` lines of at most `MAX_LINE` characters, at most `MAX_BYTES` in all.
"""
from __future__ import annotations

import collections
import datetime
import logging
import math
import threading
import time
from typing import Any, Callable, Iterable

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


def render(events: Iterable[Event], max_bytes: int = MAX_BYTES, since: float | None = None) -> str:
    """The block: the header and one line per event (from `since` on), oldest first, dropping the oldest past
    `max_bytes`."""
    lines = [line(e) for e in events if since is None or e.ts >= since]
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
    logged once per failure streak and retried at the next event. `background=False` writes in the caller.
    `slot.run_started()` (when the slot has it) says since when events belong to the current run; `clock` is this
    monitor's start otherwise."""

    def __init__(self, slot: Any, max_events: int, background: bool = True, clock: Callable[[], float] = time.time):
        self.slot = slot
        self.background = background
        self.started = math.floor(clock() * 1000) / 1000     # event times are rounded to ms (events.EventLog)
        self.since: float | None = None      # the run's start: set at the first write
        self._events: collections.deque[Event] = collections.deque(maxlen=max_events)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._io = threading.Lock()
        self._wanted = 0          # generations: the events added so far / written (or tried) so far
        self._done = 0
        self._thread: threading.Thread | None = None
        self._failing = False

    def seed(self, events: Iterable[Event]) -> None:
        """Start from the head's log (a restarted monitor: v1 cleared the slot before building the provider); what
        is older than the run is left out at the first write."""
        events = list(events)
        if events:
            self._added(events)

    def add(self, event: Event) -> None:
        self._added([event])

    def text(self) -> str:
        with self._lock:
            return render(list(self._events), since=self.since if self.since is not None else self.started)

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

    def _scope(self) -> float:
        """Since when events are of this run: the run's start, asked once (raises while the GCS is down)."""
        if self.since is None:
            ask = getattr(self.slot, "run_started", None)
            started = ask() if ask is not None else None
            # Never later than this monitor's start: a run is at least as old as the monitor serving it.
            self.since = min(started, self.started) if started is not None else self.started
        return self.since

    def _write(self, target: int) -> None:
        with self._io:        # one read-merge-write at a time (background=False: the launchers' threads)
            try:
                since = self._scope()
                with self._lock:
                    block = render(list(self._events), since=since)
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
