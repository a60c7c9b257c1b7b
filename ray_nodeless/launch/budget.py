"""`provider.max_hourly_cost` as a reservation: what the cluster costs is what runs plus what may be starting.

The launcher reserves a candidate's price x count under one lock before it calls the backend, so concurrent
`create_node` calls (Ray v2 runs a request's batches in parallel on its launcher pool) can never sum past the cap:
the check and the reservation are one step. A reservation ends three ways:
- the machines came back: they go into the view (`MachineView.launched`, counted from then on) in the same step as
  the reservation is dropped, so there is no moment at which they count twice or not at all (a backend that shows
  its machines before its launch call returns, MachineBackend.on_created, puts them in the view earlier: a hold
  counts only those of its machines the view does not show, matched by request token);
- nothing was made (a capacity error, a request the cloud refused): it is dropped;
- the outcome is unknown (the answer was lost and the retries failed, a registration failed and so did the
  terminate of its machines): it becomes an *orphan*, counted until a listing shows the machines (from then on they
  are counted as listed machines) or until a listing taken `ttls.LAUNCH_GRACE_S` after the failure (the cloud's
  listing lag) does not show them: then they do not exist.
Machines are matched to an orphan by their ids when known, else by the launch's request token, which every machine
carries (`TAG_REQUEST`). The live part is the view's machines, whose price is their decision tag: what the cloud
says runs (machine_view.py asks by id about every machine a listing does not show, young ones included, so one
ended from outside moments after its launch stops counting at once).

Every provider object of the cluster on this machine shares its reservations through a ledger file
(launch/shared_holds.py): the check counts the other objects' launches in flight and orphans, and takes their
landed machines into the view before it counts, so N objects together stay within the cap too (objects on
different machines count each other's machines once the cloud lists them).
"""
from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from ray_nodeless.core import ttls
from ray_nodeless.launch.machine_view import MachineView, pending_machine
from ray_nodeless.launch.shared_holds import Entry, SharedHolds
from ray_nodeless.providers.base import Machine

# The tag carrying a launch's request token on every machine it makes (the AWS backend looks its launches up by
# the same tag, providers/aws/launch_params.TAG_REQUEST; the launcher sets it for every backend).
TAG_REQUEST = "nodeless-request"


@dataclass
class Hold:
    """Reserved cost of one launch attempt: `count` machines at `price`, under `token`."""

    token: str
    price: float
    count: int
    serial: int
    ids: frozenset[str] = frozenset()
    orphan_since: float | None = None    # the view's clock when the outcome became unknown

    def cost(self) -> float:
        return self.price * self.count


class Budget:
    def __init__(self, cap: float, view: MachineView, price_of: Callable[[Machine], float],
                 shared: SharedHolds | None = None):
        self.cap = cap
        self.view = view
        self.price_of = price_of
        self.shared = shared
        self._lock = threading.Lock()       # the check-and-reserve step; the ledger's and the view's locks nest in it
        self._holds: dict[int, Hold] = {}
        self._serial = itertools.count()

    def hourly_cost(self) -> float:
        """Live machines plus every reservation and orphan (this object's and, through the ledger, the other
        objects' of the cluster on this machine), USD per hour."""
        with self._lock, self._ledger() as entries:
            return self._total(self._others(entries))

    def adopt(self) -> None:
        """Take the machines other objects just launched into the view (before a listing: its by-id recheck then
        says which of them still run)."""
        with self._lock, self._ledger() as entries:
            self._others(entries)

    def reserve(self, token: str, price: float, count: int) -> Hold | None:
        """Reserve `count` x `price`, or None when that would take the cluster over the cap."""
        with self._lock, self._ledger() as entries:
            if self._total(self._others(entries)) + price * count > self.cap + 1e-9:
                return None
            hold = Hold(token=token, price=price, count=count, serial=next(self._serial))
            self._holds[hold.serial] = hold
            if entries is not None and self.shared is not None:
                self.shared.add(entries, hold.serial, token, price, count)
            return hold

    def landed(self, hold: Hold, machines: Iterable[Machine]) -> None:
        """The launch returned these machines: shown by the view and counted there, in the same step."""
        machines = list(machines)
        with self._lock:
            self.view.launched(machines)
            self._holds.pop(hold.serial, None)
            if self.shared is not None:
                self.shared.landed(hold.serial, [(m.id, dict(m.tags)) for m in machines])

    def release(self, hold: Hold) -> None:
        """Nothing was made."""
        with self._lock:
            self._holds.pop(hold.serial, None)
            if self.shared is not None:
                self.shared.release(hold.serial)

    def orphan(self, hold: Hold, ids: Iterable[str] = ()) -> None:
        """The launch may have made machines nobody will return: count them until a listing settles it."""
        with self._lock:
            hold.ids = frozenset(ids)
            hold.orphan_since = self.view.clock()
            if self.shared is not None:
                self.shared.orphan(hold.serial, hold.ids)

    def ended(self, ids: Iterable[str]) -> None:
        """These machines were terminated (by this object): out of the ledger, so that no other object of the
        cluster (a restarted monitor) takes them into its view."""
        if self.shared is not None:
            self.shared.ended(frozenset(ids))

    @contextlib.contextmanager
    def _ledger(self) -> Iterator[list[Entry] | None]:
        if self.shared is None:
            yield None
        else:
            with self.shared.locked() as entries:
                yield entries

    def _others(self, entries: list[Entry] | None) -> list[Entry]:
        """The other objects' entries still to count here; their landed machines the view has never seen are
        taken into it (and counted there). Caller holds self._lock."""
        if entries is None or self.shared is None:
            return []
        others = self.shared.others(entries)
        new = [pending_machine(mid, tags) for e in others if e.state == "landed" for mid, tags in e.machines
               if self.view.known(mid) is None]
        if new:
            self.view.launched(new, theirs=True)
        return [e for e in others if e.state != "landed"]

    def _total(self, others: list[Entry]) -> float:
        """Caller holds self._lock."""
        listed_at, machines = self.view.cost_view()
        total = sum(self.price_of(m) for m in machines.values())
        for serial, hold in list(self._holds.items()):
            # the machines of the hold the view shows already are counted above (an orphan's once listed; a live
            # launch's that its backend showed before the call returned, MachineBackend.on_created)
            shown = _shown(machines, hold.ids, hold.token)
            if hold.orphan_since is not None and (shown >= hold.count
                                                  or listed_at >= hold.orphan_since + ttls.LAUNCH_GRACE_S):
                del self._holds[serial]     # listed (and counted above), or a listing past the lag shows it gone
                continue
            total += hold.price * max(0, hold.count - shown)
        for e in others:                    # another object's launch in flight, or its orphan (within the lag)
            total += e.price * max(0, e.count - _shown(machines, e.ids, e.token))
        return total


def _shown(machines: dict[str, Machine], ids: frozenset[str], token: str) -> int:
    """How many of a launch's machines the view shows: by their ids when known, else by its request token."""
    return sum(1 for mid, m in machines.items() if mid in ids or (not ids and m.tags.get(TAG_REQUEST) == token))
