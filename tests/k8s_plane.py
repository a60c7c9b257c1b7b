"""The suite's Kubernetes control plane: ONE real control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager; ray_nodeless/testing/k8s_control_plane.py) per pytest process, so per xdist worker, started
the first time a test asks for it (the `k8s_plane` fixture of tests/conftest.py) and stopped at the session's end.
It used to be one per test module: seven starts (a few seconds each, and the CPU of two Go servers starting) for
what one plane serves.

Test modules share it and isolate by names: every test makes its own cluster name (`t<uuid>`, `kf-<uuid>`,
`rbac-<uuid>`, ...), and Nodes, pods and RayClusters are selected by that cluster's label or name, never listed
whole. A module gets the plane through a `PlaneView`, which adds the module's own attributes (which ServiceAccount
its provider acts as: `sa_kubeconfig`) without touching the shared object.

What the modules install is installed once per plane, on first use, and kept:
- `nodeless()`: cluster-configs/kubernetes-rbac.yaml (namespace `ray`, ServiceAccount `ray-nodeless` and its roles);
- `kuberay()`: the RayCluster CRD, KubeRay's head ServiceAccount and roles (ray_nodeless/testing/kuberay.py).
The API server also writes an audit log of the KubeRay head's ServiceAccount's requests (no one else's):
tests/kuberay/test_kuberay_rbac.py reads the part written during its own cycle, from the size it had before.

Tests that change the plane put it back: an RBAC test that removes a verb restores the role; an API server restart
(`restart_apiserver`, `stop_apiserver` / `start_apiserver`) keeps its port, flags and etcd's data, and the tests of
one worker run one after another, so no other test sees the outage. tests/e2e/test_real_kubelet.py keeps a plane of
its own: a real kubelet joins through kubeadm, which needs a plane started with `node_joins=True` (bootstrap-token
authentication, the bootstrapsigner / tokencleaner / CSR-signing controllers) and whose init phases rewrite
cluster-wide state (cluster-info, kubeadm-config, a placeholder Node) the other tests' plane should not carry.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import yaml

from ray_nodeless.testing.kuberay import NS as KUBERAY_NS, SA as KUBERAY_SA
from tests import REPO_ROOT

RBAC = REPO_ROOT / "cluster-configs" / "kubernetes-rbac.yaml"
SA = ("ray", "ray-nodeless")
# KubeRay's head ServiceAccount (ray_nodeless/testing/kuberay.py), as the API server names its requests.
KUBERAY_USER = f"system:serviceaccount:{KUBERAY_NS}:{KUBERAY_SA}"
# The audit policy: every request of the KubeRay head's ServiceAccount (metadata: who, verb, resource, response
# code), nothing else: the other modules' requests would only make the log bigger.
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata", "users": [KUBERAY_USER]}, {"level": "None"}]}


class PlaneView:
    """The shared plane as one test module sees it: the plane's attributes and methods, plus the module's own
    (set on the view, never on the shared plane)."""

    def __init__(self, plane: Any, **own: Any):
        object.__setattr__(self, "_plane", plane)
        for k, v in own.items():
            object.__setattr__(self, k, v)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._plane, name)


class SharedPlane:
    """One ControlPlane for the process and what the modules installed on it (see the module docstring)."""

    def __init__(self, workdir: Path):
        from ray_nodeless.testing.k8s_control_plane import ControlPlane

        self.workdir = workdir
        policy = workdir / "audit-policy.yaml"
        workdir.mkdir(parents=True, exist_ok=True)
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self.audit_log = workdir / "audit.log"
        self.plane = ControlPlane(workdir / "k8s", extra_args={"kube-apiserver": [
            f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}", "--audit-log-format=json"]})
        self._lock = threading.Lock()
        self._views: dict[str, PlaneView] = {}

    def start(self) -> "SharedPlane":
        self.plane.start()
        return self

    def stop(self) -> None:
        self.plane.stop()

    def nodeless(self) -> PlaneView:
        """The plane with cluster-configs/kubernetes-rbac.yaml applied; `sa_kubeconfig` acts as its ServiceAccount
        (ray/ray-nodeless), as ray_nodeless's provider does on a real cluster."""
        with self._lock:
            if "nodeless" not in self._views:
                self.plane.apply_manifest(RBAC)
                kc = self.plane.service_account_kubeconfig(*SA, self.workdir / "sa-ray-nodeless.kubeconfig")
                self._views["nodeless"] = PlaneView(self.plane, sa_kubeconfig=kc)
            return self._views["nodeless"]

    def kuberay(self) -> PlaneView:
        """The plane with KubeRay's RayCluster CRD and the head's ServiceAccount (KubeRay's Role and
        cluster-configs/kuberay/rbac.yaml); `sa_kubeconfig` acts as that account, `audit_log` is its requests."""
        from ray_nodeless.testing.kuberay import install_kuberay

        with self._lock:
            if "kuberay" not in self._views:
                kc = install_kuberay(self.plane, self.workdir)
                self._views["kuberay"] = PlaneView(self.plane, sa_kubeconfig=kc, audit_log=self.audit_log)
            return self._views["kuberay"]
