"""The planner's evaluation in plain Python lists, for a process that has not imported numpy (a one-off
`ray-nodeless plan`: importing numpy costs more than planning a whole cluster). The same checks in the same order on
the same values as `Planner._compute` in planner.py, so the same plans, rejection counts and errors
(tests/core/test_planner_pure.py compares the two over many requests in every region of both clouds)."""
from __future__ import annotations

import fnmatch
import threading
from array import array
from typing import Iterable, Sequence

from ray_nodeless.core.catalog import CAPACITY_TYPES, Catalog, RegionCatalog
from ray_nodeless.core.plan import SIZE_REASONS, Plan, allowed_gpu_models, failure_text
from ray_nodeless.core.requirements import Request, names_explicitly
from ray_nodeless.errors import NoFeasibleOffering


class PyRegionIndex:
    """`_RegionIndex` in plain Python lists: per-type columns, name -> code tables not needed (`in` on values)."""

    def __init__(self, rc: RegionCatalog):
        self.rc = rc
        types = rc.types
        self.names = [t.name for t in types]
        self.vcpus = [float(t.vcpus) for t in types]
        self.mem = [float(t.memory_gib) for t in types]
        self.gpus = [t.gpu_count for t in types]
        self.burstable = [bool(t.burstable) for t in types]
        self.accel = [bool(t.accelerator) for t in types]
        self.family = [t.family for t in types]
        self.gpu_model = [t.gpu_model for t in types]
        self.arch = [t.arch for t in types]
        self.zone_names = list(rc.zones)
        per_type = [0] * len(types)
        for ti in rc.type_ids:
            per_type[ti] += 1
        self.offerings_per_type = per_type
        self.known_price = [p is not None for p in rc.prices]
        self.n_types = len(types)
        self._glob_cache: dict[str, list[bool]] = {}
        self._lock = threading.Lock()

    def glob_mask(self, pattern: str) -> list[bool]:
        hit = self._glob_cache.get(pattern)
        if hit is None:
            hit = [fnmatch.fnmatchcase(n, pattern) for n in self.names]
            with self._lock:
                self._glob_cache[pattern] = hit
        return hit

    def any_glob(self, patterns: Iterable[str]) -> list[bool]:
        out = [False] * self.n_types
        for p in patterns:
            out = [a or b for a, b in zip(out, self.glob_mask(p))]
        return out


def _and(a: Sequence[bool], b: Sequence[bool]) -> list[bool]:
    return [x and y for x, y in zip(a, b)]


def _not(a: Sequence[bool]) -> list[bool]:
    return [not x for x in a]


# (reason, which types or offerings pass it): the planner's checks, in order.
_PyChecks = list[tuple[str, list[bool]]]


def _py_type_checks(idx: PyRegionIndex, request: Request) -> _PyChecks:
    """`Planner._type_checks`, per type in plain Python (same checks, same order, same values)."""
    req = request.requirements
    shape = request.shape
    n = idx.n_types
    ones = [True] * n
    none = [False] * n
    named = none
    allowed_types = ones
    for group in req.instance_types:
        allowed_types = _and(allowed_types, idx.any_glob(group))
        explicit = idx.any_glob([p for p in group if names_explicitly(p)])
        named = [a or b for a, b in zip(named, explicit)]
    families_ok = ones if req.families is None else [f in req.families for f in idx.family]
    if req.families is not None:
        named = [a or b for a, b in zip(named, families_ok)]
    named = _and(named, allowed_types)
    excluded_types = idx.any_glob(req.exclude_instance_types) if req.exclude_instance_types else none
    fam_excluded = [f in req.exclude_families for f in idx.family] if req.exclude_families else none
    arch_ok = [a in request.arch for a in idx.arch]
    has_gpu = [g > 0 for g in idx.gpus]
    gpu_allowed = allowed_gpu_models(request)
    if gpu_allowed is None:
        gpu_model_ok = ones
    else:
        gpu_model_ok = [not h or m in gpu_allowed for h, m in zip(has_gpu, idx.gpu_model)]
    gpu_excl = ([m in req.exclude_gpus and h for h, m in zip(has_gpu, idx.gpu_model)]
                if req.exclude_gpus else none)
    gpu_unwanted = (_and(has_gpu, _not(named)) if (shape.gpu == 0 and not req.allow_gpu_instances) else none)
    min_cpu = max(shape.cpu, req.min_vcpus)
    min_mem = max(shape.memory_gib, req.min_memory_gib)
    return [
        ("instance_type_not_allowed", allowed_types),
        ("instance_type_excluded", _not(excluded_types)),
        ("family_not_allowed", families_ok),
        ("family_excluded", _not(fam_excluded)),
        ("arch", arch_ok),
        ("burstable", [not (b and not m) for b, m in zip(idx.burstable, named)]),
        ("non_gpu_accelerator", [not (a and not m) for a, m in zip(idx.accel, named)]),
        ("gpu_not_requested", _not(gpu_unwanted)),
        ("gpu_model_not_allowed", gpu_model_ok),
        ("gpu_model_excluded", _not(gpu_excl)),
        ("too_few_vcpus", [v >= min_cpu for v in idx.vcpus]),
        ("too_little_memory", [m >= min_mem for m in idx.mem]),
        ("too_few_gpus", [g >= shape.gpu for g in idx.gpus]),
    ]


