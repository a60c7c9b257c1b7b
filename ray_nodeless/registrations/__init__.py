"""Registration modes: how a launched machine joins the Ray cluster (`provider.registration`), composed with any
machine backend. `vm` (the machine runs Ray itself), `local-player` (a local Ray node plays each machine),
`kubernetes` (the machine joins a Kubernetes cluster as a Node; Ray runs in a pod on it)."""
from __future__ import annotations

from typing import Any

from ray_nodeless.core.schema import Section
from ray_nodeless.core.settings import CoreSettings
from ray_nodeless.errors import ConfigError
from ray_nodeless.registrations.base import Registration

REGISTRATIONS = ("vm", "local-player", "kubernetes")


def registration_class(name: Any) -> type[Registration]:
    if name == "vm":
        from ray_nodeless.registrations.vm import BareVM
        return BareVM
    if name == "local-player":
        from ray_nodeless.registrations.local_player import LocalPlayer
        return LocalPlayer
    if name == "kubernetes":
        from ray_nodeless.registrations.kubernetes import KubernetesRegistration
        return KubernetesRegistration
    raise ConfigError("provider.registration", f"{name!r} is not one of {list(REGISTRATIONS)}")


def make_registration(name: str, settings: Section, cluster_name: str, core: CoreSettings) -> Registration:
    """Registration `name` on its parsed settings and the core's (the contract in base.py)."""
    return registration_class(name)(settings, cluster_name, core)
