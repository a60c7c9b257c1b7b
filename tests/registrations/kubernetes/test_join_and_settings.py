"""The kubernetes registration without a cluster: settings errors name the key, each join method's user data carries
the labels and taints, and the parser the kubelet player uses reads back exactly those."""
from __future__ import annotations

import subprocess

import pytest
import yaml

from ray_nodeless.core.catalog import embedded
from ray_nodeless.core.kube_join import parse_user_data
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers.base import LaunchSpec
from ray_nodeless.registrations.kubernetes import labels as L
from ray_nodeless.registrations.kubernetes.join import check_join, user_data
from ray_nodeless.registrations.kubernetes.pods import ray_pod, size_resources
from ray_nodeless.registrations.kubernetes.settings import JoinSettings

JOINS = {
    "eks": {"method": "eks", "cluster": "my-eks", "endpoint": "https://ABC.gr7.us-west-2.eks.amazonaws.com",
            "ca": "Y2VydGlmaWNhdGVBdXRob3JpdHk=", "cidr": "10.100.0.0/16"},
    "kubeadm": {"method": "kubeadm", "endpoint": "https://10.0.0.10:6443", "token": "abcdef.0123456789abcdef",
                "ca_cert_hash": "sha256:" + "0" * 64},
    "k3s": {"method": "k3s", "endpoint": "https://10.0.0.10:6443", "token": "K10secret::server:abc"},
}


def spec(name: str = "g6.xlarge", node_type: str = "gpu_worker") -> LaunchSpec:
    rc = embedded().region("aws", "us-west-2")
    o = rc.find(name, "us-west-2b", "spot")
    return LaunchSpec(cluster_name="c1", node_type=node_type, offering=o, count=2,
                      tags={"nodeless-rule": "gpu-workers-spot-first", "nodeless-hourly-price": "0.1046",
                            "nodeless-catalog": "cat-123"},
                      node_config={}, request_token="t", resources={"CPU": 4.0, "GPU": 1.0}, labels={})


def provider(**k8s) -> dict:
    block = {"namespace": "ray", "join": JOINS["eks"]}
    block.update(k8s)
    return {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws", "region": "us-west-2",
            "registration": "kubernetes", "kubernetes": block}


def test_provider_block_is_declared_and_loads():
    load_provider(provider())


@pytest.mark.parametrize("patch,key", [
    ({"join": {"method": "gke"}}, "provider.kubernetes.join.method"),
    ({"join": {"method": "eks", "clustr": "x"}}, "provider.kubernetes.join.clustr"),
    ({"namespace": "Ray_NS"}, "provider.kubernetes.namespace"),
    ({"join_timeout_s": 0}, "provider.kubernetes.join_timeout_s"),
    ({"pod_grace_s": "30"}, "provider.kubernetes.pod_grace_s"),
    ({"played": "yes"}, "provider.kubernetes.played"),
    ({"podtemplate": {}}, "provider.kubernetes.podtemplate"),
])
def test_bad_block_names_the_key(patch, key):
    with pytest.raises(ConfigError) as e:
        load_provider(provider(**patch))
    assert e.value.key == key, str(e.value)


def test_missing_block_is_an_error():
    p = provider()
    del p["kubernetes"]
    with pytest.raises(ConfigError) as e:
        load_provider(p)
    assert e.value.key == "provider.kubernetes"


@pytest.mark.parametrize("method,missing", [("eks", "cidr"), ("kubeadm", "token"), ("k3s", "endpoint")])
def test_join_keys_each_method_needs(method, missing):
    j = dict(JOINS[method])
    del j[missing]
    with pytest.raises(ConfigError) as e:
        check_join(JoinSettings.model_validate(j))
    assert e.value.key == f"provider.kubernetes.join.{missing}"


