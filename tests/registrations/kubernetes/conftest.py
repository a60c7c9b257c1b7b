"""The Kubernetes control plane of these modules (and of tests/e2e/test_k8s*.py, which import `cp`): the process's
shared plane (tests/k8s_plane.py: one per xdist worker, not one per module) with cluster-configs/kubernetes-rbac.yaml
applied: the `ray` namespace and the ServiceAccount / roles the provider acts as (`cp.sa_kubeconfig`). Tests isolate
by their own cluster names."""
from __future__ import annotations

import types

import pytest

from ray_nodeless.testing.clock import wait_for  # noqa: F401 - imported by the tests of this directory
from tests.k8s_plane import RBAC, SA  # noqa: F401 - imported by the tests of this directory and tests/e2e


@pytest.fixture(scope="module")
def cp(k8s_plane):
    return k8s_plane.nodeless()


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
