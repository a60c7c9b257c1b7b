"""The provider-block keys of the local backend and of played machines (played.py), declared once (see
core/schema.py), and which player a provider block asks for (`player_of`).

    provider:
      cloud: local
      gcs_address: 127.0.0.1:6379        # the head's GCS: every node started here joins it
      head_ip: 192.168.1.5               # the address the head's raylet reports (default: Ray's own resolution)
      state_dir: /tmp/ray-nodeless/<cluster>                   # local backend: records, logs, faults.json
      player_state_dir: /tmp/ray-nodeless/<cluster>-player     # registration: local-player: the same, its own
      local_faults:                      # injected launch errors (also read from <state_dir>/faults.json)
        - {instance_type: p3.2xlarge, zone: us-west-2a, capacity: spot, node_type: gpu,
           code: InsufficientInstanceCapacity, message: "...", times: 1}
      local_object_store_memory: 83886080   # bytes per node
      local_port_base: 20000             # first port of the first node's port block
      local_start_timeout_s: 90          # how long one node may take to report "Ray runtime started"
      local_min_free_memory_mb: 800      # below this much available host memory a launch is a capacity error
      local_ray_start_args: []           # extra `ray start` arguments for every node
      local_prewarm: true                # keep a Python with Ray's CLI imported, ready for the next start
      local_real_kubelet: {node_type: cpu_worker, workdir: /tmp/rnk-1}   # kubernetes.played: a REAL kubelet
                                         # for that node type's machines (RealKubeletSettings)
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import ConfigDict, Field

from ray_nodeless.core.requirements import REQUIREMENT_KEYS
from ray_nodeless.core.schema import Section, suggest_key
from ray_nodeless.core.settings import DEFAULT_GCS_PORT, HeadAddress
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.base import BackendConfig
from ray_nodeless.providers.local.slots import DEFAULT_PORT_BASE, MAX_PORT_BASE, MIN_PORT_BASE

# Ray's default head on this host: what `ray start --head` listens on without --port.
DEFAULT_GCS_ADDRESS = f"127.0.0.1:{DEFAULT_GCS_PORT}"
# Ray refuses an object store below 75 MiB.
MIN_OBJECT_STORE_MEMORY = 75 * 1024 * 1024
# Just above Ray's minimum: keeps each node's /dev/shm footprint small (nodes here emulate VMs, not store data).
DEFAULT_OBJECT_STORE_MEMORY = 80 * 1024 * 1024
# A worker's `ray start` takes a few seconds; starts are serialised machine-wide, so on a loaded 2-core host one
# may wait behind others. A node that has not started by then is killed and reported with its log tail.
DEFAULT_START_TIMEOUT_S = 90.0
# Below this much available memory a new node (~500 MB resident when idle) would push the host towards the OOM
# killer: refuse it as a capacity shortage instead, exactly like a cloud without capacity.
DEFAULT_MIN_FREE_MEMORY_MB = 800
# The error an injected fault raises when it names no code: EC2's stockout code, which the launcher treats as a
# capacity miss of one offering.
DEFAULT_FAULT_CODE = "InsufficientInstanceCapacity"



# Under the temp dir, named so that it is not importable: a directory "ray_nodeless" in /tmp would shadow the
# package for any script run from /tmp (its directory comes first on sys.path).
STATE_ROOT = "ray-nodeless"


def default_state_dir(cluster_name: str, suffix: str = "") -> Path:
    return Path(tempfile.gettempdir()) / STATE_ROOT / f"{cluster_name}{suffix}"


class FaultSpec(Section):
    """One injected launch error. Omitted match fields are wildcards; `times` omitted (or null) fails every
    matching launch, otherwise that many launches, after which the fault is spent."""

    # A misspelled match field would silently become a wildcard and fail every launch: unknown keys are errors.
    model_config = ConfigDict(extra="forbid")

    instance_type: str | None = None
    zone: str | None = None
    capacity: Literal["spot", "on-demand"] | None = None
    node_type: str | None = None
    code: str | None = None             # the CapacityError category; None: DEFAULT_FAULT_CODE
    message: str | None = None
    times: int | None = Field(None, ge=0)


class NodeProcessSettings(HeadAddress):
    """What every local Ray node process is started with (the local backend's workers and the local player's);
    `head_ip` / `gcs_address` are the core's declaration (HeadAddress). Without `gcs_address` the local backend's
    nodes join DEFAULT_GCS_ADDRESS (`local_gcs_address`), a played kubelet's pods `<head_ip>:6379`."""

    local_object_store_memory: int = Field(DEFAULT_OBJECT_STORE_MEMORY, ge=MIN_OBJECT_STORE_MEMORY)
    local_port_base: int = Field(DEFAULT_PORT_BASE, ge=MIN_PORT_BASE, le=MAX_PORT_BASE)
    local_start_timeout_s: float = Field(DEFAULT_START_TIMEOUT_S, gt=0)
    local_min_free_memory_mb: int = Field(DEFAULT_MIN_FREE_MEMORY_MB, ge=0)
    local_ray_start_args: list[str] = Field(default_factory=list)
    local_prewarm: bool = True

    def local_gcs_address(self) -> str:
        """The GCS the local backend's and the Ray-node player's nodes join: `gcs_address`, else Ray's default head
        on this host (DEFAULT_GCS_ADDRESS)."""
        return self.gcs_address or DEFAULT_GCS_ADDRESS


