"""Reading a cluster YAML with everything the launch needs known: the backend registry, each backend's and
registration's declared keys, each node type's node_config checks. One path for `ray up`'s bootstrap,
`ray-nodeless plan` and the provider object, so they fail on the same errors, before anything launches.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Mapping

from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.cluster_plan import ClusterPlan, load_catalog, plan_cluster
from ray_nodeless.core.requirements import split_node_config
from ray_nodeless.core.schema import declared_keys, parse_section
from ray_nodeless.core.settings import ProviderSettings, node_types_of, parse_provider
from ray_nodeless.errors import CatalogError, ConfigError
from ray_nodeless.providers import backend_class, backend_config, backend_names
from ray_nodeless.providers.base import BackendConfig, MachineBackend
from ray_nodeless.registrations import registration_class

logger = logging.getLogger(__name__)

# What the config checks call: a backend's BackendConfig, or (a backend registered without one) its class.
BackendChecks = type[BackendConfig] | type[MachineBackend]


def load_provider(provider: Any) -> tuple[ProviderSettings, type[MachineBackend]]:
    """Validate the whole provider block (core, backend and registration keys) and return the core settings and
    the backend class. Errors name the key."""
    settings, _ = load_provider_config(provider)
    return settings, backend_class(settings.cloud)


def load_provider_config(provider: Any) -> tuple[ProviderSettings, BackendChecks]:
    """`load_provider` without importing the backend: the same checks and errors, and the backend's config-time
    half (`providers.backend_config`: no cloud SDK, no Ray) instead of its class."""
    if not isinstance(provider, Mapping):
        raise ConfigError("provider", f"must be a mapping, got {type(provider).__name__}")
    cloud = provider.get("cloud", "local")
    if not isinstance(cloud, str) or cloud not in backend_names():
        raise ConfigError("provider.cloud", f"{cloud!r} is not one of {backend_names()}")
    cls = backend_config(cloud)
    reg = registration_class(provider.get("registration", "vm"))
    known = declared_keys(cls.settings_model, reg.settings_model)
    settings = parse_provider(provider, clouds=backend_names(), known_keys=known)
    if settings.interruption_queue_url is not None and not cls.supports_interruption_queue:
        raise ConfigError("provider.interruption_queue_url", f"backend {settings.cloud!r} polls no queue of "
                                                             "interruption warnings (the aws backend polls an SQS "
                                                             "queue of EC2 spot interruption warnings)")
    parse_section(cls.settings_model, provider, "provider")
    parse_section(reg.settings_model, provider, "provider")
    return settings, cls


def check_node_types(cluster_config: Mapping[str, Any], provider: Mapping[str, Any],
                     cls: BackendChecks) -> None:
    for name, nt in node_types_of(cluster_config).items():
        node_config = nt.get("node_config") or {}
        if not isinstance(node_config, Mapping):
            raise ConfigError(f"available_node_types.{name}.node_config", "must be a mapping")
        _, backend_keys = split_node_config(node_config)
        cls.check_node_config(provider, name, backend_keys, f"available_node_types.{name}.node_config")


# What Ray's `prepare_config` requires of a `type: external` YAML (it fills nothing for external providers) and
# raises KeyError / AssertionError for, before any provider code runs.
RAY_REQUIRED_KEYS = ("setup_commands", "head_setup_commands", "worker_setup_commands", "max_workers")
RAY_EXTERNAL_HEAD_TYPE = "ray.head.default"     # Ray's MINIMAL_EXTERNAL_CONFIG head_node_type


def prepare_like_ray_up(cluster_config: Mapping[str, Any]) -> dict[str, Any]:
    """The node-type view `ray up` plans from, without importing Ray (a cold `plan` stays fast): Ray's
    `prepare_config` for `type: external` merges nothing but its minimal defaults, requires the setup-command lists
    and `max_workers`, and fills each node type's `min_workers` (0) and `max_workers` (0 for the head, else the
    global value). tests/launch/test_prepare.py checks this equals Ray's own preparation on every shipped YAML."""
    if not isinstance(cluster_config, Mapping):
        raise ConfigError("cluster", "a cluster YAML must be a mapping")
    provider = cluster_config.get("provider")
    if isinstance(provider, Mapping) and provider.get("type", "external") != "external":
        raise ConfigError("provider.type", f"{provider.get('type')!r}: ray_nodeless runs as `type: external`; "
                                           "`ray-nodeless convert` turns a Ray AWS/GCP YAML into one")
    for key in RAY_REQUIRED_KEYS:
        if key not in cluster_config:
            raise ConfigError(key, "missing: `ray up` needs this top-level key for `type: external` providers (Ray "
                                   "fills it only for its own clouds); `ray-nodeless convert` writes a complete YAML")
    config = copy.deepcopy(dict(cluster_config))
    config.setdefault("head_node_type", RAY_EXTERNAL_HEAD_TYPE)
    types = node_types_of(config)     # checks each node type's shape first
    for name, nt in types.items():
        nt.setdefault("min_workers", 0)
        nt.setdefault("max_workers", 0 if name == config["head_node_type"] else config["max_workers"])
    config["available_node_types"] = types
    # Ray's validate_config next: its cluster schema (types, unknown top-level keys), read without Ray.
    from ray_nodeless.launch.ray_schema import check_ray_schema

    check_ray_schema(config)
    return config


