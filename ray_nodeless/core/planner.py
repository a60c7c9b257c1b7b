"""Cheapest fit: turn a `Request` into the ordered candidate offerings, and explain the decision.

The ranking is a documented total order, identical on every run and machine:

    1. capacity preference index (position of the offering's capacity type in the request's `capacity` list)
    2. hourly price (USD)
    3. instance type name
    4. zone name

Every offering of the region is checked against the constraints in the fixed order of `REASONS`; an offering
that fails is counted under the *first* reason it fails, so the counts in an explanation add up to the number
of offerings considered minus the candidates. Offerings whose price is unknown are never candidates.

Filtering runs on numpy arrays of the region (about 10,000 offerings); per-type checks run on the type table and
are broadcast to offerings. Plans are cached per request (requests are hashable), so the autoscaler asking for
the same shape again costs a dict look-up.

A process that has not imported numpy (a one-off `ray-nodeless plan`: importing numpy costs more than planning
a whole cluster) gets the same evaluation in plain Python (`_PyRegionIndex`, `Planner._compute_py`): the same
checks in the same order on the same values, so the same plans, rejection counts and errors
(tests/core/test_planner_pure.py compares the two over many requests in every region of both clouds).
"""
from __future__ import annotations

import fnmatch
import logging
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from ray_nodeless.core.catalog import CAPACITY_TYPES, Catalog, Offering, RegionCatalog
from ray_nodeless.errors import NoFeasibleOffering
from ray_nodeless.core.requirements import Request, names_explicitly

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

# Rejection reasons in attribution order. Type-level checks first, then offering-level ones.
REASONS = (
    "instance_type_not_allowed",   # not in an `instance_types` allow-list
    "instance_type_excluded",      # matches `exclude_instance_types` / provider.exclude.instance_types
    "family_not_allowed",          # not in `families`
    "family_excluded",             # in `exclude_families` / provider.exclude.families
    "arch",                        # not in `arch` (default x86_64)
    "burstable",                   # burstable family, not named explicitly
    "non_gpu_accelerator",         # Inferentia/Trainium, not named explicitly
    "gpu_not_requested",           # has GPUs, the shape asks for GPU 0 (unless allow_gpu_instances or named)
    "gpu_model_not_allowed",       # GPU model not in `gpus` (or the shape's accelerator_type)
    "gpu_model_excluded",          # GPU model in `exclude_gpus` / provider.exclude.gpus
    "too_few_vcpus",
    "too_little_memory",
    "too_few_gpus",
    "capacity_type",               # capacity type not in `capacity`
    "zone",                        # not in `zones`
    "unknown_price",               # the catalog has no price for it
    "over_max_hourly_price",
)
_SIZE_REASONS = frozenset({"too_few_vcpus", "too_little_memory", "too_few_gpus"})


@dataclass
class Plan:
    """The ordered candidates for one request, and why everything else was rejected."""

    request: Request
    catalog_id: str
    region: RegionCatalog
    candidate_index: np.ndarray | list[int]   # offering indices into `region`, in ranking order
    considered: int
    # Counting rejections by reason costs about as much as finding the candidates, and a launch never needs it:
    # it is computed on first use (explain(), the CLI) and kept.
    _attribute: Callable[[], dict[str, int]] = field(repr=False, default=dict)
    _rejected: dict[str, int] | None = field(default=None, repr=False)
    _cache: dict[int, Offering] = field(default_factory=dict, repr=False)

    @property
    def rejected(self) -> dict[str, int]:
        """Reason -> count, in REASONS order, zero counts left out."""
        if self._rejected is None:
            self._rejected = self._attribute()
            self._attribute = dict   # release the masks the closure held
        return self._rejected

    def __len__(self) -> int:
        return len(self.candidate_index)

    def offering(self, rank: int) -> Offering:
        hit = self._cache.get(rank)
        if hit is None:
            hit = self._cache[rank] = self.region.offering(int(self.candidate_index[rank]))
        return hit

    @property
    def chosen(self) -> Offering:
        return self.offering(0)

    def top(self, n: int) -> list[Offering]:
        return [self.offering(i) for i in range(min(n, len(self)))]

    def candidates(self, skip: Callable[[Offering], bool] | None = None) -> Iterator[Offering]:
        """Offerings in ranking order, leaving out those `skip` says (e.g. recently out of capacity)."""
        for i in range(len(self)):
            o = self.offering(i)
            if skip is None or not skip(o):
                yield o

    def explain(self, alternatives: int = 4) -> dict:
        """A JSON-ready record of the decision (what `ray-nodeless plan --json` prints per node type)."""
        chosen = self.chosen
        return {
            "node_type": self.request.node_type or None,
            "shape": self.request.shape.describe(),
            "rule": self.request.rule,
            "catalog_id": self.catalog_id,
            "cloud": self.request.cloud,
            "region": self.request.region,
            **_offering_record(chosen),
            "considered": self.considered,
            "candidates": len(self),
            "rejected": dict(self.rejected),
            "unknown_price_skipped": self.rejected.get("unknown_price", 0),
            "alternatives": [_offering_record(o) for o in self.top(alternatives + 1)[1:]],
        }


