"""`local-player` registration: every machine a backend launches is *played* by a local Ray node process.

The cloud control plane is real code against a fake cloud (EC2 under moto, GCE under a fake server); nothing boots
there. So for each worker machine the backend creates, the player starts a local `ray start --block` node with the
machine's Ray resources and labels and `RAY_CLOUD_INSTANCE_ID=<the cloud machine id>` (how autoscaler v2 matches a
Ray node to its instance), and reports the player's 127.0.0.N as the machine's IP (how v1 matches them). When the
machine is terminated, or vanishes from the cloud (a preemption emulated in the fake cloud), its player is stopped.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path
from typing import Any

from ray.autoscaler.tags import NODE_KIND_HEAD, TAG_RAY_NODE_KIND

from ray_nodeless.core.settings import CoreSettings
from ray_nodeless.errors import BackendError
from ray_nodeless.providers.base import TAG_CLUSTER, LaunchSpec, Machine
from ray_nodeless.providers.local.processes import LocalNodeProcesses
from ray_nodeless.providers.local.ray_start import instance_env
from ray_nodeless.providers.local.runner import LocalCommandRunner, runner_marker
from ray_nodeless.providers.local.settings import LocalPlayerSettings, default_state_dir
from ray_nodeless.providers.local.slots import default_head_ip
from ray_nodeless.registrations.base import Registration

logger = logging.getLogger(__name__)


class LocalPlayer(Registration):
    """Plays every worker machine with a local Ray node; its provider-block keys are `LocalPlayerSettings`."""

    name = "local-player"
    settings_model = LocalPlayerSettings

    def __init__(self, settings: LocalPlayerSettings, cluster_name: str, core: CoreSettings):
        self.cluster_name = cluster_name
        self.settings = settings
        self.state_dir = Path(self.settings.player_state_dir or default_state_dir(cluster_name, "-player"))
        self.nodes = LocalNodeProcesses.from_settings(self.settings, self.state_dir)
        self.home = self.state_dir / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.runner_marker = runner_marker(self.home)   # see LocalBackend.runner_marker
        self.head_ip = self.settings.head_ip or default_head_ip()
        # machine id -> player IP. A player's IP never changes while it lives, so a hit never goes stale; entries go
        # when the player is stopped. Misses read one record file (cheap enough for describe()).
        self._ips: dict[str, str] = {}
        self._lock = threading.Lock()

    def after_launch(self, spec: LaunchSpec, machine_ids: list[str]) -> None:
        """Start one player per worker machine, one at a time. Raises BackendError naming the machines that got no
        player (the others keep theirs); the caller decides whether to terminate those machines."""
        if spec.is_head:
            return
        failed: dict[str, str] = {}
        for mid in machine_ids:
            if self.nodes.get(mid) is not None:
                continue   # a retried hook: that machine already has its player
            try:
                rec = self.nodes.start(mid, spec.node_type, spec.resources, spec.labels, extra_env=instance_env(spec),
                                       tags=dict(spec.tags), request_token=spec.request_token)
            except BackendError as e:
                logger.error("local player for %s failed: %s", mid, e)
                failed[mid] = str(e)
                continue
            with self._lock:
                self._ips[mid] = rec.ip
        if failed:
            raise BackendError(f"local player could not start Ray for {sorted(failed)}: "
                               + "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in failed.items()),
                               category="LocalPlayerStartFailed")

    def player_ip(self, machine_id: str) -> str | None:
        with self._lock:
            ip = self._ips.get(machine_id)
        if ip is None:
            rec = self.nodes.get(machine_id)
            if rec is None:
                return None
            ip = rec.ip
            with self._lock:
                self._ips[machine_id] = ip
        return ip

    def describe(self, machine: Machine) -> Machine:
        if machine.tags.get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD:
            # The head's Ray runs on this host via the command runner; its raylet reports the host's address.
            ip = self.head_ip
        else:
            ip = self.player_ip(machine.id)
            if ip is None:
                return machine   # no player (yet, or it died): leave the cloud's IP, no raylet will claim it
        return dataclasses.replace(machine, internal_ip=ip, external_ip=ip)

    def after_terminate(self, machine_ids: list[str]) -> None:
        """Stop the players of these machines (terminated, or vanished from the cloud). Unknown ids are ignored."""
        self.nodes.stop(list(machine_ids))
        with self._lock:
            for mid in machine_ids:
                self._ips.pop(mid, None)

    def leftovers(self) -> list[dict[str, str]]:
        """The live players of this cluster (a player outlives its machine when nothing saw the machine go)."""
        return [{"kind": "player", "name": r.id, "machine_id": r.id, "node_kind": "worker",
                 "state": "running" if r.ready else "starting"}
                for r in self.nodes.list() if r.tags.get(TAG_CLUSTER) == self.cluster_name]

    def close(self) -> None:
        self.nodes.close()

    def command_runner(self, log_prefix: str, node_id: str, auth_config: dict, cluster_name: str,
                       process_runner: Any, use_internal_ip: bool, docker_config: dict | None = None):
        """Every played machine is this host: the provider should use this instead of SSH (e.g. for the head)."""
        return LocalCommandRunner(log_prefix, node_id, self.home, process_runner=process_runner)
