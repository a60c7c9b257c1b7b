"""Shape-open provisioning, the pure part: Ray's pending demands -> the machines to launch, each the cheapest fit.

`OpenFitter.fit(demand, selector)` is the cheapest-fit search for one demand: the planner's candidates for the
demand's shape under the first rule that matches the demand (exclusions, pins and `max_hourly_price` applied), in
the documented total order, without offerings recently unavailable, keeping only those whose machine's Ray
resources really hold the demand (Ray's `memory` resource is 70 % of the RAM: `instance_resources`) and whose
labels match the selector. The result is an `OpenType`: one offering (instance type, zone, market) as a Ray node
type whose labels promise exactly what the machine will be, so a launch never breaks a label promise.

The packing of many demands onto machines (first-fit-decreasing, gangs) is core/open_pack.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Mapping

from ray_nodeless.core.documents import Document, DocumentView
from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.catalog import Offering, RegionCatalog
from ray_nodeless.core.gpus import canonical_gpu
from ray_nodeless.core.demand import ACCELERATOR_RESOURCE, Demand, Selector, fits, offering_labels
from ray_nodeless.core.node_resources import instance_resources
from ray_nodeless.core.plan import Plan
from ray_nodeless.core.planner import Planner
from ray_nodeless.core.diagnose import explain_no_offering
from ray_nodeless.core.requirements import GIB, OPEN_SHAPE_KEY, REQUIREMENT_KEYS, Request
from ray_nodeless.core.settings import Resolver
from ray_nodeless.core.ttls import TASK_MEMORY_FRACTION
from ray_nodeless.errors import ConfigError, NoFeasibleOffering

# Resources an instance has. A demand for anything else (a custom resource) is for a declared node type.
INSTANCE_RESOURCES = ("CPU", "GPU", "memory")

TYPE_PREFIX = "nl-"
CAPACITY_SUFFIX = {"spot": "spot", "on-demand": "od"}


@dataclass(frozen=True)
class OpenType:
    """One offering as a generated Ray node type."""

    name: str
    offering: Offering
    rule: str
    resources: tuple[tuple[str, int], ...]      # the machine's Ray resources (integers, as Ray's schema wants)
    labels: tuple[tuple[str, str], ...]
    shape: tuple[tuple[str, float], ...]        # the demand it was opened for: its rule is matched at launch

    @property
    def price(self) -> float:
        return self.offering.hourly_price or 0.0

    def node_type(self, template: DocumentView, max_workers: int, priority: int) -> Document:
        """The `available_node_types` entry: pinned to this offering, labelled with what it is."""
        o = self.offering
        node_config = {k: v for k, v in template.get("node_config", {}).items()}
        node_config.update(instance_types=[o.instance_type.name], zones=[o.zone], capacity=[o.capacity])
        node_config[OPEN_SHAPE_KEY] = {k: (int(v) if float(v).is_integer() else v) for k, v in self.shape}
        out: Document = {"min_workers": 0, "max_workers": int(max_workers), "resources": dict(self.resources),
                               "labels": dict(self.labels), "priority": int(priority), "node_config": node_config}
        if template.get("idle_timeout_s") is not None:
            out["idle_timeout_s"] = template["idle_timeout_s"]
        return out


def type_name(o: Offering) -> str:
    """`nl-<instance type>-<zone>-<spot|od>`: stable, readable, within Ray's and GCE's 63 characters."""
    return f"{TYPE_PREFIX}{o.instance_type.name}-{o.zone}-{CAPACITY_SUFFIX.get(o.capacity, o.capacity)}"[:63]


def ray_int_resources(o: Offering) -> tuple[tuple[str, int], ...]:
    res = instance_resources(o.instance_type, {})
    return tuple(sorted((k, int(math.floor(v + 1e-9))) for k, v in res.items()))


DERIVED_CACHE = 4096     # plans derived from a smaller shape's (see OpenFitter._plan), per fitter


class OpenFitter:
    """The cheapest allowed offering for one demand (see the module docstring)."""

    def __init__(self, resolver: Resolver, planner: Planner | Callable[[], Planner],
                 unavailable: UnavailableOfferings | None = None,
                 template_node_config: DocumentView | None = None, derive_sizes: bool = True):
        self.resolver = resolver
        # derive_sizes: take the candidates of a bigger shape from a smaller shape's plan under the same rule and
        # requirements instead of asking the planner (`_plan`); the same candidates in the same order, so the same
        # fits. False: always ask the planner (tests compare the two).
        self.derive_sizes = derive_sizes
        self._bases: dict[_SizeKey, _Base] = {}
        self._derived: dict[Request, Plan] = {}
        self._size_columns: dict[int, tuple[RegionCatalog, _Columns]] = {}
        # A callable: the provider loads its catalog at the first plan, not when Ray builds it.
        self._planner = planner
        self.unavailable = unavailable
        # Only the template's requirement keys narrow the search (families, exclusions ...); its launch keys
        # (images, subnets) go to the generated types as they are.
        self.narrowing = {k: v for k, v in (template_node_config or {}).items() if k in REQUIREMENT_KEYS}
        self._why: dict[Request, str] = {}

    @property
    def planner(self) -> Planner:
        return self._planner if isinstance(self._planner, Planner) else self._planner()

    def fit(self, demand: Demand, selector: Selector | None = None, zone: str | None = None,
            quiet: bool = False) -> OpenType:
        """`quiet`: the caller drops the NoFeasibleOffering message (a probe); it may then be a short one."""
        request, shape, plan = self._demand_plan(demand, quiet)
        skipped = [0, 0]       # offerings left out by the selector, and as recently unavailable
        for t in self._allowed(demand, request, shape, plan, selector, zone, skipped):
            return t
        (skipped_labels, unavailable), nearest = skipped, plan.chosen
        where = f" in zone {zone}" if zone else ""
        why = (f"no offering of rule {request.rule!r}{where} has labels {selector.describe()}" if skipped_labels
               and selector is not None else f"all {unavailable} fitting offerings{where} are recently unavailable"
               if unavailable else f"no offering of rule {request.rule!r}{where} holds it")
        raise NoFeasibleOffering(f"{demand.describe()}: {why} (nearest allowed: {nearest.instance_type.name} "
                                 f"{nearest.zone} {nearest.capacity} ${nearest.hourly_price or 0:.4f}/h)")

    def allowed(self, demand: Demand, selector: Selector | None = None) -> list[OpenType]:
        """Every offering `fit` chooses from for `demand` under `selector`, in its order (benches/lp_bound.py)."""
        request, shape, plan = self._demand_plan(demand, quiet=True)      # NoFeasibleOffering as `fit` raises it
        return list(self._allowed(demand, request, shape, plan, selector, None, [0, 0]))

    def _demand_plan(self, demand: Demand, quiet: bool) -> tuple[Request, Document, Plan]:
        """The demand's planner request (whole GPUs, the GPU model as a resource, memory as RAM) and its plan."""
        want = demand.res
        others = sorted(k for k in want if k not in INSTANCE_RESOURCES and not k.startswith(ACCELERATOR_RESOURCE))
        if others:
            raise NoFeasibleOffering(
                f"{demand.describe()}: no instance offers the resource(s) {others}; declare a node type with them")
        shape: Document = {"CPU": want.get("CPU", 0.0), "GPU": math.ceil(want.get("GPU", 0.0) - 1e-9)}
        if demand.accelerator:
            shape[f"{ACCELERATOR_RESOURCE}{demand.accelerator}"] = 1
            if not shape["GPU"]:
                shape["GPU"] = 1     # `accelerator_type` without num_gpus: the machine still has that GPU
        node_config = dict(self.narrowing)
        if want.get("memory"):
            shape["memory"] = want["memory"]
            ram = want["memory"] / GIB / TASK_MEMORY_FRACTION
            node_config["min_memory_gib"] = max(float(node_config.get("min_memory_gib", 0) or 0), ram)
        try:
            request = self.resolver.request("open", shape, node_config, is_head=False)
        except ConfigError as e:
            raise NoFeasibleOffering(f"{demand.describe()}: {e}") from e
        try:
            return request, shape, self._plan(request, quiet)
        except NoFeasibleOffering as e:
            if quiet:     # a probe: nobody reads the message, so no diagnosis (it re-plans the demand)
                raise NoFeasibleOffering(f"{demand.describe()}: {e}") from e
            raise NoFeasibleOffering(f"{demand.describe()}: {self._why_none(request, e, shape, node_config)}") from e

    def _allowed(self, demand: Demand, request: Request, shape: Document, plan: Plan, selector: Selector | None,
                 zone: str | None, skipped: list[int]) -> Iterator[OpenType]:
        """The candidates `fit` may take, in order; `skipped` counts those left out by selector and unavailability."""
        want = demand.res
        for o in plan.candidates():
            if zone is not None and o.zone != zone:
                continue
            labels = offering_labels(o)
            if selector is not None and not selector.matches(labels):
                skipped[0] += 1
                continue
            # An accelerator demand is a fraction of the machine's one `accelerator_type:<model>` unit.
            held = {k: min(v, 1.0) if k.startswith(ACCELERATOR_RESOURCE) else v
                    for k, v in held_as(want, o.instance_type.gpu_model).items()}
            if not fits(instance_resources(o.instance_type, {}), held):
                continue
            if self.unavailable is not None and self.unavailable.reason(o) is not None:
                skipped[1] += 1
                continue
            yield OpenType(name=type_name(o), offering=o, rule=request.rule, resources=ray_int_resources(o),
                           labels=tuple(sorted(labels.items())), shape=tuple(sorted(shape.items())))

    def _why_none(self, request: Request, error: NoFeasibleOffering, shape: DocumentView,
                  node_config: DocumentView) -> str:
        """The key that removed the demand's last candidate and the nearest offering (core/diagnose.py), once
        per request: an unservable demand stays pending, and is planned again every loop."""
        if request not in self._why:
            s = self.resolver.settings
            rc = self.planner.catalog.region(s.price_cloud, s.region)
            explained = explain_no_offering(error, self.planner.plan, rc, s, "open",
                                            {"resources": dict(shape), "node_config": dict(node_config)}, False,
                                            self.resolver.backend_overrides)
            self._why[request] = (str(explained).splitlines()[0].replace("node type 'open' ", "the demand ")
                                  .replace("available_node_types.open.", "the demand's ")
                                  .replace("available_node_types.open", "the demand"))
        return self._why[request]

    def _plan(self, request: Request, quiet: bool) -> Plan:
        """`planner.plan(request)`, or the same candidates taken from the plan of a smaller shape.

        The packer probes many sizes of one demand (`_group_sizes`: n, n/2, ... equal demands on one machine), each
        a new planner shape that in plain Python (the monitor's path) costs a full evaluation of the region, and for
        a size no machine holds also the rejection counts and nearest offerings of a message nobody reads. Every
        planner check but three is independent of the shape's size: when two requests have the same cloud,
        region, rule, node type, GPU model, GPU-or-not and requirements (but `min_memory_gib`, which `fit` sets from
        the memory demand), the candidates of the one with the higher thresholds (vCPUs >= max(CPU, min_vcpus),
        RAM >= max(memory, min_memory_gib), GPUs >= GPU) are exactly the other's candidates whose instance type
        passes those thresholds, in the same order (core/planner.py's size checks on the same type columns).
        tests/core/test_open_plan_sizes.py compares this with the planner."""
        planner = self.planner
        if not self.derive_sizes:
            return planner.plan(request)
        key, need = _size_free(request, planner.catalog.catalog_id)
        base = self._bases.get(key)
        if base is None or base[1].request == request or any(n < b for n, b in zip(need, base[0])):
            plan = planner.plan(request)      # raises NoFeasibleOffering as it always did
            if base is None or all(n <= b for n, b in zip(need, base[0])):
                # The smallest shape seen: the most candidates to derive from (offering and type index of each).
                index = [int(i) for i in plan.candidate_index]
                type_ids = plan.region.type_ids
                self._bases[key] = (need, plan, index, [type_ids[i] for i in index], self._columns(plan.region))
            return plan
        derived = self._derived.get(request)
        if derived is None:
            derived = _filtered(base, request, need, planner)
            if len(self._derived) >= DERIVED_CACHE:
                self._derived.clear()
            self._derived[request] = derived
        if len(derived):
            return derived
        if quiet:
            raise NoFeasibleOffering(f"no offering holds {request.shape.describe()} under rule {request.rule!r}")
        return planner.plan(request)          # the planner's own error, with its explanation

    def _columns(self, rc: RegionCatalog) -> _Columns:
        hit = self._size_columns.get(id(rc))
        if hit is None or hit[0] is not rc:
            hit = self._size_columns[id(rc)] = (rc, _size_columns(rc))
        return hit[1]


