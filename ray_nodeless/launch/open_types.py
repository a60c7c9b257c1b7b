"""Shape-open node types at run time: the generated node types kept in the cluster config the monitor re-reads.

Mechanism (docs/shape-open.md): every autoscaler loop, the provider (in the monitor only) reads Ray's
pending demands, packs those no declared worker type can serve (`core/open_plan.py`), and writes the result into
the cluster config as node types `nl-<instance>-<zone>-<spot|od>`: each pinned to one offering, its `resources`
those of the machine, its `labels` what the machine is (market type, zone, region, GPU model), its `priority`
higher the cheaper it is, and its `max_workers` the machines it has plus the machines this pass decided to open.
Ray v1 and v2 re-read the file at the start of their next loop and launch within those quotas; Ray's own
scheduler, which does not know prices, can therefore only launch what the cheapest-fit packing chose.

Why quotas and not just a menu: a type Ray may launch freely is a type it may pick for a demand it fits worse (a
1-CPU task on the 16-CPU type generated a minute ago). `max_workers = live + planned` keeps every launch one the
packing chose, and the number of node types Ray scores stays at what the workload needs (`max_open_node_types`).

A type with no machine and no planned one is dropped after `DROP_AFTER_S`, so a demand that comes back soon finds
it (and the v2 instance manager never sees a type vanish under a launch in flight).

Ray's scheduler sees a demand before the type for it is written, so Ray warns "No available node types can fulfill
resource request" for every shape-open demand. Each pass that opens machines says so (`StepResult.opened`, one
`Opening` per generated type given more machines): the event stream then tells that transient warning apart from a
real refusal (`reports`: "cannot serve ...").
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

from ray_nodeless.core.documents import Document, DocumentView
from ray_nodeless.core.catalog import Offering
from ray_nodeless.core.demand import ACCELERATOR_TYPE, Demand, NodeCapacity, canonical_resources, fits
from ray_nodeless.core.open_pack import Packer, Packing
from ray_nodeless.core.idle import capped_break_even_s, cluster_idle_s
from ray_nodeless.core.requirements import OPEN_SHAPE_KEY, parse_requirements, split_node_config
from ray_nodeless.core.settings import CoreSettings
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.base import TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE, Machine

logger = logging.getLogger(__name__)

DROP_AFTER_S = 120.0


class ConfigStore(Protocol):
    """The cluster config the autoscaler re-reads (the head's ray_bootstrap_config.yaml)."""

    def read(self) -> Document: ...

    def write(self, config: Document) -> None: ...


@dataclass
class RayNode:
    """A node alive in Ray (GCS), as the autoscaler state reports it."""

    instance_id: str
    node_type: str
    total: dict[str, float]
    available: dict[str, float]
    labels: dict[str, str]


@dataclass
class Snapshot:
    demands: list[Demand]
    nodes: list[RayNode]
    # Autoscaler v2's instances requested and not yet launched, per node type, and those launched and not yet
    # running Ray (node type, cloud instance id): a quota must never fall below them (Ray would try to stop a
    # REQUESTED instance, which its instance manager refuses, every loop).
    requested: dict[str, int] = field(default_factory=dict)
    pending_instances: list[tuple[str, str]] = field(default_factory=list)
    # `request_resources()` bundles: the cluster must be able to hold them on its machines' whole resources.
    constraints: list[Demand] = field(default_factory=list)


@dataclass(frozen=True)
class Opening:
    """Machines a pass opened on one generated type: Ray launches them at its next loop."""

    node_type: str
    offering: Offering
    count: int
    demand: str          # the shape the type was opened for (`OpenType.shape`), described

    def message(self) -> str:
        o = self.offering
        return (f"shape-open: {self.count} x {self.node_type} on its way ({o.instance_type.name} in {o.zone}, "
                f"{o.capacity}, ${o.hourly_price or 0.0:.4f}/h) for {self.demand}; Ray's \"No available node types "
                f"can fulfill\" for it is transient: the type is in the config Ray re-reads at its next loop")


@dataclass
class StepResult:
    packing: Packing
    quotas: dict[str, int]
    written: bool
    reports: list[str] = field(default_factory=list)     # demands reported infeasible for the first time
    opened: list[Opening] = field(default_factory=list)  # machines this pass added to generated types' quotas


def is_open_type(entry: DocumentView) -> bool:
    return isinstance(entry, Mapping) and OPEN_SHAPE_KEY in (entry.get("node_config") or {})


def shape_open(settings: CoreSettings, node_types: DocumentView, head_type: str) -> bool:
    """Whether the cluster is shape-open: `provider.open_shapes`, else exactly when it declares no worker type."""
    if settings.open_shapes is not None:
        return settings.open_shapes
    return not [n for n, t in node_types.items() if n != head_type and not is_open_type(t)]


def check_open(cluster_config: DocumentView, settings: CoreSettings,
               check_launch_keys: Callable[[str, Document, str], None]) -> bool:
    """Config-time checks of a shape-open cluster (`plan` and `ray up` alike), before anything launches: the
    template's requirement keys parse, and its launch keys pass the backend's own check (`check_launch_keys`,
    the bundle's `check_node_config`). Returns whether the cluster is shape-open."""
    types = cluster_config.get("available_node_types") or {}
    if not shape_open(settings, types, str(cluster_config.get("head_node_type", ""))):
        return False
    key = settings.open.key("node_config")     # as written: provider.open.node_config or provider.open_node_config
    ours, theirs = split_node_config(settings.open.node_config)
    if OPEN_SHAPE_KEY in ours:
        raise ConfigError(f"{key}.{OPEN_SHAPE_KEY}", "is written by ray_nodeless on the node types it generates")
    parse_requirements(ours, key)
    check_launch_keys("open", dict(settings.open.node_config), key)
    return True


class OpenTypes:
    def __init__(self, settings: CoreSettings, packer: Packer, store: ConfigStore,
                 clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.packer = packer
        self.store = store
        self.clock = clock
        self._idle_since: dict[str, float] = {}
        self._reported: set[Demand] = set()
        self._offerings: dict[str, Offering | None] = {}

    def step(self, snapshot: Snapshot, machines: Mapping[str, Machine]) -> StepResult:
        config = self.store.read()
        types: Document = dict(config.get("available_node_types") or {})
        head = str(config.get("head_node_type", ""))
        if not shape_open(self.settings, types, head):
            return StepResult(Packing(), {}, False)
        declared = {n: t for n, t in types.items() if n != head and not is_open_type(t)}
        generated = {n: t for n, t in types.items() if is_open_type(t)}
        demands = [d for d in snapshot.demands if not self._declared_serves(d, declared)]
        live = _live_counts(machines)
        floor = dict(snapshot.requested)
        for node_type, instance_id in snapshot.pending_instances:
            if instance_id not in machines:
                floor[node_type] = floor.get(node_type, 0) + 1
        bins = self._bins(snapshot, machines, types)
        packing = self.packer.pack(demands, bins)
        if snapshot.constraints:
            # Ray's semantics: the bundles must fit the cluster's total resources, busy or not. The machines they
            # need count beside those the demands need (a type gets the larger of the two).
            wanted = [d for d in snapshot.constraints if not self._declared_serves(d, declared)]
            held = self.packer.pack(wanted, self._bins(snapshot, machines, types, whole=True))
            for name, n in held.new.items():
                packing.types.setdefault(name, held.types[name])
                packing.new[name] = max(packing.new.get(name, 0), n)
            for d, why in held.infeasible.items():
                packing.infeasible.setdefault(d, why)
        _cap_at_max_workers(packing, config.get("max_workers"), sum(live.values()))
        now = self.clock()
        quotas: dict[str, int] = {}
        entries: dict[str, Document] = {}
        for name, t in sorted(generated.items()):
            entries[name] = dict(t)
        for name in sorted(packing.new):
            if name in entries:
                continue
            if len(entries) >= self.settings.max_open_node_types:
                logger.error("%s: not added: %d generated node types already (provider.max_open_node_types)",
                             name, len(entries))
                continue
            template: Document = {"node_config": self.settings.open_node_config}
            idle_s = self._idle_s(packing.types[name].offering, cluster_idle_s(config))
            if idle_s is not None:
                template["idle_timeout_s"] = idle_s     # cost-aware idle release, as for declared types
            entries[name] = packing.types[name].node_type(template, 0, 0)
        for name, entry in entries.items():
            # Ray's own requests of a type hold its quota, unless the type's offering has just failed: Ray would
            # then request it again and again, each failing at once, instead of the type the packing chose now.
            requested = 0 if self._unavailable(entry, packing, name) else floor.get(name, 0)
            quotas[name] = live.get(name, 0) + max(packing.new.get(name, 0), requested)
        for name in sorted(entries):
            if quotas[name] > 0:
                self._idle_since.pop(name, None)
            elif now - self._idle_since.setdefault(name, now) >= DROP_AFTER_S:
                del entries[name], quotas[name]
                self._idle_since.pop(name, None)
        # Cheaper first: Ray breaks ties between types by priority (higher first).
        by_price = sorted(entries, key=lambda n: (self._price(entries[n], packing, n), n))
        for rank, name in enumerate(by_price):
            entries[name]["max_workers"] = quotas[name]
            entries[name]["priority"] = len(by_price) - rank
        new_types = {n: t for n, t in types.items() if not is_open_type(t)}
        new_types.update(entries)
        written = False
        if new_types != types:
            config["available_node_types"] = new_types
            self.store.write(config)
            written = True
            logger.info("shape-open node types: %s", ", ".join(f"{n}={quotas[n]}" for n in sorted(quotas)) or "none")
        reports = []
        for d, why in sorted(packing.infeasible.items(), key=lambda kv: kv[0].describe()):
            if d not in self._reported:
                self._reported.add(d)
                reports.append(f"cannot serve {d.describe()}: {why}")
        opened = []
        for name in sorted(packing.new) if written else ():
            # What the quota grew by for the machines this pass planned (not for Ray's own requests' floor).
            before = int((generated.get(name) or {}).get("max_workers") or 0)
            more = min(packing.new[name], quotas.get(name, 0) - before)
            if name in entries and more > 0:
                t = packing.types[name]
                opened.append(Opening(name, t.offering, more, Demand(canonical_resources(dict(t.shape))).describe()))
        return StepResult(packing, quotas, written, reports, opened)

    def _idle_s(self, offering: Offering, cluster_s: float | None) -> float | None:
        """A generated type's idle_timeout_s: the break-even of its one offering (core/idle.py), or None (off, no
        price to divide by, or not shorter than idle_timeout_minutes) to leave the cluster-wide timeout in charge."""
        if not self.settings.cost_aware_idle:
            return None
        s = capped_break_even_s(offering.hourly_price, self.settings.expected_launch_s,
                                self.settings.relaunch_overhead_usd, cluster_s)
        return None if s is None else round(s, 3)

    def _offering(self, entry: DocumentView, name: str, packing: Packing) -> Offering | None:
        """The one offering a generated type is pinned to (cached: the catalog lookup scans a region)."""
        if name in packing.types:
            self._offerings[name] = packing.types[name].offering
        if name not in self._offerings:
            try:
                self._offerings[name] = self.packer.fitter.planner.catalog.region(
                    self.settings.price_cloud, self.settings.region).find(*_pinned(entry))
            except Exception:    # e.g. a type of another region's catalog
                self._offerings[name] = None
        return self._offerings[name]

    def _price(self, entry: DocumentView, packing: Packing, name: str) -> float:
        o = self._offering(entry, name, packing)
        return (o.hourly_price or 0.0) if o is not None else float("inf")

    def _unavailable(self, entry: DocumentView, packing: Packing, name: str) -> bool:
        """A type whose offering just failed (capacity, a machine that never came up): every launch of it would
        fail at once, so it gets no quota beyond its machines until the offering is available again."""
        o = self._offering(entry, name, packing)
        unavailable = self.packer.fitter.unavailable
        return o is not None and unavailable is not None and unavailable.reason(o) is not None

    @staticmethod
    def _declared_serves(d: Demand, declared: DocumentView) -> bool:
        """Whether a declared worker type's shape and labels hold the demand: Ray scales those itself."""
        for t in declared.values():
            res = {k: float(v) for k, v in (t.get("resources") or {}).items()}
            labels = {str(k): str(v) for k, v in (t.get("labels") or {}).items()}
            if res and fits(res, d.res) and d.accepts(labels):
                return True
        return False

    @staticmethod
    def _bins(snapshot: Snapshot, machines: Mapping[str, Machine], types: DocumentView,
              whole: bool = False) -> list[NodeCapacity]:
        """Free capacity that pending demands will get without a new machine: Ray nodes alive now, and machines
        launched that have not joined yet (the whole of their type's resources). `whole`: a node's total
        resources rather than what is free on it (for `request_resources` bundles)."""
        out = []
        joined = set()
        for n in snapshot.nodes:
            joined.add(n.instance_id)
            out.append(NodeCapacity(f"ray:{n.instance_id}", dict(n.total if whole else n.available), dict(n.labels),
                                    n.node_type,
                                    n.labels.get("ray.io/availability-zone", ""),
                                    has_gpu=n.total.get("GPU", 0) > 0 or ACCELERATOR_TYPE in n.labels))
        for mid, m in sorted(machines.items()):
            if mid in joined or m.tags.get(TAG_RAY_NODE_KIND) == "head":
                continue
            t = types.get(m.tags.get(TAG_RAY_USER_NODE_TYPE, "")) or {}
            res = {k: float(v) for k, v in (t.get("resources") or {}).items()}
            labels = {str(k): str(v) for k, v in (t.get("labels") or {}).items()}
            out.append(NodeCapacity(f"machine:{mid}", res, labels, m.tags.get(TAG_RAY_USER_NODE_TYPE, ""),
                                    labels.get("ray.io/availability-zone", ""), has_gpu=res.get("GPU", 0) > 0))
        return out


def _cap_at_max_workers(packing: Packing, max_workers: object, workers: int) -> None:
    """Keep the machines to open within the cluster's `max_workers` (Ray enforces it too, but would choose which by
    its own scoring): the first opened in packing order (selector demands, then largest first) are kept."""
    if not isinstance(max_workers, int) or isinstance(max_workers, bool):
        return
    room = max(0, max_workers - workers)
    if sum(packing.new.values()) <= room:
        return
    for name in list(packing.new):
        keep = min(packing.new[name], room)
        room -= keep
        if keep:
            packing.new[name] = keep
        else:
            del packing.new[name]
    logger.warning("shape-open: max_workers %d reached; %d machine(s) planned", max_workers, sum(packing.new.values()))


def _live_counts(machines: Mapping[str, Machine]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in machines.values():
        if m.tags.get(TAG_RAY_NODE_KIND) == "head":
            continue
        name = m.tags.get(TAG_RAY_USER_NODE_TYPE, "")
        out[name] = out.get(name, 0) + 1
    return out


def _pinned(entry: DocumentView) -> tuple[str, str, str]:
    nc = entry.get("node_config") or {}
    types, zones, capacity = (str((nc.get(k) or [""])[0]) for k in ("instance_types", "zones", "capacity"))
    return types, zones, capacity

