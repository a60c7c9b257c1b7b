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
a whole cluster) gets the same evaluation in plain Python (core/planner_py.py, `Planner._compute_py`): the same
checks in the same order on the same values, so the same plans, rejection counts and errors
(tests/core/test_planner_pure.py compares the two over many requests in every region of both clouds).
"""
from __future__ import annotations

import fnmatch
import logging
import sys
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING, Collection, Iterable

from ray_nodeless.core.catalog import CAPACITY_TYPES, Catalog, RegionCatalog
# Re-exported: callers name the plan's types through the planner.
from ray_nodeless.core.plan import REASONS as REASONS, SIZE_REASONS as SIZE_REASONS, Plan as Plan  # noqa: F401
from ray_nodeless.core.plan import allowed_gpu_models as allowed_gpu_models, failure_text as failure_text  # noqa: F401
from ray_nodeless.core.planner_py import PyPlanner
from ray_nodeless.core.requirements import Request, names_explicitly
from ray_nodeless.errors import NoFeasibleOffering

if TYPE_CHECKING:
    import numpy as np

    # (reason, which types or offerings pass it): the planner's checks, in order.
    _Checks = list[tuple[str, np.ndarray]]

logger = logging.getLogger(__name__)


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

    def any_glob(self, patterns: Iterable[str]) -> np.ndarray:
        import numpy as np

        out = np.zeros(len(self.names), dtype=bool)
        for p in patterns:
            out |= self.glob_mask(p)
        return out

    def code_mask(self, universe: list[str], codes: np.ndarray, wanted: Collection[str]) -> np.ndarray:
        import numpy as np

        lut = np.array([u in wanted for u in universe], dtype=bool)
        masked: np.ndarray = lut[codes]
        return masked


class Planner:
    """Resolves requests against one catalog. Thread-safe; plans are cached (LRU) per request."""

    def __init__(self, catalog: Catalog, cache_size: int = 1024, vectorized: bool | None = None):
        self.catalog = catalog
        # True: numpy; False: plain Python; None: numpy if this process has imported it already (same results).
        self.vectorized = vectorized
        self._indexes: dict[tuple[str, str], _RegionIndex] = {}
        self._py = PyPlanner(catalog)
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
        """The ordered candidates for `request`. Raises NoFeasibleOffering when there are none.

        Node types of one shape and requirements share one evaluation: a plan is cached without the node type's
        name and handed out as a view under each request (`Plan.for_request`), so a cluster of 1,000 node types
        of a few shapes costs a few evaluations. A failure is cached under the whole request: its message names
        the node type."""
        shared = replace(request, node_type="") if request.node_type else request
        with self._lock:
            key = shared if shared in self._plans else request
            hit = self._plans.get(key)
            if hit is not None:
                self._plans.move_to_end(key)
        if hit is None:
            try:
                hit, key = self._compute(request), shared
            except NoFeasibleOffering as e:
                hit, key = e, request
            with self._lock:
                self._plans[key] = hit
                if len(self._plans) > self._cache_size:
                    self._plans.popitem(last=False)
        if isinstance(hit, NoFeasibleOffering):
            raise hit
        return hit.for_request(request)

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
        gpu_allowed = allowed_gpu_models(request)
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
        cap_ok = np.array([c in request.catalog_capacity for c in CAPACITY_TYPES], dtype=bool)[rc.o_cap]
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
        # The counts are recomputed from the request when asked for (a launch never asks): a closure over the check
        # masks kept about 30 KB per plan alive, and a cluster plan holds every node type's plan.
        plan = Plan(request=request, catalog_id=self.catalog.catalog_id, region=rc, candidate_index=candidates,
                    considered=len(rc),
                    _attribute=lambda: self._attribute(idx, self._type_checks(idx, request),
                                                       self._offering_checks(idx, request)))
        if not len(candidates):
            raise NoFeasibleOffering(self._failure_message(idx, request, type_checks, offering_checks,
                                                           plan.rejected), explanation=plan)
        return plan

    def _compute_py(self, request: Request) -> Plan:
        return self._py.compute(request)

    @staticmethod
    def _attribute(idx: _RegionIndex, type_checks: _Checks, offering_checks: _Checks) -> dict[str, int]:
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

    def _failure_message(self, idx: _RegionIndex, request: Request, type_checks: _Checks, offering_checks: _Checks,
                         rejected: dict[str, int], nearest: int = 3) -> str:
        import numpy as np

        rc = idx.rc
        fails = np.zeros(len(rc), dtype=np.int32)
        misfits = np.zeros(len(rc), dtype=np.int32)   # failed size checks: these make an offering far away
        reasons_of: list[tuple[str, np.ndarray]] = []
        for reason, passes in type_checks:
            f = ~passes[rc.o_type]
            fails += f
            if reason in SIZE_REASONS:
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
        return failure_text(self.catalog.catalog_id, rc, request, order,
                            lambda i: [reason for reason, f in reasons_of if f[i]], rejected, nearest)
