"""The ordered-candidate launcher: plan -> candidates in the documented total order -> the first one the backend
accepts. A capacity error marks that offering unavailable (`core/availability.py`) and the walk moves on in the
same call; only when every candidate fails does the launch fail, with the cloud's category.

No Ray here: the Ray adapter translates Ray's call into `launch(...)` and `LaunchError` into Ray's exception.
"""
from __future__ import annotations

import copy
import logging
import threading
import time
import uuid
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Iterator, Literal

from cachetools import TTLCache

from ray_nodeless.core.documents import Document
from ray_nodeless.core import ttls
from ray_nodeless.core.ttls import retry_round_s as retry_round_s   # the tests' name for it
from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.catalog import Catalog, Offering
from ray_nodeless.core.node_resources import instance_resources
from ray_nodeless.core.plan import Plan
from ray_nodeless.core.planner import Planner
from ray_nodeless.core.requirements import RESERVED, split_node_config
from ray_nodeless.core.settings import Resolver
from ray_nodeless.errors import (BackendError, CapacityError, CapacityScope, ConfigError, LaunchError, ListingError,
                                 NoFeasibleOffering, TransientBackendError)
from ray_nodeless.launch.budget import TAG_REQUEST, Budget, Hold
from ray_nodeless.launch.decisions import decision_tags, launch_slot, machine_labels, request_token
from ray_nodeless.launch.reservations import ReservationBook, merged, reserved_offering
from ray_nodeless.launch.shared_holds import SharedHolds
from ray_nodeless.launch.catalog import PlanningCatalog
from ray_nodeless.launch.machine_view import MachineView, pending_machine
from ray_nodeless.providers.base import (
    TAG_CAPACITY, TAG_INSTANCE_TYPE, TAG_RESERVATION, TAG_ZONE,
    LaunchSpec, Machine, MachineBackend,
)
from ray_nodeless.registrations.base import Registration

logger = logging.getLogger(__name__)

# Every machine carries the slot of its launch: (launch request, node type, count, batch), without the offering.
TAG_LAUNCH_SLOT = "nodeless-launch-slot"
# On a machine launched at another capacity only because spot had none (a spot candidate before it was skipped as
# unavailable or failed for capacity): "spot". launch/reversion.py replaces such machines when spot is back.
TAG_FALLBACK = "nodeless-fallback-from"


@dataclass(frozen=True)
class Launched:
    offering: Offering
    machine_ids: list[str]
    spec: LaunchSpec


# A launch request's round: when it started, count -> calls so far, whether it is a retry round.
_Round = tuple[float, dict[int, int], bool]
_Slot = tuple[str, str, int, int]


