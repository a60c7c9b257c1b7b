"""The provider annotation of a RayCluster. Pure (no Ray, no Kubernetes client, no catalog read): the bridge
(`ray-nodeless kuberay-autoscaler`, which reads the live RayCluster every loop) and `ray-nodeless convert` (which
patches a manifest for the bridge) both read a RayCluster through this module, so a manifest means the same to
both. A worker group's pod scheduling as ray_nodeless rules is scheduling.py.

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

Its value is a YAML (or JSON) mapping of provider keys (docs/rules.md), exactly as
in a cluster YAML's `provider:` block, minus the keys the bridge sets: `type` and `module` (always ray_nodeless's),
`registration` (always `kubernetes`), `kubernetes.namespace` / `pod_template(s)` (the RayCluster's namespace and
groups' templates); plus `groups`: per worker group its `minWorkers` and `node_config` (constraint keys); and
`maxWorkers`, the cluster's worker limit (Ray's max_workers; without it, the sum of the groups' maxReplicas, as
Ray derives it), which a RayCluster with no worker group must give. A group's
`replicas` and `minReplicas` stay 0, since the KubeRay operator itself creates clamp(replicas, minReplicas,
maxReplicas) x numOfHosts pods of a group (its GetWorkerGroupDesiredReplicas); the minimum moves to `minWorkers`.
Errors name the key as `metadata.annotations["ray-nodeless.io/config"].<key>`.

"""
from __future__ import annotations

from typing import Any, Mapping

import yaml

from ray_nodeless.core.yaml_bounds import YamlBoundsError, load_bounded
from ray_nodeless.core.schema import suggest_key, unknown_key
from ray_nodeless.errors import ConfigError, ConfigErrors

ANNOTATION = "ray-nodeless.io/config"
MODULE = "ray_nodeless.NodelessProvider"
# Keys of the provider block the bridge sets itself: an annotation that names them is refused (naming the key),
# since a different value could only break the bridge.
BRIDGE_KEYS = {"type": "external", "module": MODULE, "registration": "kubernetes"}
# Keys of the `kubernetes:` block that come from the RayCluster itself.
BRIDGE_KUBERNETES_KEYS = ("namespace", "pod_template", "pod_templates")
GROUPS = "groups"                   # the annotation's per-group settings: {<groupName>: {minWorkers, node_config}}
GROUP_KEYS = ("minWorkers", "node_config")
# The cluster's worker limit (Ray's max_workers, which Ray's derivation makes the sum of the groups' maxReplicas):
# what bounds a RayCluster's generated (shape-open) node types, and required when it declares no worker group.
MAX_WORKERS = "maxWorkers"
CLUSTER_KEYS = (GROUPS, MAX_WORKERS)      # annotation keys that are not provider keys

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
    annotation instead (`metadata.annotations["ray-nodeless.io/config"].rules[0].capacity`); each of several."""
    if isinstance(error, ConfigErrors):
        return ConfigErrors([rekey(e) for e in error.errors])
    key = error.key
    if key == "provider" or key.startswith("provider.") or key.startswith("provider["):
        rest = key[len("provider"):].lstrip(".")
        message = str(error)[len(error.key) + 2:]
        return ConfigError(annotation_key(rest or None), message)
    return error


def parse_annotation(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """The provider keys of the annotation in `metadata` (a RayCluster's, RayJob's or RayService's), as a dict;
    {} when there is no annotation. Checks the text and its shape only: `provider_block` + `operate.config.
    load_provider` (through `rekey`) check the keys' values."""
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ConfigError("metadata", f"must be a mapping, got {type(metadata).__name__}")
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
        doc = load_bounded(text)
    except yaml.YAMLError as e:
        raise ConfigError(annotation_key(), f"not valid YAML/JSON: {e}") from e
    except YamlBoundsError as e:                 # read from the API server: anyone who may edit the RayCluster
        raise ConfigError(annotation_key(), f"refused before reading it: {e}") from e
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
    m = doc.get(MAX_WORKERS, 0)
    if isinstance(m, bool) or not isinstance(m, int) or m < 0:
        raise ConfigError(annotation_key(MAX_WORKERS), f"must be an integer >= 0 (the cluster's worker limit), "
                                                       f"got {m!r}")
    groups = doc.get(GROUPS, {})
    if not isinstance(groups, dict):
        raise ConfigError(annotation_key(GROUPS), "must map worker group names to {minWorkers, node_config}")
    for name in sorted(groups, key=str):
        g, gk = groups[name], annotation_key(f"{GROUPS}.{name}")
        if not isinstance(g, dict):
            raise ConfigError(gk, f"takes {' and '.join(GROUP_KEYS)}")
        unknown = [unknown_key(f"{gk}.{k}", str(k), GROUP_KEYS) for k in sorted(g, key=str) if k not in GROUP_KEYS]
        if unknown:
            raise ConfigErrors.of(unknown)
        m = g.get("minWorkers", 0)
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ConfigError(f"{gk}.minWorkers", f"must be an integer >= 0, got {m!r}")
        if not isinstance(g.get("node_config", {}), dict):
            raise ConfigError(f"{gk}.node_config", "must be a mapping of constraint keys")
    return doc


def check_group_names(groups: Mapping[str, Any], names: list[str]) -> None:
    """Every group the annotation's `groups` names must be a worker group of the RayCluster (`names`): a typo would
    leave the real group without its settings. All unknown ones in one error, each with its nearest group name."""
    unknown = sorted(set(map(str, groups)) - set(names), key=str)
    if unknown:
        raise ConfigErrors.of([unknown_key(annotation_key(f"{GROUPS}.{n}"), n, names, what="worker group")
                               if suggest_key(n, names) else
                               ConfigError(annotation_key(f"{GROUPS}.{n}"), f"is not a worker group of the "
                                                                           f"RayCluster (groups: "
                                                                           f"{', '.join(names) or 'none'})")
                               for n in unknown])


def split_groups(annotation: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the provider keys, the `groups` settings) of a parsed annotation (`maxWorkers` in neither: bridge_config
    reads it)."""
    provider = {k: v for k, v in annotation.items() if k not in CLUSTER_KEYS}
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
    """The provider bundle (`operate.config.load_provider`) of the annotation in `metadata` over the bridge's
    `defaults`; every error names the annotation's key."""
    from ray_nodeless.operate.config import load_provider

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
    if not isinstance(kind, str) or kind not in CLUSTER_SPEC_AT:
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
