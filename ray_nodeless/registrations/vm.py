"""`registration: vm` (the default): the machine runs Ray itself, through Ray's updater over SSH, or, with
`disable_node_updaters: true` on a cloud, through its own boot script (EC2 user data / GCE startup-script, see
`vm_boot.py`), since then nothing SSHes from the head to a new worker."""
from __future__ import annotations

from typing import Any

from pydantic import Field

from ray_nodeless.core.schema import Section
from ray_nodeless.providers.base import LaunchSpec
from ray_nodeless.registrations.base import Registration
from ray_nodeless.registrations.vm_boot import BOOT_KEY, boots_itself, worker_boot_script

DEFAULT_GCS_PORT = 6379          # Ray's default head port


class VmSettings(Section):
    head_ip: str | None = None       # the head's address for workers; default: this process's (the monitor's)
    gcs_address: str | None = Field(None, pattern=r"^[^:\s]*:\d{1,5}$")


class BareVM(Registration):
    """The machine runs Ray directly (Ray's updater over SSH, or user data / startup script)."""

    name = "vm"
    settings_model = VmSettings

    def __init__(self, provider_config: dict[str, Any], cluster_name: str):
        self.provider_config = provider_config
        self.cluster_name = cluster_name
        settings = VmSettings.model_validate({k: provider_config[k] for k in ("head_ip", "gcs_address")
                                              if provider_config.get(k) is not None})
        self.head_ip = settings.head_ip
        self.gcs_port = int((settings.gcs_address or f":{DEFAULT_GCS_PORT}").rsplit(":", 1)[1])
        self.cloud = provider_config.get("cloud", "local")
        self.boots_itself = bool(provider_config.get("disable_node_updaters")) and boots_itself(self.cloud)
        # A core key (core/settings.py), validated before any provider object is built.
        self.interruption_watcher = provider_config.get("interruption_watcher", True) is not False

    def prepare(self, spec: LaunchSpec) -> LaunchSpec:
        if self.boots_itself and not spec.is_head:
            spec.boot_script = worker_boot_script(self.cloud, spec, self._head_ip(), self.gcs_port,
                                                  self.provider_config.get(BOOT_KEY),
                                                  interruption_watcher=self.interruption_watcher)
        return spec

    def _head_ip(self) -> str:
        """`provider.head_ip`, else this process's address (the monitor that launches workers runs on the head)."""
        if self.head_ip:
            return self.head_ip
        from ray_nodeless.ray_adapter.compat.node_ip import node_ip_address
        return node_ip_address()
