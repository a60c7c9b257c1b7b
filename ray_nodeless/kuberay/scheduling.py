"""A KubeRay worker group's pod scheduling as ray_nodeless rules. Pure (no Ray, no Kubernetes client, no catalog
read); the bridge and `convert` both read a group through it (the annotation is annotation.py).

A group's scheduling (`group_rules`): what the worker group's pod template says about the node it must land on,
turned into constraint keys of the group's node type (`node_config`: instance_types, families, gpus, capacity,
zones, arch, ...), from `nodeSelector` and required node affinity on the well-known node labels of EKS, Karpenter,
GKE, NVIDIA's GPU feature discovery and Kubernetes itself, and from the group's Ray labels (`labels`:
`ray.io/market-type`, `ray.io/availability-zone`, `ray.io/availability-region`, `ray.io/accelerator-type`).
Labels that name machines only indirectly (Karpenter's category, generation, size, vCPUs, memory, GPU count and
memory, accelerators, `NotIn` zones, ...: CATALOG_LABELS) are resolved against the region's instance types and
zones, which the caller passes as `CatalogFacts` (this module reads no catalog): each such requirement keeps exactly
the catalog types whose Node would carry a matching value, written as the shortest of allowed / excluded families or
instance types. Several required selector terms (ORed) become the union of the types each keeps, when each narrows
instance types only.
What it cannot honour is returned, each naming the key path under the group, as `Unhonoured`: `blocking` ones are
required placement ray_nodeless would break (multi-host groups, TPUs, required pod affinity, ORed selector terms on
zones or capacity, DoNotSchedule topology spread across zones, machine facts the catalog does not record, ...):
convert refuses the manifest naming the key, and so does the bridge's config; the rest are
preferences dropped with a note (preferred affinities, ScheduleAnyway spread, another scheduler).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ray_nodeless.core.catalog.model import InstanceType
from ray_nodeless.core.gpus import KNOWN_GPU_MODELS, canonical_gpu
from ray_nodeless.errors import ConfigError

if TYPE_CHECKING:
    from ray_nodeless.core.catalog import Catalog

# --------------------------------------------------------------------------------------------- group scheduling


@dataclass(frozen=True)
class Unhonoured:
    """A part of a group's scheduling ray_nodeless cannot honour. `blocking`: a requirement it would break (convert
    refuses the manifest), else a preference it drops."""

    key: str
    reason: str
    blocking: bool

    def __str__(self) -> str:
        return f"{self.key}: {self.reason}"


@dataclass
class GroupRules:
    """A worker group's scheduling as ray_nodeless sees it.

    - `node_config`: constraint keys for the group's node type (requirements.py keys); `{}` when nothing narrows.
    - `regions`: the regions the group's pods require (topology.kubernetes.io/region, ray.io/availability-region);
      None: any. The caller checks the provider's region is among them.
    - `clouds`: the clouds whose node labels the group names (GKE keys: gcp; EKS / Karpenter keys: aws).
    - `node_labels`: the label pairs the pod's nodeSelector (and single-valued required `In` terms) asks of its
      Node (every mapped one holds on a machine of the group by construction of `node_config`; the others are
      noted in `unhonoured`, and contradict a `NotIn` / `DoesNotExist` on the same label).
    - `sources`: constraint key -> the group key path it came from (for notes and errors).
    - `unhonoured`: what is not honoured, in manifest order.
    """

    node_config: dict[str, Any] = field(default_factory=dict)
    regions: tuple[str, ...] | None = None
    clouds: set[str] = field(default_factory=set)
    node_labels: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    unhonoured: list[Unhonoured] = field(default_factory=list)

    def blocking(self) -> list[Unhonoured]:
        return [u for u in self.unhonoured if u.blocking]

    def check(self) -> None:
        """ConfigError naming the first blocking key, if any."""
        b = self.blocking()
        if b:
            raise ConfigError(b[0].key, b[0].reason)


# Karpenter's / EKS's / GKE's capacity vocabularies -> ours (ordered spot first: each of these node autoscalers
# prefers spot when a selector allows both).
_CAPACITY_ORDER = ("spot", "on-demand")
_KARPENTER_CAPACITY = {"spot": "spot", "on-demand": "on-demand"}
_EKS_CAPACITY = {"SPOT": "spot", "ON_DEMAND": "on-demand"}
_K8S_ARCH = {"amd64": "x86_64", "arm64": "arm64"}
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")

ZONE_KEYS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
REGION_KEYS = ("topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region")
INSTANCE_TYPE_KEYS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
ARCH_KEYS = ("kubernetes.io/arch", "beta.kubernetes.io/arch")
OS_KEYS = ("kubernetes.io/os", "beta.kubernetes.io/os")
GPU_NAME_KEYS = ("karpenter.k8s.aws/instance-gpu-name", "cloud.google.com/gke-accelerator", "nvidia.com/gpu.product")
CAPACITY_KEYS = ("karpenter.sh/capacity-type", "eks.amazonaws.com/capacityType", "cloud.google.com/gke-spot",
                 "cloud.google.com/gke-preemptible")
# Labels every Node of the kind a ray_nodeless machine stands for carries (kubelet's, the cloud's, Karpenter's or a
# managed node group's): `Exists` holds for every machine, `DoesNotExist` for none. (gke-spot / gke-preemptible are
# not among them: GKE sets them on spot / preemptible nodes only.)
ALWAYS_PRESENT = (INSTANCE_TYPE_KEYS + ZONE_KEYS + REGION_KEYS + ARCH_KEYS + OS_KEYS
                  + ("karpenter.k8s.aws/instance-family", "cloud.google.com/machine-family",
                     "karpenter.sh/capacity-type", "eks.amazonaws.com/capacityType"))

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
# whose type gives the label a value that satisfies it (README "KubeRay manifests"). Values as Karpenter sets them
# (pkg/providers/instancetype/types.go computeRequirements), GKE (gke-accelerator-count: the GPUs of a GPU node) and
# NVIDIA GPU feature discovery (gpu.count, gpu.memory in MiB per GPU).
CATALOG_LABELS: dict[str, CatalogLabel] = {
    "karpenter.k8s.aws/instance-category": CatalogLabel(lambda t: _cg(t, 0), False, family=True),
    "karpenter.k8s.aws/instance-generation": CatalogLabel(lambda t: _cg(t, 1), True, family=True),
    "karpenter.k8s.aws/instance-size": CatalogLabel(lambda t: _name_part(t, 1), False),
    "karpenter.k8s.aws/instance-capability-flex": CatalogLabel(
        lambda t: "true" if "-flex" in t.name.split(".")[0] else "false", False),
    "karpenter.k8s.aws/instance-cpu": CatalogLabel(lambda t: _whole(t.vcpus), True),
    "karpenter.k8s.aws/instance-memory": CatalogLabel(lambda t: _mib(t.memory_gib), True),
    "karpenter.k8s.aws/instance-gpu-count": CatalogLabel(lambda t: str(t.gpu_count) if t.gpu_count else None, True),
    "karpenter.k8s.aws/instance-gpu-memory": CatalogLabel(_gpu_memory_mib, True),
    # every GPU model of the catalog's vocabulary (core/gpus.py) is NVIDIA's
    "karpenter.k8s.aws/instance-gpu-manufacturer": CatalogLabel(lambda t: "nvidia" if t.gpu_count else None, False),
    "karpenter.k8s.aws/instance-accelerator-name": CatalogLabel(
        lambda t: _kebab(t.accelerator) if t.accelerator else None, False),
    "karpenter.k8s.aws/instance-accelerator-count": CatalogLabel(
        lambda t: str(t.accelerator_count) if t.accelerator else None, True),
    "cloud.google.com/gke-accelerator-count": CatalogLabel(lambda t: str(t.gpu_count) if t.gpu_count else None,
                                                           True),
    "nvidia.com/gpu.count": CatalogLabel(lambda t: str(t.gpu_count) if t.gpu_count else None, True),
    "nvidia.com/gpu.memory": CatalogLabel(_gpu_memory_mib, True),
}
# `Gt` on these is a minimum constraint key (exact: Karpenter's values are whole vCPUs / MiB), which needs no
# catalog and keeps the annotation short; `Lt` and the rest go through CATALOG_LABELS.
_GT_MINIMUM = {"karpenter.k8s.aws/instance-cpu": ("min_vcpus", lambda n: n + 1),
               "karpenter.k8s.aws/instance-memory": ("min_memory_gib", lambda n: (n + 1) / 1024)}
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
CPU_MANUFACTURER = "karpenter.k8s.aws/instance-cpu-manufacturer"   # aws (Graviton) = arm64; intel / amd unrecorded
GRAVITON = "aws"          # the manufacturer value of Graviton CPUs in Karpenter's vocabulary (not a cloud name)
# Presence only (Exists / DoesNotExist) of the GPU-name labels: a Node has them iff its machine has GPUs.
_GPU_PRESENT = CatalogLabel(lambda t: "present" if t.gpu_count else None, False)

# The scheduling keys group_rules maps (README "KubeRay"), by the cloud whose nodes carry them (None: any).
MAPPED_KEYS: dict[str, str | None] = {
    **{k: None for k in INSTANCE_TYPE_KEYS + ZONE_KEYS + REGION_KEYS + ARCH_KEYS + OS_KEYS},
    "karpenter.k8s.aws/instance-family": "aws", "karpenter.k8s.aws/instance-gpu-name": "aws",
    "karpenter.sh/capacity-type": "aws", "eks.amazonaws.com/capacityType": "aws", CPU_MANUFACTURER: "aws",
    **{k: "aws" for k in CATALOG_LABELS if k.startswith("karpenter.")},
    "cloud.google.com/gke-accelerator": "gcp", "cloud.google.com/gke-spot": "gcp",
    "cloud.google.com/gke-preemptible": "gcp", "cloud.google.com/machine-family": "gcp",
    "cloud.google.com/gke-accelerator-count": "gcp",
    "nvidia.com/gpu.product": None, "nvidia.com/gpu.count": None, "nvidia.com/gpu.memory": None,
}
TPU_KEYS = ("cloud.google.com/gke-tpu-accelerator", "cloud.google.com/gke-tpu-topology")
RAY_LABEL_KEYS = ("ray.io/market-type", "ray.io/availability-zone", "ray.io/availability-region",
                  "ray.io/accelerator-type")


@dataclass(frozen=True)
class CatalogFacts:
    """What group_rules needs of the catalog to resolve labels that name machines indirectly (Karpenter's category,
    generation, size, vCPUs, memory, GPU count / memory; GCE types with attached GPUs; NotIn zones; the region a
    group requires): the catalog cloud (a local backend's `simulate_cloud`), the region, the instance types the
    catalog offers there (at least one offering in the region) and the region's zones. The caller builds it from
    the catalog it plans with (convert: the one it prices with; the bridge and `plan`: kuberay/bridge.py
    `catalog_and_facts`): this module reads no catalog itself."""

    cloud: str
    region: str
    types: tuple[InstanceType, ...]
    zones: tuple[str, ...]

    @classmethod
    def of(cls, catalog: "Catalog", cloud: str, region: str) -> "CatalogFacts":
        r = catalog.region(cloud, region)
        offered = {r.types[i] for i in set(r.type_ids)}       # the region's rows index the cloud's whole table
        return cls(cloud, region, tuple(sorted(offered, key=lambda t: t.name)), tuple(r.zones))


def gpu_product_model(value: str) -> str | None:
    """NVIDIA GPU feature discovery's `nvidia.com/gpu.product` (`Tesla-T4`, `NVIDIA-A100-SXM4-80GB`,
    `NVIDIA-H100-80GB-HBM3`, `NVIDIA-A10G`, `NVIDIA-L4`) -> the canonical model, None when it names none we know."""
    parts = [p for p in value.upper().replace("_", "-").replace(" ", "-").split("-") if p]
    parts = [p for p in parts if p not in ("NVIDIA", "TESLA", "GEFORCE")]
    if not parts:
        return None
    model = canonical_gpu(parts[0])
    if model == "A100" and any(p.startswith("80G") for p in parts[1:]):
        model = "A100-80GB"
    if model == "RTX" and len(parts) > 2:           # NVIDIA-RTX-PRO-6000-...
        model = canonical_gpu("-".join(parts[:3]))
    return model if model in KNOWN_GPU_MODELS else None


class _Acc:
    """Accumulates constraints from several keys: allow-lists intersect, exclusions add up, minimums take the
    larger; a contradiction is a blocking Unhonoured naming both keys."""

    def __init__(self, out: GroupRules):
        self.out = out

    def _source(self, name: str, key: str) -> None:
        src = self.out.sources
        src[name] = f"{src[name]} and {key}" if name in src else key

    def allow(self, name: str, values: Sequence[str], key: str) -> None:
        nc = self.out.node_config
        if name in nc:
            kept = [v for v in nc[name] if v in values]
            if not kept:
                self.out.unhonoured.append(Unhonoured(key, f"{list(values)} contradicts {self.out.sources[name]} "
                                                           f"({nc[name]}): no machine has both", True))
                return
            nc[name] = kept
        else:
            nc[name] = list(values)
        self._source(name, key)

    def exclude(self, name: str, values: Sequence[str], key: str) -> None:
        nc = self.out.node_config
        nc[name] = sorted(set(nc.get(name, [])) | set(values))
        self._source(name, key)

    def at_least(self, name: str, value: float, key: str) -> None:
        nc = self.out.node_config
        nc[name] = max(nc.get(name, value), value)
        self._source(name, key)


def _capacities(values: Sequence[str], vocab: Mapping[str, str], key: str, out: GroupRules) -> list[str] | None:
    caps = []
    for v in values:
        if v not in vocab:
            if v.lower() in ("reserved", "capacity_block"):
                out.unhonoured.append(Unhonoured(key, f"{v!r}: reserved capacity (ODCRs, capacity blocks) is not "
                                                      "launched by ray_nodeless; only spot and on-demand", False))
                continue
            out.unhonoured.append(Unhonoured(key, f"{v!r} is not one of {sorted(vocab)}", True))
            return None
        caps.append(vocab[v])
    if not caps:
        out.unhonoured.append(Unhonoured(key, "allows only capacity ray_nodeless does not launch", True))
        return None
    return [c for c in _CAPACITY_ORDER if c in caps]


def _bool_capacity(values: Sequence[str], key: str, out: GroupRules) -> list[str] | None:
    caps = []
    for v in values:
        if str(v).lower() not in ("true", "false"):
            out.unhonoured.append(Unhonoured(key, f"{v!r} is not \"true\" or \"false\"", True))
            return None
        caps.append("spot" if str(v).lower() == "true" else "on-demand")
    return [c for c in _CAPACITY_ORDER if c in caps]


def _integer(op: str, values: Sequence[str], key: str, out: GroupRules) -> int | None:
    """The one integer a `Gt` / `Lt` compares with (Kubernetes' rule), else a blocking Unhonoured."""
    try:
        if len(values) == 1:
            return int(values[0])
    except ValueError:
        pass
    out.unhonoured.append(Unhonoured(key, f"{op} needs exactly one integer value, got {list(values)}", True))
    return None


def _holds(op: str, value: str | None, values: Sequence[str], n: int | None) -> bool:
    """Kubernetes' node selector operators on one Node's label value (None: the Node has no such label)."""
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    try:
        v = int(value) if value is not None else None
    except ValueError:
        return False
    return v is not None and (v > n if op == "Gt" else v < n)


def _restrict(label: str, op: str, values: Sequence[str], key: str, matched: Sequence[InstanceType],
              facts: CatalogFacts, acc: _Acc, out: GroupRules, *, names_families: bool) -> None:
    """Keep exactly the instance types `matched` (of facts.types) as constraint keys: nothing when it is all of them,
    else the shortest of: allowed families, excluded families (when `matched` is whole families), allowed
    instance types, excluded instance types. An allow-list names its types, and ray_nodeless launches burstable
    and non-GPU-accelerator types only when named: unless the label is a family's (`names_families`: category,
    generation select families as instance-family does), they are left out of `matched` when it holds anything
    else, so a per-type label (vCPUs, memory, size, ...) narrows ray_nodeless's defaults and never widens them.
    Machines with GPUs only: GPU instances allowed for any shape."""
    what = f"{label} {op}" + (f" {list(values)}" if op not in ("Exists", "DoesNotExist") else "")
    if not matched:
        out.unhonoured.append(Unhonoured(key, f"no {facts.cloud} instance type in {facts.region} has {what}", True))
        return
    if len(matched) == len(facts.types):
        return                                       # every machine satisfies it
    if not names_families:
        matched = [t for t in matched if not (t.burstable or t.accelerator)] or list(matched)
    names = {t.name for t in matched}
    fam_types: dict[str, set[str]] = {}
    for t in facts.types:
        fam_types.setdefault(t.family, set()).add(t.name)
    fams = {t.family for t in matched}
    options: list[tuple[str, list[str]]] = []
    if all(fam_types[f] <= names for f in fams):
        options += [("families", sorted(fams)), ("exclude_families", sorted(set(fam_types) - fams))]
    options += [("instance_types", sorted(names)),
                ("exclude_instance_types", sorted(t.name for t in facts.types if t.name not in names))]
    name, chosen = min(options, key=lambda o: len(o[1]))       # stable: the first of equal lengths
    (acc.exclude if name.startswith("exclude_") else acc.allow)(name, chosen, key)
    if all(t.gpu_count for t in matched):
        out.node_config["allow_gpu_instances"] = True


def _known(what: str, values: Sequence[str], known: set[str], key: str, facts: CatalogFacts | None,
           out: GroupRules) -> list[str] | None:
    """The `In` values the catalog has in the region (all of them without facts); the others select no Node, as in
    Kubernetes: dropped with a note, or a blocking Unhonoured when none is left."""
    if facts is None:
        return list(values)
    kept = [v for v in values if v in known]
    gone = [v for v in values if v not in known]
    if not kept:
        out.unhonoured.append(Unhonoured(key, f"{list(values)}: no {what} of {facts.cloud} in {facts.region} (the "
                                              "catalog's)", True))
        return None
    if gone:
        out.unhonoured.append(Unhonoured(key, f"{gone}: no {what} of {facts.cloud} in {facts.region} (the "
                                              "catalog's): selects nothing, dropped", False))
    return kept


def _needs_catalog(label: str, key: str, facts: CatalogFacts | None, out: GroupRules) -> bool:
    if facts is None:
        out.unhonoured.append(Unhonoured(key, f"{label} is resolved against the catalog's instance types, and "
                                              "none were given", True))
        return True
    return False


def _apply(label: str, op: str, values: list[str], key: str, acc: _Acc, out: GroupRules, *,
           facts: CatalogFacts | None) -> None:
    """One requirement `label op values` (a nodeSelector pair is `In [value]`) at `key`."""
    if label in TPU_KEYS:
        out.unhonoured.append(Unhonoured(key, "TPU node pools: ray_nodeless launches no TPU slices", True))
        return
    if op not in OPERATORS:
        out.unhonoured.append(Unhonoured(key, f"operator {op!r} is not one of {', '.join(OPERATORS)}", True))
        return
    if op in ("In", "NotIn") and not values:
        out.unhonoured.append(Unhonoured(key, f"{op} with no values", True))
        return
    if label in UNRECORDED:
        out.clouds.add("aws")
        out.unhonoured.append(Unhonoured(key, f"{label}: the catalog records no {UNRECORDED[label]}, so no "
                                              "instance type can be checked against it", True))
        return
    if label not in MAPPED_KEYS:
        _unmapped(label, op, values, key, out)
        return
    need = MAPPED_KEYS[label]
    if need is not None:
        out.clouds.add(need)
    if op == "In" and len(values) == 1:
        out.node_labels[label] = values[0]

    if label in CATALOG_LABELS or (label in GPU_NAME_KEYS and op in ("Exists", "DoesNotExist")):
        spec = CATALOG_LABELS.get(label, _GPU_PRESENT)
        if op in ("Gt", "Lt"):
            if not spec.numeric:
                out.unhonoured.append(Unhonoured(key, f"{op} compares integers; {label} is not a number", True))
                return
            n = _integer(op, values, key, out)
            if n is None:
                return
            if op == "Gt" and label in _GT_MINIMUM:
                name, minimum = _GT_MINIMUM[label]
                acc.at_least(name, minimum(n), key)
                return
        else:
            n = None
        if _needs_catalog(label, key, facts, out):
            return
        matched = [t for t in facts.types if _holds(op, spec.value(t), values, n)]
        _restrict(label, op, values, key, matched, facts, acc, out, names_families=spec.family)
        return
    if op in ("Gt", "Lt"):
        numeric = sorted(k for k, s in CATALOG_LABELS.items() if s.numeric)
        out.unhonoured.append(Unhonoured(key, f"{op} compares integers; {label} is not a number (numeric labels: "
                                              f"{', '.join(numeric)})", True))
        return
    if op in ("Exists", "DoesNotExist"):
        if label in ALWAYS_PRESENT:
            if op == "DoesNotExist":
                out.unhonoured.append(Unhonoured(key, f"every machine's Node has {label}: DoesNotExist selects "
                                                      "none", True))
        elif label in ("cloud.google.com/gke-spot", "cloud.google.com/gke-preemptible"):
            acc.allow("capacity", ["spot" if op == "Exists" else "on-demand"], key)   # GKE labels spot nodes only
        elif label == CPU_MANUFACTURER:
            if op == "DoesNotExist":
                out.unhonoured.append(Unhonoured(key, f"every machine's Node has {label}: DoesNotExist selects "
                                                      "none", True))
        return
    neg = op == "NotIn"
    if label in INSTANCE_TYPE_KEYS:
        types = facts.types if facts is not None else ()
        names = list(values) if neg else _known("instance type", values, {t.machine_type for t in types} |
                                                {t.name for t in types}, key, facts, out)
        if names is None:
            return
        # The catalog names a host with attached GPUs (GCE) `<machine_type>+<n>x<model>`: the Node's label is the
        # host's machine type, so those variants are the same selection.
        names += sorted(t.name for t in types if t.machine_type in values and t.name not in values)
        if types and not neg:        # a GCE host type the catalog lists only with its GPUs attached
            listed = {t.name for t in types}
            names = [n for n in names if n in listed]
        (acc.exclude if neg else acc.allow)("exclude_instance_types" if neg else "instance_types", names, key)
    elif label == "karpenter.k8s.aws/instance-family" or label == "cloud.google.com/machine-family":
        fams = [v.lower() for v in values]
        if not neg:
            fams = _known("family", fams, {t.family for t in facts.types} if facts else set(), key, facts, out)
            if fams is None:
                return
        (acc.exclude if neg else acc.allow)("exclude_families" if neg else "families", fams, key)
    elif label == CPU_MANUFACTURER:
        # Graviton (`aws`) is every arm64 instance type of AWS; intel and amd share x86_64 and the catalog does not
        # say which is which.
        x86 = sorted(v for v in values if v != GRAVITON)
        if not neg and x86:
            out.unhonoured.append(Unhonoured(key, f"{x86}: the catalog does not record whether an x86_64 type's "
                                                  f"CPU is Intel's or AMD's; only `{GRAVITON}` (Graviton: arm64) "
                                                  "maps", True))
            return
        if neg and x86:
            out.unhonoured.append(Unhonoured(key, f"NotIn {x86}: the catalog does not record whether an x86_64 "
                                                  "type's CPU is Intel's or AMD's", True))
            return
        acc.allow("arch", ["x86_64"] if neg else ["arm64"], key)
    elif label in GPU_NAME_KEYS:
        models = []
        for v in values:
            m = gpu_product_model(v) if label == "nvidia.com/gpu.product" else canonical_gpu(v)
            if m is None or m not in KNOWN_GPU_MODELS:
                out.unhonoured.append(Unhonoured(key, f"{v!r} names no GPU model ray_nodeless knows "
                                                      f"(known: {', '.join(sorted(KNOWN_GPU_MODELS)[:12])}, ...)",
                                                 True))
                return
            models.append(m)
            if label == "karpenter.k8s.aws/instance-gpu-name" and m == "A100":
                models.append("A100-80GB")     # EC2 names both A100s `A100` (p4d, p4de): Karpenter's `a100`
        models = sorted(set(models))
        if neg:
            acc.exclude("exclude_gpus", models, key)
        else:
            acc.allow("gpus", models, key)
            out.node_config["allow_gpu_instances"] = True
    elif label in CAPACITY_KEYS:
        if label == "karpenter.sh/capacity-type":
            caps = _capacities(values, _KARPENTER_CAPACITY, key, out)
        elif label == "eks.amazonaws.com/capacityType":
            caps = _capacities(values, _EKS_CAPACITY, key, out)
        else:
            caps = _bool_capacity(values, key, out)
        if caps is None:
            return
        if neg:
            caps = [c for c in _CAPACITY_ORDER if c not in caps]
            if not caps:
                out.unhonoured.append(Unhonoured(key, "NotIn every capacity type: nothing is left", True))
                return
        acc.allow("capacity", caps, key)
    elif label in ZONE_KEYS:
        if neg:
            if _needs_catalog(label, key, facts, out):
                return
            left = [z for z in facts.zones if z not in values]
            if not left:
                out.unhonoured.append(Unhonoured(key, f"excludes every zone of {facts.region}", True))
                return
            acc.allow("zones", left, key)
        else:
            zones = _known("zone", values, set(facts.zones) if facts else set(), key, facts, out)
            if zones is not None:
                acc.allow("zones", zones, key)
    elif label in REGION_KEYS:
        if neg:
            if facts is None:
                out.unhonoured.append(Unhonoured(key, "NotIn on the region needs the cluster's region, and no "
                                                      "catalog facts were given", True))
            elif facts.region in values:
                out.unhonoured.append(Unhonoured(key, f"excludes {facts.region}, the region the cluster runs in",
                                                 True))
            return
        _regions(out, list(values), key)
    elif label in ARCH_KEYS:
        arches = []
        for v in values:
            if v not in _K8S_ARCH:
                out.unhonoured.append(Unhonoured(key, f"{v!r} is not one of {sorted(_K8S_ARCH)}", True))
                return
            arches.append(_K8S_ARCH[v])
        if neg:
            arches = [a for a in ("x86_64", "arm64") if a not in arches]
            if not arches:
                out.unhonoured.append(Unhonoured(key, "NotIn every architecture: nothing is left", True))
                return
        acc.allow("arch", sorted(set(arches)), key)
    elif label in OS_KEYS:
        if ("linux" in values) == neg:
            out.unhonoured.append(Unhonoured(key, "ray_nodeless machines run Linux", True))


def _unmapped(label: str, op: str, values: list[str], key: str, out: GroupRules) -> None:
    """A label ray_nodeless does not map. The Ray pod is bound to its machine's Node by the machine's id (the
    template's node selection is not kept: kuberay/bridge.py worker_pod_template), and that Node carries
    ray_nodeless's and the kubelet's labels only: `NotIn` / `DoesNotExist` hold there, one `In` value is dropped
    with a note (a pool name, a team label: nothing to choose a machine by); `Exists`, several `In` values and
    `Gt` / `Lt` ask for something ray_nodeless cannot tell, and are refused."""
    if op == "In" and len(values) == 1:
        out.node_labels[label] = values[0]
        out.unhonoured.append(Unhonoured(key, f"{label} is no label ray_nodeless maps to a rule: dropped (the Ray "
                                              "pod is bound to its machine's Node by the machine's id, not by "
                                              "this selector); nothing follows from it", False))
    elif op in ("NotIn", "DoesNotExist"):
        have = out.node_labels.get(label)
        if have is not None and (op == "DoesNotExist" or have in values):
            out.unhonoured.append(Unhonoured(key, f"{op} on {label} contradicts the group's own {label}={have}: "
                                                  "no Node has both", True))
        else:
            out.unhonoured.append(Unhonoured(key, f"{op} on {label}: holds, the machine's Node does not carry "
                                                  f"{label}; nothing else follows from it", False))
    else:
        out.unhonoured.append(Unhonoured(key, f"{op} on {label}: not a label ray_nodeless maps; only a single "
                                              "`In` value (set on the Node), NotIn or DoesNotExist can be honoured",
                                         True))


def _regions(out: GroupRules, values: list[str], key: str) -> None:
    if out.regions is not None:
        both = tuple(r for r in out.regions if r in values)
        if not both:
            out.unhonoured.append(Unhonoured(key, f"{values} contradicts {out.sources['region']} "
                                                  f"({list(out.regions)})", True))
            return
        out.regions = both
        out.sources["region"] = f"{out.sources['region']} and {key}"
    else:
        out.regions = tuple(values)
        out.sources["region"] = key


def _term(term: Mapping[str, Any], tkey: str, acc: _Acc, out: GroupRules, facts: CatalogFacts | None) -> None:
    """One nodeSelectorTerm: its expressions ANDed."""
    if term.get("matchFields"):
        out.unhonoured.append(Unhonoured(f"{tkey}.matchFields", "selects Nodes by field (metadata.name): "
                                                                "ray_nodeless makes new Nodes", True))
    for j, e in enumerate(term.get("matchExpressions") or []):
        _apply(str(e.get("key")), str(e.get("operator")), [str(v) for v in e.get("values") or []],
               f"{tkey}.matchExpressions[{j}]", acc, out, facts=facts)


# The constraint keys that select instance types (each a property of the type alone): ORed terms that narrow only
# these are a union of type sets, which one node type can hold. Zones and capacity are the offering's, not the
# type's: (zone a, spot) OR (zone b, on-demand) is no single set of constraint keys.
_TYPE_KEYS = frozenset({"instance_types", "exclude_instance_types", "families", "exclude_families", "min_vcpus",
                        "min_memory_gib", "gpus", "exclude_gpus", "arch", "allow_gpu_instances"})


def _term_types(nc: Mapping[str, Any], facts: CatalogFacts) -> list[InstanceType]:
    """The types whose Node satisfies a term mapped to the type keys `nc` (Kubernetes' reading: `gpus`, from an
    `In` on a GPU label, needs a GPU of those models; the planner's "GPU types may only be these" is looser)."""
    def ok(t: InstanceType) -> bool:
        return ((("instance_types" not in nc) or t.name in nc["instance_types"])
                and t.name not in nc.get("exclude_instance_types", ())
                and (("families" not in nc) or t.family in nc["families"])
                and t.family not in nc.get("exclude_families", ())
                and t.vcpus >= nc.get("min_vcpus", 0) and t.memory_gib >= nc.get("min_memory_gib", 0)
                and (("gpus" not in nc) or (t.gpu_count > 0 and t.gpu_model in nc["gpus"]))
                and not (t.gpu_count and t.gpu_model in nc.get("exclude_gpus", ()))
                and (("arch" not in nc) or t.arch in nc["arch"]))
    return [t for t in facts.types if ok(t)]


def _ored_terms(terms: Sequence[Any], rkey: str, acc: _Acc, out: GroupRules, facts: CatalogFacts | None) -> None:
    """Several nodeSelectorTerms, ORed: when every term narrows instance types only, the union of the types each
    term keeps (resolved against the catalog); else refused naming the key."""
    many = (f"{len(terms)} terms are ORed; ray_nodeless plans one set of constraints per group: keep one term, "
            "or split the group")
    if facts is None:
        out.unhonoured.append(Unhonoured(rkey, f"{many} (ORed terms on instance types are resolved against the "
                                               "catalog's types, and none were given)", True))
        return
    union: dict[str, InstanceType] = {}
    for i, term in enumerate(terms):
        one = GroupRules()
        _term(term or {}, f"{rkey}[{i}]", _Acc(one), one, facts)
        out.clouds |= one.clouds
        out.unhonoured += one.unhonoured
        if one.blocking():
            return
        other = sorted(set(one.node_config) - _TYPE_KEYS)
        if other:
            out.unhonoured.append(Unhonoured(f"{rkey}[{i}]", f"{many}: this one narrows {', '.join(other)}, which "
                                                             "belong to a machine's offering (zone, capacity), not "
                                                             "to its type; only terms on instance types are "
                                                             "joined", True))
            return
        union.update((t.name, t) for t in (_term_types(one.node_config, facts) if one.node_config else facts.types))
    if not union:
        out.unhonoured.append(Unhonoured(rkey, f"no term selects an instance type {facts.cloud} offers in "
                                               f"{facts.region}", True))
        return
    # Each term's types are already the ones ray_nodeless may launch for it (a per-type label left the burstable
    # ones out): the union is kept as it is.
    _restrict("nodeSelectorTerms", "ORed", [], rkey, sorted(union.values(), key=lambda t: t.name), facts, acc, out,
              names_families=True)


def group_rules(group: Mapping[str, Any], *, key: str, facts: CatalogFacts | None = None) -> GroupRules:
    """A KubeRay worker group's (`workerGroupSpecs[i]`, at key path `key`) scheduling as ray_nodeless constraint
    keys. `facts` (the catalog's instance types and zones in the cluster's region) resolve what a label names
    indirectly: Karpenter's category, generation, size, vCPUs, memory, GPU count / memory, accelerators
    (CATALOG_LABELS), GCE types with attached GPUs, NotIn zones, a required region; without them those keys are
    refused (only which clouds the keys name is then meaningful). Never raises for the group's content: every key
    it cannot honour is in `unhonoured`."""
    out = GroupRules()
    acc = _Acc(out)
    kw = dict(facts=facts)

    hosts = group.get("numOfHosts", 1)
    if isinstance(hosts, int) and hosts > 1:
        out.unhonoured.append(Unhonoured(f"{key}.numOfHosts", f"{hosts}: a multi-host group scales {hosts} pods "
                                                              "as one replica (a TPU slice, a multi-node job); "
                                                              "ray_nodeless launches single machines", True))

    # Ray labels first (the group's promise to Ray), then the pod's node selection.
    labels = group.get("labels") or {}
    if isinstance(labels, Mapping):
        for name in sorted(labels):
            v, k = labels[name], f'{key}.labels["{name}"]'
            if name == "ray.io/market-type":
                caps = _capacities([str(v)], {"spot": "spot", "on-demand": "on-demand"}, k, out)
                if caps:
                    acc.allow("capacity", caps, k)
            elif name == "ray.io/availability-zone":
                zones = _known("zone", [str(v)], set(facts.zones) if facts else set(), k, facts, out)
                if zones is not None:
                    acc.allow("zones", zones, k)
            elif name == "ray.io/availability-region":
                _regions(out, [str(v)], k)
            elif name == "ray.io/accelerator-type":
                m = canonical_gpu(str(v))
                if m in KNOWN_GPU_MODELS:
                    acc.allow("gpus", [m], k)
                elif m.startswith("TPU"):
                    out.unhonoured.append(Unhonoured(k, f"{v!r}: ray_nodeless launches no TPUs", True))
                else:
                    out.unhonoured.append(Unhonoured(k, f"{v!r} names no GPU model ray_nodeless knows", True))

    template = group.get("template") or {}
    spec = template.get("spec") or {} if isinstance(template, Mapping) else {}
    tkey = f"{key}.template.spec"
    if spec.get("nodeName"):
        out.unhonoured.append(Unhonoured(f"{tkey}.nodeName", "pins an existing Node; ray_nodeless makes new ones",
                                         True))
    for i, c in enumerate(spec.get("containers") or []):
        for part in ("limits", "requests"):
            res = ((c or {}).get("resources") or {}).get(part) or {}
            if "google.com/tpu" in res:
                out.unhonoured.append(Unhonoured(f'{tkey}.containers[{i}].resources.{part}["google.com/tpu"]',
                                                 "TPUs: ray_nodeless launches no TPU machines", True))
                break
    selector = spec.get("nodeSelector") or {}
    for label in sorted(selector):
        _apply(label, "In", [str(selector[label])], f'{tkey}.nodeSelector["{label}"]', acc, out, **kw)

    affinity = spec.get("affinity") or {}
    akey = f"{tkey}.affinity"
    node_aff = affinity.get("nodeAffinity") or {}
    required = node_aff.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    rkey = f"{akey}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    if len(terms) > 1:
        _ored_terms(terms, rkey, acc, out, facts)
    elif terms:
        _term(terms[0] or {}, f"{rkey}[0]", acc, out, facts)
    if node_aff.get("preferredDuringSchedulingIgnoredDuringExecution"):
        out.unhonoured.append(Unhonoured(f"{akey}.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution",
                                         "a preference: ray_nodeless picks the cheapest fit under the rules; "
                                         "dropped (state it as a required term to keep it)", False))
    for kind in ("podAffinity", "podAntiAffinity"):
        pa = affinity.get(kind) or {}
        for j, t in enumerate(pa.get("requiredDuringSchedulingIgnoredDuringExecution") or []):
            tk = f"{akey}.{kind}.requiredDuringSchedulingIgnoredDuringExecution[{j}]"
            topo = (t or {}).get("topologyKey")
            if kind == "podAntiAffinity" and topo == "kubernetes.io/hostname":
                out.unhonoured.append(Unhonoured(tk, "holds by construction: each Ray pod gets a machine of its own",
                                                 False))
            else:
                out.unhonoured.append(Unhonoured(tk, f"required {kind} on {topo!r}: ray_nodeless places each Ray "
                                                     "pod on a new machine of its own, chosen by price, and cannot "
                                                     "follow other pods", True))
        if pa.get("preferredDuringSchedulingIgnoredDuringExecution"):
            out.unhonoured.append(Unhonoured(f"{akey}.{kind}.preferredDuringSchedulingIgnoredDuringExecution",
                                             f"a {kind} preference: dropped", False))
    for j, t in enumerate(spec.get("topologySpreadConstraints") or []):
        tk = f"{tkey}.topologySpreadConstraints[{j}]"
        topo = (t or {}).get("topologyKey")
        hard = (t or {}).get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"
        if topo == "kubernetes.io/hostname":
            out.unhonoured.append(Unhonoured(tk, "holds by construction: one Ray pod per machine", False))
        else:
            out.unhonoured.append(Unhonoured(tk, f"spread over {topo!r}: ray_nodeless launches in the cheapest zone, "
                                                 "not spread" + ("; DoNotSchedule would leave pods pending" if hard
                                                                  else "; dropped (ScheduleAnyway)"), hard))
    scheduler = spec.get("schedulerName")
    if scheduler and scheduler != "default-scheduler":
        out.unhonoured.append(Unhonoured(f"{tkey}.schedulerName", f"{scheduler!r}: the Ray pod is bound to its "
                                                                 "machine's Node by ray_nodeless; gang scheduling "
                                                                 "is not honoured", False))
    if facts is not None and "arch" not in out.node_config and set(out.node_config) & _TYPE_KEYS - {"arch"}:
        # ray_nodeless launches x86_64 unless told otherwise; a selection of Arm types only (a Graviton family)
        # means Arm machines, as it does for the node autoscaler
        arches = {t.arch for t in _term_types(out.node_config, facts)}
        if arches and "x86_64" not in arches:
            out.node_config["arch"] = sorted(arches)
            out.sources["arch"] = " and ".join(out.sources[k] for k in sorted(out.node_config)
                                               if k in _TYPE_KEYS and k in out.sources)
    if facts is not None and out.regions is not None and facts.region not in out.regions:
        out.unhonoured.append(Unhonoured(out.sources["region"], f"requires region {list(out.regions)}, the cluster "
                                                                f"runs in {facts.region}", True))
    return out
