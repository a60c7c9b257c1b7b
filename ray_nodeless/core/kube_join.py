"""The Kubernetes join formats, as data both sides of a machine's boot share: the kubernetes registration writes a
machine's join user data in them (registrations/kubernetes/join.py), and whoever boots it reads them back (a real
kubelet, or the played one of providers/local/kubelet.py, which registers the Node exactly as parsed here).

Here rather than in registrations/ because the reader is a backend decorator: providers/ never import
registrations/ (tests/cli/test_layering.py), and both import core/. Pure: no Kubernetes client (a pod is read
duck-typed, as the client's V1Pod), no Ray.

- eks: a MIME multi-part document with an AL2023 `nodeadm` NodeConfig (`apiVersion: node.eks.aws/v1alpha1`); the
  Node's labels and taints are kubelet flags in it.
- kubeadm: a bash script that writes a `JoinConfiguration` between `<<RAY_NODELESS_JOIN` markers and runs
  `kubeadm join --config`. Its `apiVersion` must be one the node's kubeadm reads (`kubeadm_api_for`: v1beta2 for
  1.15-1.21, v1beta3 for 1.22-1.30, v1beta4 from 1.31, whose `kubeletExtraArgs` is a list of {name, value}).
- k3s: a bash script running the k3s installer as an agent with `--node-name`, `--node-label`, `--node-taint`.
"""
from __future__ import annotations

import email
import email.policy
import re
import shlex
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import yaml
from ray_nodeless.core.documents import Document

NODECONFIG_API = "node.eks.aws/v1alpha1"
NODECONFIG_TYPE = "application/node.eks.aws"
KUBEADM_GROUP = "kubeadm.k8s.io"
# The JoinConfiguration versions a kubeadm reads, by the server's (= its kubeadm's) minor version: v1beta2 from 1.15
# (1.20 and 1.21 know only v1beta1/v1beta2), v1beta3 from 1.22 (v1beta2 is gone in 1.27), v1beta4 from 1.31
# (kubernetes.io "kubeadm Configuration (v1beta4)": its change list starts at v1.31; v1beta3 is deprecated there).
KUBEADM_APIS = ("v1beta2", "v1beta3", "v1beta4")
KUBEADM_API_SINCE = {"v1beta2": (1, 15), "v1beta3": (1, 22), "v1beta4": (1, 31)}
KUBEADM_API = f"{KUBEADM_GROUP}/v1beta3"    # the default when the server's version is unknown
# nodeRegistration.criSocket: kubeadm 1.20 looks only at /var/run/{dockershim.sock,containerd/containerd.sock,...}
# and otherwise assumes docker; from v1beta3 on kubeadm wants a URL (a bare path is deprecated).
DEFAULT_CRI_SOCKET = "/run/containerd/containerd.sock"
JOIN_FILE = "/etc/ray-nodeless/kubeadm-join.yaml"
JOIN_HEREDOC = "RAY_NODELESS_JOIN"          # the heredoc marker around the kubeadm JoinConfiguration
K3S_INSTALLER = "https://get.k3s.io"

# The machine's id in a kubeadm / k3s script (several machines share one launch's user data): the script sets it at
# boot from the instance metadata service; a reader that knows the machine substitutes it.
MACHINE_ID_VAR = "${MACHINE_ID}"

# Kubernetes' own names a kubelet sets.
HOSTNAME = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"


def server_minor(version: str) -> tuple[int, int]:
    """(major, minor) of a Kubernetes version string: "v1.20.2", "1.31", "v1.28.3-eks-4f4795d", "v1.22+"."""
    m = re.match(r"^v?(\d+)\.(\d+)", str(version).strip())
    if not m:
        raise ValueError(f"not a Kubernetes version: {version!r}")
    return int(m.group(1)), int(m.group(2))


def kubeadm_api_for(server_version: str) -> str:
    """The kubeadm.k8s.io version (v1beta2 / v1beta3 / v1beta4) a node of a cluster at `server_version` reads
    (its kubeadm is that version: kubeadm supports joining a control plane of its own minor). ValueError for a
    server older than 1.15, whose kubeadm reads none of them."""
    ver = server_minor(server_version)
    fits = [v for v in KUBEADM_APIS if ver >= KUBEADM_API_SINCE[v]]
    if not fits:
        raise ValueError(f"a {server_version} server's kubeadm reads none of {', '.join(KUBEADM_APIS)}")
    return fits[-1]


def cri_socket_for(api: str, socket: str | None) -> str:
    """nodeRegistration.criSocket for JoinConfiguration version `api`: `socket` as given, else containerd's
    default (a path for v1beta2, a unix:// URL from v1beta3 on)."""
    if socket:
        return socket
    return DEFAULT_CRI_SOCKET if api == "v1beta2" else "unix://" + DEFAULT_CRI_SOCKET


def dns_name(value: str) -> str:
    """A valid object name piece (RFC 1123 label: lowercase alphanumerics and '-')."""
    return re.sub(r"[^a-z0-9-]", "-", str(value).lower()).strip("-")[:63] or "x"


def taint_flag(t: dict[str, str]) -> str:
    """kubelet --register-with-taints form: key=value:Effect."""
    return f"{t['key']}={t.get('value', '')}:{t['effect']}"