def _offering_record(o: Offering) -> dict:
    t = o.instance_type
    return {
        "instance_type": t.name, "zone": o.zone, "capacity": o.capacity, "hourly_price": o.hourly_price,
        "vcpus": t.vcpus, "memory_gib": t.memory_gib, "gpu_model": t.gpu_model or None, "gpu_count": t.gpu_count,
    }


class _RegionIndex:
    """Per-region type table as arrays, plus lookup tables from names to integer codes."""

    def __init__(self, rc: RegionCatalog):
        import numpy as np

        self.rc = rc
        types = rc.types
        self.names = [t.name for t in types]
        self.vcpus = np.array([t.vcpus for t in types], dtype=np.float64)
        self.mem = np.array([t.memory_gib for t in types], dtype=np.float64)
        self.gpus = np.array([t.gpu_count for t in types], dtype=np.int32)
        self.burstable = np.array([t.burstable for t in types], dtype=bool)
        self.accel = np.array([bool(t.accelerator) for t in types], dtype=bool)
        self.families = sorted({t.family for t in types})
        fam_code = {f: i for i, f in enumerate(self.families)}
        self.family = np.array([fam_code[t.family] for t in types], dtype=np.int32)
        self.gpu_models = sorted({t.gpu_model for t in types})   # "" (no GPU) included
        gpu_code = {g: i for i, g in enumerate(self.gpu_models)}
        self.gpu_model = np.array([gpu_code[t.gpu_model] for t in types], dtype=np.int32)
        self.arches = sorted({t.arch for t in types})
        arch_code = {a: i for i, a in enumerate(self.arches)}
        self.arch = np.array([arch_code[t.arch] for t in types], dtype=np.int32)
        self.zone_names = list(rc.zones)
        # Per-region constants the per-request code would otherwise recompute every time.
        self.offerings_per_type = np.bincount(rc.o_type, minlength=len(types))
        self.known_price = ~np.isnan(rc.o_price)
        self.all_offerings = np.ones(len(rc), dtype=bool)
        self.all_types = np.ones(len(types), dtype=bool)
        self.no_types = np.zeros(len(types), dtype=bool)
        for shared in (self.offerings_per_type, self.known_price, self.all_offerings, self.all_types, self.no_types):
            shared.flags.writeable = False   # shared by every request: an in-place update would be a bug
        self._glob_cache: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def glob_mask(self, pattern: str) -> np.ndarray:
        import numpy as np

        hit = self._glob_cache.get(pattern)
        if hit is None:
            hit = np.array([fnmatch.fnmatchcase(n, pattern) for n in self.names], dtype=bool)
            with self._lock:
                self._glob_cache[pattern] = hit
        return hit

    def any_glob(self, patterns) -> np.ndarray:
        import numpy as np

        out = np.zeros(len(self.names), dtype=bool)
        for p in patterns:
            out |= self.glob_mask(p)
        return out

    def code_mask(self, universe: list[str], codes: np.ndarray, wanted) -> np.ndarray:
        import numpy as np

        lut = np.array([u in wanted for u in universe], dtype=bool)
        return lut[codes]


