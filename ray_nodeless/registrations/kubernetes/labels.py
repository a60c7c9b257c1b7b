"""Every label, annotation and taint the kubernetes registration puts on Nodes and Ray pods, in one place."""
from __future__ import annotations

import re

# The names and flag forms a kubelet reads too live with the join formats in core (the played kubelet reads them);
# the registration's modules use them as labels.<name>.
from ray_nodeless.core.kube_join import GPU_RESOURCE, MACHINE_ID_VAR, dns_name, labels_flag, taint_flag  # noqa: F401
from ray_nodeless.providers.base import LaunchSpec

# Well-known labels (kubelet sets some itself on a real cluster; we set them at registration so that they are there
# from the first moment and carry the catalog's view of the machine).
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
ARCH = "kubernetes.io/arch"

PREFIX = "ray-nodeless.io"
CLUSTER = f"{PREFIX}/cluster"
NODE_TYPE = f"{PREFIX}/node-type"
MACHINE_ID = f"{PREFIX}/machine-id"
CAPACITY_TYPE = f"{PREFIX}/capacity-type"
RULE = f"{PREFIX}/rule"
JOIN_METHOD = f"{PREFIX}/join-method"
# Annotations (kubelet cannot register annotations: the registration patches them on when it first sees the Node).
PRICE = f"{PREFIX}/hourly-price"
CATALOG = f"{PREFIX}/catalog-id"
# Pod labels beside CLUSTER / NODE_TYPE / MACHINE_ID.
ROLE = f"{PREFIX}/role"          # head | worker

TAINT_KEY = CLUSTER               # ray-nodeless.io/cluster=<cluster>:NoSchedule
TAINT_EFFECT = "NoSchedule"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

# MACHINE_ID_VAR (core/kube_join.py): the placeholder in the join configuration for the machine id, which only the
# booted machine knows (several machines share one launch's user data).

_ARCH = {"x86_64": "amd64", "arm64": "arm64", "aarch64": "arm64"}
_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]")


def label_value(value: str) -> str:
    """A valid label value: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends (others become '-')."""
    v = _VALUE_BAD.sub("-", str(value))[:63].strip("-._")
    return v


def cluster_selector(cluster: str) -> str:
    return f"{CLUSTER}={label_value(cluster)}"


def node_labels(spec: LaunchSpec, cluster: str, machine_id: str | None, method: str = "") -> dict[str, str]:
    """The labels a machine of `spec` registers its Node with. `machine_id` None: the MACHINE_ID_VAR placeholder
    (kubeadm / k3s scripts fill it at boot) or, for eks (declarative NodeConfig), left out: the registration labels the
    Node from its providerID when it first sees it."""
    o = spec.offering
    labels = {
        INSTANCE_TYPE: label_value(o.instance_type.name),
        ZONE: label_value(o.zone),
        REGION: label_value(o.region),
        ARCH: _ARCH.get(o.instance_type.arch, label_value(o.instance_type.arch)),
        CLUSTER: label_value(cluster),
        NODE_TYPE: label_value(spec.node_type),
        CAPACITY_TYPE: label_value(o.capacity),
        RULE: label_value(spec.tags.get("nodeless-rule", "")),
    }
    if method:
        labels[JOIN_METHOD] = method
    if machine_id:
        labels[MACHINE_ID] = machine_id
    return {k: v for k, v in labels.items() if v}


def node_annotations(tags: dict[str, str]) -> dict[str, str]:
    out = {}
    if tags.get("nodeless-hourly-price"):
        out[PRICE] = tags["nodeless-hourly-price"]
    if tags.get("nodeless-catalog"):
        out[CATALOG] = tags["nodeless-catalog"]
    return out


def cluster_taint(cluster: str) -> dict[str, str]:
    return {"key": TAINT_KEY, "value": label_value(cluster), "effect": TAINT_EFFECT}


def machine_id_of_node(node) -> str | None:
    """The machine a Node belongs to: its machine-id label, else its providerID (aws:///zone/i-..., gce://p/z/name)."""
    labels = (node.metadata.labels or {}) if node.metadata else {}
    if labels.get(MACHINE_ID):
        return labels[MACHINE_ID]
    pid = getattr(node.spec, "provider_id", None) if node.spec else None
    if pid and "://" in pid:
        tail = pid.split("://", 1)[1].rstrip("/").rsplit("/", 1)[-1]
        return tail or None
    return None
