"""`registration: kubernetes` against a REAL control plane (kube-apiserver, kube-scheduler, kube-controller-manager
v1.20.2, RBAC on), the registration running as the ServiceAccount of cluster-configs/kubernetes-rbac.yaml, machines'
kubelets played by KubeletPlayer from the user data the registration wrote (Ray processes stubbed here; the e2e
tests run real ones)."""
from __future__ import annotations

import copy
import time
import uuid

import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from ray_nodeless.core.catalog import embedded
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers.base import LaunchSpec, Machine
from ray_nodeless.registrations.kubernetes import KubernetesRegistration
from ray_nodeless.registrations.kubernetes import check as check_settings
from ray_nodeless.registrations.kubernetes import labels as L
from ray_nodeless.registrations.kubernetes.housekeeping import REAP_SLACK_S
from ray_nodeless.providers.local.kubelet import KubeletPlayer
from ray_nodeless.testing.clock import FakeClock
from tests.registrations.kubernetes.conftest import RBAC, StubProcesses, wait_for

JOINS = {
    "eks": {"method": "eks", "cluster": "test-eks", "ca": "Y2E=", "cidr": "10.100.0.0/16"},
    "kubeadm": {"method": "kubeadm", "token": "abcdef.0123456789abcdef", "ca_cert_hash": "sha256:" + "0" * 64},
    "k3s": {"method": "k3s", "token": "K10secret::server:abc"},
}



def check(provider_config: dict, *args, **kwargs) -> None:
    """The live check on the block as bootstrap_config hands it over: parsed once by the loader."""
    from ray_nodeless.operate.config import load_provider

    check_settings(load_provider(provider_config).registration_settings, *args, **kwargs)

def provider(cp, method="eks", kubeconfig=None, **block) -> dict:
    join = dict(JOINS[method], endpoint=cp.server)
    b = {"kubeconfig": str(kubeconfig or cp.sa_kubeconfig), "namespace": "ray", "join": join,
         "pod_template": {"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.60.0"}]}},
         "pod_grace_s": 5}
    b.update(block)
    return {"cloud": "aws", "region": "us-west-2", "registration": "kubernetes", "kubernetes": b,
            "gcs_address": "127.0.0.1:6399"}


def spec(cluster: str, name="g6.xlarge") -> LaunchSpec:
    o = embedded().region("aws", "us-west-2").find(name, "us-west-2b", "spot")
    return LaunchSpec(cluster_name=cluster, node_type="gpu_worker", offering=o, count=1,
                      tags={"ray-cluster-name": cluster, "nodeless-rule": "gpu-spot", "nodeless-hourly-price": "0.1046",
                            "nodeless-catalog": "cat-1", "ray-user-node-type": "gpu_worker",
                            "ray-node-kind": "worker", "nodeless-instance-type": name},
                      node_config={}, request_token="t", resources={"CPU": 4.0, "GPU": 1.0}, labels={})


class Harness:
    """One registration (as the ServiceAccount) + one played kubelet (admin: the kubelet's own identity)."""

    def __init__(self, cp, method="eks", fail=False, **block):
        self.cp = cp
        self.cluster = f"t{uuid.uuid4().hex[:6]}"
        self.reg = KubernetesRegistration.from_provider(provider(cp, method, **block), self.cluster)
        self.admin = cp.api_client()
        self.core = client.CoreV1Api(self.admin)
        self.procs = StubProcesses(fail=fail)
        self.player = KubeletPlayer(self.admin, "ray", self.procs)

    def launch(self, s=None):
        s = s or spec(self.cluster)
        s = self.reg.prepare(s)
        mid = f"i-{uuid.uuid4().hex[:12]}"
        t0 = time.time()
        self.reg.after_launch(s, [mid])
        assert time.time() - t0 < 0.5, "after_launch must not wait for the join"
        return s, mid

    def node_of(self, mid):
        nodes = self.core.list_node(label_selector=f"{L.MACHINE_ID}={mid}").items
        return nodes[0] if nodes else None

    def pod_of(self, mid):
        pods = self.core.list_namespaced_pod("ray", label_selector=f"{L.MACHINE_ID}={mid}").items
        return pods[0] if pods else None

    def close(self):
        self.reg.close()
        self.player.close()
        for n in self.core.list_node(label_selector=L.cluster_selector(self.cluster)).items:
            self.core.delete_node(n.metadata.name)
        self.core.delete_collection_namespaced_pod("ray", label_selector=L.cluster_selector(self.cluster),
                                                   grace_period_seconds=0)
        self.admin.close()


