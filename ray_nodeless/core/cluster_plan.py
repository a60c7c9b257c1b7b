"""Plan a whole cluster YAML: every node type's decision plus the cost preview. No cloud I/O.

Used by `ray-nodeless plan CLUSTER_YAML` and by the provider's `bootstrap_config`, so that `ray up` fails on the
same errors the CLI shows, before anything launches.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import yaml

from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.catalog_checks import check_catalog_values
from ray_nodeless.core.diagnose import explain_no_offering
from ray_nodeless.core.settings import CoreSettings, Resolver, node_types_of, parse_provider
from ray_nodeless.core.cost import ClusterCost, cluster_cost, node_type_cost
from ray_nodeless.errors import ConfigError, NoFeasibleOffering
from ray_nodeless.core.plan import Plan
from ray_nodeless.core.planner import Planner
from ray_nodeless.core.idle import IdleTimeout, cluster_idle_s, idle_timeout
from ray_nodeless.core.prices import priced, unused_overrides
from ray_nodeless.core.requirements import OPEN_SHAPE_KEY
from ray_nodeless.core.rules import rule_warnings
from ray_nodeless.core.yaml_bounds import YamlBoundsError, load_bounded
from ray_nodeless.core.documents import Document, DocumentView

logger = logging.getLogger(__name__)

# Names Ray and the backends write into tags and labels. The strictest limit among them: GCE label values and
# Kubernetes label values hold at most 63 characters (a longer name would be cut, and two clusters or node types
# sharing 63 characters would be mixed up); an AWS tag value holds 256.
NAME_MAX_LEN = 63
# A YAML nested deeper than this is refused before anything walks it (recursive code would hit Python's limit).
MAX_YAML_DEPTH = 100
# Node types a cluster YAML may define. Planning keeps one plan per distinct shape and requirements plus a small
# view per node type (benches/bench_plan_memory.py: BENCHMARKS.md has the figures), and Ray's own autoscaler walks
# every node type at every update; far beyond what a cluster needs (a few to a few dozen), and it bounds the
# memory of `plan` and `ray up` whatever the YAML holds.
MAX_NODE_TYPES = 1000

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


def load_cluster_yaml(path: str | Path) -> Document:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            # libyaml's parser when PyYAML has it (a cold `plan` spends ~25 ms in the pure-Python one), aliases
            # bounded before anything expands them (core/yaml_bounds.py) ...
            doc = load_bounded(text)
        except yaml.YAMLError:
            yaml.safe_load(text)         # ... and the pure-Python one's error message for a broken file
            raise
    except OSError as e:
        raise ConfigError(str(path), f"cannot read cluster YAML: {e}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(str(path), f"not a text file (cluster YAMLs are UTF-8): {e}") from e
    except yaml.YAMLError as e:
        raise ConfigError(str(path), f"not valid YAML: {e}") from e
    except RecursionError as e:
        raise ConfigError(str(path), f"nested too deeply to read (more than {MAX_YAML_DEPTH} levels)") from e
    except YamlBoundsError as e:
        raise ConfigError(str(path), f"refused before reading it: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(str(path), "a cluster YAML must be a mapping")
    where = too_deep(doc)
    if where is not None:
        raise ConfigError(where or str(path), f"nested more than {MAX_YAML_DEPTH} levels deep")
    return doc


def too_deep(doc: object, limit: int = MAX_YAML_DEPTH) -> str | None:
    """The dotted key where `doc` nests deeper than `limit` (None: it does not), without recursion: Ray's and our
    own checks walk a config recursively, and a 5,000-deep YAML would end in a RecursionError."""
    stack: list[tuple[object, str, int]] = [(doc, "", 0)]
    while stack:
        value, key, depth = stack.pop()
        if depth > limit:
            return key.split(".")[0] or key
        if isinstance(value, dict):
            stack.extend((v, f"{key}.{k}" if key else str(k), depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, key, depth + 1) for v in value)
    return None


def check_names(cluster_config: DocumentView) -> None:
    """`cluster_name` and the node type names (at most MAX_NODE_TYPES of them), as Ray and the backends can use
    them: strings, not empty (an empty cluster name tags machines that `sweep` then cannot tell apart), printable,
    at most NAME_MAX_LEN characters."""
    def check(value: object, key: str, what: str) -> None:
        if not isinstance(value, str):
            raise ConfigError(key, f"{what} must be a string, got {value!r} ({type(value).__name__})")
        if not value.strip():
            raise ConfigError(key, f"{what} must not be empty")
        if len(value) > NAME_MAX_LEN:
            raise ConfigError(key, f"{what} is {len(value)} characters; at most {NAME_MAX_LEN} (it becomes a tag "
                                   "and label value of every machine)")
        if not value.isprintable() or value != value.strip():
            raise ConfigError(key, f"{what} {value!r} has spaces around it or characters that cannot be printed")

    if "cluster_name" in cluster_config:
        check(cluster_config["cluster_name"], "cluster_name", "the cluster name")
    types = cluster_config.get("available_node_types")
    if isinstance(types, Mapping) and len(types) > MAX_NODE_TYPES:
        raise ConfigError("available_node_types", f"{len(types)} node types; at most {MAX_NODE_TYPES} (node types "
                                                  "of one shape can be one node type with a larger max_workers)")
    if isinstance(types, Mapping):
        for name in sorted(types, key=str):
            check(name, f"available_node_types.{name}", "a node type name")


@dataclass
class ClusterPlan:
    settings: CoreSettings
    catalog_id: str
    head_node_type: str
    plans: dict[str, Plan]               # node type -> plan, sorted by name
    node_types: dict[str, Document]
    cost: ClusterCost
    global_max_workers: int
    idle: dict[str, IdleTimeout] = field(default_factory=dict)   # worker node type -> idle timeout (core/idle.py)
    # Rules that never apply (core/rules.py rule_warnings); logged as warnings by plan_cluster.
    warnings: list[str] = field(default_factory=list)
    # node type -> the cheaper offering the default exclusion of previous-generation families left out
    # (CoreSettings.default_exclusions; `provider.allow_previous_generation: true` takes it).
    left_out: dict[str, catalog_mod.Offering] = field(default_factory=dict)

    def to_dict(self) -> Document:
        types = {}
        for name, plan in self.plans.items():
            nt = self.node_types[name]
            rec = plan.explain()
            rec["is_head"] = name == self.head_node_type
            rec["min_workers"] = 0 if rec["is_head"] else int(nt.get("min_workers", 0))
            rec["max_workers"] = 0 if rec["is_head"] else int(nt.get("max_workers", self.global_max_workers))
            if name in self.idle:
                rec.update(self.idle[name].to_dict())
            if name in self.left_out:
                o = self.left_out[name]
                rec["previous_generation_left_out"] = {"instance_type": o.instance_type.name, "zone": o.zone,
                                                       "capacity": o.capacity, "hourly_price": o.hourly_price}
            types[name] = rec
        return {"cloud": self.settings.cloud, "price_cloud": self.settings.price_cloud,
                "region": self.settings.region, "catalog_id": self.catalog_id,
                "head_node_type": self.head_node_type, "node_types": types, "summary": self.cost.to_dict(),
                "warnings": list(self.warnings)}


def plan_cluster(cluster_config: DocumentView,
                 backend_overrides: Callable[[Document], Document] | None = None,
                 catalog: catalog_mod.Catalog | None = None,
                 settings: CoreSettings | None = None, shape_open: bool = False,
                 unlisted_families: frozenset[str] = frozenset()) -> ClusterPlan:
    """Resolve every node type of `cluster_config`. Raises ConfigError / NoFeasibleOffering naming the key; a rule
    that never applies is a warning (logged, and in `warnings`). `shape_open`: the cluster serves demands no node
    type declares (launch/open_types.py shape_open), which rules may match too. `unlisted_families`: the price
    cloud's real families no catalog lists (providers.unlisted_families), accepted where a family is named.

    Pure: the backend's knowledge comes in as `backend_overrides` and pre-validated `settings`
    (`operate.config.check_cluster` supplies both); without them only the core keys are checked and the block is
    priced as `simulate_cloud` (core.settings.parse_provider: the core does not know which backends are clouds)."""
    check_names(cluster_config)
    settings = settings or parse_provider(cluster_config.get("provider") or {})
    # At effective prices (core/prices.py): the ranking, the cost preview and the cost cap all read them.
    catalog = priced(catalog or load_catalog(settings.catalog), settings.price_overrides)
    planner = planner_for(catalog)
    resolver = Resolver(settings, backend_overrides)
    node_types = node_types_of(cluster_config)
    head = cluster_config.get("head_node_type")
    if head not in node_types:
        raise ConfigError("head_node_type", f"{head!r} is not one of available_node_types {sorted(node_types)}")
    global_max = cluster_config.get("max_workers")
    requests = {name: resolver.request(name, nt.get("resources") or {}, nt.get("node_config"), name == head)
                for name, nt in node_types.items()}
    rc = catalog.region(settings.price_cloud, settings.region)
    notes = check_catalog_values(cluster_config, rc, backend_overrides, unlisted_families)
    unused = unused_overrides(settings.price_overrides, rc)
    notes += [unused] if unused else []
    plans: dict[str, Plan] = {}
    costs = []
    for name, nt in node_types.items():
        is_head = name == head
        try:
            plan = planner.plan(requests[name])
        except NoFeasibleOffering as e:
            raise explain_no_offering(e, planner.plan, rc, settings, name, nt, is_head, backend_overrides,
                                      cluster_config.get("provider")) from None
        plans[name] = plan
        costs.append(node_type_cost(name, nt, plan, is_head, default_max_workers=int(global_max or 0)))
    cost = cluster_cost(costs, global_max)
    check_cost_cap(settings.max_hourly_cost, head, plans[head], cost)
    cluster_s = cluster_idle_s(cluster_config)
    idle = {name: idle_timeout(nt, plans[name].chosen.hourly_price, cost_aware=settings.cost_aware_idle,
                               launch_latency_s=settings.expected_launch_s,
                               relaunch_overhead_usd=settings.relaunch_overhead_usd, cluster_s=cluster_s)
            for name, nt in node_types.items() if name != head}
    matched_on = {name: (_matched_on(nt), name == head) for name, nt in node_types.items()}
    warnings = notes + rule_warnings(settings.rules, matched_on, shape_open)
    for w in warnings:
        logger.warning("%s", w)
    return ClusterPlan(settings=settings, catalog_id=catalog.catalog_id, head_node_type=head, plans=plans,
                       node_types=node_types, cost=cost, global_max_workers=int(global_max or 0), idle=idle,
                       warnings=warnings, left_out=_left_out(settings, backend_overrides, planner, node_types, plans,
                                                             head))


def _left_out(settings: CoreSettings, backend_overrides: Callable[[Document], Document] | None, planner: Planner,
              node_types: Mapping[str, Mapping[str, object]], plans: Mapping[str, Plan],
              head: object) -> dict[str, catalog_mod.Offering]:
    """Per node type, the cheaper offering the default exclusion of previous-generation families removed: the same
    request planned with `allow_previous_generation`, when its choice is cheaper than the plan's."""
    if not settings.default_exclusions.exclude_families:
        return {}
    allowing = Resolver(settings.model_copy(update={"allow_previous_generation": True}), backend_overrides)
    out: dict[str, catalog_mod.Offering] = {}
    for name, nt in node_types.items():
        try:
            o = planner.plan(allowing.request(name, nt.get("resources") or {}, nt.get("node_config"),
                                              name == head)).chosen
        except NoFeasibleOffering:
            continue
        if (o.hourly_price or 0.0) < (plans[name].chosen.hourly_price or 0.0) - 1e-12:
            out[name] = o
    return out