def _py_offering_checks(idx: PyRegionIndex, request: Request) -> _PyChecks:
    """`Planner._offering_checks`, per offering in plain Python."""
    rc = idx.rc
    req = request.requirements
    cap_lut = [c in request.catalog_capacity for c in CAPACITY_TYPES]
    cap_ok = [cap_lut[c] for c in rc.cap_ids]
    n = len(rc)
    if req.zones is None:
        zone_ok = [True] * n
    else:
        zone_lut = [z in req.zones for z in idx.zone_names]
        zone_ok = [zone_lut[z] for z in rc.zone_ids]
    known = idx.known_price
    if req.max_hourly_price is None:
        under = [True] * n
    else:
        limit = req.max_hourly_price + 1e-12
        under = [p is None or p <= limit for p in rc.prices]
    return [("capacity_type", cap_ok), ("zone", zone_ok), ("unknown_price", known),
            ("over_max_hourly_price", under)]


def _py_attribute(idx: PyRegionIndex, type_checks: _PyChecks, offering_checks: _PyChecks) -> dict[str, int]:
    """`Planner._attribute` in plain Python."""
    per_type = idx.offerings_per_type
    still = [True] * idx.n_types
    out: dict[str, int] = {}
    for reason, passes in type_checks:
        n = sum(c for s, p, c in zip(still, passes, per_type) if s and not p)
        if n:
            out[reason] = n
        still = _and(still, passes)
    alive = [still[t] for t in idx.rc.type_ids]
    for reason, passes in offering_checks:
        n = sum(1 for a, p in zip(alive, passes) if a and not p)
        if n:
            out[reason] = n
        alive = _and(alive, passes)
    return out


class PyPlanner:
    """The plain-Python evaluation over one catalog (what `Planner` uses without numpy; it keeps the plan cache).
    Thread-safe: one region index per (cloud, region), built on first use."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self._indexes: dict[tuple[str, str], PyRegionIndex] = {}
        self._lock = threading.Lock()

    def index(self, cloud: str, region: str) -> PyRegionIndex:
        key = (cloud, region)
        idx = self._indexes.get(key)
        if idx is None:
            idx = PyRegionIndex(self.catalog.region(cloud, region))
            with self._lock:
                idx = self._indexes.setdefault(key, idx)
        return idx

    def compute(self, request: Request) -> Plan:
        """The plan of `request` (no cache); raises NoFeasibleOffering when there is no candidate."""
        idx = self.index(request.cloud, request.region)
        rc = idx.rc
        type_checks = _py_type_checks(idx, request)
        type_ok = [True] * idx.n_types
        for _, passes in type_checks:
            type_ok = _and(type_ok, passes)
        offering_checks = _py_offering_checks(idx, request)
        (_, cap_ok), (_, zone_ok), (_, known), (_, under) = offering_checks
        candidates = [i for i, t in enumerate(rc.type_ids) if type_ok[t] and cap_ok[i] and zone_ok[i] and known[i]
                      and under[i]]
        if candidates:
            pref = {c: i for i, c in enumerate(request.capacity)}
            cap_rank = [pref.get(c, len(pref)) for c in CAPACITY_TYPES]
            cap_ids = rc.cap_ids
            candidates.sort(key=lambda i: cap_rank[cap_ids[i]])   # stable, as numpy's kind="stable"
        # The rejection counts are recomputed from the request when asked (the masks are about 0.4 MB per plan in
        # plain Python lists, and a cluster plan keeps every node type's plan); the candidates are kept as 4-byte
        # integers rather than a list of int objects.
        plan = Plan(request=request, catalog_id=self.catalog.catalog_id, region=rc,
                    candidate_index=array("i", candidates), considered=len(rc),
                    _attribute=lambda: _py_attribute(idx, _py_type_checks(idx, request),
                                                     _py_offering_checks(idx, request)))
        if not candidates:
            raise NoFeasibleOffering(_py_failure_message(self.catalog.catalog_id, idx, request, type_checks,
                                                         offering_checks, plan.rejected), explanation=plan)
        return plan


def _py_failure_message(catalog_id: str, idx: PyRegionIndex, request: Request, type_checks: _PyChecks,
                        offering_checks: _PyChecks,
                        rejected: dict[str, int], nearest: int = 3) -> str:
    """`Planner._failure_message` in plain Python: the same nearest offerings in the same order."""
    rc = idx.rc
    t_fails = [0] * idx.n_types
    t_misfits = [0] * idx.n_types
    for reason, passes in type_checks:
        size = reason in SIZE_REASONS
        for t, p in enumerate(passes):
            if not p:
                t_fails[t] += 1
                if size:
                    t_misfits[t] += 1
    fails = [t_fails[t] for t in rc.type_ids]
    for _, passes in offering_checks:
        fails = [f + (not p) for f, p in zip(fails, passes)]
    misfits = [t_misfits[t] for t in rc.type_ids]
    order = sorted(range(len(rc)), key=lambda i: (misfits[i], fails[i], i))

    def why_of(i: int) -> list[str]:
        t = rc.type_ids[i]
        return ([reason for reason, passes in type_checks if not passes[t]]
                + [reason for reason, passes in offering_checks if not passes[i]])

    return failure_text(catalog_id, rc, request, order, why_of, rejected, nearest)
