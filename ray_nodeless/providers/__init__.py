"""Machine backends (local, aws, gcp), one subpackage each, behind the contract in `base.py`.

The registry is lazy: a backend's cloud client library is loaded only when that backend is used. Each built-in
backend's config-time half (`BackendConfig`: provider-block keys, node_config checks, requirement overrides) is
registered apart from it and imports no cloud SDK and no Ray: validating and planning a YAML (`ray-nodeless plan`,
the checks of `bootstrap_config`) loads only that.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping
from ray_nodeless.core.schema import Section
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.base import BackendConfig, MachineBackend

_BACKENDS = {
    "local": ("ray_nodeless.providers.local.backend", "LocalBackend"),
    "aws": ("ray_nodeless.providers.aws.backend", "AwsBackend"),
    "gcp": ("ray_nodeless.providers.gcp.backend", "GcpBackend"),
}

_CONFIGS = {
    "local": ("ray_nodeless.providers.local.settings", "LocalConfig"),
    "aws": ("ray_nodeless.providers.aws.config", "AwsConfig"),
    "gcp": ("ray_nodeless.providers.gcp.config", "GcpConfig"),
}


def register_backend(cloud: str, module: str, class_name: str, config: tuple[str, str] | None = None) -> None:
    """Make `provider.cloud: <cloud>` load `module.class_name` (a MachineBackend). For third-party backends: the
    class declares its provider keys as `settings_model` and is built as `cls(settings, cluster_name)` with them
    parsed (the contract in base.py). `config` (module, class name) is its `BackendConfig`; without it the config
    checks load the backend class."""
    _BACKENDS[cloud] = (module, class_name)
    if config is None:
        _CONFIGS.pop(cloud, None)
    else:
        _CONFIGS[cloud] = config


def backend_names() -> list[str]:
    return sorted(_BACKENDS)


def backend_class(cloud: str) -> type[MachineBackend]:
    if cloud not in _BACKENDS:
        raise ConfigError("provider.cloud", f"{cloud!r} is not one of {sorted(_BACKENDS)}")
    module, name = _BACKENDS[cloud]
    return getattr(importlib.import_module(module), name)


def backend_config(cloud: str) -> type[BackendConfig] | type[MachineBackend]:
    """What the config checks need of `cloud`'s backend (settings_model, check_node_config, requirement_overrides),
    without importing its cloud SDK: its BackendConfig, else (a backend registered without one) the class."""
    if cloud not in _BACKENDS:
        raise ConfigError("provider.cloud", f"{cloud!r} is not one of {sorted(_BACKENDS)}")
    if cloud not in _CONFIGS:
        return backend_class(cloud)
    module, name = _CONFIGS[cloud]
    return getattr(importlib.import_module(module), name)


def price_clouds() -> list[str]:
    """The catalog clouds that price the registered backends' machines (their `BackendConfig.catalog_cloud`),
    sorted: what `provider.simulate_cloud` and the `--cloud` of `plan` / `catalog` may name."""
    return sorted({c for name in backend_names() if (c := backend_config(name).catalog_cloud) is not None})


def previous_generation_families(catalog_cloud: str) -> frozenset[str]:
    """The previous-generation families of `catalog_cloud` (core/family_names.py), as the registered backends
    priced by that cloud declare them (`BackendConfig.previous_generation_families`)."""
    return _families_of(catalog_cloud, lambda c: c.previous_generation_families)


def unlisted_families(catalog_cloud: str) -> frozenset[str]:
    """The real instance families of `catalog_cloud` no catalog lists (retired, dedicated-host or unpriced ones:
    core/family_names.py), as the registered backends priced by that cloud declare them
    (`BackendConfig.unlisted_families`)."""
    return _families_of(catalog_cloud, lambda c: c.unlisted_families)


def _families_of(catalog_cloud: str, declared: Callable[[type[BackendConfig] | type[MachineBackend]], frozenset[str]]
                 ) -> frozenset[str]:
    """The union of what every registered backend priced by `catalog_cloud` declares."""
    out: set[str] = set()
    for name in backend_names():
        config = backend_config(name)
        if config.catalog_cloud == catalog_cloud:
            out |= declared(config)
    return frozenset(out)


def ray_provider_types() -> dict[str, str]:
    """Ray's own provider types the registered backends stand for (`BackendConfig.ray_provider_type`) -> the
    backend's name (the first by name where two claim one), sorted by type."""
    out: dict[str, str] = {}
    for name in backend_names():
        ray_type = backend_config(name).ray_provider_type
        if ray_type is not None:
            out.setdefault(ray_type, name)
    return dict(sorted(out.items()))


def make_backend(cloud: str, settings: Section, cluster_name: str) -> MachineBackend:
    """`cloud`'s backend on its parsed settings (an instance of its `settings_model`; see base.py)."""
    return backend_class(cloud)(settings, cluster_name)


# Played machines (providers/local/played.py), registered like the backends: loaded by name, when used. The
# config half (which player a block asks for, its keys) imports no Ray; the players themselves do.
_PLAYER_CONFIG = ("ray_nodeless.providers.local.settings", "player_of", "PLAYER_SETTINGS")
_PLAYED_BACKEND = ("ray_nodeless.providers.local.players", "played_backend")


def player_settings_model(provider: Mapping[str, Any]) -> type[Section] | None:
    """The provider-block keys of the local player that plays this block's machines (`registration: local-player`,
    or `kubernetes.played: true`; see providers/local/played.py), None when the machines are real. No Ray import."""
    module, player_of, models = _PLAYER_CONFIG
    config = importlib.import_module(module)
    player = getattr(config, player_of)(provider)
    return getattr(config, models)[player] if player is not None else None


def played(backend: MachineBackend, player_settings: Section, registration_settings: Section,
           cluster_name: str) -> MachineBackend:
    """`backend` wrapped in the decorator that plays its machines on this host (providers/local/played.py), with
    the player `player_settings` (an instance of `player_settings_model(...)`) is the section of. Closes `backend`
    if the player cannot be built."""
    module, name = _PLAYED_BACKEND
    try:
        return getattr(importlib.import_module(module), name)(backend, player_settings, registration_settings,
                                                               cluster_name)
    except BaseException:
        backend.close()
        raise
