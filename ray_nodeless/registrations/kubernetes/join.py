"""The join configuration a machine boots with (EC2 user data / GCE startup-script), one per join method. The
formats and their parser are core/kube_join.py (the kubelet player, providers/local/kubelet.py, registers the Node
exactly as parsed from it, so the labels and taints a test sees are the ones the user data carries).

- eks: a MIME multi-part document with an AL2023 `nodeadm` NodeConfig (`apiVersion: node.eks.aws/v1alpha1`). The
  Node's name is the instance's private DNS name (EKS's node authorizer requires it) and its `spec.providerID`
  `aws:///<zone>/<instance id>`; a NodeConfig cannot expand variables, so the machine-id label is added by the
  registration from the providerID when the Node first appears.
- kubeadm: a bash script that writes a `JoinConfiguration` (nodeRegistration: name = machine id, criSocket, kubelet
  node-labels and taints) and runs `kubeadm join --config`. Its apiVersion is `join.kubeadm_api`, or with `auto`
  the one the API server's version calls for (`kubeadm_api_version`): kubeadm 1.20 refuses v1beta3 ("no kind
  JoinConfiguration is registered for version kubeadm.k8s.io/v1beta3"), kubeadm 1.27+ refuses v1beta2.
- k3s: a bash script running the k3s installer as an agent with `--node-name`, `--node-label`, `--node-taint`.

Several machines can share one launch's user data, so kubeadm and k3s read the machine id at boot from the
instance metadata service (`MACHINE_ID`), and name the Node after it.
"""
from __future__ import annotations

import shlex
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any, Callable

import yaml

from ray_nodeless.core.kube_join import (
    JOIN_FILE, JOIN_HEREDOC, K3S_INSTALLER, KUBEADM_GROUP, NODECONFIG_API, NODECONFIG_TYPE, cri_socket_for,
    kubeadm_api_for,
)
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.base import LaunchSpec
from ray_nodeless.registrations.kubernetes import labels as L
from ray_nodeless.registrations.kubernetes.settings import JoinSettings
from ray_nodeless.registrations.vm_boot import instance_id_snippet

KEY = "provider.kubernetes.join"

# How a booted machine learns its own id: the backend's `instance_id_snippet` (registrations/vm_boot.py); for a
# backend without one (the local backend, a test backend) whoever runs the script says (the kubelet player does).
DEFAULT_MACHINE_ID_SNIPPET = 'MACHINE_ID=${MACHINE_ID:-${RAY_CLOUD_INSTANCE_ID:?machine id unknown}}'

REQUIRED = {"eks": ("cluster", "endpoint", "ca", "cidr"), "kubeadm": ("endpoint", "token", "ca_cert_hash"),
            "k3s": ("endpoint", "token")}


def check_join(join: JoinSettings) -> None:
    """The keys each method needs, as ConfigErrors naming them."""
    for k in REQUIRED[join.method]:
        if not getattr(join, k):
            raise ConfigError(f"{KEY}.{k}", f"is required for join method {join.method!r}")


def kubeadm_api_version(join: JoinSettings, server_version: Callable[[], str]) -> str:
    """The JoinConfiguration version (v1beta2 / v1beta3 / v1beta4): `join.kubeadm_api`, or with `auto` the one
    `server_version()` (the API server's gitVersion, asked only then) calls for. ConfigError naming the key when the
    server's version fits none."""
    if join.kubeadm_api != "auto":
        return join.kubeadm_api
    version = server_version()
    try:
        return kubeadm_api_for(version)
    except ValueError as e:
        raise ConfigError(f"{KEY}.kubeadm_api", f"auto: {e}; set one of v1beta2, v1beta3, v1beta4") from None


# ----------------------------------------------------------------------------------------------- generation

def user_data(join: JoinSettings, spec: LaunchSpec, cluster: str, cloud: str, kubeadm_api: str = "v1beta3") -> str:
    """The machine's join user data; `kubeadm_api` (kubeadm only) from `kubeadm_api_version`."""
    taints = [L.cluster_taint(cluster)]
    if join.method == "eks":
        return _eks(join, L.node_labels(spec, cluster, None, "eks"), taints)
    labels = L.node_labels(spec, cluster, L.MACHINE_ID_VAR, join.method)
    snippet = instance_id_snippet(cloud, "MACHINE_ID") or DEFAULT_MACHINE_ID_SNIPPET
    if join.method == "kubeadm":
        return _kubeadm(join, labels, taints, snippet, kubeadm_api)
    return _k3s(join, labels, taints, snippet)


