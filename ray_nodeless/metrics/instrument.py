"""Metrics and events around the provider's parts, as decorators (as Karpenter wraps its cloud provider): the
launcher, the machine backend, the machine view, the planner and the interruption queue keep no metrics code; each
is wrapped here and the wrapper counts what passes through it and records the decision as an event.

- `MeteredBackend.launch`: a `CapacityError` -> capacity_errors_total{instance_type,zone,capacity,code} and a
  "capacity_error" event (the launcher remembers the offering as unavailable); `list_machines` failing ->
  listing_errors_total.
- `MeteredLauncher.launch`: launches_total{node_type,capacity,result}, launch_duration_seconds, a "launch" event
  (offering, price, rule), a "fallback" event and launch_fallbacks_total when it landed after capacity errors,
  cost_cap_refusals_total and a "cost_cap_refusal" event when `provider.max_hourly_cost` refused it.
- `MeteredView.refresh`: integrates the listed machines' hourly price into cost_dollars_total (one sum per
  listing), continued across monitor restarts from the head's cost state (`cost_store.py`); the gauges are read at
  scrape time (`registry.StateCollector`).
- Every event also goes to the `ray status` block (`ray_status.py`) when the provider has one.
- `MeteredPlanning`: plan_duration_seconds around each `Planner.plan`.
- `interrupted` / `MeteredInterruptions.poll`: interruptions_total and "interruption", "interruption_notice",
  "drain" events; `unserved`: an "unservable" event when the unserved demands change.

Each decorator subclasses what it wraps (`MeteredLauncher` is a `Launcher`, `MeteredBackend` a `MachineBackend`:
decorator.py) and overrides the metered calls with their real signatures; everything else, attribute reads and
writes included, goes to the wrapped object, so code and tests that reach into `provider.view.clock` or
`provider.launcher.settings` see the real object.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, ClassVar, Mapping, TypeVar

from ray_nodeless.core.plan import Plan
from ray_nodeless.core.planner import Planner
from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.requirements import Request
from ray_nodeless.errors import CapacityError, LaunchError
from ray_nodeless.interruptions.queue import InterruptionQueue, QueueReport
from ray_nodeless.launch.catalog import PlanningCatalog
from ray_nodeless.launch.launcher import Launched, Launcher
from ray_nodeless.launch.machine_view import MachineView
from ray_nodeless.metrics.cost_store import SAVE_EVERY_S, CostStore, SavedCost
from ray_nodeless.metrics.decorator import Decorator
from ray_nodeless.metrics.events import Event, EventLog
from ray_nodeless.metrics.ray_status import RayStatusBlock
from ray_nodeless.metrics.registry import Metrics, StateSnapshot
from ray_nodeless.providers.base import (
    TAG_CAPACITY, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_RULE, TAG_ZONE, LaunchSpec, Machine, MachineBackend,
)

logger = logging.getLogger(__name__)

NO_OFFERING = ("NoFeasibleOffering", "ConfigError")
COST_CAP = "MaxHourlyCostExceeded"
REPEAT_S = 60.0


def _price(m: Machine) -> float:
    try:
        return float(m.tags.get(TAG_PRICE, "0"))
    except ValueError:
        return 0.0


class _Attempt:
    __slots__ = ("capacity_errors",)

    def __init__(self) -> None:
        self.capacity_errors: list[str] = []


class Recorder:
    """Counts into `metrics`, records events in `events` (the head's log) and `sink` (Ray's event channel)."""

    def __init__(self, metrics: Metrics, events: EventLog | None = None, sink: Callable[[str], None] | None = None,
                 unavailable: UnavailableOfferings | None = None, clock: Callable[[], float] = time.time,
                 status_block: RayStatusBlock | None = None, cost_store: CostStore | None = None):
        self.metrics = metrics
        self.events = events
        self.sink = sink
        # The capacity memory whose backoff a capacity_error event states (the provider's; None: not stated).
        self.unavailable = unavailable
        self.clock = clock          # wall time: the cost state outlives the process (cost_store.py)
        self.status_block = status_block
        self.cost_store = cost_store
        self._saved_at: float | None = None
        self._resume = cost_store.load() if cost_store is not None else None
        self._local = threading.local()
        self._cost_lock = threading.Lock()
        self._cost_total = 0.0
        self._cost_at: float | None = None
        self._hourly = 0.0
        self._keys: set[str] | None = None
        self._recent: dict[tuple[str, str], float] = {}

    # ----- events ----------------------------------------------------------------------------------------------

    def event(self, kind: str, message: str, **fields: Any) -> None:
        """Record one decision; the same (kind, message) again within `REPEAT_S` is counted, not recorded again
        (Ray v2 retries a refused request every few seconds: the log and Ray's channel get it once a minute)."""
        now = self.clock()
        with self._cost_lock:
            last = self._recent.get((kind, message))
            if last is not None and now - last < REPEAT_S:
                return
            self._recent[(kind, message)] = now
            if len(self._recent) > 1000:
                self._recent = {k: t for k, t in self._recent.items() if now - t < REPEAT_S}
        if self.events is not None:
            e = self.events.append(kind, message, **fields)
        else:
            e = Event(ts=round(time.time(), 3), kind=kind, message=message, fields=fields)
        if self.sink is not None:
            self.sink(f"ray_nodeless: {message}")
        if self.status_block is not None:
            self.status_block.add(e)

    # ----- one launch call's capacity errors (the backend's calls run in the launcher's thread) ------------------

    def begin(self) -> _Attempt:
        a = _Attempt()
        self._local.attempt = a
        return a

    def end(self) -> None:
        self._local.attempt = None

    def capacity_error(self, spec: LaunchSpec, e: CapacityError) -> None:
        o = spec.offering
        self.metrics.capacity_errors.labels(o.instance_type.name, o.zone, o.capacity, e.category).inc()
        what = f"{o.instance_type.name}/{o.zone}/{o.capacity}"
        a = getattr(self._local, "attempt", None)
        if a is not None:
            a.capacity_errors.append(what)
        skip_s, in_a_row = self.unavailable.next_skip(o) if self.unavailable is not None else (0.0, 0)
        remembered = (f"; skipped for {skip_s:.0f} s (capacity error {in_a_row} in a row on it; the backoff doubles "
                      "up to unavailable_backoff_cap_s)" if skip_s > 0 else "")
        self.event("capacity_error", f"{spec.node_type}: capacity error {e.category} on {what}{remembered}",
                   node_type=spec.node_type, instance_type=o.instance_type.name, zone=o.zone, capacity=o.capacity,
                   code=e.category, skip_s=round(skip_s, 1), in_a_row=in_a_row)

    def launched(self, node_type: str, launched: Launched, attempt: _Attempt, seconds: float) -> None:
        o = launched.offering
        m = self.metrics
        m.launches.labels(node_type, o.capacity, "launched").inc()
        m.launch_duration.labels("launched").observe(seconds)
        rule = launched.spec.tags.get(TAG_RULE, "")
        ids = sorted(launched.machine_ids)
        why = "the first candidate of the plan's order (cheapest fit under the rule) the cloud accepted"
        if attempt.capacity_errors:
            m.fallbacks.labels(node_type).inc()
            self.event("fallback", f"{node_type}: fell back to {o.instance_type.name}/{o.zone}/{o.capacity} after "
                       f"capacity errors on {', '.join(attempt.capacity_errors)}", node_type=node_type,
                       instance_type=o.instance_type.name, zone=o.zone, capacity=o.capacity,
                       failed=list(attempt.capacity_errors))
        self.event("launch", f"{node_type}: launched {len(ids)} x {o.instance_type.name} in {o.zone} ({o.capacity}, "
                   f"${o.hourly_price or 0.0:.4f}/h) by rule {rule!r}: {why}; ids {','.join(ids)}",
                   node_type=node_type, instance_type=o.instance_type.name, zone=o.zone, capacity=o.capacity,
                   price=o.hourly_price, rule=rule, machine_ids=ids)

    def launch_failed(self, node_type: str, e: LaunchError, attempt: _Attempt, seconds: float) -> None:
        m = self.metrics
        if e.category == COST_CAP:
            result = "cost_cap"
            m.cost_cap_refusals.labels(node_type).inc()
            self.event("cost_cap_refusal", str(e), node_type=node_type, code=e.category)
        elif e.category in NO_OFFERING:
            result = "no_offering"
        elif attempt.capacity_errors:
            result = "no_capacity"
        else:
            result = "error"
        m.launches.labels(node_type, "none", result).inc()
        m.launch_duration.labels(result).observe(seconds)

    # ----- listings, interruptions, unserved demands ------------------------------------------------------------

    def listed(self, machines: Mapping[str, Machine]) -> None:
        """Integrate the cost of what was listed until now, and start the next interval at this listing's price."""
        # A machine's price tag is written at its launch and never changes: the same machines as at the last
        # listing cost the same (one set comparison at C speed instead of 1,000 tag parses per update).
        keys = machines.keys()
        with self._cost_lock:
            same = self._keys is not None and keys == self._keys
            hourly = self._hourly
        if not same:
            try:      # one pass; a machine with an unreadable price tag takes the slow path
                hourly = sum(float(m.tags.get(TAG_PRICE) or 0.0) for m in machines.values())
            except ValueError:
                hourly = sum(_price(m) for m in machines.values())
        now = self.clock()
        with self._cost_lock:
            if self._resume is not None:
                self._cost_total = self._resumed(self._resume, machines, now)
                self._resume = None
            elif self._cost_at is not None:
                self._cost_total += self._hourly * max(0.0, now - self._cost_at) / 3600.0
            self._cost_at, self._hourly = now, hourly
            if not same:
                self._keys = set(keys)
            saved: SavedCost | None = None
            if self.cost_store is not None and (self._saved_at is None or now - self._saved_at >= SAVE_EVERY_S):
                self._saved_at = now
                saved = SavedCost(self._cost_total, now, hourly)
        if saved is not None and self.cost_store is not None:
            self.cost_store.save(saved)

    @staticmethod
    def _resumed(saved: SavedCost, machines: Mapping[str, Machine], now: float) -> float:
        """The saved total, plus what the machines listed now cost from the save (or their launch) until now."""
        gap = sum(_price(m) * max(0.0, now - max(saved.at, m.launched_at or saved.at)) for m in machines.values())
        return saved.total + gap / 3600.0

    def cost_total(self) -> float:
        now = self.clock()
        with self._cost_lock:
            if self._cost_at is None:
                return self._cost_total if self._resume is None else self._resume.total
            return self._cost_total + self._hourly * max(0.0, now - self._cost_at) / 3600.0

    def interrupted(self, m: Machine) -> None:
        capacity = m.tags.get(TAG_CAPACITY, "") or "none"
        self.metrics.interruptions.labels(capacity, "vanished").inc()
        self.event("interruption", f"machine {m.id} ({m.tags.get(TAG_INSTANCE_TYPE, '')} {m.tags.get(TAG_ZONE, '')} "
                   f"{capacity}) vanished without a terminate: treated as interrupted", machine_ids=[m.id],
                   instance_type=m.tags.get(TAG_INSTANCE_TYPE, ""), zone=m.tags.get(TAG_ZONE, ""), capacity=capacity)

    def notices(self, report: QueueReport, machines: Mapping[str, Machine]) -> None:
        for mid, node in sorted(report.drained.items()):
            m = machines.get(mid)
            capacity = (m.tags.get(TAG_CAPACITY, "") if m else "") or "none"
            self.metrics.interruptions.labels(capacity, "notice").inc()
            self.event("interruption_notice", f"interruption notice for machine {mid}", machine_ids=[mid],
                       capacity=capacity)
            self.event("drain", f"drained Ray node {node} of machine {mid} ahead of its interruption",
                       machine_ids=[mid], ray_node=node)

    def unserved(self, summary: str) -> None:
        if summary:
            self.event("unservable", f"demands no allowed offering can serve: {summary}")
        else:
            self.event("unservable", "no unservable demand left")


T = TypeVar("T")


class Metered(Decorator[T]):
    """A decorator that records into a Recorder."""

    _own: ClassVar[tuple[str, ...]] = ("_inner", "_rec")
    _rec: Recorder

    def __init__(self, inner: T, recorder: Recorder) -> None:
        super().__init__(inner)
        object.__setattr__(self, "_rec", recorder)


class MeteredBackend(Metered[MachineBackend], MachineBackend):
    def launch(self, spec: LaunchSpec) -> list[str]:
        try:
            return self._inner.launch(spec)
        except CapacityError as e:
            self._rec.capacity_error(spec, e)
            raise

    def list_machines(self) -> list[Machine]:
        try:
            return list(self._inner.list_machines())
        except Exception:
            self._rec.metrics.listing_errors.inc()
            raise

    # The contract's other abstract calls, unmetered (the rest of the contract is delegated by Decorator).

    def terminate(self, machine_ids: list[str]) -> None:
        self._inner.terminate(machine_ids)

    def set_tags(self, machine_id: str, tags: dict[str, str]) -> bool:
        return self._inner.set_tags(machine_id, tags)


class MeteredLauncher(Metered[Launcher], Launcher):
    def launch(self, node_type: str, node_config: dict[str, Any] | None, ray_tags: dict[str, str], count: int,
               resources: dict[str, float], labels: dict[str, str], is_head: bool,
               launch_request: str | None = None, capacities: frozenset[str] | None = None) -> Launched:
        rec = self._rec
        attempt = rec.begin()
        started = time.perf_counter()
        try:
            launched = self._inner.launch(node_type, node_config, ray_tags, count, resources, labels, is_head,
                                          launch_request, capacities)
        except LaunchError as e:
            rec.launch_failed(node_type, e, attempt, time.perf_counter() - started)
            raise
        finally:
            rec.end()
        rec.launched(node_type, launched, attempt, time.perf_counter() - started)
        return launched


class MeteredView(Metered[MachineView], MachineView):
    """Ray asks `node_tags` / `is_running` / `internal_ip` per node, many times per update: the view's `current` and
    `known` are bound to the wrapped view's methods once, so they cost no delegation."""

    _own = ("_inner", "_rec", "current", "known")

    def __init__(self, inner: MachineView, recorder: Recorder):
        super().__init__(inner, recorder)
        object.__setattr__(self, "current", inner.current)
        object.__setattr__(self, "known", inner.known)

    def refresh(self, force: bool = False) -> dict[str, Machine]:
        machines = self._inner.refresh(force)
        self._rec.listed(machines)
        return machines


class MeteredPlanner(Metered[Planner], Planner):
    def plan(self, request: Request) -> Plan:
        started = time.perf_counter()
        try:
            return self._inner.plan(request)
        finally:
            self._rec.metrics.plan_duration.observe(time.perf_counter() - started)


class MeteredPlanning(Metered[PlanningCatalog], PlanningCatalog):
    """Around `launch.catalog.PlanningCatalog`: its planner, metered (one wrapper per planner object)."""

    _own = ("_inner", "_rec", "_planners")

    def __init__(self, inner: PlanningCatalog, recorder: Recorder):
        super().__init__(inner, recorder)
        object.__setattr__(self, "_planners", {})

    @property
    def planner(self) -> Planner:
        p = self._inner.planner
        metered = self._planners.get(id(p))
        if metered is None or metered.wrapped is not p:
            metered = MeteredPlanner(p, self._rec)
            self._planners.clear()
            self._planners[id(p)] = metered
        return metered


class MeteredInterruptions(Metered[InterruptionQueue], InterruptionQueue):
    def poll(self, machines: Mapping[str, Machine]) -> QueueReport | None:
        report = self._inner.poll(machines)
        if report is not None:
            try:
                self._rec.notices(report, machines)
            except Exception as e:      # never into Ray's loop
                logger.warning("metrics: recording interruption notices failed: %s", e)
        return report


def state_source(view: MachineView, unavailable: UnavailableOfferings,
                 recorder: Recorder) -> Callable[[], StateSnapshot]:
    """What the scrape-time gauges read: the view's machines now, the capacity memory, the integrated cost."""

    def snapshot() -> StateSnapshot:
        _, machines = view.cost_view()
        counts: dict[tuple[str, str, str], int] = {}
        hourly = 0.0
        for m in machines.values():
            t = m.tags
            key = (t.get(TAG_INSTANCE_TYPE, "") or "unknown", t.get(TAG_CAPACITY, "") or "unknown",
                   t.get(TAG_ZONE, "") or "unknown")
            counts[key] = counts.get(key, 0) + 1
            hourly += _price(m)
        blocked: dict[tuple[str, str], int] = {}
        for (_, _, capacity), reason in unavailable.snapshot().items():
            blocked[(capacity, reason)] = blocked.get((capacity, reason), 0) + 1
        return StateSnapshot(counts, round(hourly, 6), recorder.cost_total(), blocked)

    return snapshot
