"""cluster-configs/kuberay/rbac.yaml is exactly what `ray-nodeless kuberay-autoscaler` needs (the converted RayCluster
turns KubeRay's in-tree autoscaler off, so KubeRay gives the head's account no Role of its own), on a REAL
kube-apiserver (the release of scripts/k8s/versions.env, RBAC on) with KubeRay's CRDs, as the head's ServiceAccount
(its token), not a mock:

- sufficient, and every rule used: one full cycle of the bridge's own code as the ServiceAccount (the start's access
  check, the config reader Ray's monitor calls every loop with the RayCluster read and its finalizer patched, the
  provider Ray builds from that config launching a machine whose Node registers and whose Ray pod runs, the machine
  ended, the RayCluster deleted and the bridge's teardown sweep). The API server's own audit log of the
  ServiceAccount's requests shows no 403, and the (resource, verb) pairs it used are exactly those the manifest
  grants;
- minimal: removing any one verb from our Role / ClusterRole makes the bridge's call that uses it (named below)
  forbidden (403), and the start's access check fails naming it.

The operator's part is played (ray_nodeless/testing/kuberay.py); a real Ray head runs (the played kubelet runs the Ray
pod as a local Ray node that joins it). The process's shared control plane (tests/k8s_plane.py).
"""
from __future__ import annotations

import copy
import json
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.local.players import PLAYER_KUBECONFIG_ENV
from ray_nodeless.kuberay import bridge as K
from ray_nodeless.ray_compat.kuberay import derive_config, node_provider
from ray_nodeless.registrations.kubernetes import labels as L
from ray_nodeless.testing.clock import wait_for
from ray_nodeless.testing.kuberay import NS, RAY_ENV, RBAC, Operator, raycluster
from ray_nodeless.testing.ray_processes import free_port, head_process
from tests.k8s_plane import KUBERAY_USER

# The shared plane's API server audits this account's requests (tests/k8s_plane.py: AUDIT_POLICY).
USER = KUBERAY_USER
# Resources every authenticated account may use (system:basic-user): the access checks themselves.
ALWAYS_ALLOWED = {("authorization.k8s.io", "selfsubjectaccessreviews", "create")}


@pytest.fixture(scope="module")
def plane(k8s_plane):
    """The process's shared control plane with KubeRay's CRD and the head's ServiceAccount (tests/k8s_plane.py);
    `plane.audit_log` is that account's requests, read from the size it had at a test's start."""
    return k8s_plane.kuberay()


def _granted() -> dict[tuple[str, str, str], tuple[str, str, int]]:
    """(apiGroup, resource, verb) -> (kind, name, rule index) of the Roles the head's ServiceAccount has."""
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d and d["kind"] in ("Role", "ClusterRole")]
    out = {}
    for d in docs:
        for i, rule in enumerate(d["rules"]):
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        assert (g, r, v) not in out, f"{v} {r} granted twice"
                        out[(g, r, v)] = (d["kind"], d["metadata"]["name"], i)
    return out


def _role(kind: str, name: str) -> dict:
    [d] = [d for d in yaml.safe_load_all(RBAC.read_text()) if d and (d["kind"], d["metadata"]["name"]) == (kind, name)]
    return d


def _audited(path: Path) -> list[dict]:
    """The ServiceAccount's requests as the API server recorded them (a watch is recorded when it starts)."""
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in events if e.get("user", {}).get("username") == USER
            and e.get("stage") in ("ResponseStarted", "ResponseComplete")]


def _key(e: dict) -> tuple[str, str, str] | None:
    ref = e.get("objectRef")
    if not ref:
        return None        # a non-resource URL (/version, /api): open to every account
    resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return ref.get("apiGroup", ""), resource, e["verb"]


def _pending_worker_tags(cfg: dict, group: str) -> dict[str, str]:
    # What Ray's v1 autoscaler passes to create_node for a worker of `group` (StandardAutoscaler.launch_new_node)
    return {"ray-node-kind": "worker", "ray-user-node-type": group,
            "ray-node-name": f"ray-{cfg['cluster_name']}-worker", "ray-node-status": "uninitialized",
            "ray-launch-config": "rbac-test"}


