"""swapin/kuberay.py: the provider annotation and a worker group's scheduling mapped to ray_nodeless constraints,
one scheduling key at a time; every mapped node_config is then parsed by the core's own parser and checked against
the embedded catalog (so a key maps to something the planner accepts, not merely to a dict)."""
from __future__ import annotations

import pytest

from ray_nodeless.core.catalog import embedded
from ray_nodeless.core.catalog_checks import CatalogValues, check_constraints
from ray_nodeless.core.requirements import parse_requirements
from ray_nodeless.errors import ConfigError
from ray_nodeless.swapin import kuberay as K

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
    out = K.group_rules(group, key=KEY, cloud=cloud, types=cat.types(cloud), zones=cat.region(cloud, region).zones)
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


def test_region_is_returned_for_the_caller_to_check():
    out = _rules(_group({"topology.kubernetes.io/region": "us-west-2"}))
    assert out.regions == ("us-west-2",) and out.node_config == {}
    out = _rules(_group(labels={"ray.io/availability-region": "us-east-1"},
                        node_selector={"topology.kubernetes.io/region": "us-west-2"}))
    [b] = out.blocking()
    assert b.key == f'{KEY}.template.spec.nodeSelector["topology.kubernetes.io/region"]'
    assert "contradicts" in b.reason and "ray.io/availability-region" in b.reason


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
     True),
    (_group({"my.example/pool": "a"}), f'{KEY}.template.spec.nodeSelector["my.example/pool"]', False),
    (_group({"karpenter.k8s.aws/instance-gpu-name": "zz99"}),
     f'{KEY}.template.spec.nodeSelector["karpenter.k8s.aws/instance-gpu-name"]', True),
    (_group({"kubernetes.io/os": "windows"}), f'{KEY}.template.spec.nodeSelector["kubernetes.io/os"]', True),
])
def test_what_cannot_be_honoured_names_the_key(group, key, blocking):
    out = K.group_rules(group, key=KEY, cloud="aws")
    [u] = out.unhonoured
    assert (u.key, u.blocking) == (key, blocking)
    assert u.reason


def test_unknown_selector_label_goes_on_the_node():
    out = K.group_rules(_group({"my.example/pool": "a"}), key=KEY)
    assert out.node_labels == {"my.example/pool": "a"} and out.node_config == {}


def test_clouds_implied_by_the_keys():
    out = K.group_rules(_group({"cloud.google.com/gke-spot": "true", "karpenter.sh/capacity-type": "spot"}), key=KEY)
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
