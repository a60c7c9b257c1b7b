"""Ray's pending demand as the GCS reports it to the autoscaler (`ClusterResourceState`), as plain Python.

Ray 2.60: `GcsClient.get_cluster_status(timeout_s=...)` returns a serialized `GetClusterStatusReply`
(`ray.autoscaler.v2.sdk.get_cluster_status` does the same; `ray status` shows it). Its `cluster_resource_state`
is the GCS's own view, filled from the raylets' resource reports, so it is there under autoscaler v1 as well as
v2; its `autoscaling_state` is autoscaler v2's last report (`pending_instance_requests`, `pending_instances`).
Fields read:
- `node_states[]`: instance_id (RAY_CLOUD_INSTANCE_ID), ray_node_type_name, total/available resources, labels,
  status (DEAD nodes are left out; IDLE ones with their `idle_duration_ms`, how long the node has run nothing);
- `pending_resource_requests[]`: ResourceRequestByCount {request: {resources_bundle, label_selectors}, count};
- `cluster_resource_constraints[]`: `request_resources()` bundles {resource_requests[]: ResourceRequestByCount};
- `pending_gang_resource_requests[]`: placement groups: {requests[], details "<pg id>:<strategy>|<state>"};
  STRICT_SPREAD bundles carry an anti-affinity constraint on the group's label, STRICT_PACK an affinity one.
"""
from __future__ import annotations

from typing import Any

RAY_NAMES = (("ray.core.generated.autoscaler_pb2", "GetClusterStatusReply"),
             ("ray.core.generated.autoscaler_pb2", "NodeStatus"),
             ("ray.core.generated.common_pb2", "LabelSelectorOperator"),
             ("ray._raylet", "GcsClient"), ("ray._private.ray_constants", "LOG_PREFIX_EVENT_SUMMARY"),
             ("ray._private.event.event_logger", "get_event_logger"), ("ray.core.generated.event_pb2", "Event"))

IN, NOT_IN = "in", "!in"


def read_state(client: Any, timeout_s: float) -> dict[str, Any]:
    """{"nodes", "requests", "gangs", "requested"} from the GCS of `client` (a GcsClient): the cluster status
    (`get_cluster_status`, what `ray status` reads), which holds the resource state and, under v2, the autoscaler's
    last report (its instances requested and not yet running, per node type)."""
    from ray.core.generated import autoscaler_pb2

    raw = client.get_cluster_status(timeout_s=timeout_s)
    reply = autoscaler_pb2.GetClusterStatusReply()
    reply.ParseFromString(raw)
    out = state_from_proto(reply.cluster_resource_state)
    out["requested"] = requested_from_proto(reply.autoscaling_state)
    return out


def requested_from_proto(autoscaling_state: Any) -> dict[str, Any]:
    """What autoscaler v2 has asked for and not yet got running: {"types": {node type: count of requests},
    "instances": [(node type, cloud instance id)]} (empty under v1)."""
    types: dict[str, int] = {}
    for r in autoscaling_state.pending_instance_requests:
        types[r.ray_node_type_name] = types.get(r.ray_node_type_name, 0) + int(r.count)
    instances = [(p.ray_node_type_name, p.instance_id) for p in autoscaling_state.pending_instances]
    return {"types": types, "instances": instances}


def state_from_proto(state: Any) -> dict[str, Any]:
    from ray.core.generated import autoscaler_pb2

    dead, idle = autoscaler_pb2.NodeStatus.DEAD, autoscaler_pb2.NodeStatus.IDLE
    nodes = [{"instance_id": n.instance_id, "node_type": n.ray_node_type_name,
              "total": dict(n.total_resources), "available": dict(n.available_resources),
              "labels": {**dict(n.labels), **dict(n.dynamic_labels)},
              "idle_s": n.idle_duration_ms / 1000 if n.status == idle else None,
              "draining": n.status == autoscaler_pb2.NodeStatus.DRAINING}
             for n in state.node_states if n.status != dead]
    requests = [dict(_request(r.request), count=int(r.count)) for r in state.pending_resource_requests]
    gangs: list[dict[str, Any]] = []
    for g in state.pending_gang_resource_requests:
        gid = (g.details or "").split(":", 1)[0]
        bundles = [_request(r) for r in g.requests]
        if not gid:
            gid = next((b["group"] for b in bundles if b["group"]), "")
        gangs.append({"id": gid or f"gang-{len(gangs)}", "details": g.details, "bundles": bundles})
    # `ray.autoscaler.sdk.request_resources(...)`: bundles the cluster must be able to hold, used or not.
    constraints = [dict(_request(r.request), count=int(r.count))
                   for c in state.cluster_resource_constraints for r in c.resource_requests]
    return {"nodes": nodes, "requests": requests, "gangs": gangs, "constraints": constraints}


def _request(r: Any) -> dict[str, Any]:
    from ray.core.generated import common_pb2

    ops = {common_pb2.LabelSelectorOperator.LABEL_OPERATOR_IN: IN,
           common_pb2.LabelSelectorOperator.LABEL_OPERATOR_NOT_IN: NOT_IN}
    selectors = []
    for s in r.label_selectors:
        selectors.append([(c.label_key, ops.get(c.operator, "?"), tuple(c.label_values))
                          for c in s.label_constraints])
    spread = packed = False
    group = ""
    for c in r.placement_constraints:
        if c.HasField("anti_affinity"):
            spread, group = True, c.anti_affinity.label_value
        if c.HasField("affinity"):
            packed, group = True, c.affinity.label_value
    return {"resources": dict(r.resources_bundle), "selectors": selectors, "spread": spread, "packed": packed,
            "group": group}


def autoscaler_event_sink(logs_dir: str | None) -> Any:
    """A callable(message) that puts one line where Ray's autoscaler events go, so drivers print it as
    `(autoscaler +Ns) ...` and it is in the session's logs: v2's AUTOSCALER event log (`get_event_logger`, the
    file the log monitor publishes under v2), and the monitor log with Ray's event-summary prefix (what the log
    monitor publishes under v1). Never raises."""
    import logging

    from ray._private import ray_constants

    prefix = ray_constants.LOG_PREFIX_EVENT_SUMMARY
    monitor_logger = logging.getLogger("ray.autoscaler._private.monitor")
    event_logger = None
    if logs_dir:
        try:
            from ray._private.event.event_logger import get_event_logger
            from ray.core.generated import event_pb2

            event_logger = get_event_logger(event_pb2.Event.SourceType.AUTOSCALER, logs_dir)
        except Exception:     # no event log here: the monitor log still has it
            event_logger = None

    def sink(message: str) -> None:
        try:
            monitor_logger.warning("%s%s", prefix, message)
            if event_logger is not None:
                event_logger.warning(message)
        except Exception:
            pass

    return sink