@pytest.fixture
def h_factory(cp):
    made = []

    def make(**kw):
        h = Harness(cp, **kw)
        made.append(h)
        return h
    yield make
    for h in made:
        h.close()


def _ready_without_not_ready_taint(node) -> bool:
    ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
    return ready and not any(t.key == L.NOT_READY_TAINT for t in (node.spec.taints or []))


@pytest.mark.parametrize("method", ["eks", "kubeadm", "k3s"])
def test_join_labels_taints_and_the_scheduler_binds_the_ray_pod(cp, h_factory, method):
    h = h_factory(method=method)
    s, mid = h.launch()
    t0 = time.time()
    h.player.play(mid, s.boot_script, s.offering)
    # eks: the NodeConfig cannot carry the instance id: the registration labels the Node from its providerID
    node = wait_for(lambda: h.node_of(mid), 30, "the Node with its machine-id label")
    labels = node.metadata.labels
    assert labels[L.INSTANCE_TYPE] == "g6.xlarge" and labels[L.ZONE] == "us-west-2b"
    assert labels[L.REGION] == "us-west-2" and labels[L.ARCH] == "amd64" and labels[L.CLUSTER] == h.cluster
    assert labels[L.NODE_TYPE] == "gpu_worker" and labels[L.CAPACITY_TYPE] == "spot" and labels[L.RULE] == "gpu-spot"
    assert labels[L.JOIN_METHOD] == method
    if method == "eks":
        assert node.metadata.name != mid and node.spec.provider_id == f"aws:///us-west-2b/{mid}"
    else:
        assert node.metadata.name == mid
    assert any(t.key == L.TAINT_KEY and t.value == h.cluster and t.effect == "NoSchedule" for t in node.spec.taints)
    node = wait_for(lambda: (n := h.node_of(mid)) and _ready_without_not_ready_taint(n) and n, 60,
                    "the controller-manager to lift the not-ready taint")
    ready_s = time.time() - t0
    node = wait_for(lambda: (n := h.node_of(mid)) and L.PRICE in (n.metadata.annotations or {}) and n, 10,
                    "the price / catalog annotations")
    assert node.metadata.annotations[L.PRICE] == "0.1046" and node.metadata.annotations[L.CATALOG] == "cat-1"
    assert node.status.allocatable["nvidia.com/gpu"] == "1" and node.status.allocatable["cpu"] == "4"
    pod = wait_for(lambda: (p := h.pod_of(mid)) and p.spec.node_name and p, 60, "the scheduler to bind the pod")
    bound_s = time.time() - t0
    assert pod.spec.node_name == node.metadata.name
    c = pod.spec.containers[0]
    assert c.resources.limits["nvidia.com/gpu"] == "1"
    assert {e.name: e.value for e in c.env}["RAY_CLOUD_INSTANCE_ID"] == mid
    pod = wait_for(lambda: (p := h.pod_of(mid)) and p.status.phase == "Running" and p, 30, "the pod to run")
    assert h.procs.started[0]["id"] == mid and h.procs.started[0]["resources"] == {"CPU": 4.0, "GPU": 1.0}
    m = wait_for(lambda: (x := h.reg.describe(Machine(mid, dict(s.tags), internal_ip="10.1.1.1"))).internal_ip
                 == pod.status.pod_ip and x, 10, "describe to give the pod IP")
    assert m.state == "running"
    assert h.reg.status(mid) == {"k8s_node": node.metadata.name, "k8s_ready": True, "pod": pod.metadata.name,
                                 "pod_phase": "Running"}
    # `ray-nodeless status` reads the same from one read-only listing (no watch, no housekeeping)
    from ray_nodeless.registrations.kubernetes.status import machine_status
    assert machine_status(h.reg.settings, h.cluster, [mid, "gone"]) == {
        mid: h.reg.status(mid), "gone": {"k8s_node": None, "k8s_ready": None, "pod": None, "pod_phase": None}}
    print(f"\nFIGURES {method}: Node Ready (not-ready taint lifted) {ready_s:.1f} s after play; "
          f"pod bound {bound_s:.1f} s after play")