class Planner:
    """Resolves requests against one catalog. Thread-safe; plans are cached (LRU) per request."""

    def __init__(self, catalog: Catalog, cache_size: int = 1024, vectorized: bool | None = None):
        self.catalog = catalog
        # True: numpy; False: plain Python; None: numpy if this process has imported it already (same results).
        self.vectorized = vectorized
        self._indexes: dict[tuple[str, str], _RegionIndex] = {}
        self._py_indexes: dict[tuple[str, str], _PyRegionIndex] = {}
        self._plans: OrderedDict[Request, Plan | NoFeasibleOffering] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def _index(self, cloud: str, region: str) -> _RegionIndex:
        key = (cloud, region)
        idx = self._indexes.get(key)
        if idx is None:
            idx = _RegionIndex(self.catalog.region(cloud, region))
            with self._lock:
                idx = self._indexes.setdefault(key, idx)
        return idx

    def plan(self, request: Request) -> Plan:
        """The ordered candidates for `request`. Raises NoFeasibleOffering when there are none."""
        with self._lock:
            hit = self._plans.get(request)
            if hit is not None:
                self._plans.move_to_end(request)
        if hit is None:
            try:
                hit = self._compute(request)
            except NoFeasibleOffering as e:
                hit = e
            with self._lock:
                self._plans[request] = hit
                if len(self._plans) > self._cache_size:
                    self._plans.popitem(last=False)
        if isinstance(hit, NoFeasibleOffering):
            raise hit
        return hit

    def _type_checks(self, idx: _RegionIndex, request: Request) -> list[tuple[str, np.ndarray]]:
        """(reason, passes) per type-level check, in REASONS order."""
        req = request.requirements
        shape = request.shape
        ones = idx.all_types
        named = idx.no_types.copy()   # explicitly named by an instance_types pattern or a families list
        allowed_types = ones
        for group in req.instance_types:
            allowed_types = allowed_types & idx.any_glob(group)
            named |= idx.any_glob([p for p in group if names_explicitly(p)])
        families_ok = ones if req.families is None else idx.code_mask(idx.families, idx.family, req.families)
        if req.families is not None:
            named |= families_ok
        named &= allowed_types
        excluded_types = idx.any_glob(req.exclude_instance_types) if req.exclude_instance_types else idx.no_types
        fam_excluded = (idx.code_mask(idx.families, idx.family, req.exclude_families)
                        if req.exclude_families else idx.no_types)
        arch_ok = idx.code_mask(idx.arches, idx.arch, request.arch)
        has_gpu = idx.gpus > 0
        gpu_allowed = req.gpus
        if shape.accelerator_type:
            gpu_allowed = (frozenset({shape.accelerator_type}) if gpu_allowed is None
                           else gpu_allowed & {shape.accelerator_type})
        if gpu_allowed is None:
            gpu_model_ok = ones
        else:
            # Only GPU-bearing types are judged on their model; a type without GPUs that a GPU shape needs is
            # rejected as too_few_gpus, which says more.
            gpu_model_ok = ~has_gpu | idx.code_mask(idx.gpu_models, idx.gpu_model, gpu_allowed)
        gpu_excl = (idx.code_mask(idx.gpu_models, idx.gpu_model, req.exclude_gpus) & has_gpu
                    if req.exclude_gpus else idx.no_types)
        gpu_unwanted = (has_gpu & ~named) if (shape.gpu == 0 and not req.allow_gpu_instances) else idx.no_types
        return [
            ("instance_type_not_allowed", allowed_types),
            ("instance_type_excluded", ~excluded_types),
            ("family_not_allowed", families_ok),
            ("family_excluded", ~fam_excluded),
            ("arch", arch_ok),
            ("burstable", ~(idx.burstable & ~named)),
            ("non_gpu_accelerator", ~(idx.accel & ~named)),
            ("gpu_not_requested", ~gpu_unwanted),
            ("gpu_model_not_allowed", gpu_model_ok),
            ("gpu_model_excluded", ~gpu_excl),
            ("too_few_vcpus", idx.vcpus >= max(shape.cpu, req.min_vcpus)),
            ("too_little_memory", idx.mem >= max(shape.memory_gib, req.min_memory_gib)),
            ("too_few_gpus", idx.gpus >= shape.gpu),
        ]

    def _offering_checks(self, idx: _RegionIndex, request: Request) -> list[tuple[str, np.ndarray]]:
        import numpy as np

        rc = idx.rc
        req = request.requirements
        cap_ok = np.array([c in request.capacity for c in CAPACITY_TYPES], dtype=bool)[rc.o_cap]
        zone_ok = idx.all_offerings if req.zones is None else idx.code_mask(idx.zone_names, rc.o_zone, req.zones)
        known = idx.known_price
        under = (idx.all_offerings if req.max_hourly_price is None
                 else ~known | (rc.o_price <= req.max_hourly_price + 1e-12))
        return [("capacity_type", cap_ok), ("zone", zone_ok), ("unknown_price", known),
                ("over_max_hourly_price", under)]

    def _compute(self, request: Request) -> Plan:
        if self.vectorized is None and "numpy" not in sys.modules or self.vectorized is False:
            return self._compute_py(request)
        import numpy as np

        idx = self._index(request.cloud, request.region)
        rc = idx.rc
        type_checks = self._type_checks(idx, request)
        type_ok = np.ones(len(idx.names), dtype=bool)
        for _, passes in type_checks:
            type_ok &= passes
        offering_checks = self._offering_checks(idx, request)
        alive = type_ok[rc.o_type]
        for _, passes in offering_checks:
            alive &= passes
        candidates = np.nonzero(alive)[0]
        if len(candidates):
            pref = {c: i for i, c in enumerate(request.capacity)}
            cap_rank = np.array([pref.get(c, len(pref)) for c in CAPACITY_TYPES], dtype=np.int8)
            order = np.argsort(cap_rank[rc.o_cap[candidates]], kind="stable")
            candidates = candidates[order]
        # The closure keeps the check masks (about 30 KB, most of them shared per region) until the counts are
        # asked for; Plan drops it then.
        plan = Plan(request=request, catalog_id=self.catalog.catalog_id, region=rc, candidate_index=candidates,
                    considered=len(rc),
                    _attribute=lambda: self._attribute(idx, type_checks, offering_checks))
        if not len(candidates):
            raise NoFeasibleOffering(self._failure_message(idx, request, type_checks, offering_checks,
                                                           plan.rejected), explanation=plan)
        return plan

    def _compute_py(self, request: Request) -> Plan:
        return _py_compute(self, request)

    @staticmethod
    def _attribute(idx: _RegionIndex, type_checks, offering_checks) -> dict[str, int]:
        """Count each rejected offering under the first reason it fails."""
        import numpy as np

        rc = idx.rc
        per_type = idx.offerings_per_type
        still = np.ones(len(idx.names), dtype=bool)
        out: dict[str, int] = {}
        for reason, passes in type_checks:
            failed = still & ~passes
            n = int(per_type[failed].sum())
            if n:
                out[reason] = n
            still &= passes
        alive = still[rc.o_type]
        for reason, passes in offering_checks:
            n = int(np.count_nonzero(alive & ~passes))
            if n:
                out[reason] = n
            alive &= passes
        return out

    def _failure_message(self, idx: _RegionIndex, request: Request, type_checks, offering_checks,
                         rejected: dict[str, int], nearest: int = 3) -> str:
        import numpy as np

        rc = idx.rc
        fails = np.zeros(len(rc), dtype=np.int32)
        misfits = np.zeros(len(rc), dtype=np.int32)   # failed size checks: these make an offering far away
        reasons_of: list[tuple[str, np.ndarray]] = []
        for reason, passes in type_checks:
            f = ~passes[rc.o_type]
            fails += f
            if reason in _SIZE_REASONS:
                misfits += f
            reasons_of.append((reason, f))
        for reason, passes in offering_checks:
            f = ~passes
            fails += f
            reasons_of.append((reason, f))
        # Nearest = offerings big enough for the shape first (blocked only by rules), then fewest failed checks,
        # then the ranking order (the arrays are already in base order); one offering per instance type, so three
        # zones of the same type do not fill the list.
        order = np.lexsort((np.arange(len(rc)), fails, misfits))
        return self._failure_text(rc, request, order, lambda i: [reason for reason, f in reasons_of if f[i]],
                                  rejected, nearest)

    def _failure_text(self, rc: RegionCatalog, request: Request, order, why_of: Callable[[int], list[str]],
                      rejected: dict[str, int], nearest: int) -> str:
        lines: list[str] = []
        seen: set[int] = set()
        for i in order:
            if len(lines) >= nearest:
                break
            i = int(i)
            if rc.type_ids[i] in seen:
                continue
            seen.add(rc.type_ids[i])
            o = rc.offering(i)
            why = why_of(i)
            t = o.instance_type
            price = "unknown" if o.hourly_price is None else f"${o.hourly_price:.4f}/h"
            gpu = f", {t.gpu_count}x{t.gpu_model}" if t.gpu_count else ""
            lines.append(f"  - {t.name} ({t.vcpus:g} vCPU, {t.memory_gib:g} GiB{gpu}) {o.zone} {o.capacity} "
                         f"{price}: rejected for {', '.join(why)}")
        counts = ", ".join(f"{k}={v}" for k, v in rejected.items())
        who = f"node type {request.node_type!r} " if request.node_type else ""
        return (f"no offering in {request.cloud} {request.region} fits {who}{request.shape.describe()} under rule "
                f"{request.rule!r} (catalog {self.catalog.catalog_id}; {len(rc)} offerings considered; "
                f"rejected: {counts}). Nearest offerings:\n" + "\n".join(lines))


