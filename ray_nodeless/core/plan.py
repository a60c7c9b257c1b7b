"""A plan: the ordered candidate offerings for one request, and why everything else was rejected (`REASONS`).
Made by the planner (planner.py, or planner_py.py in a process without numpy); what both evaluations share (the
reasons, the GPU models a request allows, the text of a failure) is here, so neither imports the other's names."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

from ray_nodeless.core.catalog import Offering, RegionCatalog
from ray_nodeless.core.requirements import Request
from ray_nodeless.core.documents import Document

if TYPE_CHECKING:
    import numpy as np

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
# The size checks: an offering that fails one is far from the request (ranked last among the nearest).
SIZE_REASONS = frozenset({"too_few_vcpus", "too_little_memory", "too_few_gpus"})


def allowed_gpu_models(request: Request) -> frozenset[str] | None:
    """The GPU models the request allows (None: any): its `gpus`, narrowed to the shape's accelerator_type."""
    allowed, wanted = request.requirements.gpus, request.shape.accelerator_type
    if wanted:
        allowed = frozenset({wanted}) if allowed is None else allowed & {wanted}
    return allowed


@dataclass
class Plan:
    """The ordered candidates for one request, and why everything else was rejected."""

    request: Request
    catalog_id: str
    region: RegionCatalog
    candidate_index: np.ndarray | Sequence[int]   # offering indices into `region`, in ranking order
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

    def for_request(self, request: Request) -> Plan:
        """This plan under another request of the same shape and requirements (another node type's name): the
        candidates, the offerings made of them and the rejection counts are shared, not computed again."""
        if request == self.request:
            return self
        return Plan(request=request, catalog_id=self.catalog_id, region=self.region,
                    candidate_index=self.candidate_index, considered=self.considered,
                    _attribute=lambda: self.rejected, _cache=self._cache)

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

    def explain(self, alternatives: int = 4) -> Document:
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


def _offering_record(o: Offering) -> Document:
    t = o.instance_type
    return {
        "instance_type": t.name, "zone": o.zone, "capacity": o.capacity, "hourly_price": o.hourly_price,
        "list_price": o.listed,     # the catalog's price; hourly_price is the effective one (core/prices.py)
        "vcpus": t.vcpus, "memory_gib": t.memory_gib, "gpu_model": t.gpu_model or None, "gpu_count": t.gpu_count,
    }


def failure_text(catalog_id: str, rc: RegionCatalog, request: Request, order: Iterable[int],
                 why_of: Callable[[int], list[str]], rejected: dict[str, int], nearest: int) -> str:
    """The NoFeasibleOffering message: the rejection counts and the `nearest` offerings in `order` (one per
    instance type, so three zones of one type do not fill the list), each with the checks it failed."""
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
            f"{request.rule!r} (catalog {catalog_id}; {len(rc)} offerings considered; "
            f"rejected: {counts}). Nearest offerings:\n" + "\n".join(lines))