def test_the_watches_read_events_as_objects_and_list_once(cp, h_factory):
    """A machine's whole join (Node added, labelled, Ready, taint lifted; pod created, bound, Running) is a stream of
    events the registration's two watches read as V1Node / V1Pod, each applied as it comes: no watch lists again
    for them. (Its list functions carry no `:return:` docstring, from which kubernetes' Watch would take the model:
    the events came as raw dicts, each taken for a Status, and every one made the watch list everything again.)"""
    h = h_factory(method="kubeadm")
    wait_for(lambda: all(e.is_set() for e in h.reg.synced.values()), 30, "both watches' first list")
    rest = h.reg.core.api_client.rest_client
    inner, lists = rest.request, []

    def request(method, url, *a, **kw):     # the client's REST layer, where every request of the registration goes
        query = dict(kw.get("query_params") or [])
        if method == "GET" and not query.get("watch") and url.rstrip("/").endswith(("/nodes", "/pods")):
            lists.append(url)
        return inner(method, url, *a, **kw)
    rest.request = request
    s, mid = h.launch()
    h.player.play(mid, s.boot_script, s.offering)
    wait_for(lambda: (p := h.pod_of(mid)) and p.status.phase == "Running" and p, 90, "the pod to run")
    m = wait_for(lambda: (x := h.reg.describe(Machine(mid, dict(s.tags)))).state == "running" and x, 10,
                 "the registration to see the pod Running (from its pod watch)")
    assert m.internal_ip == h.pod_of(mid).status.pod_ip
    assert lists == [], f"the watches listed again {len(lists)} times for one machine's join: {lists[:4]}"


def test_an_untolerating_pod_stays_off_the_node(cp, h_factory):
    h = h_factory()
    s, mid = h.launch()
    h.player.play(mid, s.boot_script, s.offering)
    wait_for(lambda: (n := h.node_of(mid)) and _ready_without_not_ready_taint(n), 60, "Ready")
    name = f"intruder-{uuid.uuid4().hex[:6]}"
    h.core.create_namespaced_pod("ray", {"metadata": {"name": name}, "spec": {
        "nodeSelector": {L.MACHINE_ID: mid}, "containers": [{"name": "x", "image": "busybox"}]}})
    try:
        # the scheduler's verdict, once it has tried (PodScheduled=False, Unschedulable), instead of a fixed sleep
        p = wait_for(lambda: (x := h.core.read_namespaced_pod(name, "ray")) and any(
            c.type == "PodScheduled" and c.reason == "Unschedulable" for c in x.status.conditions or []) and x, 30,
            "the scheduler to find the intruder unschedulable")
        assert p.spec.node_name is None
    finally:
        h.core.delete_namespaced_pod(name, "ray", grace_period_seconds=0)


def test_terminate_deletes_the_pod_then_the_node(cp, h_factory):
    h = h_factory()
    s, mid = h.launch()
    h.player.play(mid, s.boot_script, s.offering)
    wait_for(lambda: (p := h.pod_of(mid)) and p.status.phase == "Running", 60, "the pod to run")
    node_name = h.node_of(mid).metadata.name
    t0 = time.time()
    h.reg.after_terminate([mid])
    assert time.time() - t0 < 2
    n = h.node_of(mid)
    assert n is None or n.spec.unschedulable       # cordoned at once
    wait_for(lambda: h.pod_of(mid) is None, 20, "the pod to go")
    wait_for(lambda: h.node_of(mid) is None, 30, "the Node to go")
    assert mid not in h.procs.recs                  # the played kubelet stopped its Ray process
    with pytest.raises(ApiException):
        h.core.read_node(node_name)


def test_a_terminated_played_machine_stops_its_kubelet_and_its_pod_goes_without_waiting_out_the_grace(cp, h_factory):
    # The played-machines decorator (providers/local/played.py) ends the kubelet when the backend terminated the
    # machine, before the registration deletes the pod: the forgotten kubelet stops its Ray process at once and
    # still confirms its pod's deletion, so the Node goes before pod_grace_s (5 s) + the reaper's slack (10 s)
    # would have let the reaper force it.
    h = h_factory()
    s, mid = h.launch()
    h.player.play(mid, s.boot_script, s.offering)
    wait_for(lambda: (p := h.pod_of(mid)) and p.status.phase == "Running", 60, "the pod to run")
    assert h.player.node_name(mid) is not None
    t0 = time.time()
    h.player.forget(mid)
    assert mid not in h.procs.recs and h.player.node_name(mid) is None
    h.reg.after_terminate([mid])
    wait_for(lambda: h.pod_of(mid) is None, 20, "the pod to go")
    gone_s = time.time() - t0
    wait_for(lambda: h.node_of(mid) is None, 30, "the Node to go")
    # Unconfirmed, the pod would stay Terminating until the reaper forced it at pod_grace_s + REAP_SLACK_S.
    assert gone_s < REAP_SLACK_S, f"pod gone {gone_s:.1f} s after terminate"


