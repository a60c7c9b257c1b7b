"""Reading a cluster YAML with everything the launch needs known: the backend registry, each backend's and
registration's declared keys, each node type's node_config checks. One path for `ray up`'s bootstrap,
`ray-nodeless plan` and the provider object, so they fail on the same errors, before anything launches.

`load_provider` is the one reader of a provider block: it validates every key once and returns a `ProviderBundle`
(the core's settings, the backend's and the registration's parsed sections, and their classes). The provider
object, `bootstrap_config`, `plan`, `sweep` and `status` build from it; nothing below parses the block again.
"""
from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any, Mapping

from ray_nodeless.core.documents import Document, DocumentView
from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.cluster_plan import ClusterPlan, plan_cluster
from ray_nodeless.core.requirements import split_node_config
from ray_nodeless.core.schema import Section, declared_keys, parse_section
from ray_nodeless.core.settings import CoreSettings, key_problems, node_types_of, parse_provider
from ray_nodeless.errors import ConfigError, ConfigErrors
from ray_nodeless.launch.catalog import catalog_for as catalog_for   # re-exported: bootstrap's and convert's name
from ray_nodeless.launch.open_types import check_open
from ray_nodeless.operate.ray_prepare import RAY_REQUIRED_KEYS, check_ray_preparation
from ray_nodeless.providers import (
    backend_class, backend_config, backend_names, played, player_settings_model, previous_generation_families,
    price_clouds, unlisted_families,
)
from ray_nodeless.providers.base import BackendConfig, MachineBackend
from ray_nodeless.ray_compat import in_teardown
from ray_nodeless.registrations import registration_class
from ray_nodeless.registrations.base import Registration

logger = logging.getLogger(__name__)

# What the config checks call: a backend's BackendConfig, or (a backend registered without one) its class.
BackendChecks = type[BackendConfig] | type[MachineBackend]


@dataclass(frozen=True)
class ProviderBundle:
    """One provider block, validated once (`load_provider`): the core's settings, the backend's and the
    registration's parsed sections, and the classes they belong to. Everything below the loader takes its part of
    this (a backend its section, a registration its section and the core's) instead of the raw block, so no layer
    parses the block again or climbs back up for a key."""

    core: CoreSettings
    backend_settings: Section                  # an instance of backend_config.settings_model
    registration_settings: Section             # an instance of registration_class.settings_model
    backend_config: BackendChecks              # the backend's config-time half: no cloud SDK, no Ray
    registration_class: type[Registration]
    # Played machines (`registration: local-player`, `kubernetes.played: true`): the player's parsed section;
    # make_backend then wraps the backend in the decorator that plays them (providers/local/played.py).
    player_settings: Section | None = None

    def backend_class(self) -> type[MachineBackend]:
        """The backend itself (imports its cloud SDK)."""
        return backend_class(self.core.cloud)

    def make_backend(self, cluster_name: str) -> MachineBackend:
        backend = self.backend_class()(self.backend_settings, cluster_name)
        if self.player_settings is None:
            return backend
        return played(backend, self.player_settings, self.registration_settings, cluster_name)

    def make_registration(self, cluster_name: str) -> Registration:
        return self.registration_class(self.registration_settings, cluster_name, self.core)

    def registration_for_sweep(self, cluster_name: str) -> Registration:
        return self.registration_class.for_sweep(self.registration_settings, cluster_name, self.core)

    def requirement_overrides(self, node_config: Document) -> Document:
        """Requirement keys the backend's keys of `node_config` imply, given its parsed settings."""
        return self.backend_config.requirement_overrides(self.backend_settings, node_config)

    def check_node_config(self, node_type: str, node_config: Document, key: str) -> None:
        self.backend_config.check_node_config(self.backend_settings, node_type, node_config, key)


