"""KubeRay's side of the swap-in: the provider annotation of a RayCluster, and a worker group's pod scheduling as
ray_nodeless rules. Pure (no Ray, no Kubernetes client, no catalog read): the bridge (`ray-nodeless
kuberay-autoscaler`, which reads the live RayCluster every loop) and `ray-nodeless convert` (which patches a manifest
for the bridge) both read a RayCluster through this module, so a manifest means the same to both.

The annotation. ray_nodeless's settings live in one annotation of the RayCluster's metadata (of the RayCluster
a RayJob / RayService creates: `spec.rayClusterSpec` / `spec.rayClusterConfig` have no metadata of their own, so
there it is the RayJob's / RayService's, which KubeRay copies onto the RayCluster it creates):

    metadata:
      annotations:
        ray-nodeless.io/config: |
          cloud: aws
          region: us-west-2
          max_hourly_cost: 40
          exclude: {gpus: [K80, M60]}
          kubernetes: {join: {method: eks, cluster: my-eks}}
          groups:
            gpu-group:
              minWorkers: 1                  # the group's minimum (its minReplicas must be 0: see below)
              node_config: {capacity: [spot, on-demand], gpus: [A10G, L4]}

Its value is a YAML (or JSON) mapping of provider keys (README "How a node type becomes an instance"), exactly as
in a cluster YAML's `provider:` block, minus the keys the bridge sets: `type` and `module` (always ray_nodeless's),
`registration` (always `kubernetes`), `kubernetes.namespace` / `pod_template(s)` (the RayCluster's namespace and
groups' templates); plus `groups`: per worker group its `minWorkers` and `node_config` (constraint keys). A group's
`replicas` and `minReplicas` stay 0, since the KubeRay operator itself creates clamp(replicas, minReplicas,
maxReplicas) x numOfHosts pods of a group (its GetWorkerGroupDesiredReplicas); the minimum moves to `minWorkers`.
Errors name the key as `metadata.annotations["ray-nodeless.io/config"].<key>`.

A group's scheduling (`group_rules`): what the worker group's pod template says about the node it must land on,
turned into constraint keys of the group's node type (`node_config`: instance_types, families, gpus, capacity,
zones, arch, ...), from `nodeSelector` and required node affinity on the well-known node labels of EKS, Karpenter,
GKE, NVIDIA's GPU feature discovery and Kubernetes itself, and from the group's Ray labels (`labels`:
`ray.io/market-type`, `ray.io/availability-zone`, `ray.io/availability-region`, `ray.io/accelerator-type`).
What it cannot honour is returned, each naming the key path under the group, as `Unhonoured`: `blocking` ones are
required placement ray_nodeless would break (multi-host groups, TPUs, required pod affinity, ORed selector terms,
DoNotSchedule topology spread across zones, ...): convert refuses the manifest naming the key; the rest are
preferences dropped with a note (preferred affinities, ScheduleAnyway spread, another scheduler).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import yaml

from ray_nodeless.core.catalog.model import InstanceType
from ray_nodeless.core.gpus import KNOWN_GPU_MODELS, canonical_gpu
from ray_nodeless.errors import ConfigError

ANNOTATION = "ray-nodeless.io/config"
MODULE = "ray_nodeless.NodelessProvider"
# Keys of the provider block the bridge sets itself: an annotation that names them is refused (naming the key),
# since a different value could only break the bridge.
BRIDGE_KEYS = {"type": "external", "module": MODULE, "registration": "kubernetes"}
# Keys of the `kubernetes:` block that come from the RayCluster itself.
BRIDGE_KUBERNETES_KEYS = ("namespace", "pod_template", "pod_templates")
GROUPS = "groups"                   # the annotation's per-group settings: {<groupName>: {minWorkers, node_config}}
GROUP_KEYS = ("minWorkers", "node_config")

API_VERSION = "ray.io/v1"
# kind -> where the RayCluster spec is in that kind's `spec` (None: `spec` itself).
CLUSTER_SPEC_AT: dict[str, str | None] = {"RayCluster": None, "RayJob": "rayClusterSpec",
                                          "RayService": "rayClusterConfig"}


def annotation_key(key: str | None = None) -> str:
    """The key path of the annotation (or of one provider key inside it), as errors name it."""
    base = f'metadata.annotations["{ANNOTATION}"]'
    return f"{base}.{key}" if key else base


def rekey(error: ConfigError) -> ConfigError:
    """A ConfigError about the provider block the annotation became (`provider.rules[0].capacity`), naming the
    annotation instead (`metadata.annotations["ray-nodeless.io/config"].rules[0].capacity`)."""
    key = error.key
    if key == "provider" or key.startswith("provider.") or key.startswith("provider["):
        rest = key[len("provider"):].lstrip(".")
        message = str(error)[len(error.key) + 2:]
        return ConfigError(annotation_key(rest or None), message)
    return error


def parse_annotation(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """The provider keys of the annotation in `metadata` (a RayCluster's, RayJob's or RayService's), as a dict;
    {} when there is no annotation. Checks the text and its shape only: `provider_block` + `launch.config.
    load_provider` (through `rekey`) check the keys' values."""
    annotations = (metadata or {}).get("annotations") or {}
    if not isinstance(annotations, Mapping):
        raise ConfigError("metadata.annotations", f"must be a mapping, got {type(annotations).__name__}")
    if ANNOTATION not in annotations:
        return {}
    text = annotations[ANNOTATION]
    if not isinstance(text, str):
        raise ConfigError(annotation_key(), f"must be a string (a YAML or JSON mapping), got "
                                            f"{type(text).__name__}: annotations are strings")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(annotation_key(), f"not valid YAML/JSON: {e}") from e
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(annotation_key(), f"must be a mapping of provider keys (cloud, region, rules, ...), got "
                                            f"{type(doc).__name__}")
    for k in sorted(doc, key=str):
        if not isinstance(k, str):
            raise ConfigError(annotation_key(str(k)), "provider keys are strings")
        if k in BRIDGE_KEYS:
            raise ConfigError(annotation_key(k), f"set by the bridge (always {BRIDGE_KEYS[k]!r}); remove it")
    kube = doc.get("kubernetes")
    if kube is not None and not isinstance(kube, dict):
        raise ConfigError(annotation_key("kubernetes"), "must be a mapping")
    for k in BRIDGE_KUBERNETES_KEYS:
        if k in (kube or {}):
            raise ConfigError(annotation_key(f"kubernetes.{k}"), "comes from the RayCluster (its namespace and each "
                                                                 "worker group's template)")
    groups = doc.get(GROUPS, {})
    if not isinstance(groups, dict):
        raise ConfigError(annotation_key(GROUPS), "must map worker group names to {minWorkers, node_config}")
    for name in sorted(groups, key=str):
        g, gk = groups[name], annotation_key(f"{GROUPS}.{name}")
        if not isinstance(g, dict):
            raise ConfigError(gk, f"takes {' and '.join(GROUP_KEYS)}")
        for k in sorted(g, key=str):
            if k not in GROUP_KEYS:
                raise ConfigError(f"{gk}.{k}", f"unknown key; a group takes {', '.join(GROUP_KEYS)}")
        m = g.get("minWorkers", 0)
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ConfigError(f"{gk}.minWorkers", f"must be an integer >= 0, got {m!r}")
        if not isinstance(g.get("node_config", {}), dict):
            raise ConfigError(f"{gk}.node_config", "must be a mapping of constraint keys")
    return doc


def split_groups(annotation: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the provider keys, the `groups` settings) of a parsed annotation."""
    provider = {k: v for k, v in annotation.items() if k != GROUPS}
    return provider, dict(annotation.get(GROUPS) or {})


def provider_block(annotation: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The provider block the bridge runs with: `defaults` (the bridge's: in-cluster `kubernetes:` block, head
    address, ...), the annotation's provider keys (without `groups`: split_groups) over them (a `kubernetes:`
    mapping merged key by key), and BRIDGE_KEYS."""
    out: dict[str, Any] = {**BRIDGE_KEYS}
    for k, v in (defaults or {}).items():
        if k not in BRIDGE_KEYS:
            out[k] = v
    for k, v in annotation.items():
        if k == "kubernetes" and isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def load_annotated(metadata: Mapping[str, Any] | None, defaults: Mapping[str, Any] | None = None) -> Any:
    """The provider bundle (`launch.config.load_provider`) of the annotation in `metadata` over the bridge's
    `defaults`; every error names the annotation's key."""
    from ray_nodeless.launch.config import load_provider

    block = provider_block(split_groups(parse_annotation(metadata))[0], defaults)
    try:
        return load_provider(block, planning=True)
    except ConfigError as e:
        raise rekey(e) from e


def render_annotation(provider: Mapping[str, Any]) -> str:
    """The annotation's value for these provider keys (block YAML, keys in the given order)."""
    return yaml.safe_dump({k: v for k, v in provider.items() if k not in BRIDGE_KEYS}, sort_keys=False,
                          default_flow_style=False)


def cluster_spec(doc: Mapping[str, Any], where: str = "") -> tuple[str, dict[str, Any], str]:
    """(kind, the RayCluster spec inside a RayCluster / RayJob / RayService, its key path). ConfigError naming the
    key for anything else."""
    api, kind = doc.get("apiVersion"), doc.get("kind")
    pre = f"{where}." if where else ""
    if kind not in CLUSTER_SPEC_AT:
        raise ConfigError(f"{pre}kind", f"{kind!r}: convert reads {', '.join(CLUSTER_SPEC_AT)} manifests")
    if not isinstance(api, str) or not api.startswith("ray.io/"):
        raise ConfigError(f"{pre}apiVersion", f"{api!r}: a {kind} is ray.io/v1")
    if api != API_VERSION:
        raise ConfigError(f"{pre}apiVersion", f"{api!r}: only {API_VERSION} (KubeRay >= 1.0) is read")
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        raise ConfigError(f"{pre}spec", "a RayCluster manifest needs a spec mapping")
    at = CLUSTER_SPEC_AT[kind]
    if at is None:
        return kind, spec, f"{pre}spec"
    inner = spec.get(at)
    if not isinstance(inner, dict):
        raise ConfigError(f"{pre}spec.{at}", f"a {kind} needs spec.{at} (the RayCluster it creates)")
    return kind, inner, f"{pre}spec.{at}"


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
      Node; a machine made for the group must carry them for the Ray pod to be scheduled there (every mapped key
      holds on it by construction of `node_config`).
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
_KARPENTER_FAMILY = re.compile(r"^([a-z]+)(\d+)")

ZONE_KEYS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
REGION_KEYS = ("topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region")
INSTANCE_TYPE_KEYS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
ARCH_KEYS = ("kubernetes.io/arch", "beta.kubernetes.io/arch")
OS_KEYS = ("kubernetes.io/os", "beta.kubernetes.io/os")
# The scheduling keys group_rules maps (README "KubeRay"), by the cloud whose nodes carry them (None: any).
MAPPED_KEYS: dict[str, str | None] = {
    **{k: None for k in INSTANCE_TYPE_KEYS + ZONE_KEYS + REGION_KEYS + ARCH_KEYS + OS_KEYS},
    "karpenter.k8s.aws/instance-family": "aws", "karpenter.k8s.aws/instance-category": "aws",
    "karpenter.k8s.aws/instance-generation": "aws", "karpenter.k8s.aws/instance-gpu-name": "aws",
    "karpenter.sh/capacity-type": "aws", "eks.amazonaws.com/capacityType": "aws",
    "cloud.google.com/gke-accelerator": "gcp", "cloud.google.com/gke-spot": "gcp",
    "cloud.google.com/gke-preemptible": "gcp", "cloud.google.com/machine-family": "gcp",
    "nvidia.com/gpu.product": None,
}
TPU_KEYS = ("cloud.google.com/gke-tpu-accelerator", "cloud.google.com/gke-tpu-topology")
RAY_LABEL_KEYS = ("ray.io/market-type", "ray.io/availability-zone", "ray.io/availability-region",
                  "ray.io/accelerator-type")


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
    """Accumulates constraints from several keys: allow-lists intersect, exclusions add up; a contradiction is a
    blocking Unhonoured naming both keys."""

    def __init__(self, out: GroupRules):
        self.out = out

    def allow(self, name: str, values: Sequence[str], key: str) -> None:
        nc = self.out.node_config
        if name in nc:
            kept = [v for v in nc[name] if v in values]
            if not kept:
                self.out.unhonoured.append(Unhonoured(key, f"{list(values)} contradicts {self.out.sources[name]} "
                                                           f"({nc[name]}): no machine has both", True))
                return
            nc[name] = kept
            self.out.sources[name] = f"{self.out.sources[name]} and {key}"
        else:
            nc[name] = list(values)
            self.out.sources[name] = key

    def exclude(self, name: str, values: Sequence[str], key: str) -> None:
        nc = self.out.node_config
        nc[name] = sorted(set(nc.get(name, [])) | set(values))
        self.out.sources[name] = f"{self.out.sources[name]} and {key}" if name in self.out.sources else key


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


def _families_where(types: Iterable[InstanceType], pred) -> list[str]:
    out = set()
    for t in types:
        m = _KARPENTER_FAMILY.match(t.family)
        if m and pred(m.group(1), int(m.group(2))):
            out.add(t.family)
    return sorted(out)


def _apply(label: str, op: str, values: list[str], key: str, acc: _Acc, out: GroupRules, *,
           cloud: str | None, types: Sequence[InstanceType], zones: Sequence[str] | None) -> None:
    """One requirement `label op values` (a nodeSelector pair is `In [value]`) at `key`."""
    if label in TPU_KEYS:
        out.unhonoured.append(Unhonoured(key, "TPU node pools: ray_nodeless launches no TPU slices", True))
        return
    if label not in MAPPED_KEYS:
        if op == "In" and len(values) == 1:
            out.node_labels[label] = values[0]
            out.unhonoured.append(Unhonoured(key, f"{label} is no label ray_nodeless maps to a rule: the machine's "
                                                  f"Node is labelled {label}={values[0]} so the pod schedules, "
                                                  "nothing else follows from it", False))
        else:
            out.unhonoured.append(Unhonoured(key, f"{op} on {label}: not a label ray_nodeless maps; only a single "
                                                  "`In` value (set on the Node) can be honoured", True))
        return
    need = MAPPED_KEYS[label]
    if need is not None:
        out.clouds.add(need)
    if op in ("Exists", "DoesNotExist"):
        out.unhonoured.append(Unhonoured(key, f"{op} on {label} narrows nothing ray_nodeless chooses by; dropped",
                                         op == "DoesNotExist" and label not in OS_KEYS))
        return
    if op in ("Gt", "Lt"):
        if label != "karpenter.k8s.aws/instance-generation":
            out.unhonoured.append(Unhonoured(key, f"{op} only applies to karpenter.k8s.aws/instance-generation", True))
            return
        try:
            n = int(values[0]) if len(values) == 1 else None
        except ValueError:
            n = None
        if n is None:
            out.unhonoured.append(Unhonoured(key, f"{op} needs one integer value, got {values}", True))
            return
        fams = _families_where(types, (lambda c, g: g > n) if op == "Gt" else (lambda c, g: g < n))
        if not fams:
            out.unhonoured.append(Unhonoured(key, f"no {cloud or 'aws'} family has a generation {op} {n}", True))
            return
        acc.allow("families", fams, key)
        return
    if op not in ("In", "NotIn"):
        out.unhonoured.append(Unhonoured(key, f"operator {op!r} is not one of In, NotIn, Exists, DoesNotExist, "
                                              "Gt, Lt", True))
        return
    if not values:
        out.unhonoured.append(Unhonoured(key, f"{op} with no values", True))
        return
    if op == "In" and len(values) == 1:
        out.node_labels[label] = values[0]
    neg = op == "NotIn"
    if label in INSTANCE_TYPE_KEYS:
        names = list(values)
        # The catalog names a host with attached GPUs (GCE) `<machine_type>+<n>x<model>`: the Node's label is the
        # host's machine type, so those variants are the same selection.
        names += sorted(t.name for t in types if t.machine_type in values and t.name not in values)
        (acc.exclude if neg else acc.allow)("exclude_instance_types" if neg else "instance_types", names, key)
    elif label == "karpenter.k8s.aws/instance-family" or label == "cloud.google.com/machine-family":
        fams = [v.lower() for v in values]
        (acc.exclude if neg else acc.allow)("exclude_families" if neg else "families", fams, key)
    elif label == "karpenter.k8s.aws/instance-category" or label == "karpenter.k8s.aws/instance-generation":
        want = set(values)
        if label.endswith("category"):
            fams = _families_where(types, lambda c, g: (c in want) != neg)
        else:
            fams = _families_where(types, lambda c, g: (str(g) in want) != neg)
        if not fams:
            out.unhonoured.append(Unhonoured(key, f"{op} {values}: no {cloud or 'aws'} instance family matches"
                                                  + ("" if types else " (no catalog types given)"), True))
            return
        acc.allow("families", fams, key)
    elif label in ("karpenter.k8s.aws/instance-gpu-name", "cloud.google.com/gke-accelerator",
                   "nvidia.com/gpu.product"):
        models = []
        for v in values:
            m = gpu_product_model(v) if label == "nvidia.com/gpu.product" else canonical_gpu(v)
            if m is None or m not in KNOWN_GPU_MODELS:
                out.unhonoured.append(Unhonoured(key, f"{v!r} names no GPU model ray_nodeless knows "
                                                      f"(known: {', '.join(sorted(KNOWN_GPU_MODELS)[:12])}, ...)",
                                                 True))
                return
            models.append(m)
        models = sorted(set(models))
        if neg:
            acc.exclude("exclude_gpus", models, key)
        else:
            acc.allow("gpus", models, key)
            out.node_config["allow_gpu_instances"] = True
    elif label in ("karpenter.sh/capacity-type", "eks.amazonaws.com/capacityType",
                   "cloud.google.com/gke-spot", "cloud.google.com/gke-preemptible"):
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
            if zones is None:
                out.unhonoured.append(Unhonoured(key, "NotIn on zones needs the region's zones", True))
                return
            left = [z for z in zones if z not in values]
            if not left:
                out.unhonoured.append(Unhonoured(key, "excludes every zone of the region", True))
                return
            acc.allow("zones", left, key)
        else:
            acc.allow("zones", list(values), key)
    elif label in REGION_KEYS:
        if neg:
            out.unhonoured.append(Unhonoured(key, "NotIn on the region: state the region the cluster runs in "
                                                  "(the annotation's `region`) instead", True))
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


def group_rules(group: Mapping[str, Any], *, key: str, cloud: str | None = None,
                types: Iterable[InstanceType] = (), zones: Sequence[str] | None = None) -> GroupRules:
    """A KubeRay worker group's (`workerGroupSpecs[i]`, at key path `key`) scheduling as ray_nodeless constraint
    keys. `cloud`, `types` (the cloud's catalog instance types) and `zones` (the region's) resolve what a label
    names indirectly: Karpenter's instance category / generation (families), GCE types with attached GPUs, NotIn
    zones. Never raises for the group's content: every key it cannot honour is in `unhonoured`."""
    types = list(types)
    out = GroupRules()
    acc = _Acc(out)
    kw = dict(cloud=cloud, types=types, zones=zones)

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
                acc.allow("zones", [str(v)], k)
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
        out.unhonoured.append(Unhonoured(rkey, f"{len(terms)} terms are ORed; ray_nodeless plans one set of "
                                               "constraints per group: keep one term, or split the group", True))
    elif terms:
        term = terms[0] or {}
        if term.get("matchFields"):
            out.unhonoured.append(Unhonoured(f"{rkey}[0].matchFields", "selects Nodes by field (metadata.name): "
                                                                       "ray_nodeless makes new Nodes", True))
        for j, e in enumerate(term.get("matchExpressions") or []):
            ekey = f"{rkey}[0].matchExpressions[{j}]"
            _apply(str(e.get("key")), str(e.get("operator")), [str(v) for v in e.get("values") or []],
                   f'{ekey}', acc, out, **kw)
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
    return out