def test_orphan_node_of_a_gone_machine_is_collected(cp, h_factory):
    h = h_factory(orphan_grace_s=0)
    s, mid = h.launch()
    h.player.play(mid, s.boot_script, s.offering)
    wait_for(lambda: h.node_of(mid), 30, "Node")
    # a Node of this cluster nobody launched (a machine that vanished while the provider was down)
    other = f"i-{uuid.uuid4().hex[:12]}"
    h.player.play(other, s.boot_script, s.offering, wait=True)
    wait_for(lambda: h.node_of(other), 30, "the orphan's Node labelled")
    with h.reg._lock:                 # forget the launch: the orphan is only known from its Node (a restart)
        h.reg.machines[other].launched_at = 0
    h.reg.observe_listing({mid})
    h.reg.housekeeping()
    wait_for(lambda: h.node_of(other) is None, 10, "the orphan Node to be deleted")
    assert h.node_of(mid) is not None


def test_join_timeout_is_reported_with_machine_and_method(cp, h_factory, caplog):
    h = h_factory(method="kubeadm", join_timeout_s=10)
    clock = h.reg.clock = FakeClock(time.time())      # wall-clock scale: ages are compared with Node timestamps
    wait_for(lambda: h.reg.synced["nodes"].is_set(), 10, "first listing")   # before it, nothing is judged
    s, mid = h.launch()            # never played: the machine never joins
    assert h.reg.overdue_machines() == {}
    clock.advance(9.9)             # just short of join_timeout_s: not overdue yet
    assert h.reg.overdue_machines() == {}
    clock.advance(0.2)
    overdue = h.reg.overdue_machines()
    assert list(overdue) == [mid] and "kubeadm" in overdue[mid] and mid in overdue[mid]
    assert mid in h.reg.machines_to_end()
    assert any(mid in r.getMessage() and "kubeadm" in r.getMessage() for r in caplog.records)


def test_pod_failed_for_good_reports_the_machine(cp, h_factory):
    h = h_factory(fail=True)
    s, mid = h.launch()
    h.player.play(mid, s.boot_script, s.offering)
    wait_for(lambda: (p := h.pod_of(mid)) and p.status.phase == "Failed", 60, "the pod to fail")
    ends = wait_for(lambda: h.reg.machines_to_end(), 10, "the failed machine reported")
    assert list(ends) == [mid] and "failed" in ends[mid]


def test_api_server_restart_mid_launch_is_tolerated(cp, h_factory):
    h = h_factory()
    wait_for(lambda: h.reg.synced["nodes"].is_set(), 10, "first listing")
    s, mid = h.launch()
    cp.restart_apiserver(down_seconds=3)
    h.player.play(mid, s.boot_script, s.offering)
    # the watch resumes (re-list after the outage) and the pod is created exactly once
    wait_for(lambda: (p := h.pod_of(mid)) and p.status.phase == "Running", 90, "the pod to run after the restart")
    pods = h.core.list_namespaced_pod("ray", label_selector=L.cluster_selector(h.cluster)).items
    assert len(pods) == 1


def test_state_is_rebuilt_after_a_restart(cp, h_factory):
    h = h_factory()
    s, mid = h.launch()
    h.player.play(mid, s.boot_script, s.offering)
    wait_for(lambda: (p := h.pod_of(mid)) and p.status.phase == "Running", 60, "the pod to run")
    h.reg.close()
    fresh = KubernetesRegistration.from_provider(provider(cp), h.cluster)
    try:
        m = fresh.describe(Machine(mid, dict(s.tags), internal_ip="10.1.1.1", launched_at=time.time() - 30))
        wait_for(lambda: fresh.status(mid)["pod_phase"] == "Running", 15, "state rebuilt from Node and pod")
        m = fresh.describe(Machine(mid, dict(s.tags), internal_ip="10.1.1.1"))
        assert m.internal_ip == h.pod_of(mid).status.pod_ip
        assert len(h.core.list_namespaced_pod("ray", label_selector=L.cluster_selector(h.cluster)).items) == 1
        fresh.after_terminate([mid])
        wait_for(lambda: h.node_of(mid) is None and h.pod_of(mid) is None, 30, "pod and Node gone")
    finally:
        fresh.close()


