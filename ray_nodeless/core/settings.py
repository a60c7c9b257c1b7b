"""The `provider:` block and the node types of a cluster YAML, turned into planner requests.

    provider:
      type: external
      module: ray_nodeless.NodelessProvider
      cloud: aws                 # local | aws | gcp
      region: us-west-2
      simulate_cloud: aws        # cloud: local only: whose catalog prices the local "instances"
      catalog: embedded          # embedded | live | a path to a catalog file
      unavailable_ttl_s: 180     # how long an offering that failed for capacity is skipped
      registration: vm           # vm | local-player (| kubernetes)
      exclude: {...}             # see requirements.py
      rules: [...]               # see rules.py
"""
from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ray_nodeless.errors import ConfigError
from ray_nodeless.core.requirements import (
    Request, Requirements, Shape, parse_exclude, parse_requirements, split_node_config,
)
from ray_nodeless.core.rules import DEFAULT_RULE, Rule, RuleSet, parse_rules

logger = logging.getLogger(__name__)

PRICE_CLOUDS = ("aws", "gcp")
REGISTRATIONS = ("vm", "local-player")
DEFAULT_UNAVAILABLE_TTL_S = 180.0

OUR_PROVIDER_KEYS = frozenset({
    "cloud", "region", "simulate_cloud", "catalog", "catalog_ttl_s", "unavailable_ttl_s", "registration",
    "exclude", "rules", "list_cache_s", "node_type_resources", "worker_boot",
})
# Keys Ray itself reads from the provider block, and keys our backends read. Anything else that looks like a
# misspelling of one of these is an error; anything else entirely is passed through with a warning.
OTHER_PROVIDER_KEYS = frozenset({
    "type", "module", "use_internal_ips", "disable_node_updaters", "cache_stopped_nodes", "security_group",
    "disable_launch_config_check", "foreground_node_launch", "worker_liveness_check", "use_node_id_as_ip",
    "head_ip", "worker_ips", "availability_zone", "aws_credentials", "endpoint_url", "aws_max_attempts",
    "subnets", "image_id", "project_id", "api_endpoint", "credentials", "image", "operation_timeout_s",
    "state_dir", "gcs_address", "local_faults", "player_state_dir", "launch_timeout_s", "call_timeout_s",
    "max_attempts", "retry_base_s", "retry_max_s", "poll_interval_s", "disk_size_gb", "network",
    "aws_retry_mode", "aws_retry_base_delay_s", "aws_describe_page_size", "local_object_store_memory",
    "local_port_base", "local_start_timeout_s", "local_min_free_memory_mb", "local_ray_start_args", "local_prewarm",
})


@dataclass(frozen=True)
class ProviderSettings:
    cloud: str                 # the machine backend
    price_cloud: str           # the catalog cloud that prices decisions (== cloud except for local)
    region: str
    catalog: str
    unavailable_ttl_s: float
    registration: str
    rules: RuleSet
    list_cache_s: float


