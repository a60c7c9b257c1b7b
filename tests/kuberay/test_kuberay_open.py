"""Shape-open KubeRay: a RayCluster that declares no worker group (or groups for some shapes only), as `convert
--open`, `plan` and the bridge read it; a manifest read as the API server stores it (KubeRay's CRD defaults: the
table checked against the CRD the project builds and against the real API server); Ray's v2 autoscaler asked for
as KubeRay users ask (`autoscalerOptions.version: v2`), which the operator refuses as an env with its autoscaler
off. The end-to-end run with the real operator is tests/e2e/test_kuberay_operator.py
(`test_kuberay_raycluster_with_no_worker_group_serves_each_demand_on_its_cheapest_fit`)."""
from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli.convert import convert_command
from ray_nodeless.cli.plan import plan_command
from ray_nodeless.errors import ConfigError
from ray_nodeless.kuberay import annotation as K
from ray_nodeless.kuberay import bridge as B
from ray_nodeless.kuberay import sidecar
from ray_nodeless.kuberay.crd_defaults import WORKER_GROUP_DEFAULTS, with_defaults
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers.aws.images import default_ami
from ray_nodeless.ray_adapter.bootstrap import settle_images
from ray_nodeless.ray_compat.kuberay import derive_config
from ray_nodeless.testing.kuberay import NS, Operator, crd_files

SAMPLES = Path(__file__).resolve().parent.parent / "data" / "kuberay" / "samples"     # KubeRay's, unchanged
NO_GROUP_SAMPLE = SAMPLES / "ray-job.pytorch-distributed-training.yaml"               # a RayJob with no worker group
HEAD_IMAGE = "rayproject/ray:2.60.0"


def run(*args: str):
    return CliRunner().invoke(convert_command, list(args))


def no_group_cluster(settings: dict | None = None) -> dict:
    """A RayCluster with a head only, as a user writes it (no workerGroupSpecs key), annotated for the bridge."""
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "open", "namespace": "ray", "uid": "u-1", "annotations": {K.ANNOTATION: yaml.safe_dump(
                {"cloud": "local", "simulate_cloud": "aws", "region": "us-west-2", **(settings or {}),
                 "kubernetes": {"join": {"method": "kubeadm", "endpoint": "https://10.0.0.1:6443",
                                         "token": "abcdef.0123456789abcdef", "ca_cert_hash": "sha256:" + "0" * 64}}})}},
            "spec": {"headGroupSpec": {"rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                                       "template": {"metadata": {"labels": {"team": "ml"}}, "spec": {
                                           "serviceAccountName": "open-sa",
                                           "tolerations": [{"key": "head-only", "operator": "Exists"}],
                                           "nodeSelector": {"pool": "heads"},
                                           "volumes": [{"name": "data", "emptyDir": {}},
                                                       {"name": "sidecar-only", "emptyDir": {}}],
                                           "containers": [
                                               {"name": "ray-head", "image": HEAD_IMAGE,
                                                "env": [{"name": "MODEL", "value": "v7"}],
                                                "ports": [{"containerPort": 6379, "name": "gcs"}],
                                                "resources": {"limits": {"cpu": "2", "memory": "8Gi"}},
                                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                                               {"name": "log-shipper", "image": "busybox",
                                                "volumeMounts": [{"name": "sidecar-only", "mountPath": "/x"}]}]}}}}}


# ------------------------------------------------------------------------------------------ convert --open


def test_a_manifest_with_no_worker_group_converts_with_open_and_max_workers_and_plans_shape_open(tmp_path):
    out = tmp_path / "open.yaml"
    r = run(str(NO_GROUP_SAMPLE), "--cloud", "aws", "--region", "us-west-2", "--open", "--max-workers", "4",
            "-o", str(out))
    assert r.exit_code == 0, r.output
    [job] = [d for d in yaml.safe_load_all(out.read_text()) if d and d.get("kind") == "RayJob"]
    settings = yaml.safe_load(job["metadata"]["annotations"][K.ANNOTATION])
    assert settings["open_shapes"] is True and settings["maxWorkers"] == 4, settings
    # the sample names itself by generateName only: the head's ServiceAccount is that prefix, the name rbac.yaml
    # is applied under (the API server's random suffix is unknown when converting)
    assert set(job["metadata"]) == {"generateName", "annotations"}
    assert job["metadata"]["generateName"] == "pytorch-text-classifier-"
    head_pod = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head_pod["serviceAccountName"] == "pytorch-text-classifier"
    p = CliRunner().invoke(plan_command, [str(out)])
    assert p.exit_code == 0, p.output
    assert "shape-open: every pending demand no declared worker type holds gets its cheapest fit (up to " \
           "max_workers 4" in p.output, p.output
    # the generated types' machines boot Ray's default AMI of the region, as a declared type's would
    assert "GPU 1 T4" in p.output and "g4dn.xlarge" in p.output
    # the ceiling is max_workers machines at the dearest allowed offering, not the (unlaunched) head pod's $0
    [last] = [ln for ln in p.output.splitlines() if ln.startswith("idle cost:")]
    assert "max_workers 4 x the dearest allowed offering" in last and "the head pod not counted" in last, last
    assert float(last.split("ceiling: $")[1].split("/h")[0]) > 100, last


