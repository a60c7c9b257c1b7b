"""The node labels ray_nodeless maps, as a table of label handlers: label key -> the function that turns one
requirement on it into constraint keys.

`NODE_LABELS` holds one `LabelHandler` per well-known node label of EKS, Karpenter, GKE, NVIDIA's GPU feature
discovery and Kubernetes itself: the cloud whose Nodes carry it, and the handler of a requirement on it (zone,
region, instance type, family, architecture, OS, CPU manufacturer, GPU name, capacity vocabularies, and the labels
resolved against the catalog: catalog_labels.py). `RAY_LABELS` does the same for a group's Ray labels
(`ray.io/market-type`, ...). `apply` is the one entry: it refuses what no machine can satisfy (TPU pools, unknown
operators, machine facts the catalog does not record), hands a mapped label to its handler, and notes or refuses an
unmapped one. Imports go one way: scheduling.py -> labels.py -> constraints.py -> catalog_labels.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ray_nodeless.core.gpus import KNOWN_GPU_MODELS, canonical_gpu
from ray_nodeless.kuberay.catalog_labels import CATALOG_LABELS, GPU_PRESENT, GT_MINIMUM, UNRECORDED, CatalogFacts, \
    CatalogLabel
from ray_nodeless.kuberay.constraints import Builder, Requirement, holds, integer, known, needs_catalog, restrict

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")

ZONE_KEYS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
REGION_KEYS = ("topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region")
INSTANCE_TYPE_KEYS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
ARCH_KEYS = ("kubernetes.io/arch", "beta.kubernetes.io/arch")
OS_KEYS = ("kubernetes.io/os", "beta.kubernetes.io/os")
GPU_NAME_KEYS = ("karpenter.k8s.aws/instance-gpu-name", "cloud.google.com/gke-accelerator", "nvidia.com/gpu.product")
CAPACITY_KEYS = ("karpenter.sh/capacity-type", "eks.amazonaws.com/capacityType", "cloud.google.com/gke-spot",
                 "cloud.google.com/gke-preemptible")
CPU_MANUFACTURER = "karpenter.k8s.aws/instance-cpu-manufacturer"   # aws (Graviton) = arm64; intel / amd unrecorded
GRAVITON = "aws"          # the manufacturer value of Graviton CPUs in Karpenter's vocabulary (not a cloud name)
TPU_KEYS = ("cloud.google.com/gke-tpu-accelerator", "cloud.google.com/gke-tpu-topology")
# Karpenter's / EKS's / GKE's capacity vocabularies -> ours (ordered spot first: each of these node autoscalers
# prefers spot when a selector allows both).
CAPACITY_ORDER = ("spot", "on-demand")
_KARPENTER_CAPACITY = {"spot": "spot", "on-demand": "on-demand"}
_EKS_CAPACITY = {"SPOT": "spot", "ON_DEMAND": "on-demand"}
_K8S_ARCH = {"amd64": "x86_64", "arm64": "arm64"}

Handler = Callable[[Requirement, Builder, "CatalogFacts | None"], None]


@dataclass(frozen=True)
class LabelHandler:
    """A node label ray_nodeless maps: `cloud` is the cloud whose Nodes carry it (None: any), `handle` turns one
    requirement on it (any operator; the values already checked against the operator) into constraint keys."""

    cloud: str | None
    handle: Handler


# ----------------------------------------------------------------------------------- operators a handler shares

def _every_node_has_it(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
    """Exists / DoesNotExist on a label every Node of the kind a ray_nodeless machine stands for carries (kubelet's,
    the cloud's, Karpenter's or a managed node group's: instance type, zone, region, arch, os, family, capacity
    type, CPU manufacturer): `Exists` holds for every machine, `DoesNotExist` for none. (gke-spot / gke-preemptible
    are not among them: GKE sets them on spot / preemptible nodes only; nor the GPU names: GPU nodes only.)"""
    if r.op == "DoesNotExist":
        b.refuse(r.key, f"every machine's Node has {r.label}: DoesNotExist selects none")


def _by_value(select: Handler, presence: Handler = _every_node_has_it) -> Handler:
    """A label whose values map to constraint keys: `select` handles In / NotIn, `presence` Exists / DoesNotExist;
    Gt / Lt are refused (the label is no number)."""
    def handle(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
        if r.op in ("Gt", "Lt"):
            numeric = sorted(k for k, s in CATALOG_LABELS.items() if s.numeric)
            b.refuse(r.key, f"{r.op} compares integers; {r.label} is not a number (numeric labels: "
                            f"{', '.join(numeric)})")
        elif r.op in ("Exists", "DoesNotExist"):
            presence(r, b, facts)
        else:
            select(r, b, facts)
    return handle


def _from_catalog(spec: CatalogLabel) -> Handler:
    """A label whose value follows from the instance type (catalog_labels.py): every operator keeps exactly the
    catalog types whose Node satisfies it, except `Gt` on vCPUs / memory, a minimum constraint key."""
    def handle(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
        n = None
        if r.op in ("Gt", "Lt"):
            if not spec.numeric:
                b.refuse(r.key, f"{r.op} compares integers; {r.label} is not a number")
                return
            n = integer(r, b)
            if n is None:
                return
            if r.op == "Gt" and r.label in GT_MINIMUM:
                name, minimum = GT_MINIMUM[r.label]
                b.at_least(name, minimum(n), r.key)
                return
        if needs_catalog(r, facts, b):
            return
        assert facts is not None
        matched = [t for t in facts.types if holds(r.op, spec.value(t), r.values, n)]
        restrict(r, matched, facts, b, names_families=spec.family)
    return handle


# ------------------------------------------------------------------------------------------ In / NotIn handlers

def _instance_types(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
    types = facts.types if facts is not None else ()
    names = list(r.values) if r.negated else known("instance type", r.values, {t.machine_type for t in types}
                                                   | {t.name for t in types}, r.key, facts, b)
    if names is None:
        return
    # The catalog names a host with attached GPUs (GCE) `<machine_type>+<n>x<model>`: the Node's label is the
    # host's machine type, so those variants are the same selection.
    names += sorted(t.name for t in types if t.machine_type in r.values and t.name not in r.values)
    if types and not r.negated:        # a GCE host type the catalog lists only with its GPUs attached
        listed = {t.name for t in types}
        names = [n for n in names if n in listed]
    if r.negated:
        b.exclude("exclude_instance_types", names, r.key)
    else:
        b.allow("instance_types", names, r.key)


def _families(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
    fams = [v.lower() for v in r.values]
    if r.negated:
        b.exclude("exclude_families", fams, r.key)
        return
    kept = known("family", fams, {t.family for t in facts.types} if facts else set(), r.key, facts, b)
    if kept is not None:
        b.allow("families", kept, r.key)


def _cpu_manufacturer(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
    # Graviton (`aws`) is every arm64 instance type of AWS; intel and amd share x86_64 and the catalog does not
    # say which is which.
    x86 = sorted(v for v in r.values if v != GRAVITON)
    if x86 and not r.negated:
        b.refuse(r.key, f"{x86}: the catalog does not record whether an x86_64 type's CPU is Intel's or AMD's; only "
                        f"`{GRAVITON}` (Graviton: arm64) maps")
    elif x86:
        b.refuse(r.key, f"NotIn {x86}: the catalog does not record whether an x86_64 type's CPU is Intel's or AMD's")
    else:
        b.allow("arch", ["x86_64"] if r.negated else ["arm64"], r.key)


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


def _gpu_names(model_of: Callable[[str], str | None], *, a100_is_both: bool = False) -> Handler:
    """A GPU-name label, its values read by `model_of`. `a100_is_both`: EC2 names both A100s `A100` (p4d, p4de),
    so Karpenter's `a100` is either."""
    def handle(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
        models = []
        for v in r.values:
            m = model_of(v)
            if m is None or m not in KNOWN_GPU_MODELS:
                b.refuse(r.key, f"{v!r} names no GPU model ray_nodeless knows (known: "
                                f"{', '.join(sorted(KNOWN_GPU_MODELS)[:12])}, ...)")
                return
            models.append(m)
            if a100_is_both and m == "A100":
                models.append("A100-80GB")
        models = sorted(set(models))
        if r.negated:
            b.exclude("exclude_gpus", models, r.key)
        else:
            b.allow("gpus", models, r.key)
            b.out.node_config["allow_gpu_instances"] = True
    return handle


def capacities(values: Sequence[str], vocab: Mapping[str, str], key: str, b: Builder) -> list[str] | None:
    """Capacity values of one vocabulary -> ours, spot first; reserved capacity is dropped with a note, an unknown
    value refused."""
    caps = []
    for v in values:
        if v not in vocab:
            if v.lower() in ("reserved", "capacity_block"):
                b.drop(key, f"{v!r}: reserved capacity (ODCRs, capacity blocks) is not launched by ray_nodeless; only "
                            "spot and on-demand")
                continue
            b.refuse(key, f"{v!r} is not one of {sorted(vocab)}")
            return None
        caps.append(vocab[v])
    if not caps:
        b.refuse(key, "allows only capacity ray_nodeless does not launch")
        return None
    return [c for c in CAPACITY_ORDER if c in caps]


def _bool_capacities(values: Sequence[str], key: str, b: Builder) -> list[str] | None:
    """GKE's gke-spot / gke-preemptible: "true" is spot."""
    caps = []
    for v in values:
        if str(v).lower() not in ("true", "false"):
            b.refuse(key, f"{v!r} is not \"true\" or \"false\"")
            return None
        caps.append("spot" if str(v).lower() == "true" else "on-demand")
    return [c for c in CAPACITY_ORDER if c in caps]


def _capacity(read: Callable[[Sequence[str], str, Builder], list[str] | None]) -> Handler:
    """A capacity label whose values `read` turns into ours; NotIn keeps the others."""
    def handle(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
        caps = read(r.values, r.key, b)
        if caps is None:
            return
        if r.negated:
            caps = [c for c in CAPACITY_ORDER if c not in caps]
            if not caps:
                b.refuse(r.key, "NotIn every capacity type: nothing is left")
                return
        b.allow("capacity", caps, r.key)
    return handle


def _spot_nodes_only(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
    """Exists / DoesNotExist on gke-spot / gke-preemptible: GKE labels spot nodes only."""
    b.allow("capacity", ["spot" if r.op == "Exists" else "on-demand"], r.key)


def _zones(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
    if not r.negated:
        zones = known("zone", r.values, set(facts.zones) if facts else set(), r.key, facts, b)
        if zones is not None:
            b.allow("zones", zones, r.key)
        return
    if needs_catalog(r, facts, b):
        return
    assert facts is not None
    left = [z for z in facts.zones if z not in r.values]
    if not left:
        b.refuse(r.key, f"excludes every zone of {facts.region}")
        return
    b.allow("zones", left, r.key)


def _regions(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
    if not r.negated:
        b.regions(list(r.values), r.key)
    elif facts is None:
        b.refuse(r.key, "NotIn on the region needs the cluster's region, and no catalog facts were given")
    elif facts.region in r.values:
        b.refuse(r.key, f"excludes {facts.region}, the region the cluster runs in")


def _arch(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
    arches = []
    for v in r.values:
        if v not in _K8S_ARCH:
            b.refuse(r.key, f"{v!r} is not one of {sorted(_K8S_ARCH)}")
            return
        arches.append(_K8S_ARCH[v])
    if r.negated:
        arches = [a for a in ("x86_64", "arm64") if a not in arches]
        if not arches:
            b.refuse(r.key, "NotIn every architecture: nothing is left")
            return
    b.allow("arch", sorted(set(arches)), r.key)


def _os(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
    if ("linux" in r.values) == r.negated:
        b.refuse(r.key, "ray_nodeless machines run Linux")


# --------------------------------------------------------------------------------------------------- the table

def _each(keys: Sequence[str], cloud: str | None, handle: Handler) -> dict[str, LabelHandler]:
    return {k: LabelHandler(cloud, handle) for k in keys}


_GPU_PRESENCE = _from_catalog(GPU_PRESENT)

# The scheduling keys group_rules maps (docs/kuberay.md), each with the cloud whose nodes carry it (None: any).
NODE_LABELS: dict[str, LabelHandler] = {
    **_each(INSTANCE_TYPE_KEYS, None, _by_value(_instance_types)),
    **_each(ZONE_KEYS, None, _by_value(_zones)),
    **_each(REGION_KEYS, None, _by_value(_regions)),
    **_each(ARCH_KEYS, None, _by_value(_arch)),
    **_each(OS_KEYS, None, _by_value(_os)),
    "karpenter.k8s.aws/instance-family": LabelHandler("aws", _by_value(_families)),
    "cloud.google.com/machine-family": LabelHandler("gcp", _by_value(_families)),
    CPU_MANUFACTURER: LabelHandler("aws", _by_value(_cpu_manufacturer)),
    "karpenter.k8s.aws/instance-gpu-name": LabelHandler(
        "aws", _by_value(_gpu_names(canonical_gpu, a100_is_both=True), _GPU_PRESENCE)),
    "cloud.google.com/gke-accelerator": LabelHandler("gcp", _by_value(_gpu_names(canonical_gpu), _GPU_PRESENCE)),
    "nvidia.com/gpu.product": LabelHandler(None, _by_value(_gpu_names(gpu_product_model), _GPU_PRESENCE)),
    "karpenter.sh/capacity-type": LabelHandler(
        "aws", _by_value(_capacity(lambda vs, k, b: capacities(vs, _KARPENTER_CAPACITY, k, b)))),
    "eks.amazonaws.com/capacityType": LabelHandler(
        "aws", _by_value(_capacity(lambda vs, k, b: capacities(vs, _EKS_CAPACITY, k, b)))),
    **_each(("cloud.google.com/gke-spot", "cloud.google.com/gke-preemptible"), "gcp",
            _by_value(_capacity(_bool_capacities), _spot_nodes_only)),
    **{k: LabelHandler("aws" if k.startswith("karpenter.") else "gcp" if k.startswith("cloud.google.com/") else None,
                       _from_catalog(spec)) for k, spec in CATALOG_LABELS.items()},
}


def apply(r: Requirement, b: Builder, facts: CatalogFacts | None) -> None:
    """One requirement on a node label: refused, handed to its label's handler, or (unmapped) noted."""
    if r.label in TPU_KEYS:
        b.refuse(r.key, "TPU node pools: ray_nodeless launches no TPU slices")
        return
    if r.op not in OPERATORS:
        b.refuse(r.key, f"operator {r.op!r} is not one of {', '.join(OPERATORS)}")
        return
    if r.op in ("In", "NotIn") and not r.values:
        b.refuse(r.key, f"{r.op} with no values")
        return
    if r.label in UNRECORDED:
        b.out.clouds.add("aws")
        b.refuse(r.key, f"{r.label}: the catalog records no {UNRECORDED[r.label]}, so no instance type can be "
                        "checked against it")
        return
    handler = NODE_LABELS.get(r.label)
    if handler is None:
        _unmapped(r, b)
        return
    if handler.cloud is not None:
        b.out.clouds.add(handler.cloud)
    if r.op == "In" and len(r.values) == 1:
        b.out.node_labels[r.label] = r.values[0]
    handler.handle(r, b, facts)


def _unmapped(r: Requirement, b: Builder) -> None:
    """A label ray_nodeless does not map. The Ray pod is bound to its machine's Node by the machine's id (the
    template's node selection is not kept: kuberay/pod_templates.py worker_pod_template), and that Node carries
    ray_nodeless's and the kubelet's labels only: `NotIn` / `DoesNotExist` hold there, one `In` value is dropped
    with a note (a pool name, a team label: nothing to choose a machine by); `Exists`, several `In` values and
    `Gt` / `Lt` ask for something ray_nodeless cannot tell, and are refused."""
    label, op = r.label, r.op
    if op == "In" and len(r.values) == 1:
        b.out.node_labels[label] = r.values[0]
        b.drop(r.key, f"{label} is no label ray_nodeless maps to a rule: dropped (the Ray pod is bound to its "
                      "machine's Node by the machine's id, not by this selector); nothing follows from it")
    elif op in ("NotIn", "DoesNotExist"):
        have = b.out.node_labels.get(label)
        if have is not None and (op == "DoesNotExist" or have in r.values):
            b.refuse(r.key, f"{op} on {label} contradicts the group's own {label}={have}: no Node has both")
        else:
            b.drop(r.key, f"{op} on {label}: holds, the machine's Node does not carry {label}; nothing else follows "
                          "from it")
    else:
        b.refuse(r.key, f"{op} on {label}: not a label ray_nodeless maps; only a single `In` value (set on the "
                        "Node), NotIn or DoesNotExist can be honoured")


# ----------------------------------------------------------------------------------------------- Ray labels

def _market_type(value: Any, key: str, b: Builder, facts: CatalogFacts | None) -> None:
    caps = capacities([str(value)], {"spot": "spot", "on-demand": "on-demand"}, key, b)
    if caps:
        b.allow("capacity", caps, key)


def _availability_zone(value: Any, key: str, b: Builder, facts: CatalogFacts | None) -> None:
    zones = known("zone", [str(value)], set(facts.zones) if facts else set(), key, facts, b)
    if zones is not None:
        b.allow("zones", zones, key)


def _availability_region(value: Any, key: str, b: Builder, facts: CatalogFacts | None) -> None:
    b.regions([str(value)], key)


def _accelerator_type(value: Any, key: str, b: Builder, facts: CatalogFacts | None) -> None:
    m = canonical_gpu(str(value))
    if m in KNOWN_GPU_MODELS:
        b.allow("gpus", [m], key)
    elif m.startswith("TPU"):
        b.refuse(key, f"{value!r}: ray_nodeless launches no TPUs")
    else:
        b.refuse(key, f"{value!r} names no GPU model ray_nodeless knows")


# A group's Ray labels (the group's promise to Ray: a task with a label selector lands on its machines) that say
# where its machines must be: label -> handler of its value (as the manifest has it; the messages quote it).
# Other Ray labels say nothing about the machine.
RAY_LABELS: dict[str, Callable[[Any, str, Builder, "CatalogFacts | None"], None]] = {
    "ray.io/market-type": _market_type,
    "ray.io/availability-zone": _availability_zone,
    "ray.io/availability-region": _availability_region,
    "ray.io/accelerator-type": _accelerator_type,
}
