"""`registration: vm` (the default): the machine runs Ray itself, through Ray's updater over SSH, or, with
`disable_node_updaters: true` on a cloud, through its own boot script (EC2 user data / GCE startup-script, see
`vm_boot.py`), since then nothing SSHes from the head to a new worker."""
from __future__ import annotations

from ray_nodeless.core.settings import CoreSettings, HeadAddress
from ray_nodeless.providers.base import LaunchSpec
from ray_nodeless.registrations.base import Registration
from ray_nodeless.registrations.vm_boot import boots_itself, worker_boot_script


class VmSettings(HeadAddress):
    """`registration: vm`'s keys: `head_ip` (the head's address for self-booting workers; default: this process's,
    the monitor's) and `gcs_address` (its port is the one they join) are the core's declaration (HeadAddress)."""

    # Ray's key, with Ray's meaning: no updater SSHes into new nodes; on a cloud, workers boot Ray themselves.
    disable_node_updaters: bool = False


class BareVM(Registration):
    """The machine runs Ray directly (Ray's updater over SSH, or user data / startup script)."""

    name = "vm"
    settings_model = VmSettings

    def __init__(self, settings: VmSettings, cluster_name: str, core: CoreSettings):
        super().__init__(settings, cluster_name, core)
        self.settings: VmSettings = settings
        self.head_ip = settings.head_ip
        self.gcs_port = settings.gcs_port()
        self.cloud = core.cloud
        self.boots_itself = settings.disable_node_updaters and boots_itself(self.cloud)
        self.interruption_watcher = core.interruption_watcher
        self.boot_commands = core.worker_boot       # recorded by bootstrap_config (BOOT_KEY)

    def prepare(self, spec: LaunchSpec) -> LaunchSpec:
        if self.boots_itself and not spec.is_head:
            spec.boot_script = worker_boot_script(self.cloud, spec, self._head_ip(), self.gcs_port,
                                                  self.boot_commands,
                                                  interruption_watcher=self.interruption_watcher)
        return spec

    def _head_ip(self) -> str:
        """`provider.head_ip`, else this process's address (the monitor that launches workers runs on the head)."""
        if self.head_ip:
            return self.head_ip
        from ray_nodeless.ray_compat.node_ip import node_ip_address
        return node_ip_address()