def load_provider(provider: object, *, planning: bool | None = None) -> ProviderBundle:
    """The one loader of a provider block: every key validated once (core, backend and registration keys; unknown
    keys with a did-you-mean), errors naming the key. Imports no cloud SDK: `bundle.backend_class()` does.

    `planning=False` reads it for a teardown: `rules` / `exclude` that do not parse are a warning, not an error
    (core.settings.parse_provider), so that `ray down` and `sweep` end the machines whatever the rules say now.
    None (the default): False inside Ray's `ray down` (its teardown_cluster builds provider objects and calls
    bootstrap_config, and tells neither), else True."""
    if not isinstance(provider, Mapping):
        raise ConfigError("provider", f"must be a mapping, got {type(provider).__name__}")
    cls, reg, player, models = _sections(provider)
    core = parse_provider(provider, clouds=backend_names(), known_keys=declared_keys(*models),
                          catalog_cloud=cls.catalog_cloud, price_clouds=price_clouds(), required_by=models,
                          planning=not in_teardown() if planning is None else planning)
    core._previous_generation = previous_generation_families(core.price_cloud)
    if core.interruption_queue_url is not None and not cls.supports_interruption_queue:
        raise ConfigError("provider.interruption_queue_url", f"backend {core.cloud!r} polls no queue of "
                                                             "interruption warnings (the aws backend polls an SQS "
                                                             "queue of EC2 spot interruption warnings)")
    return ProviderBundle(core=core, backend_settings=parse_section(cls.settings_model, provider, "provider"),
                          registration_settings=parse_section(reg.settings_model, provider, "provider"),
                          backend_config=cls, registration_class=reg,
                          player_settings=None if player is None else parse_section(player, provider, "provider"))


def _sections(provider: Mapping[str, Any]) -> tuple[BackendChecks, type[Registration], type[Section] | None,
                                                   tuple[type[Section], ...]]:
    """The backend's checks, the registration's class, the player's model (played machines) and every model whose
    keys the block may hold besides the core's."""
    cloud = provider.get("cloud", "local")
    if not isinstance(cloud, str) or cloud not in backend_names():
        raise ConfigError("provider.cloud", f"{cloud!r} is not one of {backend_names()}")
    cls = backend_config(cloud)
    reg = registration_class(provider.get("registration", "vm"))
    player = player_settings_model(provider)      # played machines: the player's keys (providers/local/played.py)
    models = (cls.settings_model, reg.settings_model) + ((player,) if player is not None else ())
    return cls, reg, player, models


def provider_key_problems(provider: object) -> list[ConfigError]:
    """The provider block's unknown and missing keys (core.settings.key_problems), or the one error that keeps
    them from being known (no mapping, an unknown cloud or registration); [] when there is none."""
    if not isinstance(provider, Mapping):
        return [ConfigError("provider", f"must be a mapping, got {type(provider).__name__}")]
    try:
        _, _, _, models = _sections(provider)
    except ConfigError as e:
        return [e]
    return key_problems(provider, declared_keys(*models), models)


def check_node_types(cluster_config: DocumentView, bundle: ProviderBundle) -> None:
    for name, nt in node_types_of(cluster_config).items():
        node_config = nt.get("node_config") or {}
        if not isinstance(node_config, Mapping):
            raise ConfigError(f"available_node_types.{name}.node_config", "must be a mapping")
        _, backend_keys = split_node_config(node_config)
        bundle.check_node_config(name, backend_keys, f"available_node_types.{name}.node_config")


RAY_EXTERNAL_HEAD_TYPE = "ray.head.default"     # Ray's MINIMAL_EXTERNAL_CONFIG head_node_type


# The provider classes a `type: external` block names as `module` (Ray imports the module and takes the class):
# ray_nodeless's own, and the KubeRay bridge's (kuberay/bridge.py writes it).
PROVIDER_MODULES = ("ray_nodeless.NodelessProvider", "ray_nodeless.kuberay.provider.KubeRayNodelessProvider")


def check_module(module: object) -> None:
    """`provider.module` as Ray imports it at `ray up` (`_load_external_provider`: the module part imported, the
    last part its class): one of ours, else a module that exists (a user's subclass); a near miss of ours gets a
    did-you-mean. Finds the module without importing it."""
    import importlib.util

    from ray_nodeless.core.schema import suggest_key

    if not isinstance(module, str) or "." not in module.strip(".") or not all(module.split(".")):
        raise ConfigError("provider.module", f"must be a dotted path to a provider class, e.g. "
                                             f"{PROVIDER_MODULES[0]!r}; got {module!r}")
    if module in PROVIDER_MODULES:
        return
    close = suggest_key(module, PROVIDER_MODULES)
    if close:
        raise ConfigError("provider.module", f"{module!r} is not a provider class; did you mean {close!r}?")
    path = module.rsplit(".", 1)[0]
    try:
        found = importlib.util.find_spec(path) is not None
    except (ImportError, ValueError):      # a parent package that does not exist
        found = False
    if not found:
        raise ConfigError("provider.module", f"{module!r}: no module {path!r} to import (Ray imports it at "
                                             f"`ray up`); ray_nodeless's provider is {PROVIDER_MODULES[0]!r}")