# The open fitter's cache of base plans: a request's fields besides its size (hashed and compared only), the size
# thresholds (vCPUs, memory GiB, GPUs), a region's type columns of those, and a cached base plan with its candidates.
_SizeKey = tuple[object, ...]
_Need = tuple[float, float, int]
_Columns = tuple[list[float], list[float], list[int]]
_Base = tuple[_Need, Plan, list[int], list[int], _Columns]


def _size_free(request: Request, catalog_id: str) -> tuple[_SizeKey, _Need]:
    """(what the planner's checks depend on besides size, the three size thresholds) of a request."""
    req, shape = request.requirements, request.shape
    key = (catalog_id, request.cloud, request.region, request.rule, request.node_type, shape.accelerator_type,
           shape.gpu > 0, replace(req, min_memory_gib=0.0))
    return key, (max(shape.cpu, req.min_vcpus), max(shape.memory_gib, req.min_memory_gib), shape.gpu)


def _size_columns(rc: RegionCatalog) -> _Columns:
    """The type columns the planner's size checks read (planner_py.PyRegionIndex: the same values)."""
    return ([float(t.vcpus) for t in rc.types], [float(t.memory_gib) for t in rc.types],
            [t.gpu_count for t in rc.types])


def _filtered(base: _Base, request: Request, need: _Need, planner: Planner) -> Plan:
    """The base plan's candidates whose instance type passes `need` (the planner's too_few_vcpus, too_little_memory
    and too_few_gpus checks, on the same float columns), in the same order, as `request`'s plan."""
    _, plan, candidates, type_ids, (vcpus, mem, gpus) = base
    cpu, memory, gpu = need
    ok = [v >= cpu and m >= memory and g >= gpu for v, m, g in zip(vcpus, mem, gpus)]
    index = [i for i, ti in zip(candidates, type_ids) if ok[ti]]
    # The rejection counts are the planner's to give (nothing here reads them; explain() would).
    return Plan(request=request, catalog_id=plan.catalog_id, region=plan.region, candidate_index=index,
                considered=plan.considered, _attribute=lambda: planner.plan(request).rejected)


def group_sizes(remaining: int) -> list[int]:
    """The group sizes tried when a machine is opened for `remaining` equal demands: remaining, then halving."""
    out: list[int] = []
    m = remaining
    while m > 1 and len(out) < 8:
        out.append(m)
        m //= 2
    return out


def held_as(want: Mapping[str, float], model: str, free: Mapping[str, float] | None = None) -> dict[str, float]:
    """A demand as a machine with GPUs of `model` holds it: an `accelerator_type:<name>` of that model (in any
    spelling the GPU vocabulary knows) is the machine's `accelerator_type:<model>` resource, unless the machine's
    `free` resources have the demand's own spelling."""
    out = {}
    for k, v in want.items():
        if (model and k.startswith(ACCELERATOR_RESOURCE) and (free is None or k not in free)
                and canonical_gpu(k[len(ACCELERATOR_RESOURCE):]) == model):
            k = f"{ACCELERATOR_RESOURCE}{model}"
        out[k] = v
    return out