def check_cluster(cluster_config: Mapping[str, Any], catalog: catalog_mod.Catalog | None = None) -> ClusterPlan:
    """Validate a whole cluster YAML and plan every node type (no cloud I/O)."""
    if not isinstance(cluster_config, Mapping):
        raise ConfigError("cluster", "a cluster YAML must be a mapping")
    provider = cluster_config.get("provider")
    settings, cls = load_provider_config(provider)
    check_node_types(cluster_config, provider, cls)
    registration_class(settings.registration).check_config(provider)
    catalog = catalog or catalog_for(settings)
    return plan_cluster(cluster_config, backend_overrides=lambda nc: cls.requirement_overrides(provider, nc),
                        catalog=catalog, settings=settings)


def catalog_for(settings: ProviderSettings) -> catalog_mod.Catalog:
    """The catalog file and region the settings name, as errors naming `provider.catalog` / `provider.region`."""
    try:
        catalog = load_catalog(settings.catalog)
    except CatalogError as e:
        raise ConfigError("provider.catalog", str(e)) from e
    try:
        catalog.region(settings.price_cloud, settings.region)
    except CatalogError as e:
        raise ConfigError("provider.region", str(e)) from e
    return catalog


def provider_catalog(settings: ProviderSettings, provider: Mapping[str, Any]) -> catalog_mod.Catalog:
    """The catalog that prices decisions: `embedded`, a file, or `live` (refreshed from the cloud's API, falling
    back to the embedded one: a live catalog is an optimisation, never a reason to fail the cluster)."""
    if settings.catalog != "live":
        return catalog_for(settings)
    try:
        if settings.price_cloud == "aws":
            from ray_nodeless.providers.aws.catalog import refresh_aws_catalog
            return refresh_aws_catalog(settings.region, session_kwargs=provider.get("aws_credentials"),
                                       endpoint_url=provider.get("endpoint_url"))
        from ray_nodeless.providers.gcp.catalog import refresh_gcp_catalog
        from ray_nodeless.providers.gcp.settings import GcpSettings

        credentials = parse_section(GcpSettings, provider, "provider").client_credentials()
        return refresh_gcp_catalog(settings.region, provider.get("project_id", ""),
                                   api_endpoint=provider.get("api_endpoint"), credentials=credentials)
    except Exception as e:
        logger.warning("live catalog unavailable (%s); using the embedded catalog", e)
        return load_catalog("embedded")
