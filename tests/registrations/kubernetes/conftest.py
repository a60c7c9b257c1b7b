"""A real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) for the module,
started and stopped around it, with the `ray` namespace and the ServiceAccount / roles of
cluster-configs/kubernetes-rbac.yaml applied."""
from __future__ import annotations

import types
from pathlib import Path
from typing import Iterator

import pytest

from ray_nodeless.testing.clock import wait_for  # noqa: F401 - imported by the tests of this directory
from tests import REPO_ROOT

RBAC = REPO_ROOT / "cluster-configs" / "kubernetes-rbac.yaml"
SA = ("ray", "ray-nodeless")


@pytest.fixture(scope="module")
def cp(tmp_path_factory) -> Iterator[object]:
    from ray_nodeless.testing.k8s_control_plane import ControlPlane
    plane = ControlPlane(tmp_path_factory.mktemp("k8s"))
    plane.start()
    try:
        plane.apply_manifest(RBAC)
        plane.sa_kubeconfig = plane.service_account_kubeconfig(*SA, Path(plane.workdir) / "sa.kubeconfig")
        yield plane
    finally:
        plane.stop()


class StubProcesses:
    """Stands in for LocalNodeProcesses in the kubelet player when a test needs no real Ray: a pod "runs" at once."""

    def __init__(self, fail: bool = False):
        self.recs: dict[str, types.SimpleNamespace] = {}
        self.n = 0
        self.fail = fail
        self.started: list[dict] = []

    def get(self, mid):
        return self.recs.get(mid)

    def start(self, mid, node_type, resources, labels, extra_env=None, tags=None, request_token=""):
        from ray_nodeless.errors import BackendError
        if self.fail:
            raise BackendError(f"local node {mid} failed to start (`ray start` exited with code 1)")
        self.n += 1
        rec = types.SimpleNamespace(id=mid, ip=f"127.0.0.{100 + self.n}", resources=dict(resources))
        self.recs[mid] = rec
        self.started.append({"id": mid, "node_type": node_type, "resources": dict(resources), "env": extra_env})
        return rec

    def stop(self, ids):
        for i in ids:
            self.recs.pop(i, None)

    def list(self):
        return list(self.recs.values())

    def _all_records(self):
        return list(self.recs.values())

    def close(self):
        pass