class LocalSettings(NodeProcessSettings):
    """The local backend's provider-block keys."""

    state_dir: str | None = Field(None, min_length=1)        # None: default_state_dir(cluster_name)
    local_faults: list[FaultSpec] = Field(default_factory=list)


class LocalPlayerSettings(NodeProcessSettings):
    """The keys of machines played by Ray nodes (`registration: local-player`, PLAYER_RAY_NODE)."""

    player_state_dir: str | None = Field(None, min_length=1)  # None: default_state_dir(cluster_name, "-player")


class RealKubeletSettings(Section):
    """`local_real_kubelet`: machines of `node_type` boot a REAL kubelet on containerd on this host
    (real_kubelet.py), one at a time (some of its paths are host-wide); the others stay played.

        local_real_kubelet:
          node_type: cpu_worker          # whose machines get the real kubelet
          workdir: /tmp/rnk-1            # containerd's and the kubelet's state (short: a unix socket lives there)
          node_dir: ~/.cache/ray-nodeless/k8s-node    # scripts/k8s/build_node.sh's output (the default)
          boot_timeout_s: 180            # containerd up + kubeadm configured the kubelet, else the boot fails
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    node_type: str = Field(min_length=1)
    workdir: str = Field(min_length=1, max_length=80)      # + "/run/containerd.sock.ttrpc" within a socket's 108
    node_dir: str | None = Field(None, min_length=1)
    boot_timeout_s: float = Field(180.0, gt=0)


class KubeletPlayerSettings(NodeProcessSettings):
    """The keys of machines whose kubelet is played (`registration: kubernetes` + `kubernetes.played: true`,
    PLAYER_KUBELET): the Ray processes of their pods. Records live in default_state_dir(cluster_name, "-kubelet");
    without `gcs_address` they join `<head_ip>:6379`, the head the registration points the pods at.
    `local_real_kubelet` (RealKubeletSettings): one node type's machines run a real kubelet instead."""

    local_real_kubelet: RealKubeletSettings | None = None


# Which local player stands in for what would run on each machine (played.py).
PLAYER_RAY_NODE = "ray-node"     # the VM's own Ray node: `ray start` with the machine's id
PLAYER_KUBELET = "kubelet"       # the VM's kubelet: registers the Node from the join user data, runs its Ray pods
PLAYER_SETTINGS: dict[str, type[NodeProcessSettings]] = {
    PLAYER_RAY_NODE: LocalPlayerSettings,
    PLAYER_KUBELET: KubeletPlayerSettings,
}


def player_of(provider: Mapping[str, Any]) -> str | None:
    """The player that plays this provider block's machines, None when they are real. Said by the keys the
    cluster YAMLs have always used: `registration: local-player` (a cloud backend's machines, each played by a
    local Ray node), `registration: kubernetes` with `kubernetes.played: true` (each machine's kubelet played).
    A malformed `kubernetes` block plays nothing here: the registration's own checks name the key."""
    registration = provider.get("registration", "vm")
    if registration == "local-player":
        return PLAYER_RAY_NODE
    block = provider.get("kubernetes")
    if registration == "kubernetes" and isinstance(block, Mapping) and block.get("played") is True:
        return PLAYER_KUBELET
    return None


class LocalConfig(BackendConfig):
    """The local backend's config-time half (no node_config keys of its own; see providers/base.py)."""

    cloud = "local"
    settings_model = LocalSettings

    @classmethod
    def check_node_config(cls, settings: Section, node_type: str, node_config: dict[str, Any], key: str) -> None:
        """The local backend reads no launch key of node_config, so one there is ignored; but one that is a near
        miss of a constraint key (`min_memory`, `familes`) is a typo that would silently constrain nothing."""
        for k in sorted(node_config, key=str):
            # Only snake_case keys: a cloud's launch key (`InstanceType`) copied from a cloud YAML stays ignored.
            close = suggest_key(str(k), REQUIREMENT_KEYS) if str(k) == str(k).lower() else None
            if close:
                raise ConfigError(f"{key}.{k}", f"unknown key {k!r}; did you mean {close!r}?")
