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

The modules, imports going one way: this one (group_rules: a group's keys and its selector terms) -> labels.py
(the table of label handlers, one per well-known node label, and the Ray labels) -> constraints.py (GroupRules and
the Builder that accumulates constraint keys from several keys) -> catalog_labels.py (the labels resolved against
the catalog, CatalogFacts).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ray_nodeless.core.catalog.model import InstanceType
from ray_nodeless.kuberay.catalog_labels import CatalogFacts
from ray_nodeless.kuberay.constraints import Builder, GroupRules, Requirement, Unhonoured, restrict
from ray_nodeless.kuberay.labels import RAY_LABELS, apply

__all__ = ["CatalogFacts", "GroupRules", "Unhonoured", "group_rules"]


# A manifest's shape, as the RayCluster CRD (and so the API server) has it: a field of the wrong type is a blocking
# Unhonoured naming its key, and is read as empty, so a hostile manifest is refused naming the key, never a traceback.
def _mapping(value: Any, key: str, b: Builder) -> Mapping[str, Any]:
    """`value` when it is a mapping (null: empty); else refused naming `key`, and empty."""
    if value is None or isinstance(value, Mapping):
        return value or {}
    b.refuse(key, f"must be a mapping, got {type(value).__name__}")
    return {}


def _items(value: Any, key: str, b: Builder) -> list[Any]:
    """`value` when it is a list (null: empty); else refused naming `key`, and empty."""
    if value is None or isinstance(value, list):
        return value or []
    b.refuse(key, f"must be a list, got {type(value).__name__}")
    return []


def _label_value(value: Any, key: str, b: Builder) -> str | None:
    """A label value as Kubernetes compares it (a string; a number or boolean written unquoted reads as its text);
    a list, mapping or null is refused naming `key`."""
    if value is None or isinstance(value, (Mapping, list)):
        b.refuse(key, f"must be a string (a label value), got {'null' if value is None else type(value).__name__}")
        return None
    return str(value)


def _term(term: Mapping[str, Any], tkey: str, b: Builder, facts: CatalogFacts | None) -> None:
    """One nodeSelectorTerm: its expressions ANDed."""
    if term.get("matchFields"):
        b.refuse(f"{tkey}.matchFields", "selects Nodes by field (metadata.name): ray_nodeless makes new Nodes")
    for j, raw in enumerate(_items(term.get("matchExpressions"), f"{tkey}.matchExpressions", b)):
        ekey = f"{tkey}.matchExpressions[{j}]"
        e = _mapping(raw, ekey, b)
        if not e:
            continue
        label = e.get("key")
        if not isinstance(label, str) or not label:
            b.refuse(f"{ekey}.key", f"must be a label key (a non-empty string), got {label!r}")
            continue
        values = [_label_value(v, f"{ekey}.values[{i}]", b)
                  for i, v in enumerate(_items(e.get("values"), f"{ekey}.values", b))]
        if None in values:
            continue
        apply(Requirement(label, str(e.get("operator")), [v for v in values if v is not None], ekey), b, facts)


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


def _ored_terms(terms: Sequence[Any], rkey: str, b: Builder, facts: CatalogFacts | None) -> None:
    """Several nodeSelectorTerms, ORed: when every term narrows instance types only, the union of the types each
    term keeps (resolved against the catalog); else refused naming the key."""
    many = (f"{len(terms)} terms are ORed; ray_nodeless plans one set of constraints per group: keep one term, "
            "or split the group")
    if facts is None:
        b.refuse(rkey, f"{many} (ORed terms on instance types are resolved against the catalog's types, and none "
                       "were given)")
        return
    union: dict[str, InstanceType] = {}
    for i, term in enumerate(terms):
        one = GroupRules()
        ob = Builder(one)
        _term(_mapping(term, f"{rkey}[{i}]", ob), f"{rkey}[{i}]", ob, facts)
        b.out.clouds |= one.clouds
        b.out.unhonoured += one.unhonoured
        if one.blocking():
            return
        other = sorted(set(one.node_config) - _TYPE_KEYS)
        if other:
            b.refuse(f"{rkey}[{i}]", f"{many}: this one narrows {', '.join(other)}, which belong to a machine's "
                                     "offering (zone, capacity), not to its type; only terms on instance types are "
                                     "joined")
            return
        union.update((t.name, t) for t in (_term_types(one.node_config, facts) if one.node_config else facts.types))
    if not union:
        b.refuse(rkey, f"no term selects an instance type {facts.cloud} offers in {facts.region}")
        return
    # Each term's types are already the ones ray_nodeless may launch for it (a per-type label left the burstable
    # ones out): the union is kept as it is.
    restrict(Requirement("nodeSelectorTerms", "ORed", [], rkey), sorted(union.values(), key=lambda t: t.name),
             facts, b, names_families=True)


def _ray_labels(group: Mapping[str, Any], key: str, b: Builder, facts: CatalogFacts | None) -> None:
    """The group's Ray labels that say where its machines must be (labels.py RAY_LABELS)."""
    labels = _mapping(group.get("labels"), f"{key}.labels", b)
    for name in sorted(labels, key=str):
        handle = RAY_LABELS.get(name)
        if handle is not None:
            handle(labels[name], f'{key}.labels["{name}"]', b, facts)


def _machine_pins(spec: Mapping[str, Any], tkey: str, b: Builder) -> None:
    """What names a machine ray_nodeless never makes: an existing Node, a TPU."""
    if spec.get("nodeName"):
        b.refuse(f"{tkey}.nodeName", "pins an existing Node; ray_nodeless makes new ones")
    for i, raw in enumerate(_items(spec.get("containers"), f"{tkey}.containers", b)):
        ckey = f"{tkey}.containers[{i}]"
        resources = _mapping(_mapping(raw, ckey, b).get("resources"), f"{ckey}.resources", b)
        for part in ("limits", "requests"):
            res = _mapping(resources.get(part), f"{ckey}.resources.{part}", b)
            if "google.com/tpu" in res:
                b.refuse(f'{tkey}.containers[{i}].resources.{part}["google.com/tpu"]',
                         "TPUs: ray_nodeless launches no TPU machines")
                break


def _node_selection(spec: Mapping[str, Any], tkey: str, b: Builder, facts: CatalogFacts | None) -> None:
    """nodeSelector (each pair an `In [value]`), then required node affinity; a preferred one is dropped."""
    selector = _mapping(spec.get("nodeSelector"), f"{tkey}.nodeSelector", b)
    for label in sorted(selector, key=str):
        skey = f'{tkey}.nodeSelector["{label}"]'
        value = _label_value(selector[label], skey, b)
        if value is not None:
            apply(Requirement(str(label), "In", [value], skey), b, facts)
    akey = f"{tkey}.affinity"
    nkey = f"{akey}.nodeAffinity"
    node_aff = _mapping(_mapping(spec.get("affinity"), akey, b).get("nodeAffinity"), nkey, b)
    rkey = f"{nkey}.requiredDuringSchedulingIgnoredDuringExecution"
    required = _mapping(node_aff.get("requiredDuringSchedulingIgnoredDuringExecution"), rkey, b)
    rkey += ".nodeSelectorTerms"
    terms = _items(required.get("nodeSelectorTerms"), rkey, b)
    if len(terms) > 1:
        _ored_terms(terms, rkey, b, facts)
    elif terms:
        _term(_mapping(terms[0], f"{rkey}[0]", b), f"{rkey}[0]", b, facts)
    if node_aff.get("preferredDuringSchedulingIgnoredDuringExecution"):
        b.drop(f"{akey}.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution",
               "a preference: ray_nodeless picks the cheapest fit under the rules; dropped (state it as a required "
               "term to keep it)")


def _pod_placement(spec: Mapping[str, Any], tkey: str, b: Builder) -> None:
    """Pod (anti-)affinity, topology spread and the scheduler: one Ray pod per new machine, chosen by price, holds
    anti-affinity and spread per host; whatever follows other pods or spreads zones cannot be honoured."""
    akey = f"{tkey}.affinity"
    raw_affinity = spec.get("affinity")
    affinity: Mapping[str, Any] = raw_affinity if isinstance(raw_affinity, Mapping) else {}   # else refused above
    for kind in ("podAffinity", "podAntiAffinity"):
        pa = _mapping(affinity.get(kind), f"{akey}.{kind}", b)
        rkey = f"{akey}.{kind}.requiredDuringSchedulingIgnoredDuringExecution"
        for j, t in enumerate(_items(pa.get("requiredDuringSchedulingIgnoredDuringExecution"), rkey, b)):
            tk = f"{rkey}[{j}]"
            topo = _mapping(t, tk, b).get("topologyKey")
            if kind == "podAntiAffinity" and topo == "kubernetes.io/hostname":
                b.drop(tk, "holds by construction: each Ray pod gets a machine of its own")
            else:
                b.refuse(tk, f"required {kind} on {topo!r}: ray_nodeless places each Ray pod on a new machine of its "
                             "own, chosen by price, and cannot follow other pods")
        if pa.get("preferredDuringSchedulingIgnoredDuringExecution"):
            b.drop(f"{akey}.{kind}.preferredDuringSchedulingIgnoredDuringExecution", f"a {kind} preference: dropped")
    for j, raw in enumerate(_items(spec.get("topologySpreadConstraints"), f"{tkey}.topologySpreadConstraints", b)):
        tk = f"{tkey}.topologySpreadConstraints[{j}]"
        t = _mapping(raw, tk, b)
        topo = t.get("topologyKey")
        hard = t.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"
        if topo == "kubernetes.io/hostname":
            b.drop(tk, "holds by construction: one Ray pod per machine")
        else:
            b.out.unhonoured.append(Unhonoured(
                tk, f"spread over {topo!r}: ray_nodeless launches in the cheapest zone, not spread"
                    + ("; DoNotSchedule would leave pods pending" if hard else "; dropped (ScheduleAnyway)"), hard))
    scheduler = spec.get("schedulerName")
    if scheduler and scheduler != "default-scheduler":
        b.drop(f"{tkey}.schedulerName", f"{scheduler!r}: the Ray pod is bound to its machine's Node by ray_nodeless; "
                                        "gang scheduling is not honoured")


def _arm_only(out: GroupRules, facts: CatalogFacts) -> None:
    """ray_nodeless launches x86_64 unless told otherwise; a selection of Arm types only (a Graviton family) means
    Arm machines, as it does for the node autoscaler."""
    if "arch" not in out.node_config and set(out.node_config) & _TYPE_KEYS - {"arch"}:
        arches = {t.arch for t in _term_types(out.node_config, facts)}
        if arches and "x86_64" not in arches:
            out.node_config["arch"] = sorted(arches)
            out.sources["arch"] = " and ".join(out.sources[k] for k in sorted(out.node_config)
                                               if k in _TYPE_KEYS and k in out.sources)


def group_rules(group: Mapping[str, Any], *, key: str, facts: CatalogFacts | None = None) -> GroupRules:
    """A KubeRay worker group's (`workerGroupSpecs[i]`, at key path `key`) scheduling as ray_nodeless constraint
    keys. `facts` (the catalog's instance types and zones in the cluster's region) resolve what a label names
    indirectly: Karpenter's category, generation, size, vCPUs, memory, GPU count / memory, accelerators
    (catalog_labels.py CATALOG_LABELS), GCE types with attached GPUs, NotIn zones, a required region; without them
    those keys are refused (only which clouds the keys name is then meaningful). Never raises for the group's
    content: every key it cannot honour is in `unhonoured`."""
    out = GroupRules()
    b = Builder(out)
    if not isinstance(group, Mapping):
        b.refuse(key, f"must be a mapping (a worker group), got {type(group).__name__}")
        return out
    hosts = group.get("numOfHosts", 1)
    if isinstance(hosts, int) and hosts > 1:
        b.refuse(f"{key}.numOfHosts", f"{hosts}: a multi-host group scales {hosts} pods as one replica (a TPU slice, "
                                      "a multi-node job); ray_nodeless launches single machines")
    # Ray labels first (the group's promise to Ray), then the pod's node selection.
    _ray_labels(group, key, b, facts)
    tkey = f"{key}.template.spec"
    spec = _mapping(_mapping(group.get("template"), f"{key}.template", b).get("spec"), tkey, b)
    _machine_pins(spec, tkey, b)
    _node_selection(spec, tkey, b, facts)
    _pod_placement(spec, tkey, b)
    if facts is not None:
        _arm_only(out, facts)
        if out.regions is not None and facts.region not in out.regions:
            b.refuse(out.sources["region"], f"requires region {list(out.regions)}, the cluster runs in "
                                            f"{facts.region}")
    return out
