"""The KubeRay bridge's config (kuberay/bridge.py bridge_config): Ray's own derivation of a RayCluster from
tests/data/kuberay (KubeRay's samples) with the provider swapped for ray_nodeless, the worker groups' templates as the
Ray pods'
templates, and the RayClusters the bridge must refuse (naming the key)."""
from __future__ import annotations

import copy

import pytest
import yaml

from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.kuberay import bridge as K
from ray_nodeless.ray_compat.kuberay import derive_config
from ray_nodeless.registrations.kubernetes.pods import ray_pod, template_for
from ray_nodeless.kuberay.annotation import annotation_key
from tests import REPO_ROOT

SAMPLE = REPO_ROOT / "tests" / "data" / "kuberay" / "ray-cluster.autoscaler.yaml"   # KubeRay's own sample
ANNOTATION = {"cloud": "local", "simulate_cloud": "aws", "region": "us-west-2",
              "kubernetes": {"join": {"method": "kubeadm", "endpoint": "https://127.0.0.1:6443",
                                      "token": "abcdef.0123456789abcdef",
                                      "ca_cert_hash": "sha256:" + "0" * 64}},
              "rules": [{"name": "gpu-spot", "match": {"GPU": ">=1"}, "capacity": ["spot", "on-demand"]}],
              "groups": {"gpu-group": {"minWorkers": 0, "node_config": {"exclude_gpus": ["K80"]}}}}


