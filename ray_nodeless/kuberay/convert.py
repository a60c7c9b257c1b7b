"""`ray-nodeless convert` for KubeRay manifests (RayCluster, RayJob `spec.rayClusterSpec`, RayService
`spec.rayClusterConfig`; multi-document files, other documents kept as they are).

What it writes, per KubeRay document (docs/kuberay.md, "KubeRay manifests"):
- the manifest patched for the bridge: KubeRay's in-tree autoscaler off and a container of the head pod running
  `ray-nodeless kuberay-autoscaler` (kuberay/sidecar.py: KubeRay v1.5.0 cannot run another command in its own
  autoscaler container), each worker group's
  `replicas` / `minReplicas` set to 0 (the KubeRay operator creates clamp(replicas, minReplicas, maxReplicas) x
  numOfHosts pods of a group itself; its GetWorkerGroupDesiredReplicas), and the `ray-nodeless.io/config`
  annotation: cloud, region, the group's minimum (`groups.<g>.minWorkers`); the groups' pod scheduling stays in
  their templates, checked here as the bridge maps it every loop (kuberay/scheduling.py `group_rules`);
- optionally a `ray up` YAML with `registration: kubernetes` (a VM head; the workers join the Kubernetes cluster
  as Nodes running the groups' pod templates), converted as a Ray YAML for the cloud is (swapin/convert.py).

The config it plans (and `ray-nodeless plan MANIFEST` plans) is the bridge's own: Ray's derivation of the
RayCluster (compat/kuberay.py `derive_config`) with the provider swapped by `ray_adapter.kuberay.bridge_config`.
Group resources, labels, min/max and idle timeout are therefore Ray's reading of the RayCluster.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

from ray_nodeless.core.yaml_bounds import YamlBoundsError, load_bounded_all
from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.cluster_plan import ClusterPlan
from ray_nodeless.errors import ConfigError
from ray_nodeless.kuberay import annotation as K
from ray_nodeless.kuberay import scheduling as S
from ray_nodeless.kuberay import shape, sidecar
from ray_nodeless.kuberay.crd_defaults import with_defaults
from ray_nodeless.kuberay.images import settle_ray_images
from ray_nodeless.swapin.convert import NodeTypeChange, Side, _summary

# Planning a manifest needs no cluster, but the provider block must be complete: when the annotation has no
# `kubernetes.join` (how machines join: the user's, docs/kubernetes.md), plan reads it with this one
# and says so; the bridge itself refuses to start without it.
PLANNING_JOIN = {"method": "kubeadm", "endpoint": "https://kubernetes.default.svc:443",
                 "token": "abcdef.0123456789abcdef", "ca_cert_hash": "sha256:" + "0" * 64}


def is_kuberay(doc: Any) -> bool:
    return (isinstance(doc, Mapping) and isinstance(doc.get("apiVersion"), str)
            and doc["apiVersion"].startswith("ray.io/") and isinstance(doc.get("kind"), str)
            and doc["kind"] in K.CLUSTER_SPEC_AT)


def load_documents(text: str, source: str) -> list[Any]:
    try:
        return load_bounded_all(text)
    except yaml.YAMLError as e:
        raise ConfigError(source, f"not valid YAML: {e}") from e
    except YamlBoundsError as e:
        raise ConfigError(source, f"refused before reading it: {e}") from e


def kuberay_indexes(docs: list[Any]) -> list[int]:
    return [i for i, d in enumerate(docs) if is_kuberay(d)]


def _where(docs: list[Any], i: int) -> str:
    """Key prefix of document i: none when the file holds one KubeRay document."""
    return "" if len(kuberay_indexes(docs)) == 1 else f"documents[{i}]"


def _pre(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def cluster_name(meta: Mapping[str, Any]) -> str:
    """The name a document's RayCluster goes by here: its own, else its generateName without the trailing `-` (the
    API server adds a random suffix, which no manifest can know), else `raycluster`."""
    return str(meta.get("name") or str(meta.get("generateName") or "raycluster").rstrip("-") or "raycluster")


def ray_cluster(doc: Mapping[str, Any], where: str = "") -> tuple[dict[str, Any], str]:
    """The RayCluster a document is or creates (metadata: the document's, whose annotations KubeRay copies onto
    the RayCluster of a RayJob / RayService), and the key path of its spec."""
    kind, spec, spec_key = K.cluster_spec(doc, where)
    meta = copy.deepcopy(dict(doc.get("metadata") or {}))
    shape.check_names(meta, _pre(where, "metadata"))
    meta["name"] = cluster_name(meta)
    meta.setdefault("namespace", "default")
    return {"apiVersion": K.API_VERSION, "kind": "RayCluster", "metadata": meta, "spec": copy.deepcopy(spec)}, spec_key


def bridge_cluster_config(ray_cr: Mapping[str, Any], spec_key: str = "spec", *, planning: bool = True,
                          notes: list[str] | None = None,
                          catalog: catalog_mod.Catalog | None = None) -> dict[str, Any]:
    """The cluster config the bridge runs for this RayCluster (Ray's derivation, provider swapped, the groups'
    scheduling resolved against `catalog`, else the one the annotation names, as the bridge resolves it), with a
    planning join when the annotation has none (noted)."""
    from ray_nodeless.ray_compat.kuberay import derive_config
    from ray_nodeless.kuberay.bridge import annotation_settings, bridge_config, catalog_and_facts

    cr = copy.deepcopy(dict(ray_cr))
    if isinstance(cr.get("spec"), Mapping):
        cr["spec"] = with_defaults(cr["spec"])        # as the API server stores it (Ray's derivation needs them)
    settings = K.parse_annotation(cr.get("metadata"))
    if planning and not (settings.get("kubernetes") or {}).get("join"):
        settings.setdefault("kubernetes", {})
        settings["kubernetes"] = {**settings["kubernetes"], "join": dict(PLANNING_JOIN)}
        cr["metadata"].setdefault("annotations", {})[K.ANNOTATION] = K.render_annotation(settings)
        if notes is not None:
            notes.append(f"{K.annotation_key('kubernetes.join')}: not set: planned without it; the bridge needs how "
                         "machines join the cluster (docs/kubernetes.md) before it starts")
    try:
        derived = derive_config(cr)
    except (LookupError, TypeError, ValueError, AttributeError) as e:
        raise ConfigError(spec_key, f"Ray's derivation of the autoscaling config from the RayCluster failed: "
                                    f"{e!r}") from e
    _, facts = catalog_and_facts(annotation_settings(cr), catalog)
    try:
        return bridge_config(cr, derived, facts=facts)
    except ConfigError as e:
        raise _respec(K.rekey(e), spec_key) from e


def _respec(e: ConfigError, spec_key: str) -> ConfigError:
    """A key the bridge names under the RayCluster's `spec.` named under the document's spec (RayJob / RayService)."""
    if spec_key != "spec" and e.key.startswith("spec."):
        return ConfigError(spec_key + e.key[len("spec"):], str(e)[len(e.key) + 2:])
    return e


def plan_manifest(ray_cr: Mapping[str, Any], spec_key: str = "spec", catalog: catalog_mod.Catalog | None = None,
                  notes: list[str] | None = None) -> tuple[dict[str, Any], ClusterPlan]:
    """(the bridge's config, its plan): what `ray-nodeless plan MANIFEST` shows."""
    from ray_nodeless.operate.config import check_cluster, load_provider, prepare_like_ray_up

    from ray_nodeless.ray_adapter.bootstrap import settle_images

    cfg = prepare_like_ray_up(bridge_cluster_config(ray_cr, spec_key, notes=notes, catalog=catalog))
    # What the bridge hands its running provider about KubeRay's head pod (listing it as the head node) plays no
    # part in a plan.
    cfg["provider"].pop("kuberay", None)
    try:
        bundle = load_provider(cfg["provider"])
    except ConfigError as e:
        raise K.rekey(e) from e
    bundle = settle_images(cfg, bundle)    # the cloud's default image, as `plan` and bootstrap_config set it
    return cfg, check_cluster(cfg, catalog=catalog, bundle=bundle)


# --------------------------------------------------------------------------------------------- conversion


@dataclass
class ManifestConversion:
    source: str
    cloud: str
    region: str
    documents: list[Any]                    # every document, the KubeRay ones patched
    text: str                               # ... as written
    node_types: dict[str, NodeTypeChange]
    summary: dict[str, float | None]
    plan: ClusterPlan
    head_node_type: str
    ray_up: dict[str, Any] | None = None    # the `ray up` YAML (--ray-up)
    ray_up_text: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"node_types": {n: {"before": c.before.to_dict(), "after": c.after.to_dict()}
                               for n, c in self.node_types.items()},
                "summary": dict(self.summary)}


