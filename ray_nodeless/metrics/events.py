"""The provider's decisions as events: one record per decision, kept in a bounded log on the head and read back by
`ray-nodeless status CLUSTER_YAML --events`.

Kinds (`KINDS`): a launch chosen (and why: rule, price, candidate), a fallback to a later candidate, a capacity error
remembered, a cost-cap refusal, a machine interrupted, an interruption notice and its drain, unservable demands,
machines on their way for shape-open demands ("opening"), and an idle machine the learned idle release ended sooner
than its type's timeout ("idle_release", launch/idle_release.py).
Each also goes to Ray's autoscaler event channel (the sink the provider hands in, `compat.demand`).

The log is a JSON-lines file per cluster in the events dir of the machine the monitor runs on (the head):
`provider.events_dir`, else $RAY_NODELESS_EVENTS_DIR, else `~/.ray-nodeless/events/` (`events_dir`), appended under
a file lock and cut to its newest `MAX_EVENTS` records, so it outlives a monitor restart. The log serves the
provider, never the other way round (state_files.py): a log that is not UTF-8, a directory where the log or a file
where the events dir belongs is set aside at the monitor's start (`EventLog.check`) and a fresh log begun; a lock
another process holds is waited for at most `LOCK_WAIT_S` (an event is recorded after its machine launched), then
the event is left out of the log (logged; Ray's channel still has it). What the machines carry
themselves (their decision tags, the head's unserved-demands tag) is read back from any machine that can list the
cluster (`events_from_machines`); `ray-nodeless status --events` reads the head's log through `ray exec`'s path
(`head_events_path` names it for a command on the head).
"""
from __future__ import annotations

import json
import logging
import os
import re
import shlex
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from filelock import FileLock, Timeout

from ray_nodeless.providers.base import (
    TAG_CAPACITY, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_RAY_USER_NODE_TYPE, TAG_RULE, TAG_UNSERVED, TAG_ZONE, Machine,
)
from ray_nodeless.metrics.state_files import directory_ready, file_ready, set_aside

logger = logging.getLogger(__name__)

KINDS = ("launch", "fallback", "capacity_error", "cost_cap_refusal", "interruption", "interruption_notice", "drain",
         "unservable", "opening", "idle_release")
MAX_EVENTS = 1000
LOCK_WAIT_S = 1.0      # the longest an event waits for the log's lock held by another process
EVENTS_DIR = "~/.ray-nodeless/events"
EVENTS_DIR_ENV = "RAY_NODELESS_EVENTS_DIR"


@dataclass(frozen=True)
class Event:
    ts: float                  # wall clock (time.time), seconds
    kind: str                  # one of KINDS
    message: str
    fields: dict[str, Any] = field(default_factory=dict)
    source: str = "log"        # "log" (the head's event log) or "tags" (read from the machines)

    def record(self) -> dict[str, Any]:
        return asdict(self)


def events_dir(configured: str | None = None) -> str:
    """Where the logs are: `provider.events_dir`, else $RAY_NODELESS_EVENTS_DIR, else ~/.ray-nodeless/events."""
    return configured or os.environ.get(EVENTS_DIR_ENV) or EVENTS_DIR


