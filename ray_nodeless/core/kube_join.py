"""The Kubernetes join formats, as data both sides of a machine's boot share: the kubernetes registration writes a
machine's join user data in them (registrations/kubernetes/join.py), and whoever boots it reads them back (a real
kubelet, or the played one of providers/local/kubelet.py, which registers the Node exactly as parsed here).

Here rather than in registrations/ because the reader is a backend decorator: providers/ never import
registrations/ (tests/cli/test_layering.py), and both import core/. Pure: no Kubernetes client (a pod is read
duck-typed, as the client's V1Pod), no Ray.

- eks: a MIME multi-part document with an AL2023 `nodeadm` NodeConfig (`apiVersion: node.eks.aws/v1alpha1`); the
  Node's labels and taints are kubelet flags in it.
- kubeadm: a bash script that writes a `JoinConfiguration` between `<<RAY_NODELESS_JOIN` markers and runs
  `kubeadm join --config`.
- k3s: a bash script running the k3s installer as an agent with `--node-name`, `--node-label`, `--node-taint`.
"""
from __future__ import annotations

import email
import email.policy
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

NODECONFIG_API = "node.eks.aws/v1alpha1"
NODECONFIG_TYPE = "application/node.eks.aws"
KUBEADM_API = "kubeadm.k8s.io/v1beta3"
JOIN_FILE = "/etc/ray-nodeless/kubeadm-join.yaml"
JOIN_HEREDOC = "RAY_NODELESS_JOIN"          # the heredoc marker around the kubeadm JoinConfiguration
K3S_INSTALLER = "https://get.k3s.io"

# The machine's id in a kubeadm / k3s script (several machines share one launch's user data): the script sets it at
# boot from the instance metadata service; a reader that knows the machine substitutes it.
MACHINE_ID_VAR = "${MACHINE_ID}"

# Kubernetes' own names a kubelet sets.
HOSTNAME = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"


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


def pod_env(pod: Any) -> dict[str, str]:
    """The first container's literal env of a V1Pod."""
    c = (pod.spec.containers or [None])[0]
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
                spec: dict[str, Any] = doc.get("spec") or {}
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
    extra = dict(reg.get("kubeletExtraArgs") or {})
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