def test_no_worker_group_without_open_or_a_limit_is_refused_naming_what_to_pass(tmp_path):
    r = run(str(NO_GROUP_SAMPLE), "--cloud", "aws", "--region", "us-west-2", "-o", str(tmp_path / "o.yaml"))
    assert r.exit_code == 2 and "spec.rayClusterSpec.workerGroupSpecs: no worker group" in r.output \
        and "--open" in r.output, r.output
    r = run(str(NO_GROUP_SAMPLE), "--cloud", "aws", "--region", "us-west-2", "--open", "-o", str(tmp_path / "o.yaml"))
    assert r.exit_code == 2 and "ray-nodeless: error: --max-workers: a RayCluster with no worker group" in r.output
    assert not (tmp_path / "o.yaml").exists()
    r = run(str(NO_GROUP_SAMPLE), "--cloud", "aws", "--region", "us-west-2", "--open", "--max-workers", "-1")
    assert r.exit_code == 2 and "--max-workers: must be >= 0" in r.output


def test_open_and_max_workers_apply_to_kuberay_manifests_only():
    r = run(str(Path(__file__).resolve().parents[2] / "cluster-configs" / "aws-gpu-head.yaml"), "--open")
    assert r.exit_code == 2 and "--open applies to KubeRay manifests only" in r.output, r.output


def test_open_on_a_cluster_with_groups_turns_shape_open_on(tmp_path):
    out = tmp_path / "o.yaml"
    r = run(str(SAMPLES / "ray-cluster.sample.yaml"), "--cloud", "aws", "--region", "us-west-2", "--open",
            "-o", str(out))
    assert r.exit_code == 0, r.output
    [rc] = [d for d in yaml.safe_load_all(out.read_text()) if d]
    settings = yaml.safe_load(rc["metadata"]["annotations"][K.ANNOTATION])
    assert settings["open_shapes"] is True and "maxWorkers" not in settings


# ------------------------------------------------------------------------------------------ the bridge