def convert_manifest(docs: list[Any], *, source_name: str = "<manifest>", cloud: str | None = None,
                     region: str | None = None, project_id: str | None = None, join: Mapping[str, Any] | None = None,
                     autoscaler_image: str | None = None, ray_up: bool = False,
                     catalog: catalog_mod.Catalog | None = None, ray_image: str | None = None,
                     open_shapes: bool = False, max_workers: int | None = None) -> ManifestConversion:
    """`open_shapes` (--open): shape-open node types on (a demand no worker group holds gets its cheapest fit as a
    generated node type), which a RayCluster with no worker group needs; `max_workers` (--max-workers): the
    annotation's `maxWorkers`, the cluster's worker limit, which a RayCluster with no worker group needs."""
    idx = kuberay_indexes(docs)
    if not idx:
        raise ConfigError("kind", "no RayCluster, RayJob or RayService document in the file")
    if len(idx) > 1:
        raise ConfigError(f"documents[{idx[1]}]", f"one KubeRay cluster per file (documents {idx} are "
                                                  "RayCluster / RayJob / RayService); split the file")
    i = idx[0]
    where = _where(docs, i)
    doc = copy.deepcopy(docs[i])
    kind, spec, spec_key = K.cluster_spec(doc, where)
    existing = K.parse_annotation(doc.get("metadata"))          # the metadata's shape checked, naming the key
    if doc.get("metadata") is None:
        doc["metadata"] = {}
    meta = doc["metadata"]
    ray_cluster(doc, where)                                      # its name and namespace checked, before any work
    provider, groups_cfg = K.split_groups(existing)
    notes: list[str] = []

    workers = spec.get("workerGroupSpecs")
    if workers is None:
        workers = []
    if not isinstance(workers, list):
        raise ConfigError(f"{spec_key}.workerGroupSpecs", f"must be a list of worker groups, got "
                                                          f"{shape._type(workers)}")
    if max_workers is not None:
        if max_workers < 0:
            raise ConfigError("--max-workers", f"must be >= 0, got {max_workers}")
        existing[K.MAX_WORKERS] = max_workers
    open_shapes = open_shapes or provider.get("open_shapes") is True
    if not workers and not open_shapes:
        raise ConfigError(f"{spec_key}.workerGroupSpecs", "no worker group: the head pod runs everything and "
                                                          "ray_nodeless would launch nothing; add a worker group "
                                                          "(its pods become ray_nodeless machines), or pass --open "
                                                          "(shape-open: each demand gets its cheapest-fit machine)")
    if not workers and K.MAX_WORKERS not in existing:
        raise ConfigError("--max-workers", f"a RayCluster with no worker group needs the cluster's worker limit: "
                                           f"pass --max-workers N (written as {K.annotation_key(K.MAX_WORKERS)})")
    if open_shapes:
        provider["open_shapes"] = True
    for j, g in enumerate(workers):
        if isinstance(g, Mapping) and "maxReplicas" not in g:
            notes.append(f"{spec_key}.workerGroupSpecs[{j}].maxReplicas: not set: KubeRay's default is 2147483647 "
                         f"(no limit); set it, or the annotation's maxWorkers / max_hourly_cost")
    for j, g in enumerate(workers):
        shape.check_group(g, f"{spec_key}.workerGroupSpecs[{j}]")
    shape.head_image(spec, spec_key)                             # the head group checked, then its Ray images
    notes += settle_ray_images(spec, spec_key, ray_image)
    image_of_head = shape.head_image(spec, spec_key)
    shape.check_autoscaler_options(spec, spec_key)
    # The cloud: the option, else the annotation, else the one the groups' node labels name.
    implied: dict[str, str] = {}
    for j, g in enumerate(workers):
        for c in sorted(S.group_rules(g, key=f"{spec_key}.workerGroupSpecs[{j}]").clouds):
            implied.setdefault(c, f"{spec_key}.workerGroupSpecs[{j}]")
    cloud = cloud or provider.get("cloud") or (next(iter(implied)) if len(implied) == 1 else None)
    if not cloud:
        raise ConfigError(K.annotation_key("cloud"), "not set, and no group's node labels name a cloud: pass "
                                                     "--cloud aws|gcp (convert writes it into the annotation)")
    for c, at in sorted(implied.items()):
        if c != cloud:
            raise ConfigError(at, f"its node labels are {c}'s (a {c} node pool) but the cluster converts for "
                                  f"{cloud}: remove them or convert with --cloud {c}")
    provider["cloud"] = cloud
    region = region or provider.get("region")
    if not region:
        raise ConfigError(K.annotation_key("region"), "not set: pass --region (convert writes it into the "
                                                      "annotation)")
    provider["region"] = region
    from ray_nodeless.swapin import keymap

    try:
        keymap.strategy(cloud).complete_provider(provider, project_id)      # GCP: project_id
    except ConfigError as e:
        raise K.rekey(e) from e
    if join is not None:
        provider["kubernetes"] = {**(provider.get("kubernetes") or {}), "join": dict(join)}
    from ray_nodeless.kuberay.bridge import catalog_and_facts

    # the catalog the annotation names (embedded, live, a file), as the bridge loads it: it prices the report and
    # resolves the labels that name machines indirectly (Karpenter's category, vCPUs, ...; NotIn zones)
    cat, facts = catalog_and_facts(provider, catalog)

    # Worker groups: the scheduling checked, the minimum into the annotation, no pods of the operator's.
    before_types: dict[str, str | None] = {}
    for j, g in enumerate(workers):
        gkey = f"{spec_key}.workerGroupSpecs[{j}]"
        name = str(g.get("groupName"))
        gr = S.group_rules(g, key=gkey, facts=facts)
        gr.check()                                     # one message, naming the key it cannot honour
        notes += [str(u) for u in gr.unhonoured]
        own = dict(groups_cfg.get(name) or {})
        # The scheduling stays in the template, which the bridge maps every loop (an edit of it takes effect, and
        # catalog-resolved lists follow the catalog the bridge reads): a copy in the annotation's node_config would
        # go over it and freeze it. That node_config keeps only the user's own keys.
        if gr.node_config:
            notes.append(f"{gkey}.template.spec: its scheduling maps to {', '.join(sorted(gr.node_config))} (the "
                         "bridge maps it every loop; `ray-nodeless plan` shows the values)")
        minimum = g.get("minReplicas") or 0
        if minimum and "minWorkers" not in own:
            own["minWorkers"] = minimum
        for k in ("replicas", "minReplicas"):
            if (g.get(k) or 0) != 0:
                notes.append(f"{gkey}.{k}: {g.get(k)} -> 0: the operator would create that many pods itself; "
                             f"the minimum is {K.annotation_key(f'groups.{name}.minWorkers')}"
                             + (" (the initial replicas above it are Ray's to decide)" if k == "replicas" and
                                (g.get(k) or 0) > minimum else ""))
                g[k] = 0
        if own:
            groups_cfg[name] = own
        its = gr.node_config.get("instance_types") or []
        before_types[name] = its[0] if len(its) == 1 else None
    annotation = dict(provider)
    if K.MAX_WORKERS in existing:
        annotation[K.MAX_WORKERS] = existing[K.MAX_WORKERS]
    if groups_cfg:
        annotation[K.GROUPS] = {n: groups_cfg[n] for n in sorted(groups_cfg)}

    opts = spec.get("autoscalerOptions") or {}
    image = autoscaler_image or ray_image or opts.get("image") or image_of_head
    notes += sidecar.install(spec, spec_key, cluster_name(meta), image)
    if not autoscaler_image:
        notes.append(f"{spec_key}.headGroupSpec.template.spec.containers[{sidecar.CONTAINER}].image: {image!r}: it "
                     "runs `ray-nodeless kuberay-autoscaler`, so this image needs ray_nodeless installed "
                     "(--autoscaler-image names another; cluster-configs/kuberay/Dockerfile builds one: "
                     "`make kuberay-image`)")
    meta.setdefault("annotations", {})[K.ANNOTATION] = K.render_annotation(annotation)

    ray_cr, _ = ray_cluster(doc, where)
    cfg, cp = plan_manifest(ray_cr, spec_key, catalog=cat, notes=notes)
    head = cp.head_node_type
    changes = _changes(cfg, cp, head, before_types, cat, cloud, region, head_is_pod=True)
    out_docs = list(docs)
    out_docs[i] = doc
    text = (f"# Converted from {source_name} by `ray-nodeless convert` for the ray_nodeless KubeRay bridge "
            f"(docs/kuberay.md). Preview: `ray-nodeless plan <this file>`.\n"
            + yaml.dump_all(out_docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False))
    conv = ManifestConversion(source=source_name, cloud=cloud, region=region, documents=out_docs, text=text,
                              node_types=changes, summary=_summary(changes, cfg.get("max_workers")), plan=cp,
                              head_node_type=head, notes=notes)
    if ray_up:
        _ray_up(conv, ray_cr, cfg, annotation, cat, source_name)
    return conv


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the annotation, serveConfigV2, runtimeEnvYAML) as `|` blocks, as people write them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value and all(ln == ln.rstrip() for ln in value.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _changes(cfg: Mapping[str, Any], cp: ClusterPlan, head: str, before_types: Mapping[str, str | None],
             cat: catalog_mod.Catalog, cloud: str, region: str, *, head_is_pod: bool) -> dict[str, NodeTypeChange]:
    """Per node type: before = what the pod's selector pins (one instance type; else the node autoscaler's choice,
    unknown), after = ray_nodeless's plan. The head of a bridged cluster is KubeRay's pod on an existing Node:
    neither side launches it, so it is left out of the costs."""
    from ray_nodeless.swapin.keymap import RayLaunch, cheapest_offering

    out: dict[str, NodeTypeChange] = {}
    for name in sorted(cfg["available_node_types"]):
        if name == head and head_is_pod:
            continue
        nt = cfg["available_node_types"][name]
        chosen = cp.plans[name].chosen
        pinned = before_types.get(name)
        caps = (nt.get("node_config") or {}).get("capacity") or ["on-demand"]
        b = Side(None, None, None)
        if pinned:
            o = cheapest_offering(cat, cloud, region, RayLaunch(pinned, caps[0], None))
            b = Side(pinned, caps[0], o.hourly_price if o is not None else None)
        is_head = name == head
        out[name] = NodeTypeChange(
            name=name, is_head=is_head, min_workers=0 if is_head else int(nt.get("min_workers", 0)),
            max_workers=0 if is_head else int(nt.get("max_workers", cfg.get("max_workers", 0))),
            before=b, after=Side(chosen.instance_type.name, chosen.capacity, chosen.hourly_price), freed=False)
    return out


def _ray_up(conv: ManifestConversion, ray_cr: Mapping[str, Any], cfg: Mapping[str, Any],
            annotation: Mapping[str, Any], cat: catalog_mod.Catalog, source_name: str) -> None:
    """The `ray up` YAML: the cluster as a Ray YAML for the cloud (a VM head of the head group's resources; the
    worker groups as node types with their Ray resources, labels, min/max and constraint keys), converted as any
    Ray YAML is (swapin/convert.py), with `registration: kubernetes` and each group's pod template."""
    from ray_nodeless.swapin.convert import convert

    provider = cfg["provider"]
    kube = {k: v for k, v in (provider.get("kubernetes") or {}).items() if k in ("join", "namespace",
                                                                                  "pod_templates", "pod_template")}
    if not (annotation.get("kubernetes") or {}).get("join"):
        raise ConfigError("--join", "a `ray up` YAML with registration: kubernetes needs how machines join the "
                                    "cluster: pass --join '{method: eks, cluster: NAME}' (or kubeadm / k3s keys, "
                                    "docs/kubernetes.md), or set kubernetes.join in the annotation")
    ray_provider = {"type": annotation["cloud"], "region": annotation["region"]}
    ray_provider.update({k: v for k, v in annotation.items()
                         if k not in ("cloud", "region", "kubernetes", *K.CLUSTER_KEYS)})
    ray_provider["registration"] = "kubernetes"
    ray_provider["kubernetes"] = {**{k: v for k, v in (annotation.get("kubernetes") or {}).items()}, **kube}
    head = cfg["head_node_type"]
    node_types = {}
    for name, nt in cfg["available_node_types"].items():
        out: dict[str, Any] = {"resources": dict(nt.get("resources") or {}),
                               "node_config": dict(nt.get("node_config") or {})}
        if name != head:
            out["min_workers"] = int(nt.get("min_workers", 0))
            out["max_workers"] = int(nt.get("max_workers", 0))
        if nt.get("labels"):
            out["labels"] = dict(nt["labels"])
        node_types[name] = out
    ray_yaml = {"cluster_name": ray_cr["metadata"]["name"], "max_workers": cfg.get("max_workers", 0),
                "idle_timeout_minutes": cfg.get("idle_timeout_minutes", 1), "provider": ray_provider,
                "available_node_types": node_types, "head_node_type": head}
    rc = convert(ray_yaml, source_name=source_name, catalog=cat)
    conv.ray_up, conv.ray_up_text = rc.config, rc.text
    head_change = rc.node_types[head]
    conv.node_types = {head: head_change, **conv.node_types}
    conv.summary = _summary(conv.node_types, cfg.get("max_workers"))
    conv.notes += [f"ray up YAML: {n}" for n in rc.notes]


# --------------------------------------------------------------------------------------------- report


def table(conv: ManifestConversion, output: str | None, ray_up_output: str | None = None) -> str:
    """The same before/after report as for Ray YAMLs (report.py cost_table); the head of a bridged cluster is
    KubeRay's pod, listed without costs unless --ray-up made it a VM node type."""
    from ray_nodeless.swapin.report import cost_table

    title = (f"converted {conv.source} (KubeRay) -> {output or 'stdout'} for the ray_nodeless bridge "
             f"({conv.cloud} {conv.region})" + (f"; ray up YAML -> {ray_up_output}" if ray_up_output else ""))
    head = ([] if conv.head_node_type in conv.node_types else
            [(conv.head_node_type, "head", "KubeRay's head pod", "KubeRay's head pod (not launched)")])
    return cost_table(title, "before (node autoscaler)", conv.node_types, conv.summary, conv.notes,
                      idle_scope="min workers" + (", VM head" if conv.ray_up else ""),
                      ceiling_scope="at max workers", not_pinned="(its pods' nodes: not pinned)", first_rows=head)
