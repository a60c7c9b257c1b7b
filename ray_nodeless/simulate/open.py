"""Shape-open clusters in a replay: what to launch is decided by the monitor's own packing.

On a shape-open cluster (`launch/open_types.shape_open`) the running monitor packs every pending demand that no
declared worker node type holds (`OpenTypes.step`) with `core/open_pack.Packer` over the free capacity of the nodes
that are up or launching, and Ray launches exactly the machines the packing chose (each generated node type's
`max_workers` is its live machines plus the planned ones). The replay does the same with the same Packer and
OpenFitter, built from the cluster's rules as the provider builds them (`NodelessProvider._open_types`), and
launches `Packing.new` directly; demands a declared worker type holds still go to Ray's v1 scheduler (the engine).

What is not modelled: the global `max_workers` is kept (cheapest planned machines first, as Ray's `priority` orders
the generated types), but not v1's pending-launch cap (`upscaling_speed`) for generated types; trace tasks carry no
label selectors, so every demand is a plain resource demand; no capacity errors (nothing is ever unavailable).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ray_nodeless.core.demand import Demand, NodeCapacity, canonical_resources, fits
from ray_nodeless.core.open_pack import Packer
from ray_nodeless.core.open_plan import OpenFitter, OpenType
from ray_nodeless.core.planner import Planner
from ray_nodeless.core.settings import CoreSettings, Resolver


@dataclass
class OpenCluster:
    """The shape-open half of a replayed cluster: the packer, and the declared worker types that come first."""

    packer: Packer
    declared: dict[str, dict[str, float]]               # declared worker type -> its resources
    infeasible: dict[str, str] = field(default_factory=dict)     # demand -> why nothing allowed serves it

    @classmethod
    def build(cls, settings: CoreSettings, planner: Planner, declared: Mapping[str, Mapping[str, float]],
              backend_overrides: Any = None) -> "OpenCluster":
        fitter = OpenFitter(Resolver(settings, backend_overrides), planner, None, settings.open_node_config)
        return cls(Packer(fitter, settings.single_zone_gangs), {k: dict(v) for k, v in declared.items()})

    def declared_holds(self, need: Mapping[str, float]) -> bool:
        """`OpenTypes._declared_serves` for a demand without labels: Ray scales a declared type for it."""
        return any(res and fits(res, need) for res in self.declared.values())

    def plan(self, needs: Iterable[Mapping[str, float]], bins: list[NodeCapacity],
             room: int) -> list[tuple[OpenType, int]]:
        """The machines to open for `needs` (pending tasks' resources) given the free capacity `bins`, at most
        `room` in all, cheapest first; what nothing allowed can serve is kept in `infeasible`."""
        counts = Counter(canonical_resources(n) for n in needs)
        demands = [Demand(res, count=c) for res, c in sorted(counts.items())]
        packing = self.packer.pack(demands, bins)
        for d, why in packing.infeasible.items():
            self.infeasible.setdefault(d.describe(), why)
        out: list[tuple[OpenType, int]] = []
        for name in sorted(packing.new, key=lambda n: (packing.types[n].price, n)):
            take = min(packing.new[name], room)
            if take <= 0:
                break
            out.append((packing.types[name], take))
            room -= take
        return out
