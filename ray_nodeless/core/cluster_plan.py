"""Plan a whole cluster YAML: every node type's decision plus the cost preview. No cloud I/O.

Used by `ray-nodeless plan CLUSTER_YAML` and by the provider's `bootstrap_config`, so that `ray up` fails on the
same errors the CLI shows, before anything launches.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.settings import ProviderSettings, Resolver, node_types_of, parse_provider
from ray_nodeless.core.cost import ClusterCost, cluster_cost, node_type_cost
from ray_nodeless.errors import ConfigError
from ray_nodeless.core.planner import Plan, Planner

_planners: dict[str, Planner] = {}


def planner_for(catalog: catalog_mod.Catalog) -> Planner:
    """One planner (and plan cache) per catalog per process."""
    p = _planners.get(catalog.catalog_id)
    if p is None:
        p = _planners.setdefault(catalog.catalog_id, Planner(catalog))
    return p


def load_catalog(spec: str) -> catalog_mod.Catalog:
    """`embedded`, or a path to a catalog file. (`live` is resolved by the provider, which may do cloud I/O.)"""
    if spec in ("embedded", "live"):
        return catalog_mod.embedded()
    return catalog_mod.load_file(spec)


def load_cluster_yaml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            # libyaml's parser when PyYAML has it (a cold `plan` spends ~25 ms in the pure-Python one) ...
            doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError:
            doc = yaml.safe_load(text)   # ... and the pure-Python one's error message for a broken file
    except OSError as e:
        raise ConfigError(str(path), f"cannot read cluster YAML: {e}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(str(path), f"not a text file (cluster YAMLs are UTF-8): {e}") from e
    except yaml.YAMLError as e:
        raise ConfigError(str(path), f"not valid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(str(path), "a cluster YAML must be a mapping")
    return doc


@dataclass
class ClusterPlan:
    settings: ProviderSettings
    catalog_id: str
    head_node_type: str
    plans: dict[str, Plan]               # node type -> plan, sorted by name
    node_types: dict[str, dict[str, Any]]
    cost: ClusterCost
    global_max_workers: int

    def to_dict(self) -> dict:
        types = {}
        for name, plan in self.plans.items():
            nt = self.node_types[name]
            rec = plan.explain()
            rec["is_head"] = name == self.head_node_type
            rec["min_workers"] = 0 if rec["is_head"] else int(nt.get("min_workers", 0))
            rec["max_workers"] = 0 if rec["is_head"] else int(nt.get("max_workers", self.global_max_workers))
            types[name] = rec
        return {"cloud": self.settings.cloud, "price_cloud": self.settings.price_cloud,
                "region": self.settings.region, "catalog_id": self.catalog_id,
                "head_node_type": self.head_node_type, "node_types": types, "summary": self.cost.to_dict()}


def plan_cluster(cluster_config: Mapping[str, Any],
                 backend_overrides: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 catalog: catalog_mod.Catalog | None = None,
                 settings: ProviderSettings | None = None) -> ClusterPlan:
    """Resolve every node type of `cluster_config`. Raises ConfigError / NoFeasibleOffering naming the key.

    Pure: the backend's knowledge comes in as `backend_overrides` and pre-validated `settings`
    (`launch.config.check_cluster` supplies both); without them only the core keys are checked."""
    settings = settings or parse_provider(cluster_config.get("provider") or {})
    catalog = catalog or load_catalog(settings.catalog)
    planner = planner_for(catalog)
    resolver = Resolver(settings, backend_overrides)
    node_types = node_types_of(cluster_config)
    head = cluster_config.get("head_node_type")
    if head not in node_types:
        raise ConfigError("head_node_type", f"{head!r} is not one of available_node_types {sorted(node_types)}")
    global_max = cluster_config.get("max_workers")
    plans: dict[str, Plan] = {}
    costs = []
    for name, nt in node_types.items():
        is_head = name == head
        request = resolver.request(name, nt.get("resources") or {}, nt.get("node_config"), is_head)
        plan = planner.plan(request)
        plans[name] = plan
        costs.append(node_type_cost(name, nt, plan, is_head, default_max_workers=int(global_max or 0)))
    return ClusterPlan(settings=settings, catalog_id=catalog.catalog_id, head_node_type=head, plans=plans,
                       node_types=node_types, cost=cluster_cost(costs, global_max),
                       global_max_workers=int(global_max or 0))
