"""Read-only Kubernetes view for `ray-nodeless status`: each machine's Node, its Ready condition, its Ray pod and
the pod's phase, from one listing of the cluster's Nodes and pods (no watch, no housekeeping: status changes
nothing)."""
from __future__ import annotations

from typing import Any, Iterable

from kubernetes import client

from ray_nodeless.registrations.kubernetes import labels as L
from ray_nodeless.registrations.kubernetes.settings import KubernetesSettings


def machine_status(settings: KubernetesSettings, cluster_name: str,
                   machine_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """machine id -> {k8s_node, k8s_ready, pod, pod_phase} (None where there is none); `settings` as the loader
    parsed them."""
    k = settings.kubernetes
    api = k.api_client()
    try:
        core = client.CoreV1Api(api)
        selector = L.cluster_selector(cluster_name)
        nodes = core.list_node(label_selector=selector).items
        pods = core.list_namespaced_pod(k.namespace, label_selector=selector).items
    finally:
        api.close()
    out = {}
    for mid in machine_ids:
        value = L.label_value(mid)
        node = next((n for n in nodes if L.machine_id_of_node(n) == mid), None)
        pod = next((p for p in pods if (p.metadata.labels or {}).get(L.MACHINE_ID) == value), None)
        ready = None
        if node is not None:
            ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
        out[mid] = {"k8s_node": node.metadata.name if node is not None else None, "k8s_ready": ready,
                    "pod": pod.metadata.name if pod is not None else None,
                    "pod_phase": pod.status.phase if pod is not None and pod.status else None}
    return out