def _matched_on(node_type: Mapping[str, object]) -> Mapping[str, float]:
    """What a node type's rule is matched on (as Resolver.request): a generated type's demand, else its resources."""
    node_config = node_type.get("node_config")
    shape = node_config.get(OPEN_SHAPE_KEY) if isinstance(node_config, Mapping) else None
    matched = shape if isinstance(shape, Mapping) else (node_type.get("resources") or {})
    # Resolver.request has checked both for this node type already (a ConfigError otherwise): mappings.
    return matched if isinstance(matched, Mapping) else {}


def check_cost_cap(cap: float | None, head: str, head_plan: Plan, cost: ClusterCost) -> None:
    """`provider.max_hourly_cost` must leave room for the cluster at rest: the head (launched by `ray up`) and the
    min_workers the autoscaler starts at once. A cap below either could never be kept."""
    if cap is None:
        return
    price = head_plan.chosen.hourly_price or 0.0
    if cap < price - 1e-9:
        raise ConfigError("provider.max_hourly_cost",
                          f"${cap:.4f}/h is below the head's own price: node type {head!r} gets "
                          f"{head_plan.chosen.instance_type.name} at ${price:.4f}/h")
    if cap < cost.idle_cost_per_hour - 1e-9:
        raise ConfigError("provider.max_hourly_cost",
                          f"${cap:.4f}/h is below the idle cost of head + min_workers, "
                          f"${cost.idle_cost_per_hour:.4f}/h (`ray-nodeless plan` shows it per node type)")
