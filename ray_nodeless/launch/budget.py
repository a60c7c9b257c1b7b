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
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Callable, Iterable

from ray_nodeless.core import ttls
from ray_nodeless.launch.machine_view import MachineView
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
    def __init__(self, cap: float, view: MachineView, price_of: Callable[[Machine], float]):
        self.cap = cap
        self.view = view
        self.price_of = price_of
        self._lock = threading.Lock()       # the check-and-reserve step; the view's own lock nests inside it
        self._holds: dict[int, Hold] = {}
        self._serial = itertools.count()

    def hourly_cost(self) -> float:
        """Live machines plus every reservation and orphan, USD per hour."""
        with self._lock:
            return self._total()

    def reserve(self, token: str, price: float, count: int) -> Hold | None:
        """Reserve `count` x `price`, or None when that would take the cluster over the cap."""
        with self._lock:
            if self._total() + price * count > self.cap + 1e-9:
                return None
            hold = Hold(token=token, price=price, count=count, serial=next(self._serial))
            self._holds[hold.serial] = hold
            return hold

    def landed(self, hold: Hold, machines: Iterable[Machine]) -> None:
        """The launch returned these machines: shown by the view and counted there, in the same step."""
        with self._lock:
            self.view.launched(machines)
            self._holds.pop(hold.serial, None)

    def release(self, hold: Hold) -> None:
        """Nothing was made."""
        with self._lock:
            self._holds.pop(hold.serial, None)

    def orphan(self, hold: Hold, ids: Iterable[str] = ()) -> None:
        """The launch may have made machines nobody will return: count them until a listing settles it."""
        with self._lock:
            hold.ids = frozenset(ids)
            hold.orphan_since = self.view.clock()

    def _total(self) -> float:
        """Caller holds self._lock."""
        listed_at, machines = self.view.cost_view()
        total = sum(self.price_of(m) for m in machines.values())
        for serial, hold in list(self._holds.items()):
            # the machines of the hold the view shows already are counted above (an orphan's once listed; a live
            # launch's that its backend showed before the call returned, MachineBackend.on_created)
            shown = sum(1 for mid, m in machines.items()
                        if mid in hold.ids or (not hold.ids and m.tags.get(TAG_REQUEST) == hold.token))
            if hold.orphan_since is not None and (shown >= hold.count
                                                  or listed_at >= hold.orphan_since + ttls.LAUNCH_GRACE_S):
                del self._holds[serial]     # listed (and counted above), or a listing past the lag shows it gone
                continue
            total += hold.price * max(0, hold.count - shown)
        return total
