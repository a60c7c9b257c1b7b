"""The real-kubelet machine image of the local backend without booting a kubelet: its provider keys (errors name the
key), its refusal when the node binaries are missing or the host's one kubelet slot is taken, and its pid files
(a recycled pid is never signalled). The boot itself is tests/e2e/test_real_kubelet.py."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ray_nodeless.errors import BackendError, ConfigError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers.local.real_kubelet import RealKubeletMachine, cri_socket
from ray_nodeless.providers.local.settings import KubeletPlayerSettings


def provider(real: object) -> dict:
    return {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "local", "region": "us-west-2",
            "simulate_cloud": "aws", "registration": "kubernetes", "local_real_kubelet": real,
            "kubernetes": {"namespace": "ray", "played": True,
                           "join": {"method": "kubeadm", "endpoint": "https://127.0.0.1:6443",
                                    "token": "abcdef.0123456789abcdef", "ca_cert_hash": "sha256:" + "0" * 64}}}


def test_the_key_is_declared_for_played_kubelets():
    bundle = load_provider(provider({"node_type": "cpu_worker", "workdir": "/tmp/rnk-x"}))
    player = next(s for s in vars(bundle).values() if isinstance(s, KubeletPlayerSettings))
    assert player.local_real_kubelet.node_type == "cpu_worker"
    assert player.local_real_kubelet.boot_timeout_s == 180


@pytest.mark.parametrize("real,key", [
    ({"workdir": "/tmp/rnk-x"}, "provider.local_real_kubelet.node_type"),
    ({"node_type": "w", "workdir": "/tmp/" + "x" * 90}, "provider.local_real_kubelet.workdir"),
    ({"node_type": "w", "workdir": "/tmp/rnk", "boot_timeout_s": 0}, "provider.local_real_kubelet.boot_timeout_s"),
    ({"node_type": "w", "workdir": "/tmp/rnk", "nodetype": "w"}, "provider.local_real_kubelet.nodetype"),
    ("cpu_worker", "provider.local_real_kubelet"),
])
def test_bad_keys_name_the_key(real, key):
    with pytest.raises(ConfigError) as e:
        load_provider(provider(real))
    assert e.value.key == key, str(e.value)


def test_boot_without_node_binaries_says_how_to_build_them(tmp_path: Path):
    m = RealKubeletMachine(tmp_path / "w", node=tmp_path / "no-node")
    with pytest.raises(BackendError, match="build_node.sh"):
        m.boot("local-1", "#!/bin/bash\n")
    assert m.machine_id() is None and m.live() == {}


def test_one_machine_per_workdir(tmp_path: Path):
    m = RealKubeletMachine(tmp_path / "w", node=tmp_path / "no-node")
    m.w.mkdir(parents=True)
    m.machine_file.write_text("local-1\n")
    with pytest.raises(BackendError, match="one real kubelet per host"):
        m.boot("local-2", "#!/bin/bash\n")
    assert m.machine_id() == "local-1"


def test_a_recycled_pid_is_not_ours(tmp_path: Path):
    m = RealKubeletMachine(tmp_path / "w")
    m.pids.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "30"])          # a process that names nothing of the workdir
    try:
        (m.pids / "kubelet.pid").write_text(str(other.pid))
        assert m.pid("kubelet") is None and m.live() == {}
        m.stop()                                        # must not signal it
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_cri_socket_is_under_the_workdir():
    assert cri_socket("/tmp/rnk-1") == "/tmp/rnk-1/run/containerd.sock"