def prepare_like_ray_up(cluster_config: DocumentView) -> Document:
    """The node-type view `ray up` plans from, without importing Ray (a cold `plan` stays fast): Ray's
    `prepare_config` for `type: external` merges nothing but its minimal defaults, requires the setup-command lists
    and `max_workers`, and fills each node type's `min_workers` (0) and `max_workers` (0 for the head, else the
    global value). tests/operate/test_prepare.py checks this equals Ray's own preparation on every shipped YAML."""
    if not isinstance(cluster_config, Mapping):
        raise ConfigError("cluster", "a cluster YAML must be a mapping")
    provider = cluster_config.get("provider")
    if isinstance(provider, Mapping) and provider.get("type", "external") != "external":
        raise ConfigError("provider.type", f"{provider.get('type')!r}: ray_nodeless runs as `type: external`; "
                                           "`ray-nodeless convert` turns a Ray AWS/GCP YAML into one")
    if isinstance(provider, Mapping) and "module" in provider:
        check_module(provider["module"])
    # What a user fixes in one edit, named at once: unknown top-level keys (a did-you-mean from Ray's schema), the
    # top-level keys Ray requires, the provider block's unknown and missing keys.
    from ray_nodeless.operate.ray_schema import unknown_top_level_keys

    problems = unknown_top_level_keys(cluster_config)
    missing = [key for key in RAY_REQUIRED_KEYS if key not in cluster_config]
    problems += [ConfigError(key, "missing: `ray up` needs this top-level key for `type: external` providers (Ray "
                                  "fills it only for its own clouds); `ray-nodeless convert` writes a complete YAML"
                             if i == 0 else "missing too") for i, key in enumerate(missing)]
    types = cluster_config.get("available_node_types")
    if "head_node_type" not in cluster_config and isinstance(types, Mapping) and types \
            and RAY_EXTERNAL_HEAD_TYPE not in types:
        problems.append(ConfigError("head_node_type", f"missing: name the head's node type (one of "
                                                      f"{sorted(map(str, types))}); without it Ray looks for "
                                                      f"{RAY_EXTERNAL_HEAD_TYPE!r}"))
    if problems and "provider" in cluster_config:
        # With the top-level ones, so all are named at once; alone, the loader names them (after the caller has
        # taken out keys that are not the provider's, e.g. the KubeRay bridge's `kuberay`).
        problems += provider_key_problems(cluster_config["provider"])
    if problems:
        raise ConfigErrors.of(problems)
    # Then what Ray's own steps before the provider import would crash on (operate/ray_prepare.py: a missing
    # `provider.type`, a docker block without its image, a node type that is not a mapping, a value JSON cannot
    # hold), named by key: `ray up` shows Ray's traceback for these, `plan` names them.
    check_ray_preparation(cluster_config)
    config = copy.deepcopy(dict(cluster_config))
    config.setdefault("head_node_type", RAY_EXTERNAL_HEAD_TYPE)
    types = node_types_of(config)     # checks each node type's shape first
    for name, nt in types.items():
        nt.setdefault("min_workers", 0)
        nt.setdefault("max_workers", 0 if name == config["head_node_type"] else config["max_workers"])
    config["available_node_types"] = types
    # Ray's validate_config next: its cluster schema (types, unknown top-level keys), read without Ray.
    from ray_nodeless.operate.ray_schema import check_ray_schema

    check_ray_schema(config)
    return config


def check_cluster(cluster_config: DocumentView, catalog: catalog_mod.Catalog | None = None,
                  bundle: ProviderBundle | None = None) -> ClusterPlan:
    """Validate a whole cluster YAML and plan every node type (no cloud I/O). `bundle`: its provider block as
    `load_provider` read it, when the caller has it already."""
    if not isinstance(cluster_config, Mapping):
        raise ConfigError("cluster", "a cluster YAML must be a mapping")
    bundle = bundle or load_provider(cluster_config.get("provider"))
    check_node_types(cluster_config, bundle)
    bundle.registration_class.check_config(bundle.registration_settings)
    is_open = check_open(cluster_config, bundle.core, bundle.check_node_config)   # shape-open: the generated template
    catalog = catalog or catalog_for(bundle.core)
    return plan_cluster(cluster_config, backend_overrides=bundle.requirement_overrides, catalog=catalog,
                        settings=bundle.core, shape_open=is_open,
                        unlisted_families=unlisted_families(bundle.core.price_cloud))

