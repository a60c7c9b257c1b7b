"""What a test needs around a REAL kubelet (providers/local/real_kubelet.py, the local machine image that boots a
machine's join user data on containerd): the node binaries, the cluster side of a kubeadm join, a Ray pod template
the kubelet can run, and a clean-up that works whatever a failed test left.

- `ensure_node_binaries()` runs scripts/k8s/build_node.sh (kubelet + kubeadm of the control plane's Go build,
  containerd + runc + CNI plugins from Debian, the pause and ray-host images), cached in
  ~/.cache/ray-nodeless/k8s-node: seconds once the control plane is built, instant afterwards.
- `prepare_kubeadm_cluster(cp, workdir)` does on a running `ControlPlane(node_joins=True)` what `kubeadm init` does
  for joining nodes, with the real kubeadm's own phases: `upload-config kubeadm` (ClusterConfiguration),
  `upload-config kubelet` (the KubeletConfiguration every joining kubelet downloads: this host's ports, cgroupfs,
  127.0.0.1 only) and `bootstrap-token` (the token, the cluster-info ConfigMap the bootstrapsigner signs, the RBAC
  that lets a kubelet TLS-bootstrap and have its CSR auto-approved). Returns the join keys for the cluster config:
  endpoint, token, ca_cert_hash, cri_socket.
- `ray_host_pod_template(...)`: the pod template of a Ray worker the real kubelet runs: the locally built
  `local/ray-host:1` image (busybox + a usr-merged skeleton, imagePullPolicy Never: no registry), hostNetwork with
  an explicit `--node-ip-address=127.0.0.N` (the Node's own IP is the host's interface address: a kubelet refuses
  loopback) and explicit ports, and hostPath mounts of /usr, the venv and its base interpreter so `ray` runs.
- `stop_real_kubelet(workdir)`: stops whatever runs for that workdir (by PID), restores the sysctls, unmounts.

Pitfalls: ../shared/k8s/kubelet/README.md (all 12 are handled here or in the machine image).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray_nodeless.providers.local.real_kubelet import RealKubeletMachine, cri_socket, node_dir
from ray_nodeless.testing.k8s_control_plane import k8s_version
from ray_nodeless.testing.k8s_support import ControlPlaneError

BUILD_NODE_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "k8s" / "build_node.sh"
NODE_BUILD_TIMEOUT_S = 5400.0
KUBELET_PORT = 20250          # the kubelet's API and healthz on 127.0.0.1 (not the defaults 10250/10248)
HEALTHZ_PORT = 20248
BOOTSTRAP_TOKEN = "rnkjn0.0123456789abcdef"
PHASE_TIMEOUT_S = 200         # `upload-config kubelet` waits up to 120 s for the Node it annotates
PLACEHOLDER_NODE = "kubeadm-placeholder"


def node_binaries_present() -> bool:
    d = node_dir()
    return (d / ".stamp").is_file() and all((d / "bin" / b).exists() for b in ("kubelet", "kubeadm", "containerd"))


def ensure_node_binaries(timeout: float = NODE_BUILD_TIMEOUT_S) -> Path:
    """The node directory of build_node.sh, built first if needed (it builds the control plane first too)."""
    if node_binaries_present():
        return node_dir()
    try:
        subprocess.run(["bash", str(BUILD_NODE_SCRIPT)], stdout=subprocess.DEVNULL, check=True, timeout=timeout)
    except subprocess.CalledProcessError as e:
        raise ControlPlaneError(f"{BUILD_NODE_SCRIPT} failed with exit {e.returncode}; see its output above") from e
    except subprocess.TimeoutExpired as e:
        raise ControlPlaneError(f"{BUILD_NODE_SCRIPT} did not finish within {timeout:.0f} s") from e
    if not node_binaries_present():
        raise ControlPlaneError(f"{BUILD_NODE_SCRIPT} succeeded but {node_dir()} lacks the kubelet")
    return node_dir()


@dataclass(frozen=True)
class KubeadmJoinKeys:
    """The `kubernetes.join` keys of a kubeadm join to this cluster."""

    endpoint: str
    token: str
    ca_cert_hash: str
    cri_socket: str

    def join_block(self) -> dict[str, str]:
        return {"method": "kubeadm", "endpoint": self.endpoint, "token": self.token,
                "ca_cert_hash": self.ca_cert_hash, "cri_socket": self.cri_socket}


def ca_cert_hash(ca_file: Path) -> str:
    """kubeadm's discovery-token-ca-cert-hash: sha256 of the CA's SubjectPublicKeyInfo (DER)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    cert = x509.load_pem_x509_certificate(ca_file.read_bytes())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def kubelet_configuration(workdir: Path, ca_file: Path) -> dict[str, Any]:
    """The KubeletConfiguration every joining kubelet downloads (kubeadm's `kubelet-config` ConfigMap): 127.0.0.1 only,
    this host's ports, cgroupfs (no systemd), cgroup v1 allowed (this host's hierarchy; 1.35+ refuses it unless
    told), swap tolerated, no iptables chains, eviction thresholds a shared test host meets."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": "127.0.0.1", "port": KUBELET_PORT, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": HEALTHZ_PORT,
        "cgroupDriver": "cgroupfs", "failSwapOn": False, "makeIPTablesUtilChains": False, "failCgroupV1": False,
        "staticPodPath": str(Path(workdir).resolve() / "kroot" / "etc" / "kubernetes" / "manifests"),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca_file)}},
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local", "clusterDNS": ["10.0.0.10"],
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
    }


def _host_ip() -> str:
    """The interface address kubeadm's InitConfiguration needs (it refuses 127.0.0.1 as advertiseAddress; nothing
    listens on it: the API server stays on 127.0.0.1)."""
    out = subprocess.run(["ip", "-4", "route", "get", "1.1.1.1"], capture_output=True, text=True, timeout=10).stdout
    words = out.split()
    return words[words.index("src") + 1] if "src" in words else "192.0.2.2"


def prepare_kubeadm_cluster(cp: Any, workdir: str | os.PathLike, *, kubeadm: Path | None = None) -> KubeadmJoinKeys:
    """kubeadm's init phases for joining nodes, on the running control plane `cp` (see the module docstring)."""
    import yaml
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    if not getattr(cp, "node_joins", False):
        raise ControlPlaneError("prepare_kubeadm_cluster needs ControlPlane(node_joins=True)")
    kubeadm = kubeadm or node_dir() / "bin" / "kubeadm"
    work = Path(cp.workdir) / "kubeadm"
    work.mkdir(parents=True, exist_ok=True)
    ca = Path(cp.ca_file)
    # the admin kubeconfig with the CA as data: `init phase bootstrap-token` copies it into cluster-info
    kc = {"apiVersion": "v1", "kind": "Config",
          "clusters": [{"name": "local", "cluster": {"server": cp.server, "certificate-authority-data":
                                                     base64.b64encode(ca.read_bytes()).decode()}}],
          "users": [{"name": "admin", "user": {"token": cp.admin_token}}],
          "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
          "current-context": "local"}
    admin = work / "admin.conf"
    admin.write_text(json.dumps(kc))
    os.chmod(admin, 0o600)
    port = int(cp.server.rsplit(":", 1)[1])
    docs = [
        {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
         "bootstrapTokens": [{"token": BOOTSTRAP_TOKEN, "ttl": "2h", "usages": ["signing", "authentication"],
                              "groups": ["system:bootstrappers:kubeadm:default-node-token"]}],
         "localAPIEndpoint": {"advertiseAddress": _host_ip(), "bindPort": port},
         "nodeRegistration": {"name": PLACEHOLDER_NODE, "criSocket": f"unix://{cri_socket(workdir)}"}},
        {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
         "kubernetesVersion": f"v{k8s_version()}",
         "controlPlaneEndpoint": f"127.0.0.1:{port}",
         "networking": {"serviceSubnet": "10.0.0.0/24", "dnsDomain": "cluster.local"}},
        kubelet_configuration(Path(workdir), ca),
    ]
    init = work / "kubeadm-init.yaml"
    init.write_text(yaml.safe_dump_all(docs, sort_keys=True))
    with cp.api_client() as api:
        core = client.CoreV1Api(api)
        # `upload-config kubelet` annotates nodeRegistration.name's Node and waits for it (and its hostname label)
        try:
            core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": PLACEHOLDER_NODE, "labels": {"kubernetes.io/hostname": PLACEHOLDER_NODE}}})
        except ApiException as e:
            if e.status != 409:
                raise
        try:
            for phase in (["upload-config", "kubeadm"], ["upload-config", "kubelet"], ["bootstrap-token"]):
                r = subprocess.run([str(kubeadm), "init", "phase", *phase, "--config", str(init),
                                    "--kubeconfig", str(admin)], capture_output=True, text=True,
                                   timeout=PHASE_TIMEOUT_S)
                if r.returncode != 0:
                    raise ControlPlaneError(f"kubeadm init phase {' '.join(phase)} failed:\n"
                                            f"{(r.stdout + r.stderr)[-3000:]}")
        finally:
            try:
                core.delete_node(PLACEHOLDER_NODE)
            except ApiException:
                pass
    return KubeadmJoinKeys(cp.server, BOOTSTRAP_TOKEN, ca_cert_hash(ca), cri_socket(workdir))


