"""Ray's GCS client (`ray._raylet.GcsClient`) and the protobuf enums of its node table and drain call.

Ray 2.60: `GcsClient(address=...).get_all_node_info(timeout=...)` -> {NodeID: GcsNodeInfo};
`.drain_node(node_id=<hex>, reason=<DrainNodeReason>, reason_message=..., deadline_timestamp_ms=...)` ->
(accepted, rejection message), the call `ray drain-node` and autoscaler v2's RayStopper make.
"""
from __future__ import annotations

from typing import Any

RAY_NAMES = (("ray._raylet", "GcsClient"), ("ray.core.generated.gcs_pb2", "GcsNodeInfo"),
             ("ray.core.generated.gcs_pb2", "NodeSnapshot"), ("ray.core.generated.autoscaler_pb2", "DrainNodeReason"))

# What node_state() answers.
ALIVE = "ALIVE"
DRAINING = "DRAINING"
DEAD = "DEAD"


def gcs_client(address: str) -> Any:
    """A GcsClient of the cluster whose GCS is at `address` (raises Ray's own errors when it cannot connect)."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # Ray 2.60's _raylet.pyi omits it

    return GcsClient(address=address)


def node_infos(address: str, timeout_s: float) -> list[Any]:
    """The node table of the GCS at `address`: GcsNodeInfo protos (instance_id = RAY_CLOUD_INSTANCE_ID)."""
    return list(gcs_client(address).get_all_node_info(timeout=timeout_s).values())


def node_state(info: Any) -> str:
    """ALIVE, DRAINING or DEAD for a GcsNodeInfo."""
    from ray.core.generated import gcs_pb2

    if info.state == gcs_pb2.GcsNodeInfo.DEAD:
        return DEAD
    if info.state_snapshot.state == gcs_pb2.NodeSnapshot.DRAINING:
        return DRAINING
    return ALIVE


def preemption_reason() -> Any:
    """Ray's DrainNodeReason for a cloud preemption: the raylet cannot refuse it."""
    from ray.core.generated import autoscaler_pb2

    return autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION


def idle_reason() -> Any:
    """Ray's DrainNodeReason for removing an idle node: the raylet refuses it while the node runs work."""
    from ray.core.generated import autoscaler_pb2

    return autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_IDLE_TERMINATION
