"""Cluster-level cost figures from per-node-type decisions: the preview users see before anything launches."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ray_nodeless.core.planner import Plan


@dataclass(frozen=True)
class NodeTypeCost:
    node_type: str
    is_head: bool
    hourly_price: float
    min_workers: int
    max_workers: int


@dataclass(frozen=True)
class ClusterCost:
    idle_cost_per_hour: float       # head + min_workers of every worker type: what an idle cluster costs
    ceiling_cost_per_hour: float    # head + every worker type at max_workers, within the global max_workers

    def to_dict(self) -> dict:
        return {"idle_cost_per_hour": round(self.idle_cost_per_hour, 6),
                "ceiling_cost_per_hour": round(self.ceiling_cost_per_hour, 6)}


def cluster_cost(items: list[NodeTypeCost], global_max_workers: int | None) -> ClusterCost:
    idle = sum(i.hourly_price for i in items if i.is_head)
    idle += sum(i.hourly_price * i.min_workers for i in items if not i.is_head)
    ceiling = sum(i.hourly_price for i in items if i.is_head)
    # The ceiling fills the most expensive worker types first: an upper bound on what the autoscaler can spend.
    budget = global_max_workers if global_max_workers is not None else sum(i.max_workers for i in items)
    workers = sorted((i for i in items if not i.is_head), key=lambda i: (-i.hourly_price, str(i.node_type)))
    # min_workers are always running, so they take their share of the budget first.
    for i in workers:
        budget -= i.min_workers
        ceiling += i.hourly_price * i.min_workers
    for i in workers:
        extra = max(0, min(i.max_workers - i.min_workers, budget))
        ceiling += i.hourly_price * extra
        budget -= extra
    return ClusterCost(idle_cost_per_hour=idle, ceiling_cost_per_hour=ceiling)


def node_type_cost(name: str, node_type: Mapping, plan: Plan, is_head: bool,
                   default_max_workers: int = 0) -> NodeTypeCost:
    """Ray's default max_workers of a worker type is the cluster's max_workers."""
    price = plan.chosen.hourly_price or 0.0
    return NodeTypeCost(node_type=name, is_head=is_head, hourly_price=price,
                        min_workers=0 if is_head else int(node_type.get("min_workers", 0)),
                        max_workers=0 if is_head else int(node_type.get("max_workers", default_max_workers)))
