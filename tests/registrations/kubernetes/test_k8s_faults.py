"""Faults of `registration: kubernetes`, driven through `NodelessProvider` (the object Ray's autoscaler calls) on the
local backend, against a REAL control plane (API server, scheduler, controller-manager, RBAC on; the provider runs as
the ServiceAccount of cluster-configs/kubernetes-rbac.yaml). Each machine's kubelet is played by one KubeletPlayer
that outlives any provider object (it is the machine's, not the provider's), booted from the user data the backend
was given; its Ray processes are stubbed (the e2e tests run real ones).

- the provider restarts mid-launch (a new NodelessProvider while the machine is joining, or after its pod was
  created): nothing leaked, nothing duplicated: exactly one Node and one pod for the machine, and the head survives;
- the Node never joins: `non_terminated_nodes` terminates the machine after `join_timeout_s`, naming it and the join
  method;
- the pod fails for good: `non_terminated_nodes` ends the machine; its pod and Node go;
- the API server is down while a machine launches: the listing goes on, the pod is created once it is back.
"""
from __future__ import annotations

import copy
import logging
import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.registrations.kubernetes import labels as L
from ray_nodeless.providers.local.kubelet import KubeletPlayer
from ray_nodeless.testing.clock import FakeClock
from tests import REPO_ROOT
from tests.registrations.kubernetes.conftest import StubProcesses, wait_for

CONFIG = REPO_ROOT / "cluster-configs" / "local-k8s-cpu-head.yaml"
HEAD_TAGS = {"ray-node-type": "head", "ray-user-node-type": "head", "ray-node-name": "head",
             "ray-node-status": "up-to-date", "ray-launch-config": "faults"}
WORKER_TAGS = {"ray-node-type": "worker", "ray-user-node-type": "gpu_worker", "ray-node-name": "worker",
               "ray-node-status": "uninitialized", "ray-launch-config": "faults"}


class Cluster:
    """A cluster config (local-k8s-cpu-head.yaml, not played: the test's own player plays the kubelets), provider
    objects made from it, and the user data each launch gave the backend."""

    def __init__(self, cp, tmp_path: Path, player_fails: bool = False, **block):
        cfg = yaml.safe_load(CONFIG.read_text())
        self.cluster = cfg["cluster_name"] = f"kf-{uuid.uuid4().hex[:6]}"
        p = cfg["provider"]
        p.update(state_dir=str(tmp_path / "state"), gcs_address="127.0.0.1:6399")
        k = p["kubernetes"]
        k.update(kubeconfig=str(cp.sa_kubeconfig), played=False, pod_grace_s=2,
                 join=dict(k["join"], endpoint=cp.server))
        k.update(block)
        self.cfg = cfg
        self.boot = NodelessProvider.bootstrap_config(copy.deepcopy(cfg))   # ray up's checks (dry run, RBAC) pass
        self.providers: list[NodelessProvider] = []
        self.launched: dict[str, object] = {}     # machine id -> the LaunchSpec the backend got
        self.admin = cp.api_client()
        self.core = client.CoreV1Api(self.admin)
        self.procs = StubProcesses(fail=player_fails)
        self.player = KubeletPlayer(self.admin, "ray", self.procs)

    def provider(self) -> NodelessProvider:
        prov = NodelessProvider(copy.deepcopy(self.boot["provider"]), self.cluster)
        launch = prov.backend.launch

        def recording_launch(spec):
            ids = launch(spec)
            for mid in ids:
                self.launched[mid] = spec
            return ids
        prov.backend.launch = recording_launch
        self.providers.append(prov)
        return prov

    def boot_machine(self, mid: str, wait: bool = False) -> None:
        """The machine boots: its kubelet joins as its user data says."""
        spec = self.launched[mid]
        self.player.play(mid, spec.boot_script, spec.offering, wait=wait)

    def nodes(self, mid: str | None = None) -> list:
        sel = f"{L.MACHINE_ID}={mid}" if mid else L.cluster_selector(self.cluster)
        return self.core.list_node(label_selector=sel).items

    def pods(self, mid: str | None = None) -> list:
        sel = f"{L.MACHINE_ID}={mid}" if mid else L.cluster_selector(self.cluster)
        return self.core.list_namespaced_pod("ray", label_selector=sel).items

    def machines(self) -> list[str]:
        return sorted(m.id for m in self.providers[-1].backend.list_machines())

    def close(self) -> None:
        for prov in self.providers:
            prov.registration.close()
        self.player.close()
        if self.providers:
            b = self.providers[-1].backend
            ids = [m.id for m in b.list_machines()]
            if ids:
                b.terminate(ids)
        for n in self.nodes():
            self.core.delete_node(n.metadata.name)
        self.core.delete_collection_namespaced_pod("ray", label_selector=L.cluster_selector(self.cluster),
                                                   grace_period_seconds=0)
        self.admin.close()


@pytest.fixture
def make(cp, tmp_path):
    made = []

    def factory(**kw):
        c = Cluster(cp, tmp_path / f"c{len(made)}", **kw)
        made.append(c)
        return c
    yield factory
    for c in made:
        c.close()