def sample_cluster(annotation: dict | None = None) -> dict:
    """The sample autoscaler RayCluster with a GPU group added, as the API server returns it (namespace, uid)."""
    docs = [d for d in yaml.safe_load_all(SAMPLE.read_text()) if d and d.get("kind") == "RayCluster"]
    rc = copy.deepcopy(docs[0])
    rc["metadata"].update(namespace="ray", uid="1234-abcd", annotations={
        K.ANNOTATION: yaml.safe_dump(ANNOTATION if annotation is None else annotation)})
    gpu = copy.deepcopy(rc["spec"]["workerGroupSpecs"][0])
    gpu.update(groupName="gpu-group", maxReplicas=2, rayStartParams={"metrics-export-port": "8080"})
    c = gpu["template"]["spec"]["containers"][0]
    c["resources"] = {"limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                      "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}}
    c["env"] = [{"name": "MODEL", "value": "llama"}]
    gpu["template"]["spec"]["nodeSelector"] = {"karpenter.sh/capacity-type": "spot"}
    gpu["template"]["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    gpu["template"]["spec"]["serviceAccountName"] = "trainer"
    gpu["template"]["metadata"] = {"labels": {"team": "ml", "ray.io/group": "gpu-group"}}
    rc["spec"]["workerGroupSpecs"].append(gpu)
    return rc


def test_the_sample_becomes_a_ray_nodeless_config_ray_derived():
    rc = sample_cluster()
    cfg = K.bridge_config(rc, derive_config(rc))
    p = cfg["provider"]
    assert (p["type"], p["module"], p["registration"]) == ("external", K.PROVIDER_MODULE, "kubernetes")
    assert p["disable_node_updaters"] is True and "foreground_node_launch" not in p
    assert p["gcs_address"] == "raycluster-autoscaler-head-svc.ray.svc:6379"
    assert p["kubernetes"]["namespace"] == "ray"
    # Ray's derivation: the node types, resources from the container limits, min/max from the replicas
    gpu = cfg["available_node_types"]["gpu-group"]
    assert gpu["resources"] == {"CPU": 4, "GPU": 1, "memory": 16 * 2**30}
    assert (gpu["min_workers"], gpu["max_workers"]) == (0, 2)
    # the template's scheduling (karpenter.sh/capacity-type: spot) as a constraint, then the annotation's keys
    assert gpu["node_config"] == {"capacity": ["spot"], "exclude_gpus": ["K80"]}
    assert cfg["head_node_type"] == "headgroup" and cfg["idle_timeout_minutes"] == 1.0
    assert p["node_type_resources"]["gpu-group"] == gpu["resources"]
    # the whole block loads as ray_nodeless's provider settings (every key known, each section parsed)
    assert p["kuberay"]["head_node_type"] == "headgroup"
    bundle = load_provider({k: v for k, v in p.items() if k != "kuberay"})   # the subclass takes `kuberay` out
    assert bundle.core.cloud == "local"
    assert sorted(bundle.registration_settings.kubernetes.pod_templates) == ["gpu-group", "small-group"]


def test_a_group_template_is_the_ray_pods_template():
    rc = sample_cluster()
    cfg = K.bridge_config(rc, derive_config(rc))
    k = cfg["provider"]["kubernetes"]
    t = template_for(k["pod_template"], k["pod_templates"], "gpu-group")
    labels = t["metadata"]["labels"]
    assert labels["ray.io/cluster"] == "raycluster-autoscaler" and labels["ray.io/node-type"] == "worker"
    assert labels[K.GROUP_LABEL] == "gpu-group" and labels["team"] == "ml"
    assert "ray.io/group" not in labels          # the operator counts and deletes a group's pods by it
    assert t["metadata"]["ownerReferences"][0]["uid"] == "1234-abcd"
    assert "nodeSelector" not in t["spec"]       # mapped to the machine's rules, not to the pod
    pod = ray_pod(t, cluster="raycluster-autoscaler", namespace="ray", machine_id="m-1", node_type="gpu-group",
                  is_head=False, instance_type="g6.xlarge", allocatable={"cpu": "4", "memory": "16Gi",
                                                                        "nvidia.com/gpu": "1"},
                  reserve_cpu="250m", reserve_memory="256Mi", grace_s=5, gcs_address="h:6379",
                  ray_resources={"CPU": 4, "GPU": 1}, ray_labels={})
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "trainer"
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]
    ray = spec["containers"][0]
    assert {"name": "MODEL", "value": "llama"} in ray["env"]
    assert ray["image"] == "rayproject/ray:2.52.0"
    assert ray["command"][-1] == "ray start --address=$(RAY_GCS_ADDRESS) --block --metrics-export-port=8080"
    assert ray["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] == {"ray-nodeless.io/machine-id": "m-1"}


@pytest.mark.parametrize(("edit", "key"), [
    (lambda rc: rc["spec"]["workerGroupSpecs"][0].update(minReplicas=1), "spec.workerGroupSpecs[0].minReplicas"),
    (lambda rc: rc["spec"]["workerGroupSpecs"][1].update(replicas=2), "spec.workerGroupSpecs[1].replicas"),
    (lambda rc: rc["spec"]["workerGroupSpecs"][1].update(numOfHosts=2), "spec.workerGroupSpecs[1].numOfHosts"),
    (lambda rc: rc["metadata"]["annotations"].pop(K.ANNOTATION), annotation_key()),
    (lambda rc: rc["metadata"]["annotations"].update({K.ANNOTATION: "registration: vm\n"}),
     annotation_key("registration")),
    (lambda rc: rc["metadata"]["annotations"].update({K.ANNOTATION: yaml.safe_dump(
        dict(ANNOTATION, groups={"nope": {}}))}), annotation_key("groups.nope")),
    (lambda rc: rc["metadata"]["annotations"].update({K.ANNOTATION: yaml.safe_dump(
        dict(ANNOTATION, groups={"gpu-group": {"minWorkers": 5}}))}),
     annotation_key("groups.gpu-group.minWorkers")),
    (lambda rc: rc["metadata"]["annotations"].update({K.ANNOTATION: yaml.safe_dump(
        dict(ANNOTATION, kubernetes={"namespace": "x"}))}), annotation_key("kubernetes.namespace")),
])
def test_refused_naming_the_key(edit, key):
    rc = sample_cluster()
    edit(rc)
    with pytest.raises(ConfigError) as e:
        K.bridge_config(rc, derive_config(rc))
    assert e.value.key == key


def test_an_unknown_provider_key_in_the_annotation_is_the_loaders_error():
    rc = sample_cluster(dict(ANNOTATION, regoin="us-west-2"))
    with pytest.raises(ConfigError, match="regoin"):
        load_provider({k: v for k, v in K.bridge_config(rc, derive_config(rc))["provider"].items() if k != "kuberay"})


def test_what_needs_a_new_provider():
    rc = sample_cluster()
    a = K.bridge_config(rc, derive_config(rc))["provider"]
    rc["spec"]["workerGroupSpecs"][1]["template"]["spec"]["containers"][0]["env"].append({"name": "X", "value": "1"})
    rc["spec"]["workerGroupSpecs"][1]["maxReplicas"] = 5
    b = K.bridge_config(rc, derive_config(rc))["provider"]
    assert a != b and K.without_templates(a) == K.without_templates(b)    # handed to the running provider
    rc["metadata"]["annotations"][K.ANNOTATION] = yaml.safe_dump(dict(ANNOTATION, region="us-east-1"))
    c = K.bridge_config(rc, derive_config(rc))["provider"]
    assert K.without_templates(c) != K.without_templates(a)               # a restart