def ray_host_pod_template(*, node_ip: str, port_base: int, object_store_memory: int = 78_643_200,
                          container: str = "ray-worker") -> dict[str, Any]:
    """A pod template whose Ray node the real kubelet runs on this host (see the module docstring). The command is
    the registration's default (`ray start --address=$(RAY_GCS_ADDRESS) --block`) plus this host's address and
    ports; resources, labels and the machine id come from the env the registration sets (RAY_OVERRIDE_RESOURCES,
    RAY_CLOUD_INSTANCE_ID), which Ray reads itself."""
    venv = Path(sys.prefix).resolve()
    base = Path(sys.base_prefix).resolve()
    mounts = ["/usr", str(venv)] + ([] if str(base).startswith("/usr") else [str(base)])
    p = port_base
    cmd = (f"exec ray start --address=$(RAY_GCS_ADDRESS) --block --disable-usage-stats --node-ip-address={node_ip}"
           f" --object-store-memory={object_store_memory} --node-manager-port={p} --object-manager-port={p + 1}"
           f" --dashboard-agent-listen-port={p + 2} --dashboard-agent-grpc-port={p + 3}"
           f" --runtime-env-agent-port={p + 4} --metrics-export-port={p + 5}"
           f" --min-worker-port={p + 10} --max-worker-port={p + 49}")
    return {"spec": {
        "hostNetwork": True, "automountServiceAccountToken": False,
        "containers": [{
            "name": container, "image": "local/ray-host:1", "imagePullPolicy": "Never",
            "command": ["/bin/bash", "-c", cmd],
            "env": [{"name": "PATH", "value": f"{venv}/bin:/usr/bin:/bin"}, {"name": "HOME", "value": "/tmp"},
                    {"name": "RAY_AUTH_MODE", "value": "disabled"}],
            "volumeMounts": [{"name": f"host{i}", "mountPath": d, "readOnly": True} for i, d in enumerate(mounts)],
        }],
        "volumes": [{"name": f"host{i}", "hostPath": {"path": d, "type": "Directory"}} for i, d in enumerate(mounts)],
    }}


def stop_real_kubelet(workdir: str | os.PathLike) -> dict[str, int]:
    """Stop whatever runs for this workdir (kubeadm, kubelet, containers, containerd), restore the sysctls,
    unmount; returns what was still running before."""
    m = RealKubeletMachine(workdir)
    live = m.live()
    m.stop()
    return live
