"""The two players of played machines (played.py), and `played_backend`, which wraps a backend in the one the
provider block asks for (settings.player_of; the loader parses its section, `ProviderBundle.make_backend` wraps).

- `RayNodePlayer` (`registration: local-player`): for each worker machine the inner backend creates, a local
  `ray start --block` node with the machine's Ray resources and labels and `RAY_CLOUD_INSTANCE_ID=<the cloud
  machine id>` (how autoscaler v2 matches a Ray node to its instance); the player's 127.0.0.N is reported as the
  machine's IP (how v1 matches them).
- `KubeletPlay` (`registration: kubernetes` + `kubernetes.played: true`): each machine's kubelet, played from the
  join user data the registration wrote (kubelet.py): the Node registers and stays Ready, and the Ray pods the real
  scheduler binds to it run as local Ray nodes. With `local_real_kubelet`, the machines of one node type boot a
  REAL kubelet on containerd instead, one at a time (real_kubelet.py: the user data runs unchanged, `kubeadm join`
  and all); the Ray pod then runs in a container of that kubelet.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from ray_nodeless.core.catalog.model import InstanceType, Offering
from ray_nodeless.core.schema import Section, parse_section
from ray_nodeless.errors import BackendError
from ray_nodeless.providers.base import TAG_CLUSTER, LaunchSpec, MachineBackend
from ray_nodeless.providers.local.played import PlayedBackend, Player
from ray_nodeless.providers.local.processes import LocalNodeProcesses
from ray_nodeless.providers.local.real_kubelet import RealKubeletMachine
from ray_nodeless.providers.local.ray_start import instance_env
from ray_nodeless.providers.local.settings import KubeletPlayerSettings, LocalPlayerSettings, default_state_dir
from ray_nodeless.providers.local.slots import default_head_ip

logger = logging.getLogger(__name__)

# A player's environment variable: the kubeconfig the played kubelets act with (a kubelet's own identity may
# create Nodes and Leases; the provider's ServiceAccount may not). Unset: the `kubernetes` block's kubeconfig.
PLAYER_KUBECONFIG_ENV = "RAY_NODELESS_PLAYER_KUBECONFIG"


class RayNodePlayer(Player):
    """Plays every worker machine with a local Ray node; its provider-block keys are `LocalPlayerSettings`."""

    def __init__(self, settings: LocalPlayerSettings, cluster_name: str):
        self.cluster_name = cluster_name
        self.state_dir = Path(settings.player_state_dir or default_state_dir(cluster_name, "-player"))
        self.nodes = LocalNodeProcesses.from_settings(settings, self.state_dir)
        super().__init__(self.state_dir / "home", settings.head_ip or default_head_ip())
        # machine id -> player IP. A player's IP never changes while it lives, so a hit never goes stale; entries go
        # when the player is stopped. Misses read one record file (cheap enough for every listing).
        self._ips: dict[str, str] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_provider(cls, provider_config: dict[str, Any], cluster_name: str) -> "RayNodePlayer":
        """The player of this provider block's machines (its keys checked, errors naming them)."""
        return cls(parse_section(LocalPlayerSettings, provider_config, "provider"), cluster_name)

    def play(self, spec: LaunchSpec, machine_ids: list[str]) -> None:
        """One player per machine, one at a time; the machines that got none are named in the BackendError."""
        failed: dict[str, str] = {}
        for mid in machine_ids:
            if self.nodes.get(mid) is not None:
                continue   # a retried launch: that machine already has its player
            try:
                rec = self.nodes.start(mid, spec.node_type, spec.resources, spec.labels, extra_env=instance_env(spec),
                                       tags=dict(spec.tags), request_token=spec.request_token)
            except BackendError as e:      # a host short of memory too: the next candidate would not fare better
                logger.error("local player for %s failed: %s", mid, e)
                failed[mid] = str(e)
                continue
            with self._lock:
                self._ips[mid] = rec.ip
        if failed:
            raise BackendError(f"local player could not start Ray for {sorted(failed)}: "
                               + "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in sorted(failed.items())),
                               category="LocalPlayerStartFailed")

    def ip(self, machine_id: str) -> str | None:
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

    def stop(self, machine_ids: list[str]) -> None:
        """Stop the players of these machines (waits for them). Unknown ids, and another cluster's players (a
        shared `player_state_dir`), are left alone."""
        mine = [mid for mid in machine_ids
                if (rec := self.nodes.get(mid)) is not None and rec.tags.get(TAG_CLUSTER) == self.cluster_name]
        if mine:
            self.nodes.stop(mine)
        with self._lock:
            for mid in machine_ids:
                self._ips.pop(mid, None)

    def leftovers(self) -> list[dict[str, str]]:
        return [{"kind": self.kind, "name": r.id, "machine_id": r.id, "node_kind": "worker",
                 "state": "running" if r.ready else "starting"}
                for r in self.nodes.list() if r.tags.get(TAG_CLUSTER) == self.cluster_name]

    def close(self) -> None:
        self.nodes.close()