class Launcher:
    def __init__(self, cluster_name: str, catalog: PlanningCatalog, resolver: Resolver,
                 backend: MachineBackend, registration: Registration, unavailable: UnavailableOfferings,
                 terminate: Callable[[list[str]], None], hourly_cost: Callable[[], float] = lambda: 0.0,
                 clock: Callable[[], float] = time.monotonic, view: MachineView | None = None,
                 price_of: Callable[[Machine], float] | None = None, holds_path: Path | None = None):
        self.cluster_name = cluster_name
        self.settings = resolver.settings
        self._clock = clock
        # The provider's view of its machines: the cost cap counts them (with what is reserved; `holds_path`: the
        # ledger shared with the cluster's other objects here, launch/shared_holds.py) and a retried launch whose
        # machines it lists gets them from it. Without one, the cap counts `hourly_cost` only.
        self._view = view
        cap = self.settings.max_hourly_cost
        shared = None if holds_path is None else SharedHolds(
            holds_path, max_hold_s=self.settings.launch_timeout_s * (1 + ttls.TRANSIENT_LAUNCH_RETRIES))
        self.budget = (Budget(cap, view, price_of, shared) if cap is not None and view is not None and price_of
                       else None)
        self._hourly_cost = self.budget.hourly_cost if self.budget is not None else hourly_cost
        # (request id, node type) -> (when its round started, count -> calls so far); the offering each slot's
        # launch succeeded on, so Ray's retry of it walks straight to the same token.
        self._rounds: TTLCache[tuple[str | None, str], _Round] = TTLCache(maxsize=100_000, ttl=ttls.REQUEST_MEMORY_S)
        self._slot_offerings: TTLCache[_Slot, Offering] = TTLCache(maxsize=100_000, ttl=ttls.REQUEST_MEMORY_S)
        # slot -> (token generation, the ids its last launch returned); see `_generation`.
        self._slot_machines: TTLCache[_Slot, tuple[int, list[str]]] = TTLCache(
            maxsize=100_000, ttl=ttls.REQUEST_MEMORY_S)
        self._batches_lock = threading.Lock()     # guards the caches above (concurrent launches)
        self._catalog = catalog          # loaded at the first plan: listing and terminating never need it
        self.resolver = resolver
        self.backend = backend
        self.registration = registration
        self.unavailable = unavailable
        self._terminate = terminate     # ends machines whose registration failed, through the provider's path
        # node type -> walk its on-demand candidates first (launch/reversion.py, after repeated interruptions).
        self.prefer_on_demand: Callable[[str], bool] = lambda node_type: False
        r = self.settings.reservations        # capacity `reserved`: the cloud's reservations (reservations.py)
        self.reservations = ReservationBook(backend.reservations, ids=r.ids, tags=r.tags, refresh_s=r.refresh_s,
                                            block_drain_s=r.block_drain_s)

    @property
    def catalog(self) -> Catalog:
        return self._catalog.catalog

    @property
    def planner(self) -> Planner:
        return self._catalog.planner

    def plan(self, node_type: str, resources: Document, node_config: Document | None,
             is_head: bool) -> Plan:
        try:
            return self.planner.plan(self.resolver.request(node_type, resources, node_config, is_head))
        except (ConfigError, NoFeasibleOffering) as e:
            raise LaunchError(str(e), type(e).__name__) from e

    def launch(self, node_type: str, node_config: Document | None, ray_tags: dict[str, str], count: int,
               resources: dict[str, float], labels: dict[str, str], is_head: bool,
               launch_request: str | None = None, capacities: frozenset[str] | None = None) -> Launched:
        """`capacities`: only candidates of these capacity types (a reversion launches spot only)."""
        plan = self.plan(node_type, resources, node_config, is_head)
        _, backend_config = split_node_config(node_config or {})
        retriable = bool(launch_request)   # Ray v2 names its requests; a call without an id is never retried
        launch_request = launch_request or uuid.uuid4().hex
        batch = self._ordinal(launch_request, node_type, count)
        slot = (launch_request, node_type, count, batch)
        if self.budget is not None:
            self._list_first(node_type)
        slot_tag = launch_slot(self.cluster_name, *slot)
        generation = self._generation(slot) if retriable else 0
        reserved = self.reservations.candidates(plan, count)
        again, shown = self._replay(plan, slot, slot_tag, reserved) if retriable else (None, {})
        started = self._clock()
        failures: list[str] = []
        skipped = over_budget = capped = 0
        refused_at: float | None = None     # the cheapest price the cap refused in this call
        tried: dict[str, int] = {}      # capacity type -> candidates tried
        last_category = "NoCapacity"
        spot_missed = False
        prefer_od = not is_head and self.prefer_on_demand(node_type)
        for offering in self._walk(plan, again, prefer_od, reserved):
            if capacities is not None and offering.capacity not in capacities:
                continue
            token = request_token(self.cluster_name, launch_request, node_type, batch, offering, count, generation)
            if offering is not again:   # a retry of a launch that ran goes to its offering whatever happened since
                if self.unavailable.reason(offering) is not None:
                    skipped += 1
                    spot_missed |= offering.capacity == "spot"
                    continue
                elapsed = self._clock() - started
                if elapsed > self.settings.launch_timeout_s:
                    last_category = "LaunchTimeout"
                    failures.append(f"stopped after {elapsed:.0f} s (launch_timeout_s)")
                    break
                if tried.get(offering.capacity, 0) >= self.settings.max_candidates_per_launch:
                    # This capacity type has had its share: go on to the next one (spot -> on-demand) rather than
                    # walk every remaining spot offering in a drought.
                    capped += 1
                    spot_missed |= offering.capacity == "spot"
                    continue
            listed = sorted(shown.get(token, ()))
            tags = dict(ray_tags)
            tags.update(decision_tags(self.cluster_name, self.catalog.catalog_id, offering, plan.request.rule))
            tags[TAG_REQUEST] = token       # the orphan accounting and a retry find this launch's machines by it,
            tags[TAG_LAUNCH_SLOT] = slot_tag    # and a restarted provider this slot's offering
            if spot_missed and offering.capacity != "spot" and not is_head:
                tags[TAG_FALLBACK] = "spot"
            reservation = self.reservations.reservation_of(offering) if offering.capacity == RESERVED else ""
            if reservation:
                tags[TAG_RESERVATION] = reservation
            spec = LaunchSpec(
                cluster_name=self.cluster_name, node_type=node_type, offering=offering, count=count, tags=tags,
                node_config=copy.deepcopy(backend_config), request_token=token,
                resources=instance_resources(offering.instance_type, resources),
                labels=machine_labels(node_type, labels, offering),
                is_head=is_head, reservation_id=reservation,
            )
            spec = self.registration.prepare(spec)
            if len(listed) >= count:
                # A retry of a batch whose machines are listed (a restarted provider does not know the request
                # had a first round): those are the answer, with no call to the cloud (an endpoint without
                # ClientToken would launch again).
                logger.info("%s: request %s batch %d already launched %s; answering Ray's retry with them",
                            node_type, launch_request, batch, ",".join(listed[:count]))
                return Launched(offering=offering, machine_ids=listed[:count], spec=spec)
            price = offering.hourly_price or 0.0
            if refused_at is not None and price >= refused_at:
                over_budget += 1        # a dearer candidate cannot fit where a cheaper one did not
                continue
            # A probing offering takes a bounded number of calls at once (core/availability.py); a retry: regardless.
            if offering is not again and not self.unavailable.claim(offering):
                skipped += 1
                spot_missed |= offering.capacity == "spot"
                continue
            hold = self._reserve(token, offering, count - len(listed))
            if hold is False:
                self.unavailable.release(offering)    # (a retry's release frees a probe at most one call early)
                over_budget += 1
                refused_at = price if refused_at is None else min(refused_at, price)
                continue
            try:
                ids = self._launch_once(spec)
            except CapacityError as e:
                self._end_hold(hold, made=False)
                tried[offering.capacity] = tried.get(offering.capacity, 0) + 1
                spot_missed |= offering.capacity == "spot"
                self._mark_unavailable(plan, offering, e)
                if reservation:
                    self.reservations.stale()     # its count was not what the listing said: list again next time
                failures.append(f"{offering.instance_type.name}/{offering.zone}/{offering.capacity}: {e.category}")
                last_category = e.category
                logger.warning("%s: %s %s %s unavailable (%s); trying the next candidate", node_type,
                               offering.instance_type.name, offering.zone, offering.capacity, e.category)
                continue
            except BackendError as e:   # throttling that outlasted retries, auth, bad request: not a capacity miss
                self.unavailable.release(offering)
                self._end_hold(hold, made=isinstance(e, TransientBackendError))   # unknown outcome: an orphan
                raise LaunchError(f"{node_type}: {e}", e.category) from e
            except BaseException:
                self.unavailable.release(offering)
                self._end_hold(hold, made=True)
                raise
            self.unavailable.succeeded(offering)     # it has capacity: its backoff is forgotten
            if reservation:
                self.reservations.launched(reservation, len(ids))
            try:
                self.registration.after_launch(spec, ids)
            except BackendError as e:
                # The machines exist but could not join: terminate them rather than leak them.
                logger.error("%s: registration failed for %s (%s); terminating them", node_type, ids, e)
                try:
                    self._terminate(ids)
                except BaseException:
                    self._end_hold(hold, made=True, ids=ids)    # still running: counted until a listing says not
                    raise
                self._end_hold(hold, made=False)
                raise LaunchError(f"{node_type}: {e}", e.category) from e
            with self._batches_lock:     # TTLCache is not thread-safe: Ray's threads and the reversion lane launch
                self._slot_offerings[slot] = offering
                self._slot_machines[slot] = (generation, list(ids))
            if hold is not None and self.budget is not None:
                self.budget.landed(hold, [pending_machine(mid, spec.tags) for mid in ids])
            logger.info(
                "launched %d x %s for node type %s %s in %s (%s, $%.4f/h) by rule %r; %d candidates, "
                "%d failed, %d skipped as recently unavailable; catalog %s; ids %s",
                len(ids), offering.instance_type.name, node_type, plan.request.shape.describe(), offering.zone,
                offering.capacity, offering.hourly_price or 0.0, plan.request.rule, len(plan), len(failures),
                skipped, self.catalog.catalog_id, ",".join(ids))
            return Launched(offering=offering, machine_ids=list(ids), spec=spec)
        if over_budget and not failures:
            desc = (f"{node_type}: refused: {count} more machine(s) would take the cluster over "
                    f"provider.max_hourly_cost = ${self.settings.max_hourly_cost:.4f}/h (now "
                    f"${self._hourly_cost():.4f}/h with the launches in flight; cheapest allowed candidate "
                    f"${self._cheapest(plan):.4f}/h each)")
            logger.warning(desc)
            raise LaunchError(desc, "MaxHourlyCostExceeded")
        desc = (f"{node_type}: every candidate failed for capacity ({len(failures)} tried, {skipped} skipped as "
                f"recently unavailable, {capped} beyond max_candidates_per_launch, {over_budget} over "
                f"max_hourly_cost): " + "; ".join(failures[:10]))
        logger.error(desc)
        raise LaunchError(desc, last_category)

    # ----- the cost cap (launch/budget.py) ----------------------------------------------------------------------

    def _list_first(self, node_type: str) -> None:
        """Under a cap, the machines that run are counted before anything launches, from a listing taken now (not
        the view's cached one): a fresh provider (a restarted monitor, `ray up`) counts what already runs, and so
        does one that overlaps another object of the cluster (an old monitor, a laptop's `ray up`): every machine
        the cloud lists with this cluster's tag counts, pending ones included, whoever launched it. What no listing
        can show yet is another object's launch in flight, or its machines in the listing lag: objects on this
        machine share those through the budget's ledger, whose landed machines go into the view first (this
        listing's by-id recheck says which still run). Concurrent calls share one listing."""
        if self._view is None:      # no view, no budget (__init__): nothing to count
            return
        if self.budget is not None:
            self.budget.adopt()
        try:
            self._view.refresh(force=True)
        except ListingError as e:
            raise LaunchError(f"{node_type}: refused: cannot count the cluster's machines for "
                              f"provider.max_hourly_cost: {e}", e.category) from e

    def _reserve(self, token: str, offering: Offering, count: int) -> Hold | None | Literal[False]:
        """A reservation for `count` new machines of `offering` (held until `_end_hold` or `Budget.landed`); None
        when there is nothing to hold (no cap, or no new machine), False when the cap has no room for them."""
        if self.budget is None:
            return None if not self._exceeds_budget(offering, count) else False
        if count <= 0:
            return None
        hold = self.budget.reserve(token, offering.hourly_price or 0.0, count)
        return False if hold is None else hold

    def _end_hold(self, hold: Hold | None, made: bool, ids: list[str] | None = None) -> None:
        """A launch attempt ended without machines to return: drop its reservation, or keep it as an orphan when
        the attempt may have made machines (`made`)."""
        if hold is None or self.budget is None:
            return
        if made:
            self.budget.orphan(hold, ids or ())
        else:
            self.budget.release(hold)

    # ----- idempotency keyed to what Ray retries ----------------------------------------------------------------

    def _ordinal(self, launch_request: str, node_type: str, count: int) -> int:
        """The number of this call among the calls of (launch request, node type) of this count in the current
        round: 0, 1, 2, ... in call order. Batches of one count are interchangeable (v2 splits a request into
        batches of 5 and one remainder), so the order they reach us in does not matter. A call more than
        `retry_round_s()` after the round's first starts a retry round, numbered from 0 again so that Ray's retry
        gets the first round's tokens and machines; it passes over the slots whose machines are all listed: Ray
        has those (it allocates every listed machine before it times an instance out), so what it retries are
        the others."""
        now = self._clock()
        key: tuple[str | None, str] = (launch_request, node_type)
        with self._batches_lock:
            round_ = self._rounds.get(key)
            retry = round_ is not None and now - round_[0] >= retry_round_s()
            if round_ is None or retry:
                round_ = (now, {}, retry)
            n = round_[1].get(count, 0)
            while round_[2] and self._slot_listed(launch_slot(self.cluster_name, launch_request, node_type,
                                                              count, n), count):
                n += 1
            round_[1][count] = n + 1
            self._rounds[key] = round_
            return n

    def _generation(self, slot: tuple[str, str, int, int]) -> int:
        """The token generation of this slot's launch. A slot this object launched before keeps its generation
        (Ray's retry gets the same tokens, so the cloud answers with the same machines) unless those machines were
        ended since, from outside (a spot reclaim, another object's terminate, the console): then the old tokens
        can only answer with machines that are gone (EC2's ClientToken replays the first answer; on an endpoint
        without it the backend's settle step sees "made, now gone" and waits, then fails PartialLookup, on every
        retry). So the ids of the last launch that the view does not show are asked about by id
        (`MachineBackend.recheck`); if the cloud says any is gone, the slot moves to the next generation and
        launches anew. Those the cloud shows nothing of (a lagging listing) keep the generation. Machines of the
        old generation still running are listed machines of the cluster: Ray adopts or ends them."""
        with self._batches_lock:
            gen, ids = self._slot_machines.get(slot, (0, []))
        if not ids or self._view is None:
            return gen
        shown = self._view.cost_view()[1]
        absent = [i for i in ids if i not in shown]
        if not absent:
            return gen
        try:
            ended = sorted(set(self.backend.recheck(absent).gone) & set(absent))
        except Exception as e:  # noqa: BLE001 - cannot tell: the old token, as before (the backend settles it)
            logger.warning("%s: could not ask about %s before retrying request %s: %s", slot[1], absent, slot[0], e)
            return gen
        if not ended:
            return gen
        with self._batches_lock:
            current = self._slot_machines.get(slot, (0, []))[0]
            new = max(current, gen) + 1
            self._slot_machines[slot] = (new, [])
        logger.warning("%s: request %s batch %d: machine(s) %s of its last launch were ended since (the cloud says "
                       "so); launching anew under token generation %d", slot[1], slot[0], slot[3],
                       ",".join(ended), new)
        return new

    def _slot_listed(self, slot_tag: str, count: int) -> bool:
        if self._view is None:
            return False
        machines = self._view.cost_view()[1]
        return sum(1 for m in machines.values() if m.tags.get(TAG_LAUNCH_SLOT) == slot_tag) >= count

    def _replay(self, plan: Plan, slot: tuple[str, str, int, int], slot_tag: str,
                reserved: list[Offering]) -> tuple[Offering | None, dict[str, list[str]]]:
        """Where this slot's launch succeeded before, if it did: the offering (this object's memory, else the
        decision tags of a listed machine of the slot, after a restart), and token -> the ids the view shows
        under it. A retry goes to that offering first, so the walk cannot launch on an earlier candidate that
        has capacity again."""
        listed = self._view.cost_view()[1] if self._view is not None else {}
        mine = sorted(((mid, m) for mid, m in listed.items() if m.tags.get(TAG_LAUNCH_SLOT) == slot_tag),
                      key=lambda item: item[0])
        shown: dict[str, list[str]] = {}
        for mid, m in mine:
            shown.setdefault(m.tags.get(TAG_REQUEST, ""), []).append(mid)
        with self._batches_lock:
            remembered = self._slot_offerings.get(slot)
        if remembered is not None:
            key = remembered.key
        elif mine:
            t = mine[0][1].tags
            key = (t.get(TAG_INSTANCE_TYPE, ""), t.get(TAG_ZONE, ""), t.get(TAG_CAPACITY, ""))
        else:
            return None, shown
        for o in (*reserved, *plan.candidates()):
            if o.key == key:
                return o, shown
        od = plan.region.find(key[0], key[1], "on-demand") if key[2] == RESERVED else None
        if od is not None:
            # Its reservation is no candidate now (this slot's own machines may have filled it): the slot's
            # offering still, with the reservation its machines are in.
            o = reserved_offering(od)
            rid = next((m.tags[TAG_RESERVATION] for _, m in mine if m.tags.get(TAG_RESERVATION)), "")
            self.reservations.remember(o, rid)
            return o, shown
        return None, shown

    @staticmethod
    def _walk(plan: Plan, first: Offering | None, on_demand_first: bool = False,
              reserved: list[Offering] | None = None) -> Iterator[Offering]:
        if first is not None:
            yield first
        # Stable: the documented order within each capacity group; reserved where the rule puts it; on-demand
        # first only when asked to (reservations.merged).
        for o in merged(plan, reserved or [], on_demand_first):
            if first is None or o.key != first.key:
                yield o

    def _launch_once(self, spec: LaunchSpec) -> list[str]:
        """backend.launch, retried with the same request token when the outcome is unknown (a lost response,
        throttling that outlasted the backend's own retries): the token makes the cloud answer a retry with the
        machines it already created, so a retry never doubles a launch."""
        for attempt in range(ttls.TRANSIENT_LAUNCH_RETRIES + 1):
            try:
                return self.backend.launch(spec)
            except TransientBackendError as e:
                if attempt == ttls.TRANSIENT_LAUNCH_RETRIES:
                    raise
                logger.warning("%s: launch outcome unknown (%s); retrying with the same request token",
                               spec.node_type, e)
                time.sleep(self.settings.launch_retry_backoff_s * (2 ** attempt))
        raise AssertionError("unreachable")

    def _exceeds_budget(self, offering: Offering, count: int) -> bool:
        """The cap without a view (a launcher built without one): against `hourly_cost` alone, nothing reserved."""
        cap = self.settings.max_hourly_cost
        if cap is None:
            return False
        return self._hourly_cost() + (offering.hourly_price or 0.0) * count > cap + 1e-9

    def _cheapest(self, plan: Plan) -> float:
        return min((o.hourly_price or 0.0 for o in plan.candidates()), default=0.0)

    def _mark_unavailable(self, plan: Plan, offering: Offering, e: CapacityError) -> None:
        # A regional limit: the same type and capacity type fails in every zone of the region (a second mark of one
        # offering within its backoff does not double it).
        same = (o for o in plan.candidates() if e.scope is CapacityScope.REGION
                and (o.instance_type.name, o.capacity) == (offering.instance_type.name, offering.capacity))
        for o in (offering, *same):
            self.unavailable.mark(o, e.category)

    def on_interrupted(self, tags: dict[str, str], machine_id: str) -> None:
        """A machine vanished without a terminate from us: if it was spot, skip its offering for a while."""
        offering = self.offering_of(tags)
        if offering is not None and offering.capacity == "spot":
            self.unavailable.mark(offering, "interrupted")
        logger.warning("machine %s (%s %s %s) disappeared without being terminated by the autoscaler: "
                       "treating it as preempted", machine_id, tags.get(TAG_INSTANCE_TYPE), tags.get(TAG_ZONE),
                       tags.get(TAG_CAPACITY))

    def offering_of(self, tags: dict[str, str]) -> Offering | None:
        capacity = tags.get(TAG_CAPACITY, "")
        try:
            o = self.catalog.region(self.resolver.settings.price_cloud, self.resolver.settings.region).find(
                tags.get(TAG_INSTANCE_TYPE, ""), tags.get(TAG_ZONE, ""),
                "on-demand" if capacity == RESERVED else capacity)
        except Exception:   # a machine from another catalog or region: nothing to mark
            return None
        return reserved_offering(o) if o is not None and capacity == RESERVED else o