def parse_provider(provider: Mapping[str, Any]) -> ProviderSettings:
    if not isinstance(provider, Mapping):
        raise ConfigError("provider", "must be a mapping")
    for k in sorted(provider):
        if k in OUR_PROVIDER_KEYS or k in OTHER_PROVIDER_KEYS or k.startswith("_"):
            continue   # keys with a leading underscore are Ray's own bookkeeping (e.g. _config_cache_path)
        close = difflib.get_close_matches(k, sorted(OUR_PROVIDER_KEYS), n=1, cutoff=0.75)
        if close:
            raise ConfigError(f"provider.{k}", f"unknown key; did you mean `{close[0]}`?")
        logger.warning("provider.%s is not a ray_nodeless key; passing it through", k)
    from ray_nodeless.providers import backend_names  # the registry: built-in backends plus registered ones

    cloud = provider.get("cloud", "local")
    if cloud not in backend_names():
        raise ConfigError("provider.cloud", f"{cloud!r} is not one of {backend_names()}")
    # Backends that are not a priced cloud (local, or a registered test backend) are priced as `simulate_cloud`.
    price_cloud = cloud if cloud in PRICE_CLOUDS else provider.get("simulate_cloud", "aws")
    if price_cloud not in PRICE_CLOUDS:
        raise ConfigError("provider.simulate_cloud", f"{price_cloud!r} is not one of {list(PRICE_CLOUDS)}")
    if cloud in PRICE_CLOUDS and "simulate_cloud" in provider:
        raise ConfigError("provider.simulate_cloud", f"only applies to backends that are not a cloud, not {cloud!r}")
    region = provider.get("region")
    if not isinstance(region, str) or not region:
        raise ConfigError("provider.region", "required: the cloud region to launch in (e.g. us-west-2)")
    catalog = provider.get("catalog", "embedded")
    if not isinstance(catalog, str) or not catalog:
        raise ConfigError("provider.catalog", "must be 'embedded', 'live' or a path to a catalog file")
    ttl = provider.get("unavailable_ttl_s", DEFAULT_UNAVAILABLE_TTL_S)
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl < 0:
        raise ConfigError("provider.unavailable_ttl_s", f"must be a number of seconds >= 0, got {ttl!r}")
    list_cache = provider.get("list_cache_s", 2.0)
    if isinstance(list_cache, bool) or not isinstance(list_cache, (int, float)) or list_cache < 0:
        raise ConfigError("provider.list_cache_s", f"must be a number of seconds >= 0, got {list_cache!r}")
    registration = provider.get("registration", "vm")
    if registration not in REGISTRATIONS:
        raise ConfigError("provider.registration", f"{registration!r} is not one of {list(REGISTRATIONS)}")
    rules = RuleSet(rules=parse_rules(provider.get("rules")),
                    exclude=parse_exclude(provider.get("exclude"), "provider.exclude"))
    return ProviderSettings(cloud=cloud, price_cloud=price_cloud, region=region, catalog=catalog,
                            unavailable_ttl_s=float(ttl), registration=registration, rules=rules,
                            list_cache_s=float(list_cache))


class Resolver:
    """Node type -> planner Request: first matching rule, narrowed by node_config, global exclusions added."""

    def __init__(self, settings: ProviderSettings,
                 backend_overrides: Callable[[dict[str, Any]], dict[str, Any]] | None = None):
        self.settings = settings
        self.backend_overrides = backend_overrides

    def request(self, node_type: str, resources: Mapping[str, Any], node_config: Mapping[str, Any] | None,
                is_head: bool) -> Request:
        key = f"available_node_types.{node_type}"
        shape = Shape.from_resources(resources or {}, f"{key}.resources")
        node_config = node_config or {}
        if not isinstance(node_config, Mapping):
            raise ConfigError(f"{key}.node_config", "must be a mapping")
        ours, theirs = split_node_config(node_config)
        rule: Rule | None = self.settings.rules.first_match(node_type, resources or {}, is_head)
        base = rule.requirements if rule else Requirements()
        req = base.narrowed_by(parse_requirements(ours, f"{key}.node_config"), f"{key}.node_config")
        if self.backend_overrides is not None:
            implied = self.backend_overrides(theirs)
            if implied:
                req = req.narrowed_by(parse_requirements(implied, f"{key}.node_config"), f"{key}.node_config")
        req = req.narrowed_by(self.settings.rules.exclude, "provider.exclude")
        return Request(cloud=self.settings.price_cloud, region=self.settings.region, shape=shape,
                       requirements=req, rule=rule.name if rule else DEFAULT_RULE, node_type=node_type)


def node_types_of(cluster_config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    types = cluster_config.get("available_node_types")
    if not isinstance(types, Mapping) or not types:
        raise ConfigError("available_node_types", "the cluster YAML must define at least one node type")
    for name, t in types.items():
        if not isinstance(t, Mapping):
            raise ConfigError(f"available_node_types.{name}", "must be a mapping")
    return {name: dict(types[name]) for name in sorted(types)}