def _launch_worker(prov: NodelessProvider) -> str:
    before = set(prov.non_terminated_nodes({}))
    prov.create_node({}, dict(WORKER_TAGS), 1)
    [mid] = set(prov.non_terminated_nodes({})) - before
    return mid


def _running(prov: NodelessProvider, mid: str) -> bool:
    return mid in prov.non_terminated_nodes({}) and prov.is_running(mid)


@pytest.mark.parametrize("when", ["joining", "pod_created"])
def test_provider_restart_mid_launch_leaks_and_duplicates_nothing(cp, make, when):
    # join_timeout_s short: the head (rebuilt from its tags by the new provider) must never count as overdue.
    c = make(join_timeout_s=4)
    a = c.provider()
    a.create_node({}, dict(HEAD_TAGS), 1)
    [head] = a.non_terminated_nodes({"ray-node-type": "head"})
    mid = _launch_worker(a)
    assert not _running(a, mid)          # launched, not joined: pending for Ray
    if when == "pod_created":
        c.boot_machine(mid)
        wait_for(lambda: c.pods(mid), 30, "provider A to create the pod")
    a.registration.close()               # the old provider process is gone (its watches with it)
    if when == "joining":
        c.boot_machine(mid)              # the kubelet joins while no provider runs
    b = c.provider()                     # a fresh NodelessProvider: state from machine tags + Node / pod labels
    clock = b.registration.clock = FakeClock(time.time())   # wall-clock scale: launch times are epoch seconds
    wait_for(lambda: _running(b, mid), 60, "the machine running under the new provider", interval=0.5)
    clock.advance(5)                     # past join_timeout_s (4 s), then a housekeeping pass and more listings by B
    b.registration.housekeeping()
    for _ in range(3):
        assert b.non_terminated_nodes({}) == sorted([head, mid])
        clock.advance(0.5)
    assert len(c.nodes(mid)) == 1 and len(c.pods(mid)) == 1 and len(c.pods()) == 1
    [pod] = c.pods(mid)
    assert pod.spec.node_name == c.nodes(mid)[0].metadata.name and pod.status.phase == "Running"
    assert c.machines() == sorted([head, mid])
    assert b.internal_ip(mid) == pod.status.pod_ip
    assert len(c.procs.started) == 1     # one Ray start for the machine
    # and terminating through the new provider leaves nothing behind
    b.terminate_nodes([mid])
    wait_for(lambda: not c.pods() and not c.nodes(), 40, "pod and Node of the machine gone", interval=0.5)
    assert c.machines() == [head] and mid not in c.procs.recs


def test_node_never_joins_machine_terminated_after_join_timeout(cp, make, caplog):
    c = make(join_timeout_s=10)
    prov = c.provider()
    clock = prov.registration.clock = FakeClock(time.time())   # wall-clock scale: launch times are epoch seconds
    wait_for(lambda: prov.registration.synced["nodes"].is_set(), 10, "the Node cache filled")
    mid = _launch_worker(prov)           # never booted: its kubelet never registers
    assert mid in prov.non_terminated_nodes({})
    clock.advance(9.9)                   # just short of join_timeout_s: not overdue yet
    assert mid in prov.non_terminated_nodes({}) and mid in c.machines()
    caplog.set_level(logging.ERROR)
    clock.advance(0.2)
    wait_for(lambda: mid not in prov.non_terminated_nodes({}), 20, "the overdue machine terminated", interval=0.5)
    assert mid not in c.machines()
    msgs = [r.getMessage() for r in caplog.records]
    assert any(mid in m and "kubeadm" in m and "join_timeout_s" in m for m in msgs), msgs
    assert not c.nodes() and not c.pods()


def test_pod_failed_for_good_ends_the_machine(cp, make):
    c = make(player_fails=True)
    prov = c.provider()
    mid = _launch_worker(prov)
    c.boot_machine(mid)
    wait_for(lambda: any(p.status.phase == "Failed" for p in c.pods(mid)), 60, "the Ray pod to fail")
    wait_for(lambda: mid not in prov.non_terminated_nodes({}), 20, "the machine ended", interval=0.5)
    assert mid not in c.machines()
    wait_for(lambda: not c.pods() and not c.nodes(), 40, "its pod and Node gone", interval=0.5)
    assert not prov.is_running(mid)


def test_api_server_restart_mid_launch_one_pod_nothing_leaked(cp, make):
    c = make(join_timeout_s=60)
    prov = c.provider()
    wait_for(lambda: prov.registration.synced["nodes"].is_set(), 10, "the Node cache filled")
    mid = _launch_worker(prov)
    cp.stop_apiserver()                  # the API server goes away while the machine boots
    try:
        assert mid in prov.non_terminated_nodes({}) and not prov.is_running(mid)   # listing survives the outage
        time.sleep(2)
    finally:
        cp.start_apiserver()
    c.boot_machine(mid)
    wait_for(lambda: _running(prov, mid), 90, "the machine running after the API server came back", interval=0.5)
    assert len(c.nodes(mid)) == 1 and len(c.pods()) == 1 and len(c.procs.started) == 1
    prov.terminate_nodes([mid])
    wait_for(lambda: not c.pods() and not c.nodes(), 40, "pod and Node gone", interval=0.5)
    assert mid not in c.machines()
