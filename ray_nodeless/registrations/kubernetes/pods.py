"""The Ray pod of one machine: the user's `pod_template` (like a KubeRay group's template) bound to that machine's
Node by a nodeSelector on the machine-id label, tolerating the cluster's taint, sized from the Node's allocatable."""
from __future__ import annotations

import copy
import json
from decimal import Decimal
from typing import Any, Mapping

from kubernetes.utils import parse_quantity

from ray_nodeless.registrations.kubernetes import labels as L

DEFAULT_CONTAINER = "ray"
DEFAULT_START = "ray start --address=$(RAY_GCS_ADDRESS) --block"
MIN_CPU = Decimal("0.1")
MIN_MEMORY = Decimal(256 * 2**20)


def default_image() -> str:
    try:
        import ray
        return f"rayproject/ray:{ray.__version__}"
    except Exception:  # pragma: no cover
        return "rayproject/ray:latest"


def template_for(default: Mapping[str, Any], by_type: Mapping[str, Mapping[str, Any]],
                 node_type: str) -> Mapping[str, Any]:
    """The pod template of a node type: its own (`pod_templates`, one per KubeRay worker group), else `pod_template`."""
    return by_type.get(node_type) or default


def pod_name(cluster: str, machine_id: str) -> str:
    return f"ray-{L.dns_name(cluster)}-{L.dns_name(machine_id)}"[:253].rstrip("-")


def _cpu(q: Decimal) -> str:
    return f"{int(q * 1000)}m"


def size_resources(allocatable: Mapping[str, str], reserve_cpu: str, reserve_memory: str) -> dict[str, dict[str, str]]:
    """requests/limits of the Ray container: all the Node offers, less what DaemonSets get (requests); limits are the
    allocatable itself; GPUs (an extended resource: requests == limits) all of them."""
    cpu = parse_quantity(allocatable.get("cpu", "0"))
    mem = parse_quantity(allocatable.get("memory", "0"))
    req_cpu = max(MIN_CPU, cpu - parse_quantity(reserve_cpu)) if cpu else MIN_CPU
    req_mem = max(MIN_MEMORY, mem - parse_quantity(reserve_memory)) if mem else MIN_MEMORY
    requests = {"cpu": _cpu(min(req_cpu, cpu) if cpu else req_cpu),
                "memory": str(int(min(req_mem, mem) if mem else req_mem))}
    limits = {}
    if cpu:
        limits["cpu"] = _cpu(cpu)
    if mem:
        limits["memory"] = str(int(mem))
    gpus = int(parse_quantity(allocatable.get(L.GPU_RESOURCE, "0")))
    if gpus:
        requests[L.GPU_RESOURCE] = limits[L.GPU_RESOURCE] = str(gpus)
    return {"requests": requests, "limits": limits}


def ray_pod(template: Mapping[str, Any], *, cluster: str, namespace: str, machine_id: str, node_type: str,
            is_head: bool, instance_type: str, allocatable: Mapping[str, str], reserve_cpu: str, reserve_memory: str,
            grace_s: int, gcs_address: str, ray_resources: Mapping[str, float], ray_labels: Mapping[str, str]) -> dict:
    """The Ray pod manifest (a dict, as the API takes it)."""
    t = copy.deepcopy(dict(template or {}))
    meta = dict(t.get("metadata") or {})
    spec = dict(t.get("spec") or {})
    labels = dict(meta.get("labels") or {})
    labels.update({L.CLUSTER: L.label_value(cluster), L.MACHINE_ID: L.label_value(machine_id),
                   L.NODE_TYPE: L.label_value(node_type), L.ROLE: "head" if is_head else "worker"})
    meta.update(name=pod_name(cluster, machine_id), namespace=namespace, labels=labels)
    meta.pop("generateName", None)
    spec["nodeSelector"] = {**dict(spec.get("nodeSelector") or {}), L.MACHINE_ID: L.label_value(machine_id)}
    taint = L.cluster_taint(cluster)
    spec["tolerations"] = list(spec.get("tolerations") or []) + [
        {"key": taint["key"], "operator": "Equal", "value": taint["value"], "effect": taint["effect"]}]
    spec.setdefault("restartPolicy", "Never")      # a Ray node that exits is a machine to end, not to restart
    spec["terminationGracePeriodSeconds"] = grace_s
    containers = [dict(c) for c in (spec.get("containers") or [])]
    if not containers:
        containers = [{"name": DEFAULT_CONTAINER, "image": default_image()}]
    ray = containers[0]
    ray.setdefault("name", DEFAULT_CONTAINER)
    ray.setdefault("image", default_image())
    if not ray.get("command") and not ray.get("args"):
        ray["command"] = ["/bin/bash", "-lc", DEFAULT_START]
    resources = {k: float(v) for k, v in sorted(ray_resources.items()) if k != "object_store_memory"}
    ours = {
        "RAY_CLOUD_INSTANCE_ID": machine_id,           # how autoscaler v2 matches the Ray node to its machine
        "RAY_NODE_TYPE_NAME": node_type,
        "RAY_CLOUD_INSTANCE_TYPE_NAME": instance_type,
        "RAY_GCS_ADDRESS": gcs_address,
        "RAY_OVERRIDE_RESOURCES": json.dumps(resources, sort_keys=True),
    }
    if ray_labels:
        ours["RAY_OVERRIDE_LABELS"] = json.dumps(dict(ray_labels), sort_keys=True)
    env = [e for e in (ray.get("env") or []) if e.get("name") not in ours]
    ray["env"] = env + [{"name": k, "value": v} for k, v in ours.items()]
    ray["resources"] = size_resources(allocatable, reserve_cpu, reserve_memory)
    containers[0] = ray
    spec["containers"] = containers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