# ----------------------------------------------------------------------------------------------- RBAC


def _role_docs():
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(RBAC.read_text())}


def _ops(cp, h):
    """One operation per (role, verb) of the manifest, as the ServiceAccount."""
    sa = client.CoreV1Api(h.reg.api)
    name = f"rbac-{uuid.uuid4().hex[:6]}"
    node = {"metadata": {"name": name, "labels": {L.CLUSTER: h.cluster}}}

    def with_node(fn):
        def run():
            h.core.create_node(node)
            try:
                fn()
            finally:
                try:
                    h.core.delete_node(name)
                except ApiException:
                    pass
        return run

    def with_pod(fn):
        def run():
            h.core.create_namespaced_pod("ray", {"metadata": {"name": name, "labels": {L.CLUSTER: h.cluster}},
                                                 "spec": {"containers": [{"name": "x", "image": "busybox"}]}})
            try:
                fn()
            finally:
                try:
                    h.core.delete_namespaced_pod(name, "ray", grace_period_seconds=0)
                except ApiException:
                    pass
        return run

    def watch_once(fn, *a):
        w = watch.Watch()
        for _ in w.stream(fn, *a, timeout_seconds=1):
            break

    return {
        ("ClusterRole", "nodes", "list"): lambda: sa.list_node(label_selector=h.reg.selector),
        ("ClusterRole", "nodes", "watch"): lambda: watch_once(sa.list_node),
        ("ClusterRole", "nodes", "patch"): with_node(lambda: sa.patch_node(name, {"spec": {"unschedulable": True}})),
        ("ClusterRole", "nodes", "delete"): with_node(lambda: sa.delete_node(name)),
        ("Role", "pods", "create"): lambda: sa.create_namespaced_pod(
            "ray", {"metadata": {"name": name}, "spec": {"containers": [{"name": "x", "image": "busybox"}]}},
            dry_run="All"),
        ("Role", "pods", "list"): lambda: sa.list_namespaced_pod("ray"),
        ("Role", "pods", "watch"): lambda: watch_once(sa.list_namespaced_pod, "ray"),
        ("Role", "pods", "delete"): with_pod(lambda: sa.delete_namespaced_pod(name, "ray", grace_period_seconds=0)),
    }