def test_a_full_bridge_cycle_uses_exactly_the_granted_verbs(plane, monkeypatch):
    admin = plane.api_client()
    core = client.CoreV1Api(admin)
    op = Operator(admin)
    name = f"rbac-{uuid.uuid4().hex[:6]}"
    selector = L.cluster_selector(name)
    work = Path(tempfile.mkdtemp(prefix="rnrb-"))       # short: Ray's socket paths live under its temp dir
    port = free_port()
    # The played kubelets register Nodes as a kubelet's own identity would (the ServiceAccount may not create Nodes)
    monkeypatch.setenv(PLAYER_KUBECONFIG_ENV, str(plane.admin_kubeconfig))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    sa = K.api_client(str(plane.sa_kubeconfig))
    provider = None
    start = plane.audit_log.stat().st_size if plane.audit_log.exists() else 0
    try:
        (work / "ray").mkdir()
        with head_process(RAY_ENV, port, str(work / "ray"), ("--no-monitor",)):
            op.apply(raycluster(name, port, work / "state", plane.sa_kubeconfig, plane.server, gpu_cpus="1",
                                gpu_memory="1Gi"))
            # `ray-nodeless kuberay-autoscaler`'s start (kuberay.run), then the loops of Ray's monitor
            K.check_access(sa, NS)
            bridge = K.KubeRayBridge(K.RayClusterApi(sa, name, NS), "127.0.0.1", derive_config, node_provider,
                                     K.sweep_cluster)
            bridge.config(bridge.rayclusters.get())
            bridge()                                    # the RayCluster read, its finalizer set
            cfg = bridge()                              # Ray's provider for the block exists from here on
            assert K.FINALIZER in op.get(name)["metadata"]["finalizers"]
            provider = node_provider(cfg["provider"], cfg["cluster_name"])
            provider.create_node(cfg["available_node_types"]["gpu-group"].get("node_config", {}),
                                 _pending_worker_tags(cfg, "gpu-group"), 1)

            def running():
                bridge()
                ids = [i for i in provider.non_terminated_nodes({"ray-node-kind": "worker"})]
                pods = core.list_namespaced_pod(NS, label_selector=selector).items
                return ids if ids and any(p.status.phase == "Running" for p in pods) else None

            [worker] = wait_for(running, 240, "the worker's Ray pod Running on its Node", interval=1)
            assert core.list_node(label_selector=selector).items
            provider.terminate_node(worker)

            def gone():
                bridge()
                return (not provider.non_terminated_nodes({"ray-node-kind": "worker"})
                        and not core.list_node(label_selector=selector).items
                        and not core.list_namespaced_pod(NS, label_selector=selector).items)

            wait_for(gone, 120, "the worker's machine, Node and pod gone", interval=1)
            op.delete(name)                             # the finalizer holds it until the bridge's teardown
            with pytest.raises(SystemExit) as e:
                bridge()
            assert e.value.code == 0
            wait_for(lambda: op.get(name) is None, 60, "the RayCluster deleted once the finalizer is gone")
    finally:
        if provider is not None:
            provider.registration.close()
            provider.backend.close()
        if op.get(name) is not None:
            op.patch(name, {"metadata": {"finalizers": []}})
            op.delete(name)
        sa.close()
        admin.close()
        shutil.rmtree(work, ignore_errors=True)

    with open(plane.audit_log) as f:
        f.seek(start)
        lines = f.read()
    (plane.audit_log.parent / "cycle.log").write_text(lines)
    events = _audited(plane.audit_log.parent / "cycle.log")
    forbidden = sorted({(e["verb"], e["requestURI"]) for e in events if e.get("responseStatus", {}).get("code") == 403})
    assert not forbidden, f"the ServiceAccount was refused: {forbidden}"
    used = {k for e in events if (k := _key(e)) is not None} - ALWAYS_ALLOWED
    granted = set(_granted())
    assert used - granted == set(), "used without a grant (allowed by some other role?)"
    assert sorted(granted - used) == [], "granted, but the full cycle never used them"
    assert used == set(CALLS), "every verb the cycle used has its named call in the minimality test"


# ------------------------------------------------------------------------------------------------- minimality

def _watch_once(fn, *a):
    for _ in watch.Watch().stream(fn, *a, timeout_seconds=1):
        break


