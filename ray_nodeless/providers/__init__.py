"""Machine backends (local, aws, gcp), one subpackage each, behind the contract in `base.py`.

The registry is lazy: a backend's cloud client library is loaded only when that backend is used.
"""
from __future__ import annotations

import importlib
from typing import Any

from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.base import MachineBackend

_BACKENDS = {
    "local": ("ray_nodeless.providers.local.backend", "LocalBackend"),
    "aws": ("ray_nodeless.providers.aws.backend", "AwsBackend"),
    "gcp": ("ray_nodeless.providers.gcp.backend", "GcpBackend"),
}


def register_backend(cloud: str, module: str, class_name: str) -> None:
    """Make `provider.cloud: <cloud>` load `module.class_name` (a MachineBackend). For third-party backends."""
    _BACKENDS[cloud] = (module, class_name)


def backend_names() -> list[str]:
    return sorted(_BACKENDS)


def backend_class(cloud: str) -> type[MachineBackend]:
    if cloud not in _BACKENDS:
        raise ConfigError("provider.cloud", f"{cloud!r} is not one of {sorted(_BACKENDS)}")
    module, name = _BACKENDS[cloud]
    return getattr(importlib.import_module(module), name)


def make_backend(cloud: str, provider_config: dict[str, Any], cluster_name: str) -> MachineBackend:
    return backend_class(cloud)(provider_config, cluster_name)
