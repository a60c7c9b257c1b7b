"""Machine backends (local, aws, gcp), one subpackage each, behind the contract in `base.py`.

The registry is lazy: a backend's cloud client library is loaded only when that backend is used. Each built-in
backend's config-time half (`BackendConfig`: provider-block keys, node_config checks, requirement overrides) is
registered apart from it and imports no cloud SDK and no Ray: validating and planning a YAML (`ray-nodeless plan`,
the checks of `bootstrap_config`) loads only that.
"""
from __future__ import annotations

import importlib
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


def make_backend(cloud: str, settings: Section, cluster_name: str) -> MachineBackend:
    """`cloud`'s backend on its parsed settings (an instance of its `settings_model`; see base.py)."""
    return backend_class(cloud)(settings, cluster_name)
