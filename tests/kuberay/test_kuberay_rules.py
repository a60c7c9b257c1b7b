"""kuberay/annotation.py: the provider annotation and a worker group's scheduling mapped to ray_nodeless constraints,
one scheduling key at a time; every mapped node_config is then parsed by the core's own parser and checked against
the embedded catalog (so a key maps to something the planner accepts, not merely to a dict)."""
from __future__ import annotations

import re

import pytest

from ray_nodeless.core.catalog import embedded
from ray_nodeless.core.catalog_checks import CatalogValues, check_constraints
from ray_nodeless.core.requirements import parse_requirements
from ray_nodeless.errors import ConfigError
from ray_nodeless.kuberay import annotation as K
from ray_nodeless.kuberay import catalog_labels as C
from ray_nodeless.kuberay import scheduling as S

KEY = "spec.workerGroupSpecs[0]"


def _group(node_selector=None, affinity=None, labels=None, **extra):
    spec = {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.52.0"}]}
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    if affinity is not None:
        spec["affinity"] = affinity
    spec.update(extra.pop("spec", {}))
    g = {"groupName": "g", "template": {"spec": spec}}
    if labels is not None:
        g["labels"] = labels
    g.update(extra)
    return g


def _required(*exprs):
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": list(exprs)}]}}}


def _rules(group, cloud="aws", region="us-west-2"):
    cat = embedded()
    out = S.group_rules(group, key=KEY, facts=S.CatalogFacts.of(cat, cloud, region))
    if not out.blocking():
        # The mapped keys parse and every value is one the catalog knows in that region.
        parse_requirements(out.node_config, "node_config")
        check_constraints(CatalogValues(cat.region(cloud, region)), out.node_config, "node_config")
    return out


@pytest.mark.parametrize("label,value,cloud,expected", [
    ("node.kubernetes.io/instance-type", "g5.xlarge", "aws", {"instance_types": ["g5.xlarge"]}),
    ("beta.kubernetes.io/instance-type", "m5.large", "aws", {"instance_types": ["m5.large"]}),
    ("karpenter.k8s.aws/instance-family", "c6i", "aws", {"families": ["c6i"]}),
    ("karpenter.k8s.aws/instance-gpu-name", "a10g", "aws", {"gpus": ["A10G"], "allow_gpu_instances": True}),
    ("karpenter.sh/capacity-type", "spot", "aws", {"capacity": ["spot"]}),
    ("karpenter.sh/capacity-type", "on-demand", "aws", {"capacity": ["on-demand"]}),
    ("eks.amazonaws.com/capacityType", "SPOT", "aws", {"capacity": ["spot"]}),
    ("eks.amazonaws.com/capacityType", "ON_DEMAND", "aws", {"capacity": ["on-demand"]}),
    ("nvidia.com/gpu.product", "Tesla-T4", "aws", {"gpus": ["T4"], "allow_gpu_instances": True}),
    ("nvidia.com/gpu.product", "NVIDIA-A10G", "aws", {"gpus": ["A10G"], "allow_gpu_instances": True}),
    ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB", "aws", {"gpus": ["A100-80GB"], "allow_gpu_instances": True}),
    ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3", "aws", {"gpus": ["H100"], "allow_gpu_instances": True}),
    ("topology.kubernetes.io/zone", "us-west-2b", "aws", {"zones": ["us-west-2b"]}),
    ("kubernetes.io/arch", "arm64", "aws", {"arch": ["arm64"]}),
    ("kubernetes.io/arch", "amd64", "aws", {"arch": ["x86_64"]}),
    ("kubernetes.io/os", "linux", "aws", {}),
    ("cloud.google.com/gke-accelerator", "nvidia-l4", "gcp", {"gpus": ["L4"], "allow_gpu_instances": True}),
    ("cloud.google.com/gke-accelerator", "nvidia-tesla-a100", "gcp", {"gpus": ["A100"], "allow_gpu_instances": True}),
    ("cloud.google.com/gke-spot", "true", "gcp", {"capacity": ["spot"]}),
    ("cloud.google.com/gke-spot", "false", "gcp", {"capacity": ["on-demand"]}),
    ("cloud.google.com/gke-preemptible", "true", "gcp", {"capacity": ["spot"]}),
    ("cloud.google.com/machine-family", "N2", "gcp", {"families": ["n2"]}),
])
def test_each_node_selector_key(label, value, cloud, expected):
    region = "us-west-2" if cloud == "aws" else "us-central1"
    if label == "topology.kubernetes.io/zone" and cloud == "gcp":
        value = "us-central1-a"
    out = _rules(_group({label: value}), cloud, region)
    assert out.blocking() == []
    assert out.node_config == expected
    assert out.node_labels == {label: value}            # the Node must carry it for the pod's nodeSelector
    if expected:
        assert all(src == f'{KEY}.template.spec.nodeSelector["{label}"]'
                   for k, src in out.sources.items() if k in expected)
    assert out.clouds <= {cloud}


def test_gce_instance_type_keeps_its_attached_gpu_variants():
    out = _rules(_group({"node.kubernetes.io/instance-type": "n1-standard-8"}), "gcp", "us-central1")
    names = out.node_config["instance_types"]
    assert names[0] == "n1-standard-8" and any(n.startswith("n1-standard-8+") for n in names[1:])


def test_a_required_region_must_be_the_clusters():
    out = _rules(_group({"topology.kubernetes.io/region": "us-west-2"}))
    assert out.regions == ("us-west-2",) and out.node_config == {} and out.blocking() == []
    out = _rules(_group({"topology.kubernetes.io/region": "us-east-1"}))
    [b] = out.blocking()
    assert b.key == f'{KEY}.template.spec.nodeSelector["topology.kubernetes.io/region"]'
    assert "the cluster runs in us-west-2" in b.reason
    out = _rules(_group(labels={"ray.io/availability-region": "us-east-1"},
                        node_selector={"topology.kubernetes.io/region": "us-west-2"}))
    b = out.blocking()[0]
    assert b.key == f'{KEY}.template.spec.nodeSelector["topology.kubernetes.io/region"]'
    assert "contradicts" in b.reason and "ray.io/availability-region" in b.reason
    # NotIn on the region: holds unless it names the cluster's
    assert _rules(_group(affinity=_required({"key": "topology.kubernetes.io/region", "operator": "NotIn",
                                             "values": ["eu-west-1"]}))).unhonoured == []
    [b] = _rules(_group(affinity=_required({"key": "topology.kubernetes.io/region", "operator": "NotIn",
                                            "values": ["us-west-2"]}))).blocking()
    assert "us-west-2, the region the cluster runs in" in b.reason


def test_karpenter_category_and_generation_resolve_to_catalog_families():
    out = _rules(_group(affinity=_required(
        {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["c", "m"]},
        {"key": "karpenter.k8s.aws/instance-generation", "operator": "Gt", "values": ["6"]})))
    fams = out.node_config["families"]
    assert fams and all(f[0] in "cm" and int(f[1]) > 6 for f in fams)
    assert "c7i" in fams and "c6i" not in fams and "r7i" not in fams
    assert "matchExpressions[0] and " in out.sources["families"]


def test_required_affinity_in_notin_and_arch_any():
    out = _rules(_group(affinity=_required(
        {"key": "node.kubernetes.io/instance-type", "operator": "NotIn", "values": ["g4dn.xlarge"]},
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "spot"]},
        {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "NotIn", "values": ["k80"]},
        {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["us-west-2a"]})))
    assert out.blocking() == []
    nc = out.node_config
    assert nc["exclude_instance_types"] == ["g4dn.xlarge"] and nc["arch"] == ["arm64", "x86_64"]
    assert nc["capacity"] == ["spot", "on-demand"]          # spot first, as Karpenter prefers it
    assert nc["exclude_gpus"] == ["K80"]
    assert "us-west-2a" not in nc["zones"] and nc["zones"]