def _eks(join: JoinSettings, labels: dict[str, str], taints: list[dict[str, str]]) -> str:
    flags = [f"--node-labels={L.labels_flag(labels)}",
             "--register-with-taints=" + ",".join(L.taint_flag(t) for t in taints), *join.kubelet_flags]
    node_config = {
        "apiVersion": NODECONFIG_API, "kind": "NodeConfig",
        "spec": {"cluster": {"name": join.cluster, "apiServerEndpoint": join.endpoint,
                             "certificateAuthority": join.ca, "cidr": join.cidr},
                 "kubelet": {"flags": flags}},
    }
    msg = MIMEMultipart(boundary="//")
    part = MIMEText("---\n" + yaml.safe_dump(node_config, sort_keys=False), "node.eks.aws")
    del part["Content-Type"]
    part["Content-Type"] = NODECONFIG_TYPE
    msg.attach(part)
    return msg.as_string()


def _kubeadm(join: JoinSettings, labels: dict[str, str], taints: list[dict[str, str]], snippet: str,
             api: str) -> str:
    extra = {"node-labels": L.labels_flag(labels)}
    for f in join.kubelet_flags:
        k, _, v = f.lstrip("-").partition("=")
        extra[k] = v
    endpoint = (join.endpoint or "").split("://", 1)[-1].rstrip("/")     # set: check_join refuses a join without
    # v1beta4 made kubeletExtraArgs a list of {name, value}
    extra_args: Any = [{"name": k, "value": v} for k, v in extra.items()] if api == "v1beta4" else extra
    cfg = {
        "apiVersion": f"{KUBEADM_GROUP}/{api}", "kind": "JoinConfiguration",
        "discovery": {"bootstrapToken": {"apiServerEndpoint": endpoint, "token": join.token,
                                         "caCertHashes": [join.ca_cert_hash]}},
        "nodeRegistration": {"name": L.MACHINE_ID_VAR, "criSocket": cri_socket_for(api, join.cri_socket),
                             "kubeletExtraArgs": extra_args, "taints": taints},
    }
    body = yaml.safe_dump(cfg, sort_keys=False, width=10_000)
    return "\n".join([
        "#!/bin/bash",
        "# Written by ray_nodeless (registration: kubernetes, join: kubeadm): join the cluster as a Node.",
        "set -eu",
        snippet,
        "export MACHINE_ID",
        f"mkdir -p {shlex.quote(JOIN_FILE.rsplit('/', 1)[0])}",
        f"cat > {JOIN_FILE} <<{JOIN_HEREDOC}",
        body.rstrip("\n"),
        JOIN_HEREDOC,
        f"kubeadm join --config {JOIN_FILE}",
    ]) + "\n"


def _k3s(join: JoinSettings, labels: dict[str, str], taints: list[dict[str, str]], snippet: str) -> str:
    def q(s: str) -> str:
        return f'"{s}"' if L.MACHINE_ID_VAR in s else shlex.quote(s)

    args = ["agent", "--node-name", q(L.MACHINE_ID_VAR)]
    for k, v in sorted(labels.items()):
        args += ["--node-label", q(f"{k}={v}")]
    for t in taints:
        args += ["--node-taint", q(L.taint_flag(t))]
    for f in join.kubelet_flags:
        args += ["--kubelet-arg", q(f.lstrip("-"))]
    env = [f"K3S_URL={shlex.quote(join.endpoint or '')}", f"K3S_TOKEN={shlex.quote(join.token or '')}"]  # check_join
    if join.k3s_version:
        env.append(f"INSTALL_K3S_VERSION={shlex.quote(join.k3s_version)}")
    return "\n".join([
        "#!/bin/bash",
        "# Written by ray_nodeless (registration: kubernetes, join: k3s): join the cluster as an agent Node.",
        "set -eu",
        snippet,
        "export MACHINE_ID",
        f"curl -sfL {K3S_INSTALLER} | {' '.join(env)} sh -s - {' '.join(args)}",
    ]) + "\n"
