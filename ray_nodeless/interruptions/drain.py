"""Draining a Ray node through Ray's own drain API (GCS `DrainNode`), the call autoscaler v2 makes itself.

Ray 2.60: `GcsClient(address=...).drain_node(node_id=<hex>, reason=<DrainNodeReason>, reason_message=...,
deadline_timestamp_ms=...) -> (accepted, rejection message)` (ray_compat/gcs.py); `ray drain-node` and
autoscaler v2's RayStopper call exactly this. With `DRAIN_NODE_REASON_PREEMPTION` the raylet cannot refuse: it stops
taking
new work at once (the scheduler places new and retried tasks elsewhere), lets running tasks go on until the machine
dies, and exits by itself if it becomes idle first. The deadline is what Ray reports to users ("the node will be
preempted at ..."), so we pass the cloud's own.

A Ray node is found in the GCS node table by the cloud instance id its `ray start` was given
(`RAY_CLOUD_INSTANCE_ID`, which our boot script and Ray's installer export: GcsNodeInfo.instance_id), else by its
IP (`node_manager_address`, the machine's private IP).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable

from ray_nodeless.errors import DrainError
from ray_nodeless.interruptions.notices import Notice
from ray_nodeless.ray_compat import gcs

logger = logging.getLogger(__name__)

# GCS node-table reads: long enough for a loaded head, short enough that a dead GCS does not stall the caller.
GCS_TIMEOUT_S = 10

NODE_ALIVE = gcs.ALIVE
NODE_DRAINING = gcs.DRAINING
NODE_DEAD = gcs.DEAD


@dataclass(frozen=True)
class RayNode:
    node_id: str            # hex
    ip: str
    instance_id: str
    state: str              # NODE_ALIVE | NODE_DRAINING | NODE_DEAD
    is_head: bool


def _node(info: Any) -> RayNode:
    return RayNode(node_id=info.node_id.hex(), ip=info.node_manager_address, instance_id=info.instance_id,
                   state=gcs.node_state(info), is_head=bool(info.is_head_node))


def match_node(nodes: Iterable[RayNode], instance_id: str | None = None, ip: str | None = None) -> RayNode | None:
    """The live node of this machine: by instance id first (exact, whatever the IPs), else by IP. Several live
    nodes on one IP is ambiguous (a test host, not a VM): an error, never a guess."""
    live = [n for n in nodes if n.state != NODE_DEAD]
    if instance_id:
        by_id = [n for n in live if n.instance_id == instance_id]
        if by_id:
            return by_id[0]
    if ip:
        by_ip = [n for n in live if n.ip == ip]
        if len(by_ip) > 1:
            raise DrainError(f"{len(by_ip)} live Ray nodes have IP {ip}; pass the instance id to pick one")
        if by_ip:
            return by_ip[0]
    return None


class RayDrainer:
    """A GCS client for one cluster: read the node table, drain a node for preemption."""

    def __init__(self, gcs_address: str):
        self.gcs_address = gcs_address
        self._client: Any = None

    def _gcs(self) -> Any:
        if self._client is None:
            if not self.gcs_address:
                raise DrainError("no GCS address to drain through")
            try:
                self._client = gcs.gcs_client(self.gcs_address)
            except Exception as e:    # RpcError / RaySystemError: GCS not reachable (yet)
                raise DrainError(f"cannot reach Ray's GCS at {self.gcs_address}: {e}") from None
        return self._client

    def nodes(self) -> list[RayNode]:
        try:
            infos = self._gcs().get_all_node_info(timeout=GCS_TIMEOUT_S)
        except DrainError:
            raise
        except Exception as e:
            raise DrainError(f"reading the node table of {self.gcs_address} failed: {e}") from None
        return [_node(i) for i in infos.values()]

    def find(self, instance_id: str | None = None, ip: str | None = None) -> RayNode | None:
        return match_node(self.nodes(), instance_id=instance_id, ip=ip)

    def drain(self, node: RayNode, notice: Notice) -> None:
        """Drain `node` for preemption with the notice's deadline. Raises DrainError if GCS refuses or fails."""
        try:
            accepted, why = self._gcs().drain_node(
                node_id=node.node_id,
                reason=gcs.preemption_reason(),
                reason_message=notice.describe(),
                deadline_timestamp_ms=notice.deadline_ms,
            )
        except DrainError:
            raise
        except Exception as e:
            raise DrainError(f"draining Ray node {node.node_id} ({node.ip}) failed: {e}") from None
        if not accepted:
            raise DrainError(f"GCS rejected draining Ray node {node.node_id} ({node.ip}): {why}")
        logger.warning("drained Ray node %s (%s, instance %s): %s", node.node_id, node.ip, node.instance_id or "-",
                       notice.describe())

    def drain_idle(self, node: RayNode, why: str) -> tuple[bool, str]:
        """Ask Ray to drain `node` as idle (launch/reversion.py): Ray accepts only when the node runs nothing and
        then schedules nothing new on it; a busy node is refused (accepted False, Ray's reason), never preempted.
        Raises DrainError when the GCS cannot be asked."""
        try:
            accepted, rejection = self._gcs().drain_node(node_id=node.node_id, reason=gcs.idle_reason(),
                                                         reason_message=why, deadline_timestamp_ms=0)
        except DrainError:
            raise
        except Exception as e:
            raise DrainError(f"draining idle Ray node {node.node_id} ({node.ip}) failed: {e}") from None
        return bool(accepted), str(rejection or "")