class Calls:
    """The bridge's call per granted verb, as the ServiceAccount, on objects the admin made for it."""

    def __init__(self, admin: client.ApiClient, sa: client.ApiClient, rc_name: str):
        self.admin, self.sa = client.CoreV1Api(admin), client.CoreV1Api(sa)
        self.rcs = K.RayClusterApi(sa, rc_name, NS)
        self.name = f"rbac-{uuid.uuid4().hex[:6]}"

    def _with_node(self, fn):
        self.admin.create_node({"metadata": {"name": self.name}})
        try:
            fn()
        finally:
            try:
                self.admin.delete_node(self.name)
            except ApiException:
                pass

    def _with_pod(self, fn):
        self.admin.create_namespaced_pod(NS, {"metadata": {"name": self.name},
                                              "spec": {"containers": [{"name": "x", "image": "busybox"}]}})
        try:
            fn()
        finally:
            try:
                self.admin.delete_namespaced_pod(self.name, NS, grace_period_seconds=0)
            except ApiException:
                pass

    def rayclusters_get(self):
        """KubeRayBridge.__call__ every loop: RayClusterApi.get."""
        assert self.rcs.get() is not None

    def rayclusters_patch(self):
        """KubeRayBridge._ensure_finalizer / teardown: RayClusterApi.set_finalizers."""
        self.rcs.set_finalizers(self.rcs.get(), [])

    def nodes_list(self):
        """The registration's Node cache (KubernetesRegistration._list_nodes), the sweep's listing."""
        self.sa.list_node(label_selector=L.cluster_selector("rbac"))

    def nodes_watch(self):
        """The registration's Node watch (_watch_loop "nodes")."""
        _watch_once(self.sa.list_node)

    def nodes_patch(self):
        """The registration labels / cordons its Node."""
        self._with_node(lambda: self.sa.patch_node(self.name, {"spec": {"unschedulable": True}}))

    def nodes_delete(self):
        """The registration deletes its machine's Node (after_terminate, the sweep)."""
        self._with_node(lambda: self.sa.delete_node(self.name))

    def pods_create(self):
        """The registration creates the group's Ray pod (and the start's dry run of it)."""
        self.sa.create_namespaced_pod(NS, {"metadata": {"name": self.name},
                                           "spec": {"containers": [{"name": "x", "image": "busybox"}]}},
                                      dry_run="All")

    def pods_list(self):
        """The registration's pod cache (_list_pods), the sweep's listing."""
        self.sa.list_namespaced_pod(NS)

    def pods_watch(self):
        """The registration's pod watch (_watch_loop "pods")."""
        _watch_once(self.sa.list_namespaced_pod, NS)

    def pods_delete(self):
        """The registration deletes its machine's Ray pod (after_terminate, the sweep)."""
        self._with_pod(lambda: self.sa.delete_namespaced_pod(self.name, NS, grace_period_seconds=0))


CALLS = {("ray.io", "rayclusters", "get"): "rayclusters_get", ("ray.io", "rayclusters", "patch"): "rayclusters_patch",
         ("", "nodes", "list"): "nodes_list", ("", "nodes", "watch"): "nodes_watch",
         ("", "nodes", "patch"): "nodes_patch", ("", "nodes", "delete"): "nodes_delete",
         ("", "pods", "create"): "pods_create", ("", "pods", "list"): "pods_list",
         ("", "pods", "watch"): "pods_watch", ("", "pods", "delete"): "pods_delete"}


def _forbidden(call) -> bool:
    try:
        call()
    except ApiException as e:
        return e.status == 403
    return False


def _allowed(call) -> bool:
    try:
        call()
        return True
    except ApiException:
        return False


def _check_passes(sa) -> bool:
    try:
        K.check_access(sa, NS)
        return True
    except ConfigError:
        return False


def test_each_granted_verb_is_needed_by_a_named_call(plane):
    admin = plane.api_client()
    sa = K.api_client(str(plane.sa_kubeconfig))
    rbac = client.RbacAuthorizationV1Api(admin)
    op = Operator(admin)
    rc_name = f"rbac-calls-{uuid.uuid4().hex[:6]}"
    client.CustomObjectsApi(admin).create_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": rc_name},
        "spec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
            {"name": "ray-head", "image": "rayproject/ray:2.60.0"}]}}}}})
    calls = Calls(admin, sa, rc_name)
    granted = _granted()
    assert set(granted) == set(CALLS), "one named call per verb the bridge is granted"
    try:
        for key in sorted(CALLS):
            getattr(calls, CALLS[key])()            # sufficient: each call works as the ServiceAccount
        K.check_access(sa, NS)
        for key in sorted(granted):
            group, resource, verb = key
            kind, role, i = granted[key]
            original = _role(kind, role)
            d = copy.deepcopy(original)
            d["rules"][i]["verbs"] = [v for v in d["rules"][i]["verbs"] if v != verb]
            replace = (rbac.replace_cluster_role if kind == "ClusterRole"
                       else lambda n, b: rbac.replace_namespaced_role(n, NS, b))
            replace(role, d)
            try:
                call = getattr(calls, CALLS[key])
                wait_for(lambda: _forbidden(call), 10, f"{CALLS[key]} forbidden without {verb} {resource}",
                         interval=0.3)
                with pytest.raises(ConfigError, match=f"cannot {verb} {group + '/' if group else ''}{resource} "):
                    K.check_access(sa, NS)
            finally:
                replace(role, original)
            wait_for(lambda: _allowed(call), 10, f"{CALLS[key]} allowed again", interval=0.3)
            wait_for(lambda: _check_passes(sa), 10, "the access check passing again", interval=0.3)
    finally:
        if op.get(rc_name) is not None:
            op.delete(rc_name)
        sa.close()
        admin.close()