@pytest.mark.parametrize("method", sorted(JOINS))
def test_user_data_round_trips_labels_and_taints(method):
    s = spec()
    text = user_data(JoinSettings.model_validate(JOINS[method]), s, "c1", "aws")
    joined = parse_user_data(text, "i-0123456789abcdef0")
    assert joined.method == method
    want = {L.INSTANCE_TYPE: "g6.xlarge", L.ZONE: "us-west-2b", L.REGION: "us-west-2", L.ARCH: "amd64",
            L.CLUSTER: "c1", L.NODE_TYPE: "gpu_worker", L.CAPACITY_TYPE: "spot", L.RULE: "gpu-workers-spot-first",
            L.JOIN_METHOD: method}
    if method != "eks":          # eks: the registration labels the Node from its providerID
        want[L.MACHINE_ID] = "i-0123456789abcdef0"
        assert joined.name == "i-0123456789abcdef0"
    assert joined.labels == want
    assert joined.taints == [{"key": L.TAINT_KEY, "value": "c1", "effect": "NoSchedule"}]
    if method == "eks":
        assert "apiVersion: node.eks.aws/v1alpha1" in text and "kind: NodeConfig" in text
        assert text.startswith("Content-Type: multipart/mixed") or "MIME-Version: 1.0" in text
        assert "application/node.eks.aws" in text
        assert joined.endpoint == JOINS["eks"]["endpoint"]
    else:
        assert "169.254.169.254/latest/meta-data/instance-id" in text
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    if method == "kubeadm":
        assert "kubeadm join --config" in text and "kind: JoinConfiguration" in text
    if method == "k3s":
        assert "curl -sfL https://get.k3s.io | K3S_URL=https://10.0.0.10:6443" in text and " agent " in text


def test_machine_id_snippet_per_cloud():
    j = JoinSettings.model_validate(JOINS["k3s"])
    assert "metadata.google.internal" in user_data(j, spec(), "c1", "gcp")
    assert "RAY_CLOUD_INSTANCE_ID" in user_data(j, spec(), "c1", "local")


def test_ray_pod_binds_to_the_machine_and_sizes_from_allocatable():
    alloc = {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1", "pods": "110"}
    tmpl = {"metadata": {"labels": {"team": "ml"}},
            "spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.60.0-gpu",
                                     "env": [{"name": "FOO", "value": "1"}]}]}}
    pod = ray_pod(tmpl, cluster="c1", namespace="ray", machine_id="i-01", node_type="gpu_worker", is_head=False,
                  instance_type="g6.xlarge", allocatable=alloc, reserve_cpu="250m", reserve_memory="256Mi",
                  grace_s=30, gcs_address="10.0.0.5:6379", ray_resources={"CPU": 4.0, "GPU": 1.0},
                  ray_labels={})
    assert pod["metadata"]["labels"] == {"team": "ml", L.CLUSTER: "c1", L.MACHINE_ID: "i-01",
                                         L.NODE_TYPE: "gpu_worker", L.ROLE: "worker"}
    assert pod["spec"]["nodeSelector"] == {L.MACHINE_ID: "i-01"}
    taint = {"key": L.TAINT_KEY, "operator": "Equal", "value": "c1", "effect": "NoSchedule"}
    assert taint in pod["spec"]["tolerations"]
    c = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["RAY_CLOUD_INSTANCE_ID"] == "i-01" and env["FOO"] == "1" and env["RAY_GCS_ADDRESS"] == "10.0.0.5:6379"
    assert c["resources"]["limits"] == {"cpu": "4000m", "memory": str(16 * 2**30), "nvidia.com/gpu": "1"}
    assert c["resources"]["requests"]["cpu"] == "3750m"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30 and pod["spec"]["restartPolicy"] == "Never"


def test_size_resources_never_exceeds_allocatable():
    r = size_resources({"cpu": "100m", "memory": "128Mi"}, "250m", "256Mi")
    assert r["requests"] == {"cpu": "100m", "memory": str(128 * 2**20)}


def test_the_parsed_block_reaches_its_api_server_and_names_the_key(tmp_path):
    """`KubernetesBlock.api_client` is how the registration and the played kubelet (handed the block, importing
    nothing of registrations/) reach the API server: one reading of kubeconfig / context, errors naming the key."""
    from kubernetes import client

    from ray_nodeless.registrations.kubernetes.settings import KubernetesBlock

    join = dict(JOINS["kubeadm"])
    with pytest.raises(ConfigError) as e:
        KubernetesBlock.model_validate({"kubeconfig": str(tmp_path / "none"), "join": join}).api_client()
    assert e.value.key == "provider.kubernetes.kubeconfig" and "cannot read" in str(e.value)
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "a",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u"}}]}))
    block = KubernetesBlock.model_validate({"kubeconfig": str(kubeconfig), "join": join})
    api = block.api_client()
    assert isinstance(api, client.ApiClient) and api.configuration.host == "https://127.0.0.1:9"
    with pytest.raises(ConfigError) as e:
        KubernetesBlock.model_validate({"kubeconfig": str(kubeconfig), "context": "b", "join": join}).api_client()
    assert e.value.key == "provider.kubernetes.context"
