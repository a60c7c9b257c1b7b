"""Capacity `reserved`: the cloud's capacity reservations as the first candidates of a launch whose rule lists it
(`capacity: [reserved, spot, on-demand]`).

A reservation (AWS: an On-Demand Capacity Reservation or a Capacity Block, `MachineBackend.reservations`) is capacity
the account has already paid for, so it ranks as free and goes before the rule's next capacity types; what a machine
on it costs (its tag, the cost table, `max_hourly_cost`) is still the real on-demand price of its type and zone,
which is what the cloud bills for reserved capacity whether used or not. Which reservations: the active ones of the
region, narrowed by `provider.reservations.ids` / `.tags` when given; a Capacity Block only between its start and
`block_drain_s` before its end.

The candidates of a launch (`ReservationBook.candidates`): one per (instance type, zone) of the plan's candidates
(so the rule's requirements and exclusions hold: a reservation of an excluded type is never used) that a
reservation with room for the whole batch covers, in the plan's order (the cheapest fit first), each naming the
reservation with the most room. Room is the cloud's `available` count less what this object launched into it since
the listing; the cloud enforces the count itself (a launch beyond it fails with a capacity error the launcher walks
past, and remembers), so several provider objects never put more into a reservation than it holds. The listing is
kept `refresh_s` and taken again after a launch into a reservation failed. Thread-safety: one lock around the
listing and the counts; the cloud call is made outside it.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable, Iterable

from ray_nodeless.core.catalog import Offering
from ray_nodeless.core.plan import Plan
from ray_nodeless.core.requirements import RESERVED
from ray_nodeless.errors import BackendError
from ray_nodeless.providers.base import Reservation

logger = logging.getLogger(__name__)

CAPACITY_BLOCK = "capacity-block"


def reserved_offering(on_demand: Offering) -> Offering:
    """The `reserved` offering of an on-demand one: same type, zone and (real) price."""
    return dataclasses.replace(on_demand, capacity=RESERVED)


class ReservationBook:
    def __init__(self, list_reservations: Callable[[], list[Reservation]], *, ids: Iterable[str] = (),
                 tags: dict[str, str] | None = None, refresh_s: float = 30.0, block_drain_s: float = 1800.0,
                 clock: Callable[[], float] = time.time):
        self._list = list_reservations
        self.ids = frozenset(ids)
        self.tags = dict(tags or {})
        self.refresh_s = refresh_s
        self.block_drain_s = block_drain_s
        self.clock = clock
        self._lock = threading.Lock()
        self._listed: list[Reservation] = []
        self._ends: dict[str, float] = {}        # capacity block id -> its end, of every block listed
        self._listed_at: float | None = None
        self._used: dict[str, int] = {}          # reservation id -> launched into it since the listing
        self._chosen: dict[tuple[str, str, str], str] = {}     # reserved offering key -> reservation id

    # -- which reservations -------------------------------------------------------------------------------------
    def selected(self, r: Reservation, now: float) -> bool:
        if self.ids and r.id not in self.ids:
            return False
        if any(r.tags.get(k) != v for k, v in self.tags.items()):
            return False
        if r.kind == CAPACITY_BLOCK:
            if r.start is not None and now < r.start:
                return False              # a block that has not started takes no instance yet
            if r.end is not None and now >= r.end - self.block_drain_s:
                return False              # its machines would be drained before they could do much
        return r.end is None or now < r.end

    def listed(self) -> list[Reservation]:
        """The selected reservations (listed again when older than `refresh_s`). A failed listing is logged and
        answers none: a launch then goes on to the rule's next capacity types."""
        now = self.clock()
        with self._lock:
            fresh = self._listed_at is not None and now - self._listed_at < self.refresh_s
            if fresh:
                return list(self._listed)
        try:
            every = self._list()
        except BackendError as e:
            logger.warning("capacity reservations: listing them failed (%s); this launch goes to the next capacity "
                           "types", e)
            return []
        got = [r for r in every if self.selected(r, now)]
        with self._lock:
            self._listed, self._listed_at, self._used = got, now, {}
            self._ends = {r.id: r.end for r in every if r.kind == CAPACITY_BLOCK and r.end is not None}
        return list(got)

    def block_ends(self) -> dict[str, float]:
        """Capacity block id -> its end, as last listed (listed again when older than `refresh_s`): what
        interruptions/block_ends.py drains the blocks' machines by."""
        self.listed()
        with self._lock:
            return dict(self._ends)

    def stale(self) -> None:
        """List again at the next launch (a launch into a reservation failed: its count was not what we saw)."""
        with self._lock:
            self._listed_at = None

    # -- a launch's candidates ----------------------------------------------------------------------------------
    def candidates(self, plan: Plan, count: int) -> list[Offering]:
        """The reserved candidates of `plan` for a batch of `count` (see the module docstring); none when its rule
        does not list `reserved`."""
        if RESERVED not in plan.request.capacity:
            return []
        listed = self.listed()
        if not listed:
            return []
        with self._lock:
            room = {r.id: r.available - self._used.get(r.id, 0) for r in listed}
        best: dict[tuple[str, str], Reservation] = {}
        for r in listed:
            if room[r.id] < count:
                continue
            key = (r.instance_type, r.zone)
            if key not in best or room[r.id] > room[best[key].id]:
                best[key] = r
        out: list[Offering] = []
        seen: set[tuple[str, str]] = set()
        for o in plan.candidates():
            key = (o.instance_type.name, o.zone)
            if key in seen or key not in best:
                continue
            seen.add(key)
            od = o if o.capacity == "on-demand" else plan.region.find(o.instance_type.name, o.zone, "on-demand")
            if od is None or od.hourly_price is None:
                continue              # no known on-demand price: no truthful price to record for it
            res = reserved_offering(od)
            with self._lock:
                self._chosen[res.key] = best[key].id
            out.append(res)
        return out

    def remember(self, offering: Offering, reservation_id: str) -> None:
        """A retried launch's reserved offering (launcher._replay) and its reservation, when the machines say it
        (a restarted object's book has not chosen it); an empty id keeps what the book chose."""
        if reservation_id:
            with self._lock:
                self._chosen[offering.key] = reservation_id

    def reservation_of(self, offering: Offering) -> str:
        with self._lock:
            return self._chosen.get(offering.key, "")

    def launched(self, reservation_id: str, count: int) -> None:
        with self._lock:
            self._used[reservation_id] = self._used.get(reservation_id, 0) + count


def merged(plan: Plan, reserved: list[Offering], on_demand_first: bool = False) -> Iterable[Offering]:
    """The launch's walk: the plan's candidates with the reserved ones at the place of `reserved` in the rule's
    capacity order (so `[spot, reserved, on-demand]` puts them between); a rule of reserved capacity only has no
    other candidates (the plan's on-demand offerings were its stand-ins). `on_demand_first`: the on-demand ones
    before spot (launch/reversion.py, after repeated interruptions), reserved still first."""
    caps = plan.request.capacity
    rest = list(plan.candidates()) if not plan.request.reserved_only else []
    if on_demand_first:
        rest.sort(key=lambda o: o.capacity != "on-demand")      # stable
    if RESERVED not in caps or not reserved:
        return rest
    if on_demand_first:
        return [*reserved, *rest]
    before = set(caps[:caps.index(RESERVED)])
    return [*(o for o in rest if o.capacity in before), *reserved, *(o for o in rest if o.capacity not in before)]