def test_rbac_manifest_is_sufficient_and_every_verb_is_needed(cp, h_factory):
    h = h_factory()
    ops = _ops(cp, h)
    docs = _role_docs()
    rbac = client.RbacAuthorizationV1Api(h.admin)
    manifest_verbs = {(k, r, v) for (k, _), d in docs.items() if k in ("ClusterRole", "Role")
                      for rule in d["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert manifest_verbs == set(ops), "every verb of the manifest has an operation here, and no more"
    for op in ops.values():          # sufficient: everything works as the ServiceAccount
        op()
    check(provider(cp), h.cluster)   # and the bootstrap check agrees
    for (kind, resource, verb), op in ops.items():      # minimal: each verb removed -> that operation is forbidden
        d = copy.deepcopy(docs[(kind, "ray-nodeless-nodes" if kind == "ClusterRole" else "ray-nodeless-pods")])
        d["rules"][0]["verbs"] = [v for v in d["rules"][0]["verbs"] if v != verb]
        name = d["metadata"]["name"]
        replace = (rbac.replace_cluster_role if kind == "ClusterRole"
                   else lambda n, b: rbac.replace_namespaced_role(n, "ray", b))
        original = docs[(kind, name)]
        replace(name, d)
        try:
            def forbidden():
                try:
                    op()
                except ApiException as e:
                    return e.status == 403
                return False
            wait_for(forbidden, 10, f"{verb} {resource} to be forbidden without the verb", interval=0.3)
            with pytest.raises(ConfigError, match=f"forbidden by RBAC: cannot {verb} {resource}"):
                check(provider(cp), h.cluster)
        finally:
            replace(name, original)
        wait_for(lambda: _ok(op), 10, f"{verb} {resource} allowed again")


def _ok(op) -> bool:
    try:
        op()
        return True
    except ApiException:
        return False


# ----------------------------------------------------------------------------------------------- bad input


def test_check_unreadable_kubeconfig(cp, tmp_path):
    with pytest.raises(ConfigError) as e:
        check(provider(cp, kubeconfig=tmp_path / "missing"))
    assert e.value.key == "provider.kubernetes.kubeconfig" and "cannot read" in str(e.value)


def test_check_unknown_context(cp):
    p = provider(cp)
    p["kubernetes"]["context"] = "nope"
    with pytest.raises(ConfigError) as e:
        check(p)
    assert e.value.key == "provider.kubernetes.context"


def test_check_unreachable_api_server(cp, tmp_path):
    import json
    cfg = json.loads(cp.sa_kubeconfig.read_text())
    cfg["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
    path = tmp_path / "kc"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as e:
        check(provider(cp, kubeconfig=path))
    assert e.value.key == "provider.kubernetes.kubeconfig" and "unreachable" in str(e.value)


def test_check_bad_token_and_forbidden(cp, tmp_path):
    with pytest.raises(ConfigError) as e:
        check(provider(cp, kubeconfig=cp.write_kubeconfig(tmp_path / "bad", "not-a-token")))
    assert "401" in str(e.value)
    token = cp.service_account_token("ray", "default")      # authenticated, but bound to nothing
    with pytest.raises(ConfigError) as e:
        check(provider(cp, kubeconfig=cp.write_kubeconfig(tmp_path / "default", token)))
    assert "forbidden by RBAC" in str(e.value)


def test_check_unknown_namespace(cp):
    p = provider(cp, kubeconfig=cp.admin_kubeconfig, namespace="no-such-ns")
    with pytest.raises(ConfigError) as e:
        check(p)
    assert e.value.key == "provider.kubernetes.namespace" and "does not exist" in str(e.value)


def test_check_pod_template_rejected_by_dry_run(cp):
    p = provider(cp, pod_template={"spec": {"containers": [{"name": "Not_A_DNS_Name", "image": "x"}]}})
    with pytest.raises(ConfigError) as e:
        check(p)
    assert e.value.key == "provider.kubernetes.pod_template" and "Not_A_DNS_Name" in str(e.value)
    # and nothing was created
    core = client.CoreV1Api(cp.api_client())
    assert not core.list_namespaced_pod("ray", label_selector=f"{L.MACHINE_ID}=dry-run").items


def test_check_unknown_join_method(cp):
    p = provider(cp)
    p["kubernetes"]["join"] = {"method": "gke"}
    with pytest.raises(ConfigError) as e:
        check(p)
    assert e.value.key == "provider.kubernetes.join.method"


def test_a_sweep_ends_the_clusters_nodes_and_pods_and_nothing_else(cp, h_factory):
    """`ray-nodeless sweep`'s Kubernetes half, after the head died (nothing watches the cluster): a passive
    registration lists the cluster's Nodes and pods afresh and ends them by the registration's own clean-up, for a
    machine just ended and for one already gone. Another cluster's Node and pod survive."""
    h = h_factory()
    s, mid = h.launch()
    h.player.play(mid, s.boot_script, s.offering)
    wait_for(lambda: (p := h.pod_of(mid)) and p.status.phase == "Running", 60, "the pod to run")
    gone = f"i-{uuid.uuid4().hex[:12]}"
    h.player.play(gone, s.boot_script, s.offering, wait=True)     # its machine is already gone
    wait_for(lambda: h.node_of(gone), 30, "the orphan's Node")
    other = h_factory()
    s2, mid2 = other.launch()
    other.player.play(mid2, s2.boot_script, s2.offering)
    wait_for(lambda: (p := other.pod_of(mid2)) and p.status.phase == "Running", 60, "the other cluster's pod")
    h.reg.close()
    sweeper = load_provider(provider(cp)).registration_for_sweep(h.cluster)   # as `ray-nodeless sweep` builds it
    try:
        left = sweeper.leftovers()
        listed = {(d["kind"], d["machine_id"]) for d in left}
        assert {("k8s-node", mid), ("k8s-node", gone), ("k8s-pod", mid)} <= listed
        assert all(d["machine_id"] != mid2 for d in left)
        sweeper.sweep([mid, gone])
        assert sweeper.leftovers() == []
    finally:
        sweeper.close()
    assert h.node_of(mid) is None and h.node_of(gone) is None and h.pod_of(mid) is None
    assert other.node_of(mid2) is not None and other.pod_of(mid2).status.phase == "Running"
