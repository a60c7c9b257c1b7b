"""Node labels whose value follows from a machine's instance type, and the catalog facts they are resolved against.

Karpenter, GKE and NVIDIA's GPU feature discovery label a Node with facts of its instance type (category,
generation, size, vCPUs, memory, GPU count and memory, accelerators): a requirement on such a label names machines
only indirectly, so scheduling keeps exactly the catalog's types whose Node would carry a matching value
(CATALOG_LABELS, resolved against the `CatalogFacts` the caller passes: this module reads no catalog). Pure: the
bottom of kuberay/'s scheduling modules (catalog_labels <- constraints <- labels <- scheduling).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ray_nodeless.core.catalog.model import InstanceType

if TYPE_CHECKING:
    from ray_nodeless.core.catalog import Catalog


@dataclass(frozen=True)
class CatalogFacts:
    """What group_rules needs of the catalog to resolve labels that name machines indirectly (Karpenter's category,
    generation, size, vCPUs, memory, GPU count / memory; GCE types with attached GPUs; NotIn zones; the region a
    group requires): the catalog cloud (a local backend's `simulate_cloud`), the region, the instance types the
    catalog offers there (at least one offering in the region) and the region's zones. The caller builds it from
    the catalog it plans with (convert: the one it prices with; the bridge and `plan`: kuberay/bridge.py
    `catalog_and_facts`): the scheduling modules read no catalog themselves."""

    cloud: str
    region: str
    types: tuple[InstanceType, ...]
    zones: tuple[str, ...]

    @classmethod
    def of(cls, catalog: "Catalog", cloud: str, region: str) -> "CatalogFacts":
        r = catalog.region(cloud, region)
        offered = {r.types[i] for i in set(r.type_ids)}       # the region's rows index the cloud's whole table
        return cls(cloud, region, tuple(sorted(offered, key=lambda t: t.name)), tuple(r.zones))


# Karpenter's instance category and generation, parsed from the instance type's name as Karpenter's AWS provider
# does (pkg/providers/instancetype/types.go, `instanceTypeScheme`): the leading letters are the category, an
# optional `-<n>tb` (the u-6tb1 high-memory types) is skipped, the digits after are the generation; `m5.large` ->
# m / 5, `c7i-flex.large` -> c / 7, `u-6tb1.metal` -> u / 1, `p6-b200.48xlarge` -> p / 6, `inf2.xlarge` -> inf / 2.
# A name that does not match (no generation digit) has neither label, as on Karpenter's nodes.
_KARPENTER_NAME = re.compile(r"^([a-z]+)(-[0-9]+tb)?([0-9]+).*\.")


def karpenter_category_generation(name: str) -> tuple[str, int] | None:
    """(category, generation) of an AWS instance type name, as Karpenter labels its node; None when it has none."""
    m = _KARPENTER_NAME.match(name)
    return (m.group(1), int(m.group(3))) if m else None


def _kebab(text: str) -> str:
    """Karpenter's lowerKabobCase: `Inferentia2` -> `inferentia2`, `Qualcomm AI100` -> `qualcomm-ai100`."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _whole(x: float) -> str | None:
    return str(int(x)) if float(x).is_integer() else None


def _mib(gib: float) -> str:
    return str(int(round(gib * 1024)))


def _cg(t: InstanceType, part: int) -> str | None:
    cg = karpenter_category_generation(t.name)
    return None if cg is None else str(cg[part])


def _name_part(t: InstanceType, part: int) -> str | None:
    parts = t.name.split(".")
    return parts[part] if len(parts) == 2 else None


def _gpu_memory_mib(t: InstanceType) -> str | None:
    # the catalog holds the machine's total GPU memory; Karpenter's and GFD's labels are one GPU's
    return _mib(t.gpu_memory_gib / t.gpu_count) if t.gpu_count and t.gpu_memory_gib else None


def _gpu_count(t: InstanceType) -> str | None:
    return str(t.gpu_count) if t.gpu_count else None


@dataclass(frozen=True)
class CatalogLabel:
    """A node label whose value follows from the machine's instance type in the catalog: `value` is the label's
    value on the Node of a machine of that type (None: the Node has no such label), `numeric` whether `Gt` / `Lt`
    apply (Kubernetes compares the value as an integer), `family` whether it is a family's (every type of a family
    has the same value: a selection on it names families, as `instance-family` does)."""

    value: Callable[[InstanceType], str | None]
    numeric: bool
    family: bool = False


# Resolved against the region's instance types (CatalogFacts): a requirement on one of these keeps the machines
# whose type gives the label a value that satisfies it (docs/kuberay.md, "KubeRay manifests"). Values as Karpenter
# sets them (pkg/providers/instancetype/types.go computeRequirements), GKE (gke-accelerator-count: the GPUs of a GPU
# node) and NVIDIA GPU feature discovery (gpu.count, gpu.memory in MiB per GPU).
CATALOG_LABELS: dict[str, CatalogLabel] = {
    "karpenter.k8s.aws/instance-category": CatalogLabel(lambda t: _cg(t, 0), False, family=True),
    "karpenter.k8s.aws/instance-generation": CatalogLabel(lambda t: _cg(t, 1), True, family=True),
    "karpenter.k8s.aws/instance-size": CatalogLabel(lambda t: _name_part(t, 1), False),
    "karpenter.k8s.aws/instance-capability-flex": CatalogLabel(
        lambda t: "true" if "-flex" in t.name.split(".")[0] else "false", False),
    "karpenter.k8s.aws/instance-cpu": CatalogLabel(lambda t: _whole(t.vcpus), True),
    "karpenter.k8s.aws/instance-memory": CatalogLabel(lambda t: _mib(t.memory_gib), True),
    "karpenter.k8s.aws/instance-gpu-count": CatalogLabel(_gpu_count, True),
    "karpenter.k8s.aws/instance-gpu-memory": CatalogLabel(_gpu_memory_mib, True),
    # every GPU model of the catalog's vocabulary (core/gpus.py) is NVIDIA's
    "karpenter.k8s.aws/instance-gpu-manufacturer": CatalogLabel(lambda t: "nvidia" if t.gpu_count else None, False),
    "karpenter.k8s.aws/instance-accelerator-name": CatalogLabel(
        lambda t: _kebab(t.accelerator) if t.accelerator else None, False),
    "karpenter.k8s.aws/instance-accelerator-count": CatalogLabel(
        lambda t: str(t.accelerator_count) if t.accelerator else None, True),
    "cloud.google.com/gke-accelerator-count": CatalogLabel(_gpu_count, True),
    "nvidia.com/gpu.count": CatalogLabel(_gpu_count, True),
    "nvidia.com/gpu.memory": CatalogLabel(_gpu_memory_mib, True),
}
# `Gt` on these is a minimum constraint key (exact: Karpenter's values are whole vCPUs / MiB), which needs no
# catalog and keeps the annotation short; `Lt` and the rest go through CATALOG_LABELS.
GT_MINIMUM: dict[str, tuple[str, Callable[[int], float]]] = {
    "karpenter.k8s.aws/instance-cpu": ("min_vcpus", lambda n: n + 1),
    "karpenter.k8s.aws/instance-memory": ("min_memory_gib", lambda n: (n + 1) / 1024)}
# Presence only (Exists / DoesNotExist) of the GPU-name labels: a Node has them iff its machine has GPUs.
GPU_PRESENT = CatalogLabel(lambda t: "present" if t.gpu_count else None, False)
# Machine facts the catalog does not record: a requirement on them cannot be checked against any instance type.
UNRECORDED = {
    "topology.k8s.aws/zone-id": "zone ids (the catalog names zones, not their ids)",
    "karpenter.k8s.aws/instance-cpu-sustained-clock-speed-mhz": "CPU clock speeds",
    "karpenter.k8s.aws/instance-hypervisor": "hypervisors",
    "karpenter.k8s.aws/instance-encryption-in-transit-supported": "in-transit encryption support",
    "karpenter.k8s.aws/instance-ebs-bandwidth": "EBS bandwidths",
    "karpenter.k8s.aws/instance-network-bandwidth": "network bandwidths",
    "karpenter.k8s.aws/instance-local-nvme": "local NVMe sizes",
    "karpenter.k8s.aws/instance-accelerator-manufacturer": "accelerator manufacturers",
    "karpenter.k8s.aws/instance-tenancy": "tenancy (ray_nodeless launches default tenancy)",
}