class _PyRegionIndex:
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

    def any_glob(self, patterns) -> list[bool]:
        out = [False] * self.n_types
        for p in patterns:
            out = [a or b for a, b in zip(out, self.glob_mask(p))]
        return out


def _and(a: Sequence[bool], b: Sequence[bool]) -> list[bool]:
    return [x and y for x, y in zip(a, b)]


def _not(a: Sequence[bool]) -> list[bool]:
    return [not x for x in a]


def _py_type_checks(idx: _PyRegionIndex, request: Request) -> list[tuple[str, list[bool]]]:
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
    gpu_allowed = req.gpus
    if shape.accelerator_type:
        gpu_allowed = (frozenset({shape.accelerator_type}) if gpu_allowed is None
                       else gpu_allowed & {shape.accelerator_type})
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


def _py_offering_checks(idx: _PyRegionIndex, request: Request) -> list[tuple[str, list[bool]]]:
    """`Planner._offering_checks`, per offering in plain Python."""
    rc = idx.rc
    req = request.requirements
    cap_lut = [c in request.capacity for c in CAPACITY_TYPES]
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


def _py_attribute(idx: _PyRegionIndex, type_checks, offering_checks) -> dict[str, int]:
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


def _py_compute(planner: Planner, request: Request) -> Plan:
    key = (request.cloud, request.region)
    idx = planner._py_indexes.get(key)
    if idx is None:
        idx = _PyRegionIndex(planner.catalog.region(request.cloud, request.region))
        with planner._lock:
            idx = planner._py_indexes.setdefault(key, idx)
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
    plan = Plan(request=request, catalog_id=planner.catalog.catalog_id, region=rc, candidate_index=candidates,
                considered=len(rc), _attribute=lambda: _py_attribute(idx, type_checks, offering_checks))
    if not candidates:
        raise NoFeasibleOffering(_py_failure_message(planner, idx, request, type_checks, offering_checks,
                                                     plan.rejected), explanation=plan)
    return plan


def _py_failure_message(planner: Planner, idx: _PyRegionIndex, request: Request, type_checks, offering_checks,
                        rejected: dict[str, int], nearest: int = 3) -> str:
    """`Planner._failure_message` in plain Python: the same nearest offerings in the same order."""
    rc = idx.rc
    t_fails = [0] * idx.n_types
    t_misfits = [0] * idx.n_types
    for reason, passes in type_checks:
        size = reason in _SIZE_REASONS
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

    return planner._failure_text(rc, request, order, why_of, rejected, nearest)