def _file_name(cluster_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", cluster_name)


def events_path(cluster_name: str, configured: str | None = None) -> Path:
    return Path(os.path.expanduser(events_dir(configured))) / f"{_file_name(cluster_name)}.jsonl"


def cost_path(cluster_name: str, configured: str | None = None) -> Path:
    """The cost state next to the log (metrics/cost_store.py)."""
    return events_path(cluster_name, configured).with_suffix(".cost.json")


def holds_path(cluster_name: str, configured: str | None = None) -> Path:
    """The cost cap's ledger of launches in flight, shared by the cluster's provider objects on this machine
    (launch/shared_holds.py), next to the log."""
    return events_path(cluster_name, configured).with_suffix(".holds.json")


def head_events_path(cluster_name: str, configured: str | None = None) -> str:
    """The log's path as a shell word for a command run on the head: `~` and $RAY_NODELESS_EVENTS_DIR are the
    head's, not this machine's."""
    name = shlex.quote(f"{_file_name(cluster_name)}.jsonl")
    if configured:
        if configured == "~" or configured.startswith("~/"):
            return '"$HOME"' + (shlex.quote(configured[1:]) if len(configured) > 1 else "") + "/" + name
        return shlex.quote(configured) + "/" + name
    return f'"${{{EVENTS_DIR_ENV}:-$HOME/.ray-nodeless/events}}"/{name}'


def parse_log(text: str) -> list[Event]:
    """The events of a log's text (unreadable lines skipped), oldest first."""
    out: list[Event] = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
            out.append(Event(ts=float(d["ts"]), kind=str(d["kind"]), message=str(d["message"]),
                             fields=dict(d.get("fields") or {}), source="log"))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


class EventLog:
    """The bounded event log of one cluster (append, and cut to the newest `max_events` records). Never raises."""

    def __init__(self, path: Path, max_events: int = MAX_EVENTS, clock: Callable[[], float] = time.time,
                 lock_wait_s: float = LOCK_WAIT_S):
        self.path = path
        self.max_events = max_events
        self.clock = clock
        self.lock_wait_s = lock_wait_s
        self._lock = threading.Lock()
        self._file_lock = FileLock(str(path) + ".lock")
        self._lines: int | None = None
        self._checked = False
        self._lock_failing = False

    def check(self) -> bool:
        """Make the log usable, setting aside what is in the way: a file where its directory belongs, a directory
        where the log belongs, a log that is not UTF-8. True when the log can be appended to. Never raises."""
        with self._lock:
            return self._check()

    def _check(self) -> bool:
        if not directory_ready(self.path.parent) or not file_ready(self.path):
            return False
        try:
            with self._file_lock.acquire(timeout=self.lock_wait_s):
                try:
                    self.path.read_bytes().decode("utf-8")
                except FileNotFoundError:
                    pass
                except UnicodeDecodeError as e:
                    if set_aside(self.path, f"holds bytes that are not UTF-8 (at byte {e.start})") is None:
                        return False
                    self._lines = None
        except Timeout:
            logger.warning("events: %s is locked by another process (waited %.1f s): checked at the next event",
                           self.path, self.lock_wait_s)
            return False
        except OSError as e:
            logger.warning("events: cannot check %s: %s", self.path, e)
            return False
        self._checked = True
        return True

    def append(self, kind: str, message: str, **fields: Any) -> Event:
        event = Event(ts=round(self.clock(), 3), kind=kind, message=message, fields=fields)
        line = json.dumps(event.record(), sort_keys=True) + "\n"
        with self._lock:
            if not self._checked and not self._check():
                logger.warning("events: %s not usable: %s event not logged there", self.path, kind)
                return event
            try:
                # After a timeout, later events do not wait again until the lock is had once more: a launch
                # records its events after its machine launched, and Ray waits for it.
                with self._file_lock.acquire(timeout=0 if self._lock_failing else self.lock_wait_s):
                    self._lock_failing = False
                    if self._lines is None:
                        self._lines = _count_lines(self.path)
                    with open(self.path, "a") as f:
                        f.write(line)
                    self._lines += 1
                    if self._lines > 2 * self.max_events:   # cut rarely: the log is a ring of max..2*max records
                        self._lines = _keep_newest(self.path, self.max_events)
            except Timeout:
                if not self._lock_failing:
                    logger.warning("events: %s is locked by another process (waited %.1f s): %s event not logged "
                                   "there, nor are the next until the lock is free", self.path, self.lock_wait_s,
                                   kind)
                self._lock_failing = True
            except OSError as e:     # a full disk, or the path changed under us: checked again at the next event
                logger.warning("events: cannot write %s: %s", self.path, e)
                self._checked = False
                self._lines = None
        return event


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def _keep_newest(path: Path, n: int) -> int:
    lines = path.read_bytes().splitlines(keepends=True)[-n:]
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(b"".join(lines))
    os.replace(tmp, path)
    return len(lines)


def read_log(path: Path) -> list[Event]:
    """The events of a log file (unreadable lines skipped, bytes that are not UTF-8 replaced), oldest first; none
    when there is no readable file. Never raises."""
    try:
        return parse_log(path.read_bytes().decode("utf-8", errors="replace"))
    except FileNotFoundError:
        return []
    except OSError as e:       # a directory in its place, or no permission: the caller goes on without it
        logger.warning("events: cannot read %s: %s", path, e)
        return []


def events_from_machines(machines: Iterable[Machine], now: float) -> list[Event]:
    """What the machines' own tags say: each machine's launch decision, and the unserved demands on the head."""
    out = []
    for m in machines:
        t = m.tags
        if t.get(TAG_INSTANCE_TYPE):
            out.append(Event(
                ts=float(m.launched_at or now), kind="launch", source="tags",
                message=(f"{m.id} ({t.get(TAG_RAY_USER_NODE_TYPE, '')}) runs {t[TAG_INSTANCE_TYPE]} in "
                         f"{t.get(TAG_ZONE, '')} ({t.get(TAG_CAPACITY, '')}, ${t.get(TAG_PRICE, '?')}/h) by rule "
                         f"{t.get(TAG_RULE, '')!r}"),
                fields={"machine_ids": [m.id], "node_type": t.get(TAG_RAY_USER_NODE_TYPE, ""),
                        "instance_type": t[TAG_INSTANCE_TYPE], "zone": t.get(TAG_ZONE, ""),
                        "capacity": t.get(TAG_CAPACITY, ""), "rule": t.get(TAG_RULE, "")}))
        if t.get(TAG_UNSERVED):
            out.append(Event(ts=now, kind="unservable", source="tags", message=f"unserved now: {t[TAG_UNSERVED]}",
                             fields={"machine_ids": [m.id]}))
    return out


def merged_events(logged: list[Event], from_tags: list[Event], since: float | None = None) -> list[Event]:
    """The log's events and the machines' (a launch the log has is not repeated from its machine's tags), from
    `since` on, oldest first."""
    logged_ids = {mid for e in logged if e.kind == "launch" for mid in e.fields.get("machine_ids", ())}
    logged_unserved = any(e.kind == "unservable" for e in logged)
    out = list(logged)
    for e in from_tags:
        if e.kind == "launch" and set(e.fields.get("machine_ids", ())) & logged_ids:
            continue
        if e.kind == "unservable" and logged_unserved and since is not None:
            continue
        out.append(e)
    if since is not None:
        out = [e for e in out if e.ts >= since]
    return sorted(out, key=lambda e: (e.ts, e.kind, e.message))


_BEGIN, _NONE = "--- ray-nodeless events log ---", "--- ray-nodeless events log: none ---"


def head_read_command(cluster_name: str, configured: str | None = None, max_lines: int = 2 * MAX_EVENTS) -> str:
    """The shell command that prints the head's log (its newest `max_lines`) after a marker line, or the "none"
    marker: what `ray exec`'s runner prints before it (a login banner) is cut off by `head_read_output`."""
    return (f"f={head_events_path(cluster_name, configured)}; if [ -f \"$f\" ]; then echo '{_BEGIN}'; "
            f"tail -n {int(max_lines)} \"$f\"; else echo '{_NONE}'; fi")


def head_read_output(out: str) -> str | None:
    """The log's text from `head_read_command`'s output; None when the head has no log; ValueError when neither
    marker is there (the command did not run as written)."""
    lines = out.splitlines()
    for i, text in enumerate(lines):
        if text.strip() == _BEGIN:
            return "\n".join(lines[i + 1:])
        if text.strip() == _NONE:
            return None
    raise ValueError(f"unexpected output from the head: {out[-300:]!r}")