def parse_taint_flag(text: str) -> dict[str, str]:
    kv, _, effect = text.rpartition(":")
    key, _, value = kv.partition("=")
    return {"key": key, "value": value, "effect": effect}


def labels_flag(labels: dict[str, str]) -> str:
    """kubelet --node-labels form: k=v,k=v (sorted by key)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def parse_labels_flag(text: str) -> dict[str, str]:
    out = {}
    for part in filter(None, text.split(",")):
        k, _, v = part.partition("=")
        out[k.strip()] = v.strip()
    return out


class _EnvVar(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> str | None: ...


class _Container(Protocol):
    @property
    def env(self) -> Sequence[_EnvVar] | None: ...


class _PodSpec(Protocol):
    @property
    def containers(self) -> Sequence[_Container] | None: ...


class Pod(Protocol):
    """What pod_env reads of a pod: the kubernetes client's V1Pod, duck-typed (no client here)."""

    @property
    def spec(self) -> _PodSpec: ...


def pod_env(pod: Pod) -> dict[str, str]:
    """The first container's literal env of a V1Pod."""
    containers = pod.spec.containers
    c = containers[0] if containers else None
    return {e.name: e.value for e in (c.env or []) if e.value is not None} if c is not None else {}


@dataclass
class JoinedNode:
    """What a kubelet started from this user data registers."""

    method: str
    name: str | None                 # None (eks): the instance's private DNS name, which the cloud decides
    labels: dict[str, str]
    taints: list[dict[str, str]]
    kubelet_flags: list[str] = field(default_factory=list)
    endpoint: str = ""


def parse_user_data(text: str, machine_id: str) -> JoinedNode:
    """What a kubelet booted from `text` on machine `machine_id` would register. ValueError if it is no join."""
    if text.startswith("MIME-Version") or "Content-Type: multipart" in text[:500]:
        return _parse_eks(text)
    script = text.replace(MACHINE_ID_VAR, machine_id).replace("$MACHINE_ID", machine_id)
    if "kubeadm join" in script:
        return _parse_kubeadm(script)
    if K3S_INSTALLER in script:
        return _parse_k3s(script)
    raise ValueError("the user data holds no Kubernetes join (eks NodeConfig, kubeadm join or k3s agent)")


def _flag(flags: list[str], name: str) -> str:
    for f in flags:
        if f.startswith(name + "="):
            return f.split("=", 1)[1]
    return ""


def _parse_eks(text: str) -> JoinedNode:
    msg = email.message_from_string(text, policy=email.policy.default)
    for part in msg.walk():
        if part.get_content_type() != NODECONFIG_TYPE:
            continue
        for doc in yaml.safe_load_all(part.get_content()):
            if isinstance(doc, dict) and doc.get("kind") == "NodeConfig" and doc.get("apiVersion") == NODECONFIG_API:
                spec: Document = doc.get("spec") or {}
                flags = list((spec.get("kubelet") or {}).get("flags") or [])
                taints = [parse_taint_flag(t) for t in _flag(flags, "--register-with-taints").split(",") if t]
                return JoinedNode("eks", None, parse_labels_flag(_flag(flags, "--node-labels")), taints, flags,
                                  (spec.get("cluster") or {}).get("apiServerEndpoint", ""))
    raise ValueError("no NodeConfig part in the MIME user data")


def _parse_kubeadm(script: str) -> JoinedNode:
    lines = script.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.endswith("<<" + JOIN_HEREDOC))
    end = lines.index(JOIN_HEREDOC, start + 1)
    cfg = yaml.safe_load("\n".join(lines[start + 1:end]))
    reg = cfg["nodeRegistration"]
    raw = reg.get("kubeletExtraArgs") or {}
    # v1beta4: a list of {name, value} (duplicates allowed); before: a map
    extra = ({a["name"]: a.get("value", "") for a in raw} if isinstance(raw, list) else dict(raw))
    taints = [{"key": t["key"], "value": t.get("value", ""), "effect": t["effect"]} for t in reg.get("taints") or []]
    return JoinedNode("kubeadm", str(reg["name"]), parse_labels_flag(extra.pop("node-labels", "")), taints,
                      [f"--{k}={v}" for k, v in extra.items()],
                      "https://" + cfg["discovery"]["bootstrapToken"]["apiServerEndpoint"])


def _parse_k3s(script: str) -> JoinedNode:
    line = next(ln for ln in script.splitlines() if K3S_INSTALLER in ln)
    before, _, after = line.partition(" sh -s - ")
    env = dict(w.split("=", 1) for w in shlex.split(before.split("|", 1)[1]) if "=" in w)
    args = shlex.split(after)
    name, labels, taints, flags = None, {}, [], []
    for i, a in enumerate(args):
        nxt = args[i + 1] if i + 1 < len(args) else ""
        if a == "--node-name":
            name = nxt
        elif a == "--node-label":
            k, _, v = nxt.partition("=")
            labels[k] = v
        elif a == "--node-taint":
            taints.append(parse_taint_flag(nxt))
        elif a == "--kubelet-arg":
            flags.append("--" + nxt)
    return JoinedNode("k3s", name, labels, taints, flags, env.get("K3S_URL", ""))
