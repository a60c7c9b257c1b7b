"""The small interface between the provider (Ray's adapter + the planner) and a machine backend.

Modelled on Karpenter's CloudProvider: a backend launches, lists, tags and terminates machines and knows nothing of
rules or prices. The provider decides *what* to launch (`LaunchSpec.offering`, from the planner) and walks the
ordered candidates when a backend raises `CapacityError`.

Contract every backend keeps (the tests of each backend check it):
- `launch` sets every tag in `spec.tags` at creation time, so no machine ever exists untagged; it is idempotent on
  `spec.request_token` (a retried call with the same token never creates a second machine); it raises
  `CapacityError` (category = the cloud's error code) for a capacity or quota shortage of that offering,
  `TransientBackendError` when throttling outlasts its retries, and `BackendError` for anything else.
  It never leaves a machine behind when it raises.
- `list_machines` returns only machines tagged `ray-cluster-name == cluster_name` that are not terminated, in one
  (paginated) listing call; it may raise `TransientBackendError`.
- `terminate` is one batched call; ids that are gone are ignored; ids not tagged as this cluster's are never touched.
"""
from __future__ import annotations

import abc
import logging
from dataclasses import dataclass, field
from typing import Any

from ray_nodeless.catalog import Offering

logger = logging.getLogger(__name__)

# Tags (AWS tags / GCE labels / local metadata) that ray_nodeless sets on every machine, beside Ray's own
# (`ray-node-type`, `ray-user-node-type`, `ray-node-name`, `ray-node-status`, `ray-launch-config`).
TAG_CLUSTER = "ray-cluster-name"
TAG_INSTANCE_TYPE = "nodeless-instance-type"
TAG_ZONE = "nodeless-zone"
TAG_CAPACITY = "nodeless-capacity"
TAG_PRICE = "nodeless-hourly-price"
TAG_RULE = "nodeless-rule"
TAG_CATALOG = "nodeless-catalog"
DECISION_TAGS = (TAG_INSTANCE_TYPE, TAG_ZONE, TAG_CAPACITY, TAG_PRICE, TAG_RULE, TAG_CATALOG)

MACHINE_PENDING = "pending"
MACHINE_RUNNING = "running"


@dataclass
class LaunchSpec:
    """One launch attempt of `count` machines of one offering."""

    cluster_name: str
    node_type: str                      # the Ray node type name (ray-user-node-type)
    offering: Offering
    count: int
    tags: dict[str, str]                # Ray tags + ray-cluster-name + decision tags; set at creation
    node_config: dict[str, Any]         # backend keys of node_config (ray_nodeless requirement keys removed)
    request_token: str                  # idempotency key: ClientToken (AWS) / requestId (GCP)
    resources: dict[str, float] = field(default_factory=dict)   # Ray logical resources of the node
    labels: dict[str, str] = field(default_factory=dict)
    is_head: bool = False
    # With `disable_node_updaters: true` on a cloud: the script the machine runs at boot to join Ray (EC2 UserData,
    # GCE startup-script). Empty otherwise. A backend that cannot run it must say so (ConfigError).
    boot_script: str = ""


@dataclass
class Machine:
    """A machine as a backend lists it."""

    id: str
    tags: dict[str, str]
    state: str = MACHINE_RUNNING        # MACHINE_PENDING | MACHINE_RUNNING; terminated machines are not listed
    internal_ip: str | None = None
    external_ip: str | None = None
    launched_at: float = 0.0            # epoch seconds


class MachineBackend(abc.ABC):
    """A place where machines run: local processes, EC2, Compute Engine."""

    cloud: str = ""

    def __init__(self, provider_config: dict[str, Any], cluster_name: str):
        self.provider_config = provider_config
        self.cluster_name = cluster_name

    @abc.abstractmethod
    def launch(self, spec: LaunchSpec) -> list[str]:
        """Create `spec.count` machines of `spec.offering`; return their ids."""

    @abc.abstractmethod
    def list_machines(self) -> list[Machine]:
        """Every non-terminated machine of this cluster, in one listing."""

    @abc.abstractmethod
    def terminate(self, machine_ids: list[str]) -> None:
        """Terminate these machines in one batched call."""

    def set_tags(self, machine_id: str, tags: dict[str, str]) -> None:
        """Merge `tags` into the machine's tags. Backends that cannot store tags after launch may no-op."""

    def validate_node_config(self, node_type: str, node_config: dict[str, Any], key: str) -> None:
        """Raise ConfigError (naming `key`.<field>) for backend keys of node_config that cannot work."""

    def requirement_overrides(self, node_config: dict[str, Any]) -> dict[str, Any]:
        """Requirement keys implied by backend keys, e.g. AWS `InstanceType: x` -> `{"instance_types": [x]}`."""
        return {}

    def command_runner(self, log_prefix: str, node_id: str, auth_config: dict, cluster_name: str,
                       process_runner: Any, use_internal_ip: bool, docker_config: dict | None = None):
        """A Ray CommandRunnerInterface for this machine, or None to use Ray's SSH runner."""
        return None

    def close(self) -> None:
        """Release clients and threads. Machines keep running."""


class Registration(abc.ABC):
    """How a machine joins the Ray cluster, composed with any backend (`provider.registration`).

    `vm` (BareVM): the machine runs Ray itself. `kubernetes`: the machine joins a Kubernetes cluster as a node.
    `local-player`: every machine a backend launches is *played* by a local `ray start` process carrying its id,
    so the real cloud control-plane code (EC2 under moto, GCE under a fake server) drives a real Ray cluster.
    """

    name: str = ""

    def prepare(self, spec: LaunchSpec) -> LaunchSpec:
        """Adjust a launch before it reaches the backend (e.g. add a join script to user data)."""
        return spec

    def after_launch(self, spec: LaunchSpec, machine_ids: list[str]) -> None:
        """Called once the backend has created the machines."""

    def describe(self, machine: Machine) -> Machine:
        """Adjust a listed machine (e.g. the IP Ray sees). Must be cheap: called for every machine per listing."""
        return machine

    def after_terminate(self, machine_ids: list[str]) -> None:
        """Called after the backend has terminated the machines."""

    def close(self) -> None:
        """Release what the registration holds."""


class BareVM(Registration):
    """The machine runs Ray directly (Ray's updater over SSH, or user data / startup script)."""

    name = "vm"