def test_ray_labels_map_and_contradictions_block():
    out = _rules(_group(labels={"ray.io/market-type": "spot", "ray.io/availability-zone": "us-west-2c",
                                "ray.io/accelerator-type": "L4", "cpu-family": "intel"}))
    assert out.node_config == {"capacity": ["spot"], "zones": ["us-west-2c"], "gpus": ["L4"]}
    out = _rules(_group({"karpenter.sh/capacity-type": "spot"}, labels={"ray.io/market-type": "on-demand"}))
    [b] = out.blocking()
    assert b.key == f'{KEY}.template.spec.nodeSelector["karpenter.sh/capacity-type"]'
    with pytest.raises(ConfigError) as e:
        out.check()
    assert e.value.key == b.key


@pytest.mark.parametrize("group,key,blocking", [
    (_group(numOfHosts=2), f"{KEY}.numOfHosts", True),
    (_group({"cloud.google.com/gke-tpu-topology": "2x2"}),
     f'{KEY}.template.spec.nodeSelector["cloud.google.com/gke-tpu-topology"]', True),
    (_group(spec={"containers": [{"name": "w", "resources": {"limits": {"google.com/tpu": "4"}}}]}),
     f'{KEY}.template.spec.containers[0].resources.limits["google.com/tpu"]', True),
    (_group(affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": []}}]}}),
     f"{KEY}.template.spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution", False),
    (_group(affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {}}]}}),
     f"{KEY}.template.spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]", True),
    (_group(affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {}}]}}),
     f"{KEY}.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]", False),
    (_group(affinity={"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}}),
     f"{KEY}.template.spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution", False),
    (_group(spec={"topologySpreadConstraints": [{"topologyKey": "topology.kubernetes.io/zone", "maxSkew": 1}]}),
     f"{KEY}.template.spec.topologySpreadConstraints[0]", True),
    (_group(spec={"topologySpreadConstraints": [{"topologyKey": "topology.kubernetes.io/zone", "maxSkew": 1,
                                                 "whenUnsatisfiable": "ScheduleAnyway"}]}),
     f"{KEY}.template.spec.topologySpreadConstraints[0]", False),
    (_group(spec={"schedulerName": "volcano"}), f"{KEY}.template.spec.schedulerName", False),
    (_group(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": []}, {"matchExpressions": []}]}}}),
     f"{KEY}.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
     True),          # without catalog facts ORed terms cannot be joined
    (_group({"my.example/pool": "a"}), f'{KEY}.template.spec.nodeSelector["my.example/pool"]', False),
    (_group({"karpenter.k8s.aws/instance-gpu-name": "zz99"}),
     f'{KEY}.template.spec.nodeSelector["karpenter.k8s.aws/instance-gpu-name"]', True),
    (_group({"kubernetes.io/os": "windows"}), f'{KEY}.template.spec.nodeSelector["kubernetes.io/os"]', True),
])
def test_what_cannot_be_honoured_names_the_key(group, key, blocking):
    out = S.group_rules(group, key=KEY)
    [u] = out.unhonoured
    assert (u.key, u.blocking) == (key, blocking)
    assert u.reason


def test_unknown_selector_label_is_dropped_with_a_note():
    out = S.group_rules(_group({"my.example/pool": "a"}), key=KEY)
    assert out.node_labels == {"my.example/pool": "a"} and out.node_config == {}
    [u] = out.unhonoured
    assert not u.blocking and "bound to its machine's Node" in u.reason


def test_clouds_implied_by_the_keys():
    out = S.group_rules(_group({"cloud.google.com/gke-spot": "true", "karpenter.sh/capacity-type": "spot"}), key=KEY)
    assert out.clouds == {"aws", "gcp"}


# ------------------------------------------------------------------------------------------------- annotation


def test_annotation_round_trip_and_block():
    provider = {"cloud": "aws", "region": "us-west-2", "max_hourly_cost": 40,
                "rules": [{"name": "gpu", "match": {"GPU": ">=1"}, "capacity": ["spot", "on-demand"]}]}
    meta = {"annotations": {K.ANNOTATION: K.render_annotation(provider)}}
    assert K.parse_annotation(meta) == provider
    block = K.provider_block(provider, {"kubernetes": {"namespace": "ray", "join": {"method": "kubeadm"}},
                                        "type": "ignored"})
    assert block["type"] == "external" and block["module"] == "ray_nodeless.NodelessProvider"
    assert block["registration"] == "kubernetes" and block["kubernetes"]["namespace"] == "ray"
    over = K.provider_block({"kubernetes": {"namespace": "jobs"}}, {"kubernetes": {"namespace": "ray", "x": 1}})
    assert over["kubernetes"] == {"namespace": "jobs", "x": 1}
    assert K.parse_annotation({}) == {} and K.parse_annotation(None) == {}
    with_groups = {**provider, "groups": {"g": {"minWorkers": 1, "node_config": {"capacity": ["spot"]}}}}
    parsed = K.parse_annotation({"annotations": {K.ANNOTATION: K.render_annotation(with_groups)}})
    assert K.split_groups(parsed) == (provider, with_groups["groups"])


@pytest.mark.parametrize("value,key", [
    ("[1, 2]", K.annotation_key()),
    ("cloud: [aws", K.annotation_key()),
    ("type: external\ncloud: aws", K.annotation_key("type")),
    ("registration: vm", K.annotation_key("registration")),
    ("kubernetes: {namespace: x}", K.annotation_key("kubernetes.namespace")),
    ("groups: [a]", K.annotation_key("groups")),
    ("groups: {g: {minWorkers: -1}}", K.annotation_key("groups.g.minWorkers")),
    ("groups: {g: {min: 1}}", K.annotation_key("groups.g.min")),
    ("groups: {g: {node_config: [1]}}", K.annotation_key("groups.g.node_config")),
    (7, K.annotation_key()),
])
def test_bad_annotations_name_the_key(value, key):
    with pytest.raises(ConfigError) as e:
        K.parse_annotation({"annotations": {K.ANNOTATION: value}})
    assert e.value.key == key


def test_value_errors_are_rekeyed_to_the_annotation():
    defaults = {"kubernetes": {"join": {"method": "kubeadm", "endpoint": "https://10.0.0.1:6443",
                                        "token": "abcdef.0123456789abcdef", "ca_cert_hash": "sha256:" + "0" * 64}}}
    text = "cloud: aws\nregion: us-west-2\nrules:\n- name: r\n  capacity: [preemptible]\n"
    with pytest.raises(ConfigError) as e:
        K.load_annotated({"annotations": {K.ANNOTATION: text}}, defaults)
    assert e.value.key == K.annotation_key("rules[0].capacity")
    assert "preemptible" in str(e.value)
    bundle = K.load_annotated({"annotations": {K.ANNOTATION: "cloud: aws\nregion: us-west-2\n"}}, defaults)
    assert (bundle.core.cloud, bundle.core.region, bundle.core.registration) == ("aws", "us-west-2", "kubernetes")


@pytest.mark.parametrize("doc,key", [
    ({"apiVersion": "v1", "kind": "ConfigMap"}, "kind"),
    ({"apiVersion": "ray.io/v1alpha1", "kind": "RayCluster", "spec": {}}, "apiVersion"),
    ({"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {}}, "spec.rayClusterSpec"),
])
def test_cluster_spec_refusals(doc, key):
    with pytest.raises(ConfigError) as e:
        K.cluster_spec(doc)
    assert e.value.key == key


def test_cluster_spec_of_each_kind():
    inner = {"headGroupSpec": {}}
    assert K.cluster_spec({"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": inner})[1:] == (inner, "spec")
    assert K.cluster_spec({"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {"rayClusterSpec": inner}}
                          )[2] == "spec.rayClusterSpec"
    assert K.cluster_spec({"apiVersion": "ray.io/v1", "kind": "RayService", "spec": {"rayClusterConfig": inner}},
                          "documents[1]")[2] == "documents[1].spec.rayClusterConfig"


# ------------------------------------------------------------------------------ labels resolved against the catalog
# Karpenter's instance labels, NVIDIA GPU feature discovery's, NotIn zones: resolved against the region's instance
# types (CatalogFacts). Each case checks the constraint keys select exactly the types the label's meaning selects,
# computed here from the catalog's fields (names, vCPUs, memory, GPUs) without the module's own label table.

AWS = S.CatalogFacts.of(embedded(), "aws", "us-west-2")
_NAME = re.compile(r"^([a-z]+)(?:-\d+tb)?(\d+)")     # Karpenter's category / generation from the type's name


def _cat(t):
    m = _NAME.match(t.name)
    return m.group(1) if m else None


def _gen(t):
    m = _NAME.match(t.name)
    return int(m.group(2)) if m else None


def _selected(nc, facts=AWS):
    """The catalog types the constraint keys of `nc` let through (the keys group_rules writes for these labels)."""
    out = set()
    for t in facts.types:
        if "instance_types" in nc and t.name not in nc["instance_types"]:
            continue
        if t.name in nc.get("exclude_instance_types", ()):
            continue
        if "families" in nc and t.family not in nc["families"]:
            continue
        if t.family in nc.get("exclude_families", ()):
            continue
        if t.vcpus < nc.get("min_vcpus", 0) or t.memory_gib < nc.get("min_memory_gib", 0):
            continue
        out.add(t.name)
    return out


def _plain(pred, facts=AWS):
    """What a per-type label selects: the matching types, without the burstable and non-GPU-accelerator ones that
    ray_nodeless launches only when named (unless nothing else matches)."""
    hit = [t for t in facts.types if pred(t)]
    return {t.name for t in ([t for t in hit if not (t.burstable or t.accelerator)] or hit)}


def _mib_per_gpu(t):
    return t.gpu_memory_gib * 1024 / t.gpu_count if t.gpu_count else None


@pytest.mark.parametrize("label,op,values,expected", [
    # family-level labels name whole families, burstable ones included (as instance-family does)
    ("karpenter.k8s.aws/instance-category", "In", ["c", "m", "r"],
     lambda: {t.name for t in AWS.types if _cat(t) in ("c", "m", "r")}),
    ("karpenter.k8s.aws/instance-category", "In", ["t"], lambda: {t.name for t in AWS.types if _cat(t) == "t"}),
    ("karpenter.k8s.aws/instance-category", "NotIn", ["p", "g"],
     lambda: {t.name for t in AWS.types if _cat(t) not in ("p", "g")}),
    ("karpenter.k8s.aws/instance-generation", "Gt", ["6"],
     lambda: {t.name for t in AWS.types if _gen(t) is not None and _gen(t) > 6}),
    ("karpenter.k8s.aws/instance-generation", "Lt", ["4"],
     lambda: {t.name for t in AWS.types if _gen(t) is not None and _gen(t) < 4}),
    ("karpenter.k8s.aws/instance-generation", "In", ["5"], lambda: {t.name for t in AWS.types if _gen(t) == 5}),
    # per-type labels
    ("karpenter.k8s.aws/instance-cpu", "In", ["4", "8"], lambda: _plain(lambda t: t.vcpus in (4, 8))),
    ("karpenter.k8s.aws/instance-cpu", "Lt", ["3"], lambda: _plain(lambda t: t.vcpus < 3)),
    ("karpenter.k8s.aws/instance-memory", "Lt", ["4096"], lambda: _plain(lambda t: t.memory_gib * 1024 < 4096)),
    ("karpenter.k8s.aws/instance-memory", "In", ["16384"], lambda: _plain(lambda t: t.memory_gib == 16)),
    ("karpenter.k8s.aws/instance-size", "In", ["2xlarge"], lambda: _plain(lambda t: t.name.endswith(".2xlarge"))),
    ("karpenter.k8s.aws/instance-size", "NotIn", ["metal"],
     lambda: _plain(lambda t: not t.name.endswith(".metal"))),
    ("karpenter.k8s.aws/instance-gpu-count", "Gt", ["1"], lambda: _plain(lambda t: t.gpu_count > 1)),
    ("karpenter.k8s.aws/instance-gpu-count", "Exists", [], lambda: _plain(lambda t: t.gpu_count > 0)),
    ("karpenter.k8s.aws/instance-gpu-count", "DoesNotExist", [], lambda: _plain(lambda t: t.gpu_count == 0)),
    ("karpenter.k8s.aws/instance-gpu-memory", "Gt", ["40000"],
     lambda: _plain(lambda t: t.gpu_count and _mib_per_gpu(t) > 40000)),
    ("karpenter.k8s.aws/instance-gpu-manufacturer", "In", ["nvidia"], lambda: _plain(lambda t: t.gpu_count > 0)),
    ("karpenter.k8s.aws/instance-gpu-name", "Exists", [], lambda: _plain(lambda t: t.gpu_count > 0)),
    ("karpenter.k8s.aws/instance-accelerator-name", "In", ["inferentia2"],
     lambda: {t.name for t in AWS.types if t.accelerator == "Inferentia2"}),
    ("karpenter.k8s.aws/instance-accelerator-count", "DoesNotExist", [], lambda: _plain(lambda t: not t.accelerator)),
    ("karpenter.k8s.aws/instance-capability-flex", "In", ["true"], lambda: _plain(lambda t: "-flex." in t.name)),
    ("nvidia.com/gpu.count", "Lt", ["2"], lambda: _plain(lambda t: 0 < t.gpu_count < 2)),
    ("nvidia.com/gpu.memory", "Gt", ["30000"], lambda: _plain(lambda t: t.gpu_count and _mib_per_gpu(t) > 30000)),
    ("nvidia.com/gpu.product", "DoesNotExist", [], lambda: _plain(lambda t: t.gpu_count == 0)),
])
def test_catalog_labels_select_exactly_the_types_they_name(label, op, values, expected):
    out = _rules(_group(affinity=_required({"key": label, "operator": op, "values": values})))
    assert out.unhonoured == []
    want = expected()
    assert want and len(want) < len(AWS.types)               # each case narrows, and leaves something
    assert _selected(out.node_config) == want
    assert out.node_config.get("allow_gpu_instances", False) == all(
        t.gpu_count for t in AWS.types if t.name in want)
    assert out.sources[next(k for k in out.node_config if k != "allow_gpu_instances")].endswith("matchExpressions[0]")


@pytest.mark.parametrize("label,op,n,key,value", [
    ("karpenter.k8s.aws/instance-cpu", "Gt", "7", "min_vcpus", 8),
    ("karpenter.k8s.aws/instance-memory", "Gt", "16383", "min_memory_gib", 16.0),
])
def test_gt_on_vcpus_and_memory_is_a_minimum(label, op, n, key, value):
    """No catalog needed: Karpenter's values are whole vCPUs and MiB, so > n is >= n + 1."""
    out = S.group_rules(_group(affinity=_required({"key": label, "operator": op, "values": [n]})), key=KEY)
    assert out.unhonoured == [] and out.node_config == {key: value}


def test_karpenter_default_nodepool_requirements_plan():
    """The requirements of Karpenter's documented default NodePool, with a spread of operators, together."""
    out = _rules(_group(affinity=_required(
        {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["c", "m", "r"]},
        {"key": "karpenter.k8s.aws/instance-generation", "operator": "Gt", "values": ["2"]},
        {"key": "karpenter.k8s.aws/instance-cpu", "operator": "Lt", "values": ["33"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]},
        {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["us-west-2d"]})))
    assert out.unhonoured == []
    nc = out.node_config
    assert nc["capacity"] == ["spot", "on-demand"] and nc["zones"] == ["us-west-2a", "us-west-2b", "us-west-2c"]
    want = {t.name for t in AWS.types if _cat(t) in ("c", "m", "r") and _gen(t) > 2 and t.vcpus < 33}
    assert _selected(nc) == want


@pytest.mark.parametrize("name,expected", [
    ("m5.large", ("m", 5)), ("c7i-flex.large", ("c", 7)), ("u-6tb1.metal", ("u", 1)),
    ("u7i-12tb.metal", ("u", 7)), ("p6-b200.48xlarge", ("p", 6)), ("inf2.xlarge", ("inf", 2)),
    ("im4gn.large", ("im", 4)), ("x2iedn.xlarge", ("x", 2)), ("mac2-m2.metal", ("mac", 2)),
    ("n2-standard-8", None), ("e2", None),
])
def test_category_and_generation_parse_as_karpenter_does(name, expected):
    assert C.karpenter_category_generation(name) == expected


@pytest.mark.parametrize("expr,reason", [
    ({"key": "karpenter.k8s.aws/instance-generation", "operator": "Gt", "values": ["x"]}, "exactly one integer"),
    ({"key": "karpenter.k8s.aws/instance-cpu", "operator": "Lt", "values": ["2", "4"]}, "exactly one integer"),
    ({"key": "karpenter.k8s.aws/instance-category", "operator": "Gt", "values": ["3"]}, "is not a number"),
    ({"key": "node.kubernetes.io/instance-type", "operator": "Lt", "values": ["3"]}, "is not a number"),
    ({"key": "karpenter.k8s.aws/instance-generation", "operator": "Gt", "values": ["99"]}, "no aws instance type"),
    ({"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["zz"]}, "no aws instance type"),
    ({"key": "node.kubernetes.io/instance-type", "operator": "DoesNotExist"}, "DoesNotExist selects none"),
    ({"key": "karpenter.k8s.aws/instance-cpu", "operator": "DoesNotExist"}, "no aws instance type"),
    ({"key": "topology.kubernetes.io/zone", "operator": "NotIn",
      "values": ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"]}, "excludes every zone of us-west-2"),
    ({"key": "topology.k8s.aws/zone-id", "operator": "In", "values": ["usw2-az1"]}, "records no zone ids"),
    ({"key": "karpenter.k8s.aws/instance-hypervisor", "operator": "In", "values": ["nitro"]}, "no hypervisors"),
    ({"key": "karpenter.k8s.aws/instance-local-nvme", "operator": "Gt", "values": ["100"]}, "no local NVMe"),
    ({"key": "karpenter.k8s.aws/instance-cpu-manufacturer", "operator": "In", "values": ["intel"]},
     "Intel's or AMD's"),
    ({"key": "my.example/pool", "operator": "Exists"}, "not a label ray_nodeless maps"),
    ({"key": "my.example/pool", "operator": "In", "values": ["a", "b"]}, "not a label ray_nodeless maps"),
    ({"key": "kubernetes.io/arch", "operator": "Matches", "values": ["a"]}, "is not one of In, NotIn"),
])
def test_what_the_catalog_cannot_honour_names_the_key(expr, reason):
    out = _rules(_group(affinity=_required(expr)))
    [b] = out.blocking()
    assert b.key == f"{KEY}.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution." \
                    "nodeSelectorTerms[0].matchExpressions[0]"
    assert reason in b.reason, b.reason


@pytest.mark.parametrize("expr", [
    {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["c"]},
    {"key": "karpenter.k8s.aws/instance-generation", "operator": "Lt", "values": ["6"]},
    {"key": "karpenter.k8s.aws/instance-cpu", "operator": "Lt", "values": ["6"]},
    {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Exists"},
    {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["us-west-2a"]},
])
def test_without_catalog_facts_the_resolved_keys_are_refused_naming_the_key(expr):
    out = S.group_rules(_group(affinity=_required(expr)), key=KEY)
    [b] = out.blocking()
    assert b.key.endswith("matchExpressions[0]") and "catalog" in b.reason


@pytest.mark.parametrize("expr,node_config", [
    ({"key": "cloud.google.com/gke-spot", "operator": "Exists"}, {"capacity": ["spot"]}),
    ({"key": "cloud.google.com/gke-spot", "operator": "DoesNotExist"}, {"capacity": ["on-demand"]}),
    ({"key": "cloud.google.com/gke-preemptible", "operator": "Exists"}, {"capacity": ["spot"]}),
    ({"key": "karpenter.k8s.aws/instance-cpu-manufacturer", "operator": "In", "values": ["aws"]}, {"arch": ["arm64"]}),
    ({"key": "karpenter.k8s.aws/instance-cpu-manufacturer", "operator": "NotIn", "values": ["aws"]},
     {"arch": ["x86_64"]}),
    ({"key": "node.kubernetes.io/instance-type", "operator": "Exists"}, {}),
    ({"key": "karpenter.sh/capacity-type", "operator": "Exists"}, {}),
    ({"key": "karpenter.k8s.aws/instance-cpu", "operator": "Exists"}, {}),
])
def test_exists_and_does_not_exist_where_they_mean_something(expr, node_config):
    out = S.group_rules(_group(affinity=_required(expr)), key=KEY, facts=AWS)
    assert out.unhonoured == [] and out.node_config == node_config


def test_an_unmapped_label_that_must_be_absent_holds_on_a_new_node():
    out = _rules(_group(affinity=_required({"key": "node-role.kubernetes.io/control-plane",
                                            "operator": "DoesNotExist"},
                                           {"key": "my.example/pool", "operator": "NotIn", "values": ["gpu"]})))
    assert out.blocking() == [] and len(out.unhonoured) == 2 and out.node_config == {}
    # ... unless the group's own nodeSelector asks for it
    out = _rules(_group({"my.example/pool": "gpu"},
                        affinity=_required({"key": "my.example/pool", "operator": "NotIn", "values": ["gpu"]})))
    [b] = out.blocking()
    assert "contradicts the group's own my.example/pool=gpu" in b.reason


def test_two_resolved_labels_intersect_and_a_contradiction_names_both():
    out = _rules(_group(affinity=_required(
        {"key": "karpenter.k8s.aws/instance-size", "operator": "In", "values": ["xlarge"]},
        {"key": "karpenter.k8s.aws/instance-cpu", "operator": "In", "values": ["4"]})))
    assert out.blocking() == []
    assert _selected(out.node_config) == _plain(lambda t: t.name.endswith(".xlarge")) & _plain(lambda t: t.vcpus == 4)
    out = _rules(_group(affinity=_required(
        {"key": "karpenter.k8s.aws/instance-accelerator-name", "operator": "In", "values": ["inferentia2"]},
        {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["m"]})))
    [b] = out.blocking()
    assert b.key.endswith("matchExpressions[1]") and "matchExpressions[0]" in b.reason and "no machine" in b.reason


@pytest.mark.parametrize("group,key,what", [
    (_group({"topology.kubernetes.io/zone": "us-east-1a"}),
     f'{KEY}.template.spec.nodeSelector["topology.kubernetes.io/zone"]', "no zone of aws in us-west-2"),
    (_group(labels={"ray.io/availability-zone": "us-west-2z"}), f'{KEY}.labels["ray.io/availability-zone"]',
     "no zone of aws in us-west-2"),
    (_group({"node.kubernetes.io/instance-type": "m99.huge"}),
     f'{KEY}.template.spec.nodeSelector["node.kubernetes.io/instance-type"]', "no instance type of aws"),
    (_group({"karpenter.k8s.aws/instance-family": "zz9"}),
     f'{KEY}.template.spec.nodeSelector["karpenter.k8s.aws/instance-family"]', "no family of aws"),
])
def test_values_the_catalog_lacks_in_the_region_name_the_template_key(group, key, what):
    """Refused at the template's key, rather than later at the node_config key the plan would name."""
    [b] = _rules(group).blocking()
    assert b.key == key and what in b.reason


def test_in_values_the_region_lacks_are_dropped_with_a_note():
    out = _rules(_group(affinity=_required({"key": "node.kubernetes.io/instance-type", "operator": "In",
                                            "values": ["m5.large", "m99.huge"]},
                                           {"key": "topology.kubernetes.io/zone", "operator": "In",
                                            "values": ["us-west-2b", "eu-west-1a"]})))
    assert out.blocking() == []
    assert out.node_config == {"instance_types": ["m5.large"], "zones": ["us-west-2b"]}
    assert [u.reason.split(":")[0] for u in out.unhonoured] == ["['m99.huge']", "['eu-west-1a']"]


def test_karpenter_a100_is_both_a100s():
    """EC2 (and so Karpenter's instance-gpu-name) calls the 40 GB and the 80 GB A100 `A100` (p4d, p4de)."""
    out = _rules(_group({"karpenter.k8s.aws/instance-gpu-name": "a100"}))
    assert out.node_config["gpus"] == ["A100", "A100-80GB"]
    assert _rules(_group({"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"})).node_config["gpus"] == ["A100"]


def test_gke_accelerator_count_on_gcp_keeps_the_hosts_with_that_many_gpus():
    """GKE's GPU count label (Autopilot's GPU selector): resolved against GCP's types, attached-GPU hosts included."""
    gcp = S.CatalogFacts.of(embedded(), "gcp", "us-central1")
    out = _rules(_group({"cloud.google.com/gke-accelerator": "nvidia-l4",
                         "cloud.google.com/gke-accelerator-count": "2"}), "gcp", "us-central1")
    assert out.blocking() == [] and out.clouds == {"gcp"}
    assert out.node_config["gpus"] == ["L4"] and out.node_config["allow_gpu_instances"] is True
    assert _selected(out.node_config, gcp) == {t.name for t in gcp.types if t.gpu_count == 2}
    out = _rules(_group({"cloud.google.com/gke-accelerator": "nvidia-tesla-t4",
                         "cloud.google.com/gke-accelerator-count": "4"}), "gcp", "us-central1")
    assert any("+4xT4" in n for n in _selected(out.node_config, gcp))


def _terms(*terms):
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": list(t)} for t in terms]}}}


RKEY = f"{KEY}.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"


def test_ored_terms_on_instance_types_are_their_union():
    """Kubernetes ORs nodeSelectorTerms: terms that narrow instance types only join into one set of types."""
    out = _rules(_group(affinity=_terms(
        [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["g5"]},
         {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "In", "values": ["1"]}],
        [{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["l4"]},
         {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}])))
    assert out.unhonoured == []
    want = ({t.name for t in AWS.types if t.family == "g5" and t.gpu_count == 1}
            | {t.name for t in AWS.types if t.gpu_model == "L4" and t.gpu_count and t.arch == "x86_64"})
    assert _selected(out.node_config) == want and out.node_config["allow_gpu_instances"] is True
    assert out.sources[next(k for k in out.node_config if k != "allow_gpu_instances")] == RKEY
    # and a nodeSelector still narrows the union (ANDed with it)
    out = _rules(_group({"node.kubernetes.io/instance-type": "g5.xlarge"}, affinity=_terms(
        [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["g5"]}],
        [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["g6"]}])))
    assert out.blocking() == [] and _selected(out.node_config) == {"g5.xlarge"}


@pytest.mark.parametrize("terms,key,reason", [
    ([[{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]}],
      [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5"]}]], f"{RKEY}[0]", "zones"),
    ([[{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5"]}],
      [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]], f"{RKEY}[1]", "capacity"),
    ([[{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5"]}],
      [{"key": "topology.k8s.aws/zone-id", "operator": "In", "values": ["usw2-az1"]}]],
     f"{RKEY}[1].matchExpressions[0]", "records no zone ids"),
])
def test_ored_terms_on_offerings_are_refused_naming_the_term(terms, key, reason):
    [b] = _rules(_group(affinity=_terms(*terms))).blocking()
    assert b.key == key and reason in b.reason


def test_a_selection_of_arm_types_only_means_arm_machines():
    """ray_nodeless launches x86_64 unless told otherwise: a Graviton family alone implies arm64, as on Karpenter."""
    out = _rules(_group({"karpenter.k8s.aws/instance-family": "c7g"}))
    assert out.node_config == {"families": ["c7g"], "arch": ["arm64"]}
    assert out.sources["arch"] == f'{KEY}.template.spec.nodeSelector["karpenter.k8s.aws/instance-family"]'
    assert "arch" not in _rules(_group({"karpenter.k8s.aws/instance-family": "c7i"})).node_config
    assert "arch" not in _rules(_group(affinity=_required(
        {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["c7g", "c7i"]}))).node_config
