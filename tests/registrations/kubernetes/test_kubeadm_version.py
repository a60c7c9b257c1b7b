"""The kubeadm JoinConfiguration's version matches the cluster's: v1beta2 for 1.15-1.21 (kubeadm 1.20 refuses
v1beta3: 'no kind "JoinConfiguration" is registered for version "kubeadm.k8s.io/v1beta3"'), v1beta3 for 1.22-1.30,
v1beta4 from 1.31 (whose kubeletExtraArgs is a list); picked from the API server's version or `join.kubeadm_api`;
criSocket is always written (kubeadm 1.20 otherwise assumes docker). The real kubeadm 1.20 joining with this
document is tests/e2e/test_real_kubelet.py."""
from __future__ import annotations

import pytest
import yaml

from ray_nodeless.core.kube_join import JOIN_HEREDOC, cri_socket_for, kubeadm_api_for, parse_user_data
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.registrations.kubernetes.join import kubeadm_api_version, user_data
from ray_nodeless.registrations.kubernetes.settings import JoinSettings
from tests.registrations.kubernetes.test_join_and_settings import JOINS, provider, spec


def join_config(script: str) -> dict:
    lines = script.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.endswith("<<" + JOIN_HEREDOC))
    return yaml.safe_load("\n".join(lines[start + 1:lines.index(JOIN_HEREDOC, start + 1)]))


@pytest.mark.parametrize("version,api", [
    ("v1.15.0", "v1beta2"), ("v1.20.2", "v1beta2"), ("1.21", "v1beta2"), ("v1.21.14-eks-1", "v1beta2"),
    ("v1.22.0", "v1beta3"), ("v1.28.3-eks-4f4795d", "v1beta3"), ("v1.30.5+k3s1", "v1beta3"),
    ("v1.31.0", "v1beta4"), ("v1.34.1", "v1beta4"), ("v2.0.0", "v1beta4"),
])
def test_api_version_follows_the_server(version, api):
    assert kubeadm_api_for(version) == api


@pytest.mark.parametrize("version", ["v1.14.10", "latest", ""])
def test_server_without_a_known_version_is_refused(version):
    with pytest.raises(ValueError):
        kubeadm_api_for(version)


def test_auto_asks_the_server_once_a_setting_does_not_ask():
    asked = []

    def server() -> str:
        asked.append(1)
        return "v1.20.2"

    assert kubeadm_api_version(JoinSettings.model_validate(JOINS["kubeadm"]), server) == "v1beta2"
    assert asked == [1]
    fixed = JoinSettings.model_validate(dict(JOINS["kubeadm"], kubeadm_api="v1beta4"))
    assert kubeadm_api_version(fixed, server) == "v1beta4"
    assert asked == [1]


def test_auto_with_an_old_server_names_the_key():
    with pytest.raises(ConfigError) as e:
        kubeadm_api_version(JoinSettings.model_validate(JOINS["kubeadm"]), lambda: "v1.13.0")
    assert e.value.key == "provider.kubernetes.join.kubeadm_api"
    assert "v1.13.0" in str(e.value)


@pytest.mark.parametrize("value", ["v1beta1", "1.20", "V1BETA3", 3])
def test_bad_setting_names_the_key(value):
    with pytest.raises(ConfigError) as e:
        load_provider(provider(join=dict(JOINS["kubeadm"], kubeadm_api=value)))
    assert e.value.key == "provider.kubernetes.join.kubeadm_api", str(e.value)


@pytest.mark.parametrize("api", ["v1beta2", "v1beta3", "v1beta4"])
def test_document_of_each_version_and_the_parser_reads_it_back(api):
    join = JoinSettings.model_validate(JOINS["kubeadm"])
    text = user_data(join, spec(), "c1", "aws", api)
    cfg = join_config(text)
    assert cfg["apiVersion"] == f"kubeadm.k8s.io/{api}" and cfg["kind"] == "JoinConfiguration"
    reg = cfg["nodeRegistration"]
    assert reg["criSocket"] == ("/run/containerd/containerd.sock" if api == "v1beta2"
                                else "unix:///run/containerd/containerd.sock")
    extra = reg["kubeletExtraArgs"]
    if api == "v1beta4":
        assert isinstance(extra, list) and {a["name"] for a in extra} == {"node-labels"}
    else:
        assert isinstance(extra, dict) and set(extra) == {"node-labels"}
    node = parse_user_data(text, "i-0abc")
    assert node.name == "i-0abc" and node.labels["ray-nodeless.io/machine-id"] == "i-0abc"
    assert node.endpoint == "https://10.0.0.10:6443"


def test_cri_socket_setting_is_written_as_given():
    join = JoinSettings.model_validate(dict(JOINS["kubeadm"], cri_socket="/run/k/containerd.sock"))
    assert join_config(user_data(join, spec(), "c1", "aws", "v1beta2"))["nodeRegistration"]["criSocket"] \
        == "/run/k/containerd.sock"
    assert cri_socket_for("v1beta3", None) == "unix:///run/containerd/containerd.sock"


def test_bad_cri_socket_names_the_key():
    with pytest.raises(ConfigError) as e:
        load_provider(provider(join=dict(JOINS["kubeadm"], cri_socket="")))
    assert e.value.key == "provider.kubernetes.join.cri_socket"
