"""The cost cap's reservations shared by every provider object of one cluster on this machine: a ledger file.

Why: each provider object reserves its launches in its own memory (launch/budget.py), so two objects of one
cluster (an old and a new monitor, the KubeRay bridge and a `ray-nodeless` command, Ray building another object for
a changed provider block) could each see an empty cluster while the other's launch was in flight, and together
reach N x `max_hourly_cost` (an independent probe measured 1.84x with 2 objects, 2.45x with 4). Objects that merely
took turns reached it too, when the cloud had not listed the other's new machines yet (EC2's DescribeInstances can
lag RunInstances by seconds). The ledger closes both on one machine:

- a launch's reservation is written to the ledger in the same step as its check (the file's lock is taken inside
  the budget's lock), so the check of every object counts every other object's launches in flight;
- when a launch lands, its entry keeps the machines (id and tags) for `ttls.LAUNCH_GRACE_S`, the listing lag: every
  other object takes them into its view (`MachineView.launched`) before it lists, so it counts them at once and
  its listing's by-id recheck says when one ended (no phantom: an ended machine stops counting at the next
  listing, which a capped launch takes first);
- an orphan (a launch whose outcome is unknown) counts for every object until the listing lag has passed.

Entries of a process that is gone stop counting once the listing lag has passed since they were written (a launch
the process made before it died is then listed, or never was). An entry older than `max_hold_s` (the longest a
launch can take) is dropped whoever wrote it.

Objects on different machines (a laptop's `ray up` beside the head's monitor) do not share a ledger; they count
each other's machines once the cloud lists them (docs/capacity.md states that bound).

The ledger is the provider's servant: a ledger that cannot be read is set aside (renamed) and started anew; one
that cannot be written, or whose lock another process holds for longer than `LOCK_WAIT_S`, is logged, and that
launch is checked against this object's own reservations only: a launch is never blocked by it.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from ray_nodeless.core import ttls

logger = logging.getLogger(__name__)

LOCK_WAIT_S = 2.0           # a ledger locked longer than this is skipped for that launch (never blocks it)
_POLL_S = 0.005
VERSION = 1


@dataclass(frozen=True)
class Entry:
    """One launch of one provider object, as the ledger holds it."""

    owner: str               # the provider object (host, pid, random part)
    serial: int              # the owner's hold (launch/budget.Hold.serial)
    token: str               # the launch's request token, which every machine it makes carries
    price: float
    count: int
    at: float                # wall clock when it was written
    pid: int
    host: str
    state: str = "holding"   # holding | landed | orphan
    since: float = 0.0       # wall clock of landed / orphan
    machines: tuple[tuple[str, dict[str, str]], ...] = ()     # (id, tags) of landed machines
    ids: frozenset[str] = field(default_factory=frozenset)      # an orphan's ids, where known

    def record(self) -> dict[str, Any]:
        return {"owner": self.owner, "serial": self.serial, "token": self.token, "price": self.price,
                "count": self.count, "at": self.at, "pid": self.pid, "host": self.host, "state": self.state,
                "since": self.since, "machines": [[i, t] for i, t in self.machines], "ids": sorted(self.ids)}

    @staticmethod
    def of(d: Any) -> "Entry":
        """Raises ValueError / TypeError / KeyError on a record that is not one of ours."""
        price, count, at, since = float(d["price"]), int(d["count"]), float(d["at"]), float(d.get("since") or 0.0)
        if not all(math.isfinite(x) and x >= 0 for x in (price, at, since)) or count < 0:
            raise ValueError(f"not a finite, non-negative entry: {d!r}")
        state = str(d.get("state") or "holding")
        if state not in ("holding", "landed", "orphan"):
            raise ValueError(f"unknown state {state!r}")
        machines = tuple((str(i), {str(k): str(v) for k, v in dict(t).items()}) for i, t in d.get("machines") or [])
        return Entry(owner=str(d["owner"]), serial=int(d["serial"]), token=str(d["token"]), price=price,
                     count=count, at=at, pid=int(d["pid"]), host=str(d["host"]), state=state, since=since,
                     machines=machines, ids=frozenset(str(i) for i in d.get("ids") or []))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # another user's live process
        return True
    return True


class SharedHolds:
    """The ledger of one cluster on this machine, seen by one provider object (`owner`)."""

    def __init__(self, path: Path, *, max_hold_s: float, clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.max_hold_s = max_hold_s
        self.clock = clock
        self.host = socket.gethostname()
        self.owner = f"{self.host}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()

    # ----- the one way in: a locked read-modify-write ----------------------------------------------------------

    @contextlib.contextmanager
    def locked(self) -> Iterator[list[Entry] | None]:
        """The live entries under the ledger's lock (the caller may change the list: it is written back when the
        block ends), or None when the ledger cannot be used now (logged; the caller goes on without it)."""
        fd = self._lock()
        if fd is None:
            yield None
            return
        try:
            entries = self._read()
            before = list(entries)
            yield entries
            if entries != before:
                self._write(entries)
        except OSError as e:
            self._warn("write", f"cost-cap ledger {self.path}: cannot be written ({e}); launches are checked "
                                "against this provider object's own reservations")
        finally:
            os.close(fd)          # closing the descriptor releases its flock

    def _lock(self) -> int | None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            self._warn("open", f"cost-cap ledger {self.lock_path}: cannot be opened ({e}); launches are checked "
                               "against this provider object's own reservations")
            return None
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    self._warn("busy", f"cost-cap ledger {self.lock_path}: locked by another process for over "
                                       f"{LOCK_WAIT_S:g} s; this launch is checked against this provider object's "
                                       "own reservations")
                    return None
                time.sleep(_POLL_S)
            except OSError as e:
                os.close(fd)
                self._warn("lock", f"cost-cap ledger {self.lock_path}: cannot be locked ({e})")
                return None

    def _read(self) -> list[Entry]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as e:             # a directory, unreadable: set aside below when renaming works
            return self._set_aside(f"cannot be read ({e})")
        try:
            doc = json.loads(raw.decode("utf-8"))
            if not isinstance(doc, dict) or doc.get("version") != VERSION:
                raise ValueError("not a ledger of this version")
            entries = [Entry.of(d) for d in doc["entries"]]
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            return self._set_aside(f"is not a ledger ({str(e)[:200]})")
        return self._live(entries)

    def _set_aside(self, why: str) -> list[Entry]:
        aside = self.path.with_name(f"{self.path.name}.bad-{int(self.clock())}")
        try:
            os.replace(self.path, aside)
            logger.warning("cost-cap ledger %s %s: set aside as %s, started anew", self.path, why, aside)
        except OSError as e:
            self._warn("aside", f"cost-cap ledger {self.path} {why} and cannot be set aside ({e})")
            raise
        return []

    def _write(self, entries: list[Entry]) -> None:
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": VERSION, "entries": [e.record() for e in entries]}))
        os.replace(tmp, self.path)

    def _live(self, entries: list[Entry]) -> list[Entry]:
        """What still counts: landed and orphan entries within the listing lag; holding entries of live launches."""
        now = self.clock()
        out = []
        for e in entries:
            if now - e.at > self.max_hold_s + ttls.LAUNCH_GRACE_S:
                continue            # no launch lasts this long: a leftover
            if e.state in ("landed", "orphan") and now - e.since > ttls.LAUNCH_GRACE_S:
                continue            # the cloud lists them by now, or they never were
            if (e.state == "holding" and e.host == self.host and not _alive(e.pid)
                    and now - e.at > ttls.LAUNCH_GRACE_S):
                continue            # its process is gone: what its launch made is listed by now
            out.append(e)
        return out

    def _warn(self, kind: str, message: str) -> None:
        with self._warn_lock:
            first = kind not in self._warned
            self._warned.add(kind)
        (logger.warning if first else logger.debug)(message)

    # ----- what the budget writes --------------------------------------------------------------------------------

    def add(self, entries: list[Entry], serial: int, token: str, price: float, count: int) -> None:
        """This owner's new reservation, into the entries of a `locked()` block."""
        entries.append(Entry(owner=self.owner, serial=serial, token=token, price=price, count=count,
                             at=self.clock(), pid=os.getpid(), host=self.host))

    def _update(self, serial: int, change: Callable[[Entry], Entry | None]) -> None:
        """Change (or, for None, drop) this owner's entry of hold `serial`."""
        with self.locked() as entries:
            if entries is None:
                return
            for i, e in enumerate(entries):
                if e.owner == self.owner and e.serial == serial:
                    new = change(e)
                    if new is None:
                        del entries[i]
                    else:
                        entries[i] = new
                    return

    def landed(self, serial: int, machines: list[tuple[str, dict[str, str]]]) -> None:
        now = self.clock()
        self._update(serial, lambda e: replace(e, state="landed", since=now, machines=tuple(machines)))

    def orphan(self, serial: int, ids: frozenset[str]) -> None:
        now = self.clock()
        self._update(serial, lambda e: replace(e, state="orphan", since=now, ids=ids))

    def release(self, serial: int) -> None:
        self._update(serial, lambda e: None)

    def ended(self, ids: frozenset[str]) -> None:
        """Terminated machines, out of every landed entry (whoever launched them)."""
        with self.locked() as entries:
            if entries is None:
                return
            for i, e in enumerate(entries):
                if e.state == "landed" and any(mid in ids for mid, _ in e.machines):
                    kept = tuple((mid, t) for mid, t in e.machines if mid not in ids)
                    entries[i] = replace(e, machines=kept, count=len(kept))
            entries[:] = [e for e in entries if e.state != "landed" or e.machines]     # all ended: nothing to hand

    def others(self, entries: list[Entry]) -> list[Entry]:
        return [e for e in entries if e.owner != self.owner]