class KubeletPlay(Player):
    """Plays the kubelet of every worker machine (kubelet.py) from its join user data (`spec.boot_script`)."""

    def __init__(self, settings: KubeletPlayerSettings, block: Any, cluster_name: str):
        # The played kubelet reads what a booted machine would: the API server and namespace of the `kubernetes`
        # block (`block`: the registration's parsed KubernetesBlock, handed down by the loader; its own
        # `api_client` reaches the server, so nothing here imports registrations/) and the user data it was given.
        # Imported here: the Kubernetes client is loaded only when kubelets are played.
        from ray_nodeless.providers.local.kubelet import KubeletPlayer
        state_dir = default_state_dir(cluster_name, "-kubelet")
        head_ip = settings.head_ip or default_head_ip()
        super().__init__(state_dir / "home", head_ip)
        gcs = settings.gcs_address_at(head_ip)       # the head the registration points the pods at
        processes = LocalNodeProcesses(
            state_dir, gcs, object_store_memory=settings.local_object_store_memory,
            port_base=settings.local_port_base, start_timeout_s=settings.local_start_timeout_s,
            min_free_memory_mb=settings.local_min_free_memory_mb,
            extra_ray_start_args=settings.local_ray_start_args, prewarm=False)
        self.kubelet = KubeletPlayer(block.api_client(os.environ.get(PLAYER_KUBECONFIG_ENV) or ""),
                                     block.namespace, processes)
        # A real machine's kubelet outlives the autoscaler that launched it; a played one runs in that process. So
        # each played machine's boot (its user data and offering) is kept in `boots/`, with a lock this process
        # holds while it plays the machine (flock: the kernel drops it when the process dies, SIGKILL included),
        # and a later process that lists the machine while nobody holds it plays it on (`adopt`).
        self.boots = state_dir / "boots"
        self._held: dict[str, int] = {}      # machine id -> the fd of its boot lock
        self._boot_lock = threading.Lock()
        real = settings.local_real_kubelet
        self.real_settings = real
        self.real = (RealKubeletMachine(real.workdir, os.path.expanduser(real.node_dir) if real.node_dir else None)
                     if real is not None else None)
        self._real_lock = threading.Lock()

    def _real_machine(self, machine_id: str) -> bool:
        return self.real is not None and self.real.machine_id() == machine_id

    def _claim_real(self, spec: LaunchSpec, machine_id: str) -> bool:
        """Whether this machine boots the real kubelet: its node type's, and the host's one real kubelet is free
        (claimed here, before the boot's thread starts, so two launches cannot both take it)."""
        if self.real is None or self.real_settings is None or spec.node_type != self.real_settings.node_type:
            return False
        with self._real_lock:
            if self.real.machine_id() is not None:
                return False
            self.real.w.mkdir(parents=True, exist_ok=True)
            self.real.machine_file.write_text(machine_id + "\n")
            return True

    def _boot_real(self, machine_id: str, user_data: str) -> None:
        assert self.real is not None and self.real_settings is not None
        try:
            self.real.boot(machine_id, user_data, self.real_settings.boot_timeout_s)
        except Exception:
            # like a VM whose boot failed: it never joins, and the registration's join_timeout_s ends it
            logger.exception("machine %s: the real kubelet did not boot", machine_id)

    def play(self, spec: LaunchSpec, machine_ids: list[str]) -> None:
        """Register each machine's Node (in a thread each: a launch never waits for a join)."""
        for mid in machine_ids:
            if self.kubelet.node_name(mid) is not None or self._real_machine(mid):
                continue   # a retried launch: that machine's kubelet already runs
            if self._claim_real(spec, mid):
                threading.Thread(target=self._boot_real, args=(mid, spec.boot_script), daemon=True,
                                 name=f"real-kubelet-boot-{mid}").start()
                continue
            self._keep_boot(mid, spec.boot_script, spec.offering)
            try:
                self.kubelet.play(mid, spec.boot_script, spec.offering)
            except ValueError as e:      # the user data is no join: a real machine would never become a Node
                raise BackendError(f"machine {mid} cannot be played as a Kubernetes node: {e}",
                                   category="KubeletPlayerFailed") from e

    # ----- boots kept for a later process (adopt) ----------------------------------------------------------------

    def _hold(self, mid: str) -> bool:
        """Take this machine's boot lock (non-blocking); False when another live process plays it."""
        with self._boot_lock:
            if mid in self._held:
                return True
            self.boots.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.boots / f"{mid}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return False
            self._held[mid] = fd
            return True

    def _keep_boot(self, mid: str, user_data: str, offering: Offering) -> None:
        if not self._hold(mid):
            return
        path = self.boots / f"{mid}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"user_data": user_data, "offering": dataclasses.asdict(offering)}))
        tmp.replace(path)

    def adopt(self, machine_ids: list[str]) -> None:
        """Play on the listed machines whose kubelet nobody plays any more (the process that launched them was
        killed): the Node is registered again if it is not there, its heartbeats resume, its bound pods run."""
        for mid in machine_ids:
            if mid in self._held or self._real_machine(mid):
                continue
            path = self.boots / f"{mid}.json"
            if not path.exists() or not self._hold(mid):
                continue
            try:
                boot = json.loads(path.read_text())
                o = dict(boot["offering"])
                offering = Offering(**{**o, "instance_type": InstanceType(**o["instance_type"])})
            except (OSError, ValueError, KeyError, TypeError) as e:
                logger.warning("played kubelet: cannot adopt machine %s (%s)", mid, e)
                continue
            logger.info("played kubelet: adopting machine %s (its player's process is gone)", mid)
            self.kubelet.play(mid, boot["user_data"], offering)

    def _drop_boot(self, mid: str) -> None:
        with self._boot_lock:
            fd = self._held.pop(mid, None)
        for suffix in (".json", ".lock"):
            with contextlib.suppress(OSError):
                (self.boots / f"{mid}{suffix}").unlink()
        if fd is not None:
            os.close(fd)

    def stop(self, machine_ids: list[str]) -> None:
        # The machine is gone, so is its kubelet; stopping its Ray processes waits for them: not on the caller's
        # thread (the autoscaler's update loop).
        for mid in machine_ids:
            if self._real_machine(mid):
                assert self.real is not None
                # Not a daemon: a short-lived process (`ray down`) must not exit with the real machine half stopped.
                threading.Thread(target=self.real.stop, name=f"real-kubelet-stop-{mid}").start()
                continue
            self._drop_boot(mid)
            threading.Thread(target=self.kubelet.forget, args=(mid,), name=f"kubelet-player-forget-{mid}",
                             daemon=True).start()

    def leftovers(self) -> list[dict[str, str]]:
        """The real kubelet's machine while its processes run (the played kubelets keep nothing: their Ray
        processes are listed by the registration's pods)."""
        if self.real is None or not self.real.live():
            return []
        return [{"kind": self.kind, "name": str(self.real.w), "machine_id": self.real.machine_id() or "",
                 "node_kind": "worker", "state": "running"}]

    def close(self) -> None:
        self.kubelet.close(stop_processes=False)


def played_backend(inner: MachineBackend, player_settings: Section, registration_settings: Section,
                   cluster_name: str) -> PlayedBackend:
    """`inner`, wrapped in the player `player_settings` is the section of (settings.PLAYER_SETTINGS): the Ray-node
    player for LocalPlayerSettings, the kubelet player for KubeletPlayerSettings (which plays the Nodes of the
    registration's parsed `kubernetes` block)."""
    if isinstance(player_settings, LocalPlayerSettings):
        return PlayedBackend(inner, RayNodePlayer(player_settings, cluster_name))
    if isinstance(player_settings, KubeletPlayerSettings):
        # The registration's section: providers/ never imports registrations/, so its type is not named here.
        block = registration_settings.kubernetes  # type: ignore[attr-defined]
        return PlayedBackend(inner, KubeletPlay(player_settings, block, cluster_name))
    raise TypeError(f"no player has the settings {type(player_settings).__name__}")
