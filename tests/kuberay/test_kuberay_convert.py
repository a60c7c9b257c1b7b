"""`ray-nodeless convert` for KubeRay manifests, over every sample of ../shared/kuberay/samples/ (unchanged, no hand
edits): each either converts into a manifest that `ray-nodeless plan` accepts (and, with --ray-up, a `ray up` YAML it
accepts too) or is refused with one line naming the key. What the bridge derives from the converted manifest (its
own bridge_config over Ray's derivation) keeps each group's resources, labels, min/max and idle timeout."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli.convert import convert_command
from ray_nodeless.cli.plan import plan_command
from ray_nodeless.ray_compat.kuberay import derive_config
from ray_nodeless.errors import ConfigError
from ray_nodeless.kuberay import sidecar as KS
from ray_nodeless.kuberay import annotation as K
from ray_nodeless.kuberay import convert as KC

SAMPLES = Path(__file__).resolve().parent.parent / "data" / "kuberay" / "samples"     # KubeRay's, unchanged
TARGETS = {"aws": ("us-west-2", []), "gcp": ("us-central1", ["--project-id", "test-project"])}
JOIN = {"aws": "{method: eks, cluster: my-eks, endpoint: 'https://X.eks.amazonaws.com', ca: LS0t, cidr: 10.100.0.0/16}",
        "gcp": "{method: k3s, endpoint: 'https://10.0.0.2:6443', token: K10abc}"}
# sample -> cloud -> None (converts and plans) or the key its one refusal names
REFUSED_EVERYWHERE = {"ray-job.pytorch-distributed-training.yaml": "spec.rayClusterSpec.workerGroupSpecs"}
OUTCOMES = {
    # gke node labels: not an aws cluster; on gcp its accelerator group asks for spot nodes (gke-spot) while its Ray
    # label promises on-demand ones: no machine is both.
    "ray-cluster-label-selector.yaml": {
        "aws": "spec.workerGroupSpecs[0]",
        "gcp": 'spec.workerGroupSpecs[1].template.spec.nodeSelector["cloud.google.com/gke-spot"]'},
}


def _samples() -> list[str]:
    return sorted(p.name for p in SAMPLES.glob("*.yaml"))


def expected(name: str, cloud: str) -> str | None:
    if name in REFUSED_EVERYWHERE:
        return REFUSED_EVERYWHERE[name]
    return OUTCOMES.get(name, {}).get(cloud)


def run(cmd, *args: str):
    return CliRunner().invoke(cmd, list(args))


def test_every_sample_is_covered():
    assert len(_samples()) == 9 and set(OUTCOMES) | set(REFUSED_EVERYWHERE) <= set(_samples())


def _original(name: str) -> tuple[dict, str]:
    docs = KC.load_documents((SAMPLES / name).read_text(), name)
    [i] = KC.kuberay_indexes(docs)
    return KC.ray_cluster(docs[i])


@pytest.mark.parametrize("cloud", sorted(TARGETS))
@pytest.mark.parametrize("name", _samples())
def test_each_sample_converts_and_plans_or_is_refused_naming_the_key(name, cloud, tmp_path):
    region, extra = TARGETS[cloud]
    out, up = tmp_path / "manifest.yaml", tmp_path / "up.yaml"
    r = run(convert_command, str(SAMPLES / name), "--cloud", cloud, "--region", region, *extra,
            "--join", JOIN[cloud], "-o", str(out), "--ray-up", str(up))
    key = expected(name, cloud)
    if key is not None:
        assert r.exit_code == 2, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"ray-nodeless: error: {key}: "), r.output
        assert not out.exists() and not up.exists()
        return
    assert r.exit_code == 0, r.output
    # plan accepts both files as written
    for path in (out, up):
        p = run(plan_command, str(path))
        assert p.exit_code == 0, p.output
        assert "idle cost:" in p.output
    _check_patched(name, out, cloud, region)


def _check_patched(name: str, out: Path, cloud: str, region: str) -> None:
    before, _ = _original(name)
    docs = list(yaml.safe_load_all(out.read_text()))
    assert len(docs) == len(KC.load_documents((SAMPLES / name).read_text(), name))   # ConfigMaps, Secrets kept
    [i] = KC.kuberay_indexes(docs)
    after, spec_key = KC.ray_cluster(docs[i])
    spec = after["spec"]
    # KubeRay's in-tree autoscaler off; the head pod runs the bridge in a container of its own, which has the
    # user's autoscaler container options; the others stay where Ray's derivation reads them
    assert spec["enableInTreeAutoscaling"] is False
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["no-monitor"] == "true"
    pod = head["template"]["spec"]
    bridge = KS.autoscaler_container(pod)
    assert bridge is not None and (bridge["command"], bridge["args"]) == (["ray-nodeless"], ["kuberay-autoscaler"])
    assert [c["name"] for c in pod["containers"]].count(KS.CONTAINER) == 1
    for k, v in (before["spec"].get("autoscalerOptions") or {}).items():
        if k in KS.CONTAINER_OPTIONS and k != "env":
            assert bridge[k] == v, k
        elif k == "env":
            assert all(e in bridge["env"] for e in v)
        else:
            assert spec["autoscalerOptions"][k] == v
    # /tmp/ray shared by the Ray container and the bridge's (its session directory)
    [ray_tmp] = [m["name"] for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/tmp/ray"]
    assert {"name": ray_tmp, "mountPath": "/tmp/ray"} in bridge["volumeMounts"]
    # the head's ServiceAccount: the template's own, else the RayCluster's name (a RayJob's or RayService's own)
    own = (before["spec"]["headGroupSpec"]["template"].get("spec") or {}).get("serviceAccountName")
    assert pod["serviceAccountName"] == (own or KC.cluster_name(before["metadata"])) != "None"
    settings = K.parse_annotation(after["metadata"])
    assert (settings["cloud"], settings["region"]) == (cloud, region)
    groups = settings.get("groups", {})
    for g0, g in zip(before["spec"]["workerGroupSpecs"], spec["workerGroupSpecs"]):
        # the operator creates no pod of its own: clamp(0, 0, max) = 0
        assert (g["replicas"], g["minReplicas"], g["maxReplicas"]) == (0, 0, g0["maxReplicas"])
        assert groups.get(g["groupName"], {}).get("minWorkers", 0) == g0.get("minReplicas", 0)
    # What the bridge derives from the converted manifest = Ray's reading of the original, minimum included.
    cfg, cp = KC.plan_manifest(after, spec_key)
    ray = derive_config(before)
    assert cfg["idle_timeout_minutes"] == ray["idle_timeout_minutes"]
    for t, nt in ray["available_node_types"].items():
        mine = cfg["available_node_types"][t]
        assert mine["resources"] == nt["resources"] and mine.get("labels") == nt.get("labels")
        assert (mine["min_workers"], mine["max_workers"]) == (nt["min_workers"], nt["max_workers"])
    # every worker type is planned in the region
    for t in cfg["available_node_types"]:
        assert cp.plans[t].chosen.zone.startswith(region)


@pytest.mark.parametrize("name", _samples())
def test_without_cloud_the_refusal_names_the_annotation_key(name):
    r = run(convert_command, str(SAMPLES / name))
    assert r.exit_code == 2
    # the label-selector sample's gke keys imply gcp; the region is then what is missing
    key = REFUSED_EVERYWHERE.get(name) or K.annotation_key("region" if name in OUTCOMES else "cloud")
    assert r.output.strip().splitlines() == [r.output.strip()] and key in r.output


def test_json_report_and_a_rerun_of_convert_on_its_own_output(tmp_path):
    out = tmp_path / "m.yaml"
    r = run(convert_command, str(SAMPLES / "ray-cluster.complete.yaml"), "--cloud", "aws", "--region", "us-west-2",
            "--json", "-o", str(out))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc) == {"node_types", "summary"}
    assert set(doc["node_types"]) == {"small-group"}           # the head is KubeRay's pod: not costed
    assert doc["node_types"]["small-group"]["before"]["instance_type"] is None
    assert doc["summary"]["idle_cost_per_hour_after"] == doc["node_types"]["small-group"]["after"]["hourly_price"]
    # converting the converted manifest again changes nothing of what it plans (the minimum stays in the annotation)
    again = tmp_path / "again.yaml"
    r2 = run(convert_command, str(out), "--json", "-o", str(again))
    assert r2.exit_code == 0, r2.output
    assert json.loads(r2.stdout) == doc


def _manifest(tmp_path: Path, selector=None, affinity=None, labels=None, minimum=0) -> Path:
    before, _ = _original("ray-cluster.complete.yaml")
    doc = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "c"}, "spec": before["spec"]}
    g = doc["spec"]["workerGroupSpecs"][0]
    g["minReplicas"] = g["replicas"] = minimum
    ts = g["template"]["spec"]
    if selector:
        ts["nodeSelector"] = selector
    if affinity:
        ts["affinity"] = affinity
    if labels:
        g["labels"] = labels
    p = tmp_path / "in.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def _converted(tmp_path: Path, src: Path, cloud="aws", region="us-west-2", *extra):
    out = tmp_path / "out.yaml"
    r = run(convert_command, str(src), "--cloud", cloud, "--region", region, *extra, "--json", "-o", str(out))
    assert r.exit_code == 0, r.output
    docs = list(yaml.safe_load_all(out.read_text()))
    cr, key = KC.ray_cluster(docs[0])
    return json.loads(r.stdout), K.parse_annotation(cr["metadata"]), KC.plan_manifest(cr, key)[1]


def test_a_pinned_instance_type_is_the_before_and_the_plan(tmp_path):
    report, settings, cp = _converted(tmp_path, _manifest(tmp_path, {"node.kubernetes.io/instance-type": "m5.large",
                                                                     "karpenter.sh/capacity-type": "spot"},
                                                          minimum=1))
    # the minimum moves to the annotation; the scheduling stays in the template, mapped by the bridge (and plan)
    assert settings["groups"]["small-group"] == {"minWorkers": 1}
    assert cp.plans["small-group"].request.requirements.capacity == ("spot",)
    nt = report["node_types"]["small-group"]
    assert nt["before"]["instance_type"] == "m5.large" and nt["before"]["capacity"] == "spot"
    assert nt["after"]["instance_type"] == "m5.large" and nt["after"]["capacity"] == "spot"
    assert nt["before"]["hourly_price"] == nt["after"]["hourly_price"] > 0
    assert report["summary"]["idle_cost_per_hour_before"] == report["summary"]["idle_cost_per_hour_after"]
    assert cp.plans["small-group"].chosen.instance_type.name == "m5.large"


def test_affinity_and_ray_labels_narrow_the_plan(tmp_path):
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["c7i", "m7i"]},
                              {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2b"]}]}]}}}
    _, settings, cp = _converted(tmp_path, _manifest(tmp_path, affinity=aff, labels={"ray.io/market-type": "spot"}))
    chosen = cp.plans["small-group"].chosen
    assert chosen.instance_type.family in ("c7i", "m7i") and chosen.zone == "us-west-2b" and chosen.capacity == "spot"


def test_gke_keys_map_on_gcp(tmp_path):
    src = _manifest(tmp_path, {"cloud.google.com/machine-family": "n2", "cloud.google.com/gke-spot": "true"})
    _, settings, cp = _converted(tmp_path, src, "gcp", "us-central1", "--project-id", "p")
    chosen = cp.plans["small-group"].chosen
    assert chosen.instance_type.family == "n2" and chosen.capacity == "spot"
    # and the same keys refuse an aws conversion, naming the group
    r = run(convert_command, str(src), "--cloud", "aws", "--region", "us-west-2")
    assert r.exit_code == 2 and "spec.workerGroupSpecs[0]: its node labels are gcp's" in r.output


def test_a_soft_preference_is_a_note_not_a_refusal(tmp_path):
    aff = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large"]}]}}]}}
    src = _manifest(tmp_path, affinity=aff)
    r = run(convert_command, str(src), "--cloud", "aws", "--region", "us-west-2", "-o", str(tmp_path / "o.yaml"))
    assert r.exit_code == 0, r.output
    assert ("spec.workerGroupSpecs[0].template.spec.affinity.nodeAffinity."
            "preferredDuringSchedulingIgnoredDuringExecution: a preference") in r.output


def test_a_multi_host_group_is_refused(tmp_path):
    before, _ = _original("ray-cluster.complete.yaml")
    before["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 4
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(before))
    r = run(convert_command, str(p), "--cloud", "aws", "--region", "us-west-2")
    assert r.exit_code == 2 and "ray-nodeless: error: spec.workerGroupSpecs[0].numOfHosts: 4:" in r.output


def test_ray_up_needs_join(tmp_path):
    r = run(convert_command, str(SAMPLES / "ray-cluster.sample.yaml"), "--cloud", "aws", "--region", "us-west-2",
            "-o", str(tmp_path / "o.yaml"), "--ray-up", str(tmp_path / "up.yaml"))
    assert r.exit_code == 2 and "ray-nodeless: error: --join:" in r.output


def test_ray_yaml_options_stay_for_ray_yamls():
    r = run(convert_command, str(SAMPLES / "ray-cluster.sample.yaml"), "--free-instance-types", "--cloud", "aws",
            "--region", "us-west-2")
    assert r.exit_code == 2 and "--free-instance-types" in r.output


def test_keys_of_a_rayservice_are_named_under_its_cluster_config(tmp_path):
    docs = KC.load_documents((SAMPLES / "ray-service.sample.yaml").read_text(), "s")
    docs[0]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["numOfHosts"] = 2
    p = tmp_path / "svc.yaml"
    p.write_text(yaml.safe_dump_all(docs))
    r = run(convert_command, str(p), "--cloud", "aws", "--region", "us-west-2")
    assert r.exit_code == 2
    assert r.output.startswith("ray-nodeless: error: spec.rayClusterConfig.workerGroupSpecs[0].numOfHosts: 2:")


def test_one_kuberay_cluster_per_file(tmp_path):
    text = (SAMPLES / "ray-cluster.sample.yaml").read_text()
    p = tmp_path / "two.yaml"
    p.write_text(text + "\n---\n" + (SAMPLES / "ray-cluster.complete.yaml").read_text())
    r = run(convert_command, str(p), "--cloud", "aws", "--region", "us-west-2")
    assert r.exit_code == 2 and r.output.startswith("ray-nodeless: error: documents[1]: one KubeRay cluster")
    assert run(plan_command, str(p)).exit_code == 2


def test_the_bridge_refuses_what_convert_did_not_patch(tmp_path):
    """plan of an unconverted manifest reads it as the bridge would: a group the operator would make pods for is
    refused, naming the key (convert sets it to 0)."""
    src = SAMPLES / "ray-cluster.sample.yaml"
    docs = KC.load_documents(src.read_text(), "s")
    meta = docs[0].setdefault("metadata", {})
    meta["annotations"] = {K.ANNOTATION: "cloud: aws\nregion: us-west-2\n"}
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump_all(docs))
    r = run(plan_command, str(p))
    assert r.exit_code == 2 and "spec.workerGroupSpecs[0].replicas" in r.output


def test_group_idle_timeout_is_kept(tmp_path):
    before, _ = _original("ray-cluster.complete.yaml")
    before["spec"]["workerGroupSpecs"][0]["idleTimeoutSeconds"] = 120
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(before))
    out = tmp_path / "o.yaml"
    assert run(convert_command, str(p), "--cloud", "aws", "--region", "us-west-2", "-o", str(out)).exit_code == 0
    cr, key = KC.ray_cluster(next(iter(yaml.safe_load_all(out.read_text()))))
    cfg, cp = KC.plan_manifest(cr, key)
    assert cfg["available_node_types"]["small-group"]["idle_timeout_s"] == 120
    assert cp.idle["small-group"].seconds == 120
    r = run(plan_command, str(out))
    assert "idle release: 120 s (the node type's idle_timeout_s)" in r.output


# Karpenter NodePool-style requirements (resolved against the catalog: category, generation, vCPUs, NotIn zones) on a
# real sample's group: convert writes them resolved, plan (the bridge's own derivation, resolving them again against
# the catalog the annotation names) accepts the file, and the live bridge resolves them the same way.
KARPENTER = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [
        {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["c", "m"]},
        {"key": "karpenter.k8s.aws/instance-generation", "operator": "Gt", "values": ["6"]},
        {"key": "karpenter.k8s.aws/instance-cpu", "operator": "Lt", "values": ["9"]},
        {"key": "karpenter.k8s.aws/instance-cpu-manufacturer", "operator": "In", "values": ["aws"]},
        {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["us-west-2a"]}]}]}}}


def _karpenter_ok(t, zone: str) -> bool:
    gen = int("".join(ch for ch in t.family[1:] if ch.isdigit())[:1])
    return (t.family[0] in "cm" and t.family[1].isdigit() and gen > 6 and t.vcpus < 9 and t.arch == "arm64"
            and zone != "us-west-2a")


def test_karpenter_requirements_convert_and_plan(tmp_path):
    report, settings, cp = _converted(tmp_path, _manifest(tmp_path, affinity=KARPENTER))
    assert "node_config" not in settings.get("groups", {}).get("small-group", {})   # stays in the template
    chosen = cp.plans["small-group"].chosen
    assert _karpenter_ok(chosen.instance_type, chosen.zone), chosen
    assert report["node_types"]["small-group"]["after"]["instance_type"] == chosen.instance_type.name
    p = run(plan_command, str(tmp_path / "out.yaml"))
    assert p.exit_code == 0, p.output
    assert chosen.instance_type.name in p.output


def test_plan_resolves_the_template_keys_as_the_bridge_does(tmp_path):
    """An unconverted manifest with an annotation (the user's own, not convert's): plan resolves the Karpenter keys
    of the template against the catalog, as the bridge does every loop."""
    src = _manifest(tmp_path, affinity=KARPENTER)
    doc = yaml.safe_load(src.read_text())
    doc["metadata"]["annotations"] = {K.ANNOTATION: "cloud: aws\nregion: us-west-2\n"}
    src.write_text(yaml.safe_dump(doc))
    cr, key = KC.ray_cluster(doc)
    cfg, cp = KC.plan_manifest(cr, key)
    nc = cfg["available_node_types"]["small-group"]["node_config"]
    assert nc["arch"] == ["arm64"] and "us-west-2a" not in nc["zones"]
    chosen = cp.plans["small-group"].chosen
    assert _karpenter_ok(chosen.instance_type, chosen.zone), chosen
    assert run(plan_command, str(src)).exit_code == 0


def test_the_bridge_resolves_catalog_labels_and_reloads_them_when_the_annotation_changes():
    from ray_nodeless.kuberay.bridge import KubeRayBridge

    before, _ = _original("ray-cluster.complete.yaml")
    rc = copy.deepcopy(before)
    rc["metadata"].update(namespace="ray", uid="u-1", annotations={K.ANNOTATION: yaml.safe_dump(
        {"cloud": "aws", "region": "us-west-2", "kubernetes": {"join": KC.PLANNING_JOIN}})})
    g = rc["spec"]["workerGroupSpecs"][0]
    g["replicas"] = g["minReplicas"] = 0
    g["template"]["spec"]["affinity"] = copy.deepcopy(KARPENTER)
    # Only what config() reads is given: the RayCluster comes as an argument, nothing is listed, launched or swept.
    bridge = KubeRayBridge(rayclusters=None, head_ip="10.0.0.9", derive=derive_config, provider_of=None, sweep=None)
    nc = bridge.config(rc)["available_node_types"]["small-group"]["node_config"]
    assert nc["zones"] == ["us-west-2b", "us-west-2c", "us-west-2d"]
    facts = bridge.catalog_facts(rc)
    assert facts.region == "us-west-2" and len(facts.types) > 100
    assert bridge.catalog_facts(rc) is facts                           # same annotation: not loaded again
    rc["metadata"]["annotations"][K.ANNOTATION] = yaml.safe_dump(
        {"cloud": "aws", "region": "us-east-1", "kubernetes": {"join": KC.PLANNING_JOIN}})
    nc = bridge.config(rc)["available_node_types"]["small-group"]["node_config"]
    facts = bridge.catalog_facts(rc)
    assert facts.region == "us-east-1" and nc["zones"] == list(facts.zones)     # us-west-2a is none of them


def test_the_bridge_logs_each_note_once_though_it_derives_the_config_every_loop(caplog):
    from ray_nodeless.kuberay.bridge import KubeRayBridge

    before, _ = _original("ray-cluster.complete.yaml")
    rc = copy.deepcopy(before)
    rc["metadata"].update(namespace="ray", annotations={K.ANNOTATION: yaml.safe_dump(
        {"cloud": "aws", "region": "us-west-2", "kubernetes": {"join": KC.PLANNING_JOIN}})})
    g = rc["spec"]["workerGroupSpecs"][0]
    g["replicas"] = g["minReplicas"] = 0
    g["template"]["spec"]["nodeSelector"] = {"example.test/once-per-process": "a"}     # a note, not a refusal
    bridge = KubeRayBridge(rayclusters=None, head_ip="10.0.0.9", derive=derive_config, provider_of=None, sweep=None)
    with caplog.at_level("WARNING", logger="ray_nodeless.kuberay.bridge"):
        for _ in range(3):
            bridge.config(rc)
    noted = [r for r in caplog.records if "example.test/once-per-process" in r.getMessage()]
    assert len(noted) == 1 and "not honoured" in noted[0].getMessage()


def test_an_edit_of_the_converted_template_takes_effect(tmp_path):
    """The scheduling is read from the template by the bridge every loop (and by plan), not frozen in the
    annotation by convert: changing the nodeSelector after the conversion changes the plan."""
    _converted(tmp_path, _manifest(tmp_path, {"karpenter.sh/capacity-type": "spot"}))
    doc = next(iter(yaml.safe_load_all((tmp_path / "out.yaml").read_text())))
    cr, key = KC.ray_cluster(doc)
    assert KC.plan_manifest(cr, key)[1].plans["small-group"].chosen.capacity == "spot"
    cr["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"] = {"karpenter.sh/capacity-type": "on-demand"}
    assert KC.plan_manifest(cr, key)[1].plans["small-group"].chosen.capacity == "on-demand"


def test_ored_terms_on_types_convert_and_plan(tmp_path):
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["c7g"]}]},
        {"matchExpressions": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m7g"]},
                              {"key": "karpenter.k8s.aws/instance-size", "operator": "In", "values": ["large"]}]}]}}}
    _, _, cp = _converted(tmp_path, _manifest(tmp_path, affinity=aff))
    t = cp.plans["small-group"].chosen.instance_type
    assert t.family == "c7g" or t.name == "m7g.large"
    assert run(plan_command, str(tmp_path / "out.yaml")).exit_code == 0


def test_convert_notes_ray_images_of_another_version_and_ray_image_sets_them_all():
    """KubeRay's samples pin Ray 2.52 images; ray_nodeless runs with the installed Ray: each Ray container on
    another version is a note naming its key, and --ray-image sets the head's, every worker group's and the
    autoscaler's."""
    from ray_nodeless.kuberay.images import installed_ray, ray_version_of

    text = (SAMPLES / "ray-cluster.autoscaler.yaml").read_text()
    docs = KC.load_documents(text, "ray-cluster.autoscaler.yaml")
    conv = KC.convert_manifest(docs, cloud="aws", region="us-west-2")
    stale = [n for n in conv.notes if f"ray_nodeless runs with Ray {installed_ray()}" in n]
    assert [n.split(":")[0] for n in stale] == ["spec.headGroupSpec.template.spec.containers[0].image",
                                               "spec.workerGroupSpecs[0].template.spec.containers[0].image"]
    image = f"rayproject/ray:{installed_ray()}"
    conv = KC.convert_manifest(KC.load_documents(text, "x.yaml"), cloud="aws", region="us-west-2", ray_image=image)
    [rc] = [d for d in conv.documents if isinstance(d, dict) and d.get("kind") == "RayCluster"]
    spec = rc["spec"]
    images = [spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"],
              KS.autoscaler_container(spec["headGroupSpec"]["template"]["spec"])["image"]]
    images += [g["template"]["spec"]["containers"][0]["image"] for g in spec["workerGroupSpecs"]]
    assert set(images) == {image}
    assert not [n for n in conv.notes if "ray_nodeless runs with Ray" in n]
    assert ray_version_of("rayproject/ray-ml:2.52.0-py311-gpu") == "2.52.0"
    assert ray_version_of("rayproject/ray:latest") is None and ray_version_of("registry:5000/ray") is None


@pytest.mark.parametrize("path,value,key", [
    (("headGroupSpec", "template", "spec", "containers", 0, "volumeMounts"), 7,
     "spec.headGroupSpec.template.spec.containers[0].volumeMounts"),
    (("headGroupSpec", "template", "spec", "volumes"), {"a": 1}, "spec.headGroupSpec.template.spec.volumes"),
    (("autoscalerOptions", "env"), ["x"], "spec.autoscalerOptions.env"),
    (("autoscalerOptions", "imagePullPolicy"), 3, "spec.autoscalerOptions.imagePullPolicy"),
])
def test_the_head_pods_bridge_container_refuses_bad_shapes_naming_the_key(path, value, key):
    """What the head pod's bridge container is built from (kuberay/sidecar.py) has the shape Kubernetes gives it,
    else a ConfigError naming the key, before anything is written (the hostile-manifest test found a TypeError)."""
    docs = KC.load_documents((SAMPLES / "ray-cluster.autoscaler.yaml").read_text(), "x.yaml")
    [i] = KC.kuberay_indexes(docs)
    cur = docs[i]["spec"]
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    with pytest.raises(ConfigError) as e:
        KC.convert_manifest(docs, cloud="aws", region="us-west-2")
    assert e.value.key == key
