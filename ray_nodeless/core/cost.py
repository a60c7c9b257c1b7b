"""Cluster-level cost figures from per-node-type decisions: the preview users see before anything launches."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ray_nodeless.core.plan import Plan
from ray_nodeless.core.documents import Document, DocumentView


@dataclass(frozen=True)
class NodeTypeCost:
    node_type: str
    is_head: bool
    hourly_price: float
    min_workers: int
    max_workers: int
    list_price: float | None = None     # the catalog's price where provider.price_overrides changed it


@dataclass(frozen=True)
class ClusterCost:
    """At effective prices (core/prices.py), what the cost cap and the launches use; `list_*` the same figures at
    the catalog's list prices (equal to them without price overrides)."""

    idle_cost_per_hour: float       # head + min_workers of every worker type: what an idle cluster costs
    ceiling_cost_per_hour: float    # head + every worker type at max_workers, within the global max_workers
    list_idle_cost_per_hour: float | None = None
    list_ceiling_cost_per_hour: float | None = None

    def to_dict(self) -> Document:
        out = {"idle_cost_per_hour": round(self.idle_cost_per_hour, 6),
               "ceiling_cost_per_hour": round(self.ceiling_cost_per_hour, 6)}
        if self.list_idle_cost_per_hour is not None:
            out.update(list_idle_cost_per_hour=round(self.list_idle_cost_per_hour, 6),
                       list_ceiling_cost_per_hour=round(self.list_ceiling_cost_per_hour or 0.0, 6))
        return out


def cluster_cost(items: list[NodeTypeCost], global_max_workers: int | None) -> ClusterCost:
    """The cost preview at effective prices, and at list prices when an override changed any of them."""
    cost = _cluster_cost(items, global_max_workers)
    if all(i.list_price is None or abs(i.list_price - i.hourly_price) <= 5e-7 for i in items):
        return cost
    listed = _cluster_cost([replace(i, hourly_price=i.list_price if i.list_price is not None else i.hourly_price)
                            for i in items], global_max_workers)
    return replace(cost, list_idle_cost_per_hour=listed.idle_cost_per_hour,
                   list_ceiling_cost_per_hour=listed.ceiling_cost_per_hour)


def _cluster_cost(items: list[NodeTypeCost], global_max_workers: int | None) -> ClusterCost:
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


def node_type_cost(name: str, node_type: DocumentView, plan: Plan, is_head: bool,
                   default_max_workers: int = 0) -> NodeTypeCost:
    """Ray's default max_workers of a worker type is the cluster's max_workers."""
    price = plan.chosen.hourly_price or 0.0
    listed = plan.chosen.list_price
    return NodeTypeCost(node_type=name, is_head=is_head, hourly_price=price, list_price=listed,
                        min_workers=0 if is_head else int(node_type.get("min_workers", 0)),
                        max_workers=0 if is_head else int(node_type.get("max_workers", default_max_workers)))