def test_the_bridge_of_a_cluster_with_no_group_is_shape_open_bounded_by_max_workers():
    rc = no_group_cluster({"maxWorkers": 6})
    cfg = B.bridge_config(rc, derive_config(rc))
    assert list(cfg["available_node_types"]) == ["headgroup"] and cfg["max_workers"] == 6
    assert "maxWorkers" not in cfg["provider"]
    t = cfg["provider"]["kubernetes"]["pod_template"]
    assert cfg["provider"]["kubernetes"]["pod_templates"] == {}
    # the head's template made a worker's: its Ray container only, its image, env, mounts and service account
    [ray] = t["spec"]["containers"]
    assert ray["image"] == HEAD_IMAGE and ray["env"] == [{"name": "MODEL", "value": "v7"}]
    assert ray["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert t["spec"]["volumes"] == [{"name": "data", "emptyDir": {}}]
    assert t["spec"]["serviceAccountName"] == "open-sa"
    assert ray["command"] == ["/bin/bash", "-lc", "ray start --address=$(RAY_GCS_ADDRESS) --block"]
    # ... without what is the head's: ports, size, placement, rayStartParams (num-cpus 0), the group label
    assert "ports" not in ray and "resources" not in ray
    assert "tolerations" not in t["spec"] and "nodeSelector" not in t["spec"]
    labels = t["metadata"]["labels"]
    assert labels == {"team": "ml", "ray.io/cluster": "open", "ray.io/node-type": "worker", "ray.io/is-ray-node": "yes"}
    assert t["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_max_workers_is_the_cluster_limit_with_groups_too():
    rc = no_group_cluster({"maxWorkers": 3})
    rc["spec"]["workerGroupSpecs"] = [{
        "groupName": "small", "replicas": 0, "minReplicas": 0, "maxReplicas": 10, "rayStartParams": {},
        "template": {"spec": {"containers": [{"name": "ray-worker", "image": HEAD_IMAGE,
                                              "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}]}}}]
    cfg = B.bridge_config(rc, derive_config(rc))
    assert cfg["max_workers"] == 3 and cfg["available_node_types"]["small"]["max_workers"] == 10
    # generated types take the first group's template
    assert cfg["provider"]["kubernetes"]["pod_template"] == cfg["provider"]["kubernetes"]["pod_templates"]["small"]
    rc["metadata"]["annotations"] = no_group_cluster()["metadata"]["annotations"]       # no maxWorkers
    assert B.bridge_config(rc, derive_config(rc))["max_workers"] == 10      # Ray's derivation: sum of maxReplicas


def test_no_group_and_no_max_workers_is_refused_naming_the_annotation_key():
    rc = no_group_cluster()
    with pytest.raises(ConfigError) as e:
        B.bridge_config(rc, derive_config(rc))
    assert e.value.key == K.annotation_key("maxWorkers") and "no worker group" in str(e.value)


@pytest.mark.parametrize("bad", [-1, "10", True, 2.5])
def test_a_bad_max_workers_is_refused_naming_the_key(bad):
    with pytest.raises(ConfigError) as e:
        K.parse_annotation({"annotations": {K.ANNOTATION: yaml.safe_dump({"cloud": "aws", "maxWorkers": bad})}})
    assert e.value.key == K.annotation_key("maxWorkers")


def test_the_head_id_is_the_head_pods_name_when_the_bridge_knows_it():
    rc = no_group_cluster({"maxWorkers": 1})
    assert B.bridge_config(rc, derive_config(rc))["provider"]["kuberay"]["head_id"] == "kuberay-head-open"
    cfg = B.bridge_config(rc, derive_config(rc), head_id="open-head-x7k2p")
    assert cfg["provider"]["kuberay"]["head_id"] == "open-head-x7k2p"


# ------------------------------------------------------------------------------------------ CRD defaults


# Kubernetes core types the RayClusterSpec embeds: their defaults are Kubernetes' own (an EnvVarSource's `name: ""`,
# a ServicePort's TCP) and play no part in Ray's derivation.
CORE_TYPES = ("template", "valueFrom", "envFrom", "headService")


def _crd_defaults() -> dict[str, object]:
    """Every default of the v1 RayClusterSpec schema outside the Kubernetes core types it embeds, from the CRD file
    itself."""
    [path] = [p for p in crd_files() if p.name == "ray.io_rayclusters.yaml"]
    crd = yaml.safe_load(path.read_text())
    [v1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    found: dict[str, object] = {}

    def walk(schema: dict, path: str) -> None:
        if "default" in schema:
            found[path] = schema["default"]
        for k, sub in (schema.get("properties") or {}).items():
            if k not in CORE_TYPES:
                walk(sub, f"{path}.{k}")
        if "items" in schema:
            walk(schema["items"], f"{path}[]")

    walk(v1["schema"]["openAPIV3Schema"]["properties"]["spec"], "spec")
    return found


def test_the_defaults_table_is_the_crds():
    assert _crd_defaults() == {f"spec.workerGroupSpecs[].{k}": v for k, v in WORKER_GROUP_DEFAULTS.items()}


def test_with_defaults_is_what_the_api_server_stores(k8s_plane):
    view = k8s_plane.kuberay()
    api = view.api_client()
    try:
        op = Operator(api, played=False)
        rc = no_group_cluster()
        rc["metadata"] = {"name": "crd-defaults", "namespace": NS}
        rc["spec"]["workerGroupSpecs"] = [{"groupName": "g", "rayStartParams": {}, "template": {"spec": {
            "containers": [{"name": "ray-worker", "image": HEAD_IMAGE}]}}}]
        op.apply(rc)
        try:
            stored = op.get("crd-defaults")["spec"]
        finally:
            op.delete("crd-defaults")
        ours = with_defaults(rc["spec"])
        keys = set(WORKER_GROUP_DEFAULTS)
        assert {k: stored["workerGroupSpecs"][0][k] for k in keys} == {k: ours["workerGroupSpecs"][0][k] for k in keys}
    finally:
        api.close()


def test_a_group_without_max_replicas_plans_and_is_noted(tmp_path):
    """Ray's derivation indexes maxReplicas: planned as stored (the CRD's default), with a note, not a KeyError."""
    rc = yaml.safe_load(yaml.safe_dump(no_group_cluster()))
    rc["metadata"]["annotations"][K.ANNOTATION] = yaml.safe_dump({"cloud": "aws", "region": "us-west-2"})
    rc["spec"]["workerGroupSpecs"] = [{"groupName": "gpu", "rayStartParams": {}, "template": {"spec": {"containers": [
        {"name": "ray-worker", "image": HEAD_IMAGE,
         "resources": {"limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}}}]}}}]
    src = tmp_path / "rc.yaml"
    src.write_text(yaml.safe_dump(rc))
    p = CliRunner().invoke(plan_command, [str(src)])
    assert p.exit_code == 0 and "KeyError" not in p.output, p.output
    r = run(str(src), "-o", str(tmp_path / "o.yaml"))
    assert r.exit_code == 0, r.output
    assert "spec.workerGroupSpecs[0].maxReplicas: not set: KubeRay's default is 2147483647" in r.output


# ------------------------------------------------------------------------------------------ autoscaler v2


def _spec(version: str | None = None, env: list | None = None, params: dict | None = None) -> dict:
    spec = copy.deepcopy(no_group_cluster()["spec"])
    if version:
        spec["autoscalerOptions"] = {"version": version}
    ray = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    ray["env"] = list(ray.get("env") or []) + list(env or [])
    spec["headGroupSpec"]["rayStartParams"].update(params or {})
    return spec


def _system(spec: dict) -> dict:
    return json.loads(shlex.split(spec["headGroupSpec"]["rayStartParams"]["system-config"])[0])


def test_version_v2_becomes_the_heads_system_config():
    spec = _spec("v2")
    notes = sidecar.install(spec, "spec", "open", HEAD_IMAGE)
    assert _system(spec) == {"enable_autoscaler_v2": True}
    assert any("system-config: enable_autoscaler_v2" in n for n in notes)
    again = copy.deepcopy(spec)
    assert not any("system-config" in n for n in sidecar.install(again, "spec", "open", HEAD_IMAGE))
    assert again == spec                                  # converting again changes nothing


def test_the_v2_env_the_operator_refuses_moves_to_the_system_config_beside_the_users_own():
    spec = _spec(env=[{"name": "RAY_enable_autoscaler_v2", "value": "1"}],
                 params={"system-config": '\'{"object_spilling_threshold": 0.9}\''})
    sidecar.install(spec, "spec", "open", HEAD_IMAGE)
    env = spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["MODEL"]
    assert _system(spec) == {"enable_autoscaler_v2": True, "object_spilling_threshold": 0.9}


def test_a_v2_env_set_off_is_dropped_without_turning_v2_on():
    spec = _spec(env=[{"name": "RAY_enable_autoscaler_v2", "value": "0"}])
    notes = sidecar.install(spec, "spec", "open", HEAD_IMAGE)
    assert "system-config" not in spec["headGroupSpec"]["rayStartParams"]
    assert any("RAY_enable_autoscaler_v2: dropped" in n for n in notes)


def test_a_system_config_that_is_not_json_is_refused_naming_the_key():
    spec = _spec("v2", params={"system-config": "{not json"})
    with pytest.raises(ConfigError) as e:
        sidecar.install(spec, "spec", "open", HEAD_IMAGE)
    assert e.value.key == "spec.headGroupSpec.rayStartParams.system-config"


# ------------------------------------------------------------------------------------------ the open template's AMI


def _settled(provider: dict, types: dict) -> tuple[dict, object]:
    """(the config, the bundle) after settle_images, as plan and bootstrap_config run it."""
    cfg = {"head_node_type": "head", "provider": {"cloud": "aws", "region": "us-west-2", **provider},
           "available_node_types": types}
    return cfg, settle_images(cfg, load_provider(cfg["provider"]))


def test_a_shape_open_clusters_template_gets_rays_default_ami_and_a_declared_one_is_left_alone():
    head = {"head": {"node_config": {"ImageId": "ami-head"}}}
    cfg, bundle = _settled({}, copy.deepcopy(head))
    assert cfg["provider"]["open_node_config"] == {"ImageId": default_ami("us-west-2")}
    assert bundle.core.open.node_config == {"ImageId": default_ami("us-west-2")}     # the settings read it
    nested, bundle = _settled({"open": {"enabled": True, "node_config": {"ImageId": "ami-own"}}},
                              {**copy.deepcopy(head), "w": {"node_config": {"ImageId": "ami-w"}}})
    assert nested["provider"]["open"]["node_config"] == {"ImageId": "ami-own"}
    flat, bundle = _settled({"open_shapes": True}, {**copy.deepcopy(head), "w": {"node_config": {"ImageId": "ami-w"}}})
    assert flat["provider"]["open_node_config"] == {"ImageId": default_ami("us-west-2")}   # beside the flat key
    declared, _ = _settled({}, {**copy.deepcopy(head), "w": {"node_config": {"ImageId": "ami-w"}}})
    assert "open_node_config" not in declared["provider"] and "open" not in declared["provider"]
    with_image_id, _ = _settled({"image_id": "ami-provider"}, {"head": {"node_config": {}}})
    assert with_image_id["provider"]["open_node_config"] == {}      # the backend uses provider.image_id


def test_a_region_without_a_default_ami_names_the_templates_key():
    with pytest.raises(ConfigError) as e:
        _settled({"region": "eu-south-2"}, {"head": {"node_config": {"ImageId": "ami-head"}}})
    assert e.value.key == "provider.open_node_config.ImageId" and "no AMI" in str(e.value)
