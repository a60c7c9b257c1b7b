"""ray_nodeless as KubeRay's autoscaler, end to end, on a REAL Kubernetes control plane (the release of
scripts/k8s/versions.env: kube-apiserver, scheduler, controller-manager with its garbage collector; RBAC on) with
KubeRay's CRDs unmodified and the REAL KubeRay operator (v1.5.0, built from the Go module proxy), KubeRay's autoscaler
sample plus a GPU group, converted for the bridge as `ray-nodeless convert` writes it (kuberay/sidecar.py).

The operator creates the head pod, its service and the RayCluster's status, and reconciles the worker groups all
along: the tests show it neither deletes nor recreates the pods the bridge makes, and creates none of its own. What
cannot run here is a container: the head pod's kubelet is played (testing/kuberay_operator.py HeadPodStandIn): the
scheduler binds the operator's head pod to a Node played for it; its Ray container runs as a real Ray head process
(`ray start --head --no-monitor` on 127.0.0.1), its `ray-nodeless-autoscaler` container as the pod's own command
line and env (KUBECONFIG and the GCS address given, as a host process shares no pod network). Workers are
local-backend machines whose kubelets are played (kubernetes.played: true): each registers a Node from its kubeadm
user data and runs its Ray pod as a local Ray node.

One cluster walks through: a GPU task -> the cheapest-fit machine, its Node, the group's Ray pod bound by the real
scheduler, the task runs there; the RayCluster edited while running (the group's template and maxReplicas); the
worker's pod killed (its machine ends, a replacement runs the next task with the edited template); idle scale-down;
the autoscaler container killed mid-launch and restarted (no duplicate machine, no leak); the RayCluster deleted
(every machine, Node and pod gone, then the RayCluster and its head pod).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
import yaml
from kubernetes import client

from ray_nodeless.core.cluster_plan import plan_cluster
from ray_nodeless.providers.base import TAG_INSTANCE_TYPE, TAG_PRICE
from ray_nodeless.providers.local.backend import LocalBackend
from ray_nodeless.providers.local.settings import default_state_dir
from ray_nodeless.kuberay import bridge as K
from ray_nodeless.kuberay import sidecar
from ray_nodeless.ray_compat.kuberay import derive_config
from ray_nodeless.registrations.kubernetes import labels as L
from ray_nodeless.testing.clock import wait_for
from ray_nodeless.providers.local.players import PLAYER_KUBECONFIG_ENV
from ray_nodeless.testing.kuberay import NS, RAY_ENV, REPO_ROOT, SA, Bridge, Operator, raycluster
from ray_nodeless.testing.kuberay_operator import HEAD_HOST_LABEL, HeadPodStandIn, RealOperator, wait_status_ready
from ray_nodeless.testing.ray_processes import free_port
from ray_nodeless.testing.service_network import ServiceNetwork
from tests.e2e.cheapest import check_served
from tests.e2e.clusters import processes_of
from tests.k8s_plane import PlaneView

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(k8s_plane, tmp_path_factory):
    """The process's shared control plane with KubeRay's CRDs and the head's ServiceAccount (tests/k8s_plane.py),
    and the real KubeRay operator on it for this module."""
    plane = k8s_plane.kuberay()
    api = plane.api_client()
    network = ServiceNetwork(api).start()       # how the operator reaches a head's dashboard (a RayJob's)
    operator = RealOperator(plane, tmp_path_factory.mktemp("ray-operator"), network=network).start()
    try:
        yield PlaneView(plane, operator=operator, network=network)
    finally:
        operator.stop()
        network.stop()
        api.close()


def driver(gcs: str, body: str, timeout: float = 300) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, time, ray
        ray.init(address="{gcs}", logging_level="ERROR", log_to_driver=False)
    """) + textwrap.dedent(body)], env=RAY_ENV, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return next(line.split(" ", 1)[1] for line in out.stdout.splitlines() if line.startswith("RESULT "))


@dataclass
class KubeRayCluster:
    """One RayCluster of a test on the shared control plane, its head (a real Ray head), its bridge and what to
    check them with."""

    name: str
    gcs: str
    cfg: dict
    core: client.CoreV1Api
    op: Operator
    backend: LocalBackend
    bridge: Bridge
    sel: str


@contextlib.contextmanager
def kuberay_cluster(world, tmp_path: Path, prefix: str, annotation: dict | None = None,
                    edit: Callable[[dict], None] | None = None) -> Iterator[KubeRayCluster]:
    """Apply a RayCluster (KubeRay's autoscaler sample with a GPU group; `annotation`: provider keys added to its
    annotation; `edit`: changes it in place before), start its head and the bridge as the autoscaler container runs
    it, and wait for the bridge's finalizer. Afterwards, whatever happened: the bridge stopped, and every machine,
    Node, pod and the RayCluster of the test gone."""
    admin = world.api_client()
    core = client.CoreV1Api(admin)
    op = Operator(admin, played=False)
    name = f"{prefix}-{os.getpid() % 10000}-{int(time.time()) % 100000}"
    port = free_port()
    gcs = f"127.0.0.1:{port}"
    rc = raycluster(name, port, tmp_path / "state", world.sa_kubeconfig, world.server)
    if annotation:
        settings = yaml.safe_load(rc["metadata"]["annotations"][K.ANNOTATION])
        rc["metadata"]["annotations"][K.ANNOTATION] = yaml.safe_dump({**settings, **annotation})
    if edit is not None:
        edit(rc)
    head_spec = rc["spec"]["headGroupSpec"]["template"]["spec"]
    head_spec["nodeSelector"] = {HEAD_HOST_LABEL: name}      # the Node played for the head pod, and only it
    head_spec["tolerations"] = [{"key": HEAD_HOST_LABEL, "operator": "Equal", "value": name, "effect": "NoSchedule"}]
    cfg = K.bridge_config(dict(rc, metadata=dict(rc["metadata"], uid="x")), derive_config(rc))
    cfg["provider"].pop("kuberay")
    backend = LocalBackend.from_provider(dict(cfg["provider"]), name)
    sel = L.cluster_selector(name)
    # the played worker kubelets register Nodes as a kubelet would, not as the head's account
    head = HeadPodStandIn(admin, name, tmp_path, world.sa_kubeconfig,
                          extra_env={PLAYER_KUBECONFIG_ENV: str(world.admin_kubeconfig)})
    bridge: Bridge | None = None
    try:
        op.apply(rc)
        with head.running():
            bridge = head.bridge
            assert bridge is not None
            wait_status_ready(op.objects, name)
            # The bridge marks the RayCluster: deleting it ends the machines first.
            wait_for(lambda: K.FINALIZER in (op.get(name)["metadata"].get("finalizers") or []), 120,
                     "the bridge's finalizer", interval=0.5)
            yield KubeRayCluster(name, gcs, cfg, core, op, backend, bridge, sel)
    except BaseException:
        print(bridge.tail() if bridge is not None else "(the bridge's container did not start)")
        raise
    finally:
        if bridge is not None:
            bridge.stop()
        ids = [mm.id for mm in backend.list_machines()]
        if ids:
            backend.terminate(ids)
        for n in core.list_node(label_selector=sel).items:
            core.delete_node(n.metadata.name)
        core.delete_collection_namespaced_pod(NS, label_selector=f"ray.io/cluster={name}", grace_period_seconds=0)
        rc_left = op.get(name)
        if rc_left is not None:
            op.patch(name, {"metadata": {"finalizers": []}})
            op.delete(name)
        shutil.rmtree(default_state_dir(name, "-kubelet"), ignore_errors=True)   # the played kubelets' records
        admin.close()


GPU_TASK = """
    @ray.remote(num_gpus=1)
    def f():
        return os.environ["RAY_CLOUD_INSTANCE_ID"]
    print("RESULT", ray.get(f.remote()))
"""


def test_kuberay_bridge_scale_up_edit_kill_idle_restart_delete(world, tmp_path: Path) -> None:
    seen: set[str] = set()
    t0 = time.monotonic()

    def step(what: str) -> None:      # the module's time per step, for the report (a figure, not an assertion)
        print(f"\nSTEP {time.monotonic() - t0:6.1f} s  {what}", flush=True)

    with kuberay_cluster(world, tmp_path, "rc") as c:
        name, gcs, core, op, bridge, sel = c.name, c.gcs, c.core, c.op, c.bridge, c.sel
        # The planner's own choice for the group (the head is KubeRay's pod, not a machine: plan the workers only)
        planned = plan_cluster({**c.cfg, "head_node_type": "small-group", "available_node_types": {
            k: v for k, v in c.cfg["available_node_types"].items() if k != "headgroup"}}).plans["gpu-group"]
        kuberay_pods = f"ray.io/cluster={name},ray.io/node-type=worker"

        def machines() -> dict:
            ms = {m.id: m for m in c.backend.list_machines()}
            seen.update(ms)
            return ms

        step("bridge up, finalizer set")
        # 1. A GPU task: the cheapest-fit machine, its Node, the group's Ray pod; the task runs in it.
        first = driver(gcs, GPU_TASK).strip()
        m = machines()[first]
        assert m.tags["nodeless-instance-type"] == planned.chosen.instance_type.name
        assert m.tags["nodeless-rule"] == "gpu-workers-spot-first"
        assert m.tags["ray-user-node-type"] == "gpu-group"
        [node] = core.list_node(label_selector=f"{L.MACHINE_ID}={first}").items
        assert node.metadata.labels[L.INSTANCE_TYPE] == planned.chosen.instance_type.name
        [pod] = core.list_namespaced_pod(NS, label_selector=f"{L.MACHINE_ID}={first}").items
        labels = pod.metadata.labels
        assert labels["ray.io/cluster"] == name and labels["ray.io/node-type"] == "worker"
        assert labels[K.GROUP_LABEL] == "gpu-group" and labels["team"] == "ml"
        assert "ray.io/group" not in labels      # the operator counts (and deletes) a group's pods by it
        assert pod.metadata.owner_references[0].kind == "RayCluster"
        assert pod.spec.node_name == node.metadata.name and pod.status.phase == "Running"
        assert pod.spec.service_account_name == SA
        # the group's template env (the played kubelet runs the Ray process, not the image: read the pod)
        assert {e.name: e.value for e in pod.spec.containers[0].env}["MODEL"] == "v1"
        assert len(processes_of(first, "raylet")) == 1

        # The real operator reconciles the RayCluster all along: it made no worker pod of its own (replicas 0) and
        # counts none of the bridge's (they carry no ray.io/group label).
        operators = f"ray.io/cluster={name},ray.io/node-type=worker,ray.io/group"
        assert not core.list_namespaced_pod(NS, label_selector=operators).items

        step("1 scale-up done")
        # 2. The RayCluster edited while running: the group's template (MODEL) and its maxReplicas.
        spec = op.get(name)["spec"]
        groups = spec["workerGroupSpecs"]
        groups[1]["template"]["spec"]["containers"][0]["env"] = [{"name": "MODEL", "value": "v2"}]
        groups[1]["maxReplicas"] = 2
        op.patch(name, {"spec": {"workerGroupSpecs": groups}})
        # the operator reconciles the edit: its status follows the new generation, the bridge's pod stays as it is
        wait_for(lambda: (op.get(name).get("status") or {}).get("observedGeneration")
                 == op.get(name)["metadata"]["generation"], 60, "the operator's status of the edit", interval=0.5)
        time.sleep(2)
        assert core.read_namespaced_pod(pod.metadata.name, NS).metadata.uid == pod.metadata.uid
        assert not core.list_namespaced_pod(NS, label_selector=operators).items
        # When it reconciles, its status counts the bridge's worker (Running pods labelled ray.io/node-type=worker).
        # It does not reconcile for the bridge's pods themselves (it watches the pods it controls): before this
        # edit its status had no worker count at all.
        assert (op.get(name).get("status") or {}).get("availableWorkerReplicas") == 1

        step("2 edited")
        # 3. The worker's pod killed: its machine ends (pod, Node, machine); the next task gets a replacement
        # built from the edited template.
        core.delete_namespaced_pod(pod.metadata.name, NS, grace_period_seconds=0)
        wait_for(lambda: first not in machines() and not core.list_node(
            label_selector=f"{L.MACHINE_ID}={first}").items, 120, "the killed pod's machine and Node gone",
            interval=0.5)
        second = driver(gcs, GPU_TASK).strip()
        assert second != first
        [pod2] = core.list_namespaced_pod(NS, label_selector=f"{L.MACHINE_ID}={second}").items
        assert {e.name: e.value for e in pod2.spec.containers[0].env}["MODEL"] == "v2"   # the edited template

        step("3 killed pod replaced")
        # 4. Idle: the worker goes (pod, Node, machine, process).
        wait_for(lambda: not machines() and not core.list_node(label_selector=sel).items
                 and not core.list_namespaced_pod(NS, label_selector=kuberay_pods).items, 180,
                 "the idle worker gone", interval=1)
        wait_for(lambda: not processes_of(second), 30, "its Ray processes gone", interval=1)

        step("4 idle gone")
        # 5. The autoscaler killed mid-launch and restarted: one machine, its pod, the task runs; nothing leaks.
        before = set(seen)
        task = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import os, ray
            ray.init(address="{gcs}", logging_level="ERROR", log_to_driver=False)
        """) + textwrap.dedent(GPU_TASK)], env=RAY_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        launched = wait_for(lambda: sorted(set(machines()) - before), 120, "a launch", interval=0.05)
        pod_before_kill = bool(core.list_namespaced_pod(NS, label_selector=f"{L.MACHINE_ID}={launched[0]}").items)
        bridge.kill()
        bridge.start()
        out, err = task.communicate(timeout=300)
        assert task.returncode == 0, err[-3000:]
        third = next(line.split()[1] for line in out.splitlines() if line.startswith("RESULT "))
        assert launched == [third], (launched, third)
        assert sorted(set(seen) - before) == [third], "a duplicate machine was launched across the restart"
        assert len(core.list_namespaced_pod(NS, label_selector=kuberay_pods).items) == 1
        print(f"\nFIGURES kuberay bridge: autoscaler killed {'after' if pod_before_kill else 'before'} the "
              f"pod was created; one machine, one pod")

        step("5 restart done")
        # 6. The RayCluster deleted (background, as kubectl does): the bridge ends every machine, Node and pod,
        # drops its finalizer, Kubernetes deletes the RayCluster and (garbage collector) its head pod.
        op.delete(name)
        wait_for(lambda: op.get(name) is None, 180, "the RayCluster gone", interval=1)
        assert not machines()
        assert not core.list_node(label_selector=sel).items
        assert not core.list_namespaced_pod(NS, label_selector=kuberay_pods).items
        wait_for(lambda: not core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={name}").items, 120,
                 "the head pod garbage-collected", interval=1)
        assert bridge.proc.wait(timeout=60) == 0, bridge.tail()
        wait_for(lambda: not any(processes_of(mid) for mid in seen), 30, "no Ray process of a machine left")
        step("6 deleted")


CPU6_TASK = """
    @ray.remote(num_cpus=6)
    def f():
        return os.environ["RAY_CLOUD_INSTANCE_ID"]
    print("RESULT", ray.get(f.remote()))
"""


def test_kuberay_bridge_serves_a_demand_no_group_declares(world, tmp_path: Path) -> None:
    """Shape-open under the bridge: with `open_shapes: true` in the RayCluster's annotation, a task no worker group
    holds ({CPU: 6}; the groups hold 1 CPU, and 4 CPUs with a GPU) gets its cheapest-fit machine as a generated node
    type (the rule an open demand matches), which registers as a Node and runs the task in a Ray pod of the default
    template; deleting the RayCluster ends machine, Node and pod."""
    with kuberay_cluster(world, tmp_path, "ro", annotation={"open_shapes": True}) as c:
        # The planner's cheapest fit for the demand under the rule it matches ({CPU: 6}: `cpu-on-demand`).
        planned = plan_cluster({**c.cfg, "head_node_type": "six", "available_node_types": {
            "six": {"resources": {"CPU": 6}, "node_config": {}}}}).plans["six"]
        got = driver(c.gcs, CPU6_TASK).strip()
        m = {mm.id: mm for mm in c.backend.list_machines()}[got]
        assert m.tags["ray-user-node-type"].startswith("nl-"), m.tags          # a generated node type
        assert m.tags["nodeless-instance-type"] == planned.chosen.instance_type.name
        assert m.tags["nodeless-rule"] == "cpu-on-demand"
        [node] = c.core.list_node(label_selector=f"{L.MACHINE_ID}={got}").items
        [pod] = c.core.list_namespaced_pod(NS, label_selector=f"{L.MACHINE_ID}={got}").items
        assert pod.spec.node_name == node.metadata.name and pod.status.phase == "Running"
        assert pod.metadata.labels["ray.io/cluster"] == c.name
        c.op.delete(c.name)
        wait_for(lambda: c.op.get(c.name) is None, 180, "the RayCluster gone", interval=1)
        assert not c.backend.list_machines() and not c.core.list_node(label_selector=c.sel).items
        assert c.bridge.proc.wait(timeout=60) == 0, c.bridge.tail()
        wait_for(lambda: not processes_of(got), 30, "no Ray process of the machine left")


GIB = 1024 ** 3
# name -> (Ray task options, the demand as Ray reports it, its label selector)
NO_GROUP_DEMANDS = {
    "cpu": ({"num_cpus": 6}, {"CPU": 6}, None),
    "gpu": ({"num_cpus": 1, "num_gpus": 1}, {"CPU": 1, "GPU": 1}, None),
    "l4": ({"num_cpus": 1, "num_gpus": 1, "accelerator_type": "L4"},
           {"CPU": 1, "GPU": 1, "accelerator_type:L4": 0.001}, None),
    "mem": ({"num_cpus": 1, "memory": 64 * GIB}, {"CPU": 1, "memory": 64 * GIB}, None),
    "zone_b": ({"num_cpus": 1, "label_selector": {"ray.io/availability-zone": "us-west-2b"}}, {"CPU": 1},
               {"ray.io/availability-zone": "us-west-2b"}),
}
NO_GROUP_UNIQUE = ("l4", "zone_b")      # only their own cheapest fit can serve them (a GPU model, a zone)


def _no_worker_groups(rc: dict) -> None:
    """No worker group at all (shape-open: every worker a generated node type), and Ray's v2 autoscaler (label
    selectors are a v2 feature) asked for as a KubeRay user asks, `autoscalerOptions.version: v2`, then converted
    again as `convert` writes it (sidecar.install: the head's system config); the cluster's worker limit in the
    annotation (`maxWorkers`, which a RayCluster with no group needs)."""
    rc["spec"]["workerGroupSpecs"] = []
    rc["spec"].setdefault("autoscalerOptions", {})["version"] = "v2"
    # A demand's machine stays until the test has listed every machine: the first task done must not leave its
    # machine idle past the sample's 60 s (or the break-even's 180 s) while a slower machine still boots (a loaded
    # CI host: it did once).
    rc["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] = 900
    settings = yaml.safe_load(rc["metadata"]["annotations"][K.ANNOTATION])
    rc["metadata"]["annotations"][K.ANNOTATION] = yaml.safe_dump({**settings, "maxWorkers": 8,
                                                                  "cost_aware_idle": False})
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    sidecar.install(rc["spec"], "spec", rc["metadata"]["name"], sidecar.autoscaler_container(head)["image"])


def test_kuberay_raycluster_with_no_worker_group_serves_each_demand_on_its_cheapest_fit(world, tmp_path) -> None:
    """A RayCluster that declares no worker group: a CPU, a GPU, a GPU-model, a memory and a label-selector demand
    at once. Each runs on a machine that holds it and carries the labels it asked for; the GPU model's and the
    zone's run on their own cheapest fit (a brute force over the catalog, not the planner); every machine launched
    is some demand's cheapest fit, and all of them cost no more than the demands' own cheapest fits together (Ray's
    scheduler may put a demand on another's machine). Each is a Node, its Ray pod made of the head's template (the
    head's image; no group label), Running on it; deleting the RayCluster ends them all."""
    with kuberay_cluster(world, tmp_path, "rn", edit=_no_worker_groups) as c:
        assert list(c.cfg["available_node_types"]) == ["headgroup"], c.cfg["available_node_types"]
        tasks = "\n".join(f"refs[{n!r}] = probe.options(**{o!r}).remote()" for n, (o, _, _) in NO_GROUP_DEMANDS.items())
        got = json.loads(driver(c.gcs, textwrap.dedent("""
            import json
            @ray.remote
            def probe():
                time.sleep(15)      # hold the machine while the others come up
                return {"machine": os.environ["RAY_CLOUD_INSTANCE_ID"],
                        "labels": ray.get_runtime_context().get_node_labels()}
            refs = {}
        """) + tasks + textwrap.dedent("""
            print("RESULT", json.dumps({n: ray.get(r, timeout=400) for n, r in refs.items()}))
        """), timeout=600))
        machines = {m.id: m.tags for m in c.backend.list_machines()}
        own_cheapest, planned = 0.0, set()
        for name, r in sorted(got.items()):
            _, want, selector = NO_GROUP_DEMANDS[name]
            tags = machines[r["machine"]]
            assert tags["ray-user-node-type"].startswith("nl-"), (name, tags)      # a generated node type
            price, cheapest = check_served(c.cfg, name, want, selector, tags, r["labels"],
                                           unique=name in NO_GROUP_UNIQUE)
            own_cheapest += price
            planned |= cheapest
        assert {tags[TAG_INSTANCE_TYPE] for tags in machines.values()} <= planned, (machines, planned)
        launched = sum(float(tags[TAG_PRICE]) for tags in machines.values())
        assert launched <= own_cheapest + 1e-6, (launched, own_cheapest)
        head_image = c.op.get(c.name)["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
        for mid in machines:
            [node] = c.core.list_node(label_selector=f"{L.MACHINE_ID}={mid}").items
            [pod] = c.core.list_namespaced_pod(NS, label_selector=f"{L.MACHINE_ID}={mid}").items
            assert pod.spec.node_name == node.metadata.name and pod.status.phase == "Running"
            assert pod.spec.containers[0].image == head_image and len(pod.spec.containers) == 1
            assert K.GROUP_LABEL not in pod.metadata.labels and pod.metadata.labels["ray.io/cluster"] == c.name
            assert node.metadata.labels[L.INSTANCE_TYPE] == machines[mid][TAG_INSTANCE_TYPE]
        print(f"\nFIGURES kuberay no worker group: {len(got)} demands on {len(machines)} machines, "
              f"${launched:.4f}/h vs ${own_cheapest:.4f}/h for each demand's own cheapest fit: "
              + ", ".join(f"{n}->{machines[r['machine']][TAG_INSTANCE_TYPE]}" for n, r in sorted(got.items())))
        c.op.delete(c.name)
        wait_for(lambda: c.op.get(c.name) is None, 180, "the RayCluster gone", interval=1)
        assert not c.backend.list_machines() and not c.core.list_node(label_selector=c.sel).items


def test_kuberay_operator_suspend_ends_the_machines(world, tmp_path: Path) -> None:
    """`spec.suspend: true`: the real operator deletes every pod of the cluster, the head pod (with the bridge's
    container) among them; the bridge ends the cluster's machines and their Nodes before it goes (on the SIGTERM of
    its container, or at its next loop), and the operator reports the cluster suspended."""
    with kuberay_cluster(world, tmp_path, "rs") as c:
        got = driver(c.gcs, GPU_TASK).strip()
        assert got in {mm.id for mm in c.backend.list_machines()}
        c.op.patch(c.name, {"spec": {"suspend": True}})
        wait_for(lambda: not c.backend.list_machines(), 90, "the suspended cluster's machines ended", interval=0.5)
        wait_for(lambda: not c.core.list_node(label_selector=c.sel).items, 60, "their Nodes gone", interval=0.5)
        wait_for(lambda: not c.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={c.name}").items, 90,
                 "every pod of the cluster gone (the operator's deletion)", interval=0.5)
        wait_for(lambda: c.bridge.proc is not None and c.bridge.proc.poll() is not None, 60,
                 "the bridge's container stopped", interval=0.5)
        wait_for(lambda: any(x.get("type") == "RayClusterSuspended" and x.get("status") == "True"
                             for x in (c.op.get(c.name).get("status") or {}).get("conditions") or []), 60,
                 "the operator's RayClusterSuspended condition", interval=0.5)
        wait_for(lambda: not processes_of(got), 30, "no Ray process of the machine left")
        print(f"\nFIGURES kuberay suspend: bridge exit {c.bridge.proc.returncode}\n{c.bridge.tail()[-1500:]}")


@dataclass
class MadeCluster:
    """A RayCluster the real operator made of a RayJob or RayService (`owner`), its head played with the
    dashboard, the bridge in it, and what to check them with."""

    owner: str
    name: str
    core: client.CoreV1Api
    op: Operator
    backend: LocalBackend
    stand_in: HeadPodStandIn
    planned: str                        # the planner's cheapest fit of the GPU group

    def machines(self) -> dict[str, str]:
        return {m.id: m.tags["nodeless-instance-type"] for m in self.backend.list_machines()}

    def made(self) -> list[dict]:
        return made_of(self.op, self.owner)

    def ends_everything(self) -> None:
        """The owner's end deletes the RayCluster: the bridge ends machines, Nodes and pods first, exits 0."""
        wait_for(lambda: not self.made(), 180, f"{self.owner}'s RayCluster deleted", interval=1)
        assert not self.backend.list_machines()
        assert not self.core.list_node(label_selector=L.cluster_selector(self.name)).items
        wait_for(lambda: not self.core.list_namespaced_pod(
            NS, label_selector=f"ray.io/cluster={self.name}").items, 120, "the cluster's pods gone", interval=1)
        bridge = self.stand_in.bridge
        assert bridge is not None and bridge.proc is not None
        assert bridge.proc.wait(timeout=60) == 0, bridge.tail()


def made_of(op: Operator, owner: str) -> list[dict]:
    """The RayClusters the operator made of the RayJob / RayService `owner` (its label on them)."""
    return op.objects.list_namespaced_custom_object(
        "ray.io", "v1", NS, "rayclusters", label_selector=f"ray.io/originated-from-cr-name={owner}")["items"]


def owned_cluster_spec(world, tmp_path: Path, owner: str, ports: dict[str, int]) -> tuple[dict, dict]:
    """(the converted RayCluster's annotations, its spec) for a RayJob / RayService named `owner`: the head's
    dashboard (and any other named container port in `ports`) on a free port, and its pod on the Node played for
    `owner` (the RayCluster's own name is the operator's to choose)."""
    rc = raycluster(owner, free_port(), tmp_path / "state", world.sa_kubeconfig, world.server)
    head = rc["spec"]["headGroupSpec"]
    head["rayStartParams"]["dashboard-port"] = str(ports["dashboard"])
    ray_container = head["template"]["spec"]["containers"][0]
    named = {p["name"]: p for p in ray_container["ports"]}
    for name, port in ports.items():
        named[name] = {**named.get(name, {"name": name}), "containerPort": port}
    ray_container["ports"] = list(named.values())
    head["template"]["spec"]["nodeSelector"] = {HEAD_HOST_LABEL: owner}
    head["template"]["spec"]["tolerations"] = [{"key": HEAD_HOST_LABEL, "operator": "Equal", "value": owner,
                                                "effect": "NoSchedule"}]
    return rc["metadata"]["annotations"], rc["spec"]


@contextlib.contextmanager
def made_by_operator(world, tmp_path: Path, plural: str, body: dict,
                     head_env: dict[str, str] | None = None) -> Iterator[MadeCluster]:
    """Apply `body` (a RayJob or RayService, `plural` its resource), wait for the RayCluster the operator makes of
    it (its name with the operator's random suffix, the owner's annotations copied onto it), play its head with the
    dashboard, run the bridge in it. Afterwards, whatever happened: the owner deleted, and every machine, Node and
    pod of the cluster gone."""
    admin = world.api_client()
    core = client.CoreV1Api(admin)
    op = Operator(admin, played=False)
    owner = body["metadata"]["name"]
    backend: LocalBackend | None = None
    stand_in: HeadPodStandIn | None = None
    name = ""
    try:
        op.objects.create_namespaced_custom_object("ray.io", "v1", NS, plural, body)
        [made] = wait_for(lambda: made_of(op, owner), 60, f"the RayCluster the operator makes of {owner}", interval=0.5)
        name = made["metadata"]["name"]
        assert name.startswith(f"{owner}-")
        assert made["metadata"]["annotations"][K.ANNOTATION] == body["metadata"]["annotations"][K.ANNOTATION]
        cfg = K.bridge_config(made, derive_config(made))
        cfg["provider"].pop("kuberay")
        backend = LocalBackend.from_provider(dict(cfg["provider"]), name)
        planned = plan_cluster({**cfg, "head_node_type": "small-group", "available_node_types": {
            k: v for k, v in cfg["available_node_types"].items() if k != "headgroup"}}).plans["gpu-group"]
        stand_in = HeadPodStandIn(admin, name, tmp_path, world.sa_kubeconfig, host_label=owner, dashboard=True,
                                  head_env=head_env,
                                  extra_env={PLAYER_KUBECONFIG_ENV: str(world.admin_kubeconfig)})
        with stand_in.running():
            yield MadeCluster(owner, name, core, op, backend, stand_in, planned.chosen.instance_type.name)
    except BaseException:
        print(stand_in.bridge.tail() if stand_in is not None and stand_in.bridge is not None else "(no bridge)")
        print("operator:", world.operator.tail()[-3000:], "\nunroutable:", world.network.refused[-5:])
        raise
    finally:
        with contextlib.suppress(client.ApiException):
            op.objects.delete_namespaced_custom_object("ray.io", "v1", NS, plural, owner)
        if backend is not None:
            ids = [mm.id for mm in backend.list_machines()]
            if ids:
                backend.terminate(ids)
        if name:
            for n in core.list_node(label_selector=L.cluster_selector(name)).items:
                core.delete_node(n.metadata.name)
            core.delete_collection_namespaced_pod(NS, label_selector=f"ray.io/cluster={name}",
                                                  grace_period_seconds=0)
            if op.get(name) is not None:
                op.patch(name, {"metadata": {"finalizers": []}})
            shutil.rmtree(default_state_dir(name, "-kubelet"), ignore_errors=True)
        admin.close()


def _owner_name(prefix: str) -> str:
    return f"{prefix}-{os.getpid() % 10000}-{int(time.time()) % 100000}"


JOB_SCRIPT = """
import os, sys, ray
ray.init(logging_level="ERROR", log_to_driver=False)

@ray.remote(num_gpus=1)
def f():
    return os.environ["RAY_CLOUD_INSTANCE_ID"]

with open(sys.argv[1], "w") as out:
    out.write(ray.get(f.remote()))
"""


def rayjob_manifest(job: str, annotations: dict, spec: dict, entrypoint: str, **more: object) -> dict:
    """A RayJob of the converted cluster `spec` as these tests submit it: HTTPMode (the operator submits to the
    head's dashboard), `shutdownAfterJobFinishes: true`, plus `more` spec keys."""
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": job, "namespace": NS, "annotations": annotations},
            "spec": {"entrypoint": entrypoint, "submissionMode": "HTTPMode", "shutdownAfterJobFinishes": True,
                     "rayClusterSpec": spec, **more}}


def test_kuberay_operator_rayjob_runs_on_a_bridge_machine_and_its_end_ends_them(world, tmp_path: Path) -> None:
    """A RayJob (HTTPMode, `shutdownAfterJobFinishes: true`) of the converted cluster: the real operator creates
    its RayCluster (the RayJob's annotation copied onto it, its name with the operator's random suffix), submits the
    job to the head's dashboard (reached through ServiceNetwork, the cluster network an out-of-cluster operator
    lacks), the job's GPU task runs on the cheapest-fit machine the bridge launches for it, the operator marks the
    job Complete and deletes the RayCluster: the bridge ends the machine and its Node first, then the cluster and
    its head pod go. Nothing of the job is played but the head pod's kubelet and the workers' kubelets."""
    job = _owner_name("rj")
    annotations, spec = owned_cluster_spec(world, tmp_path, job, {"dashboard": free_port()})
    script, result = tmp_path / "job.py", tmp_path / "job.result"
    script.write_text(JOB_SCRIPT)
    rayjob = rayjob_manifest(job, annotations, spec, f"{sys.executable} {script} {result}",
                             ttlSecondsAfterFinished=0)
    seen: dict[str, str] = {}
    with made_by_operator(world, tmp_path, "rayjobs", rayjob) as c:
        def get_job() -> dict:
            return c.op.objects.get_namespaced_custom_object("ray.io", "v1", NS, "rayjobs", job)

        def complete() -> dict | None:
            seen.update(c.machines())
            st = get_job().get("status") or {}
            return st if st.get("jobDeploymentStatus") in ("Complete", "Failed") else None

        status = wait_for(complete, 300, "the RayJob finished (the operator's status)", interval=0.5)
        assert (status["jobDeploymentStatus"], status.get("jobStatus")) == ("Complete", "SUCCEEDED"), status
        ran_on = result.read_text().strip()
        assert seen == {ran_on: c.planned}          # one machine, the planned fit, and the job's task ran on it
        c.ends_everything()                         # shutdownAfterJobFinishes: the operator deletes the RayCluster
        assert get_job()["status"]["jobDeploymentStatus"] == "Complete"       # the RayJob stays, as KubeRay does
        wait_for(lambda: not processes_of(ran_on), 30, "no Ray process of the machine left")
        print(f"\nFIGURES kuberay rayjob: {ran_on} ({seen[ran_on]}); job {status.get('jobId')}; "
              f"{world.network.routed} dashboard requests of the operator routed so far")


def serve_config(port: int, replicas: int) -> str:
    """serveConfigV2 of tests/e2e/serve_app.py: its HTTP proxy on the head only (every proxy of the host would take
    the same port), on 127.0.0.1 at the head's `serve` container port."""
    return yaml.safe_dump({
        "proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{"name": "where", "route_prefix": "/", "import_path": "tests.e2e.serve_app:app",
                          "deployments": [{"name": "Where", "num_replicas": replicas}]}]})


def test_kuberay_operator_rayservice_replicas_scale_the_machines(world, tmp_path: Path) -> None:
    """A RayService of the converted cluster (GPU group up to 2 workers): the real operator makes its RayCluster,
    deploys the Serve application through the head's dashboard and checks its proxy; each GPU replica is a demand
    the bridge launches the cheapest fit for; the application answers from the machine its replica runs on, and the
    operator's health check of the head's proxy passes. Two
    replicas (the serveConfigV2 edited in place, as the operator applies it): two machines; back to one: the idle
    one goes. The RayService deleted: its RayCluster, machines, Nodes and pods go."""
    svc = _owner_name("rsv")
    serve_port = free_port()
    annotations, spec = owned_cluster_spec(world, tmp_path, svc, {"dashboard": free_port(), "serve": serve_port})
    spec["workerGroupSpecs"][1]["maxReplicas"] = 2
    body = {"apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": svc, "namespace": NS, "annotations": annotations},
            "spec": {"serveConfigV2": serve_config(serve_port, 1), "rayClusterConfig": spec}}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def answer() -> str | None:
        try:
            with opener.open(f"http://127.0.0.1:{serve_port}/", timeout=5) as r:
                return r.read().decode().strip() or None
        except OSError:
            return None

    with made_by_operator(world, tmp_path, "rayservices", body, head_env={"PYTHONPATH": str(REPO_ROOT)}) as c:
        def get_svc() -> dict:
            return c.op.objects.get_namespaced_custom_object("ray.io", "v1", NS, "rayservices", svc)

        def app_status() -> str:
            st = (get_svc().get("status") or {}).get("activeServiceStatus") or {}
            return ((st.get("applicationStatuses") or {}).get("where") or {}).get("status", "")

        wait_for(lambda: app_status() == "RUNNING", 300, "the Serve application RUNNING (the operator's status)",
                 interval=1)
        first = wait_for(answer, 60, "an answer from the application", interval=0.5)
        assert c.machines() == {first: c.planned}      # the replica's demand: one machine, the planned fit
        # The operator's health check of the head's Serve proxy passed: it labels the head pod for the serve
        # Service. (Its Ready condition counts that Service's endpoints, which the played pod's IP can never be:
        # Kubernetes refuses a loopback address in an EndpointSlice, core/validation ValidateEndpointIP.)
        wait_for(lambda: (c.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={c.name},"
                                                      "ray.io/node-type=head,ray.io/serve=true").items), 120,
                 "the operator's serve label on the head pod (its proxy health check)", interval=1)

        # Two replicas: the second replica's demand gets a second machine.
        c.op.objects.patch_namespaced_custom_object("ray.io", "v1", NS, "rayservices", svc,
                                                    {"spec": {"serveConfigV2": serve_config(serve_port, 2)}})
        two = wait_for(lambda: (lambda ms: ms if len(ms) == 2 else None)(c.machines()), 240,
                       "a second machine for the second replica", interval=1)
        assert set(two.values()) == {c.planned} and first in two
        answers = wait_for(lambda: (lambda got: got if len(got) == 2 else None)(
            {a for a in (answer() for _ in range(20)) if a}), 120, "answers from both replicas", interval=1)
        assert answers == set(two)

        # Back to one replica: the idle machine goes (its Ray node idle past the cluster's idle timeout).
        c.op.objects.patch_namespaced_custom_object("ray.io", "v1", NS, "rayservices", svc,
                                                    {"spec": {"serveConfigV2": serve_config(serve_port, 1)}})
        one = wait_for(lambda: (lambda ms: ms if len(ms) == 1 else None)(c.machines()), 240,
                       "the idle replica's machine ended", interval=1)
        assert set(one) < set(two)
        assert answer() in one

        c.op.objects.delete_namespaced_custom_object("ray.io", "v1", NS, "rayservices", svc)
        c.ends_everything()
        wait_for(lambda: not any(processes_of(mid) for mid in two), 30, "no Ray process of a machine left")
        print(f"\nFIGURES kuberay rayservice: 1 replica -> {first}; 2 -> {sorted(two)}; back to 1 -> {sorted(one)}")


LONG_JOB_SCRIPT = """
import os, sys, time, ray
ray.init(logging_level="ERROR", log_to_driver=False)

@ray.remote(num_gpus=1)
def f(path):
    with open(path, "w") as out:
        out.write(os.environ["RAY_CLOUD_INSTANCE_ID"])
    time.sleep(600)

ray.get(f.remote(sys.argv[1]))
"""


def test_kuberay_operator_rayjob_suspended_ends_the_machines(world, tmp_path: Path) -> None:
    """`spec.suspend: true` on a running RayJob: the real operator stops the job and deletes its RayCluster
    (JobDeploymentStatus Suspending -> Suspended); the bridge answers it as any deletion: the job's machine and Node
    end before the RayCluster goes, and the bridge exits 0."""
    job = _owner_name("rjs")
    annotations, spec = owned_cluster_spec(world, tmp_path, job, {"dashboard": free_port()})
    script, running = tmp_path / "job.py", tmp_path / "job.running"
    script.write_text(LONG_JOB_SCRIPT)
    rayjob = rayjob_manifest(job, annotations, spec, f"{sys.executable} {script} {running}")
    with made_by_operator(world, tmp_path, "rayjobs", rayjob) as c:
        def get_job() -> dict:
            return c.op.objects.get_namespaced_custom_object("ray.io", "v1", NS, "rayjobs", job)

        wait_for(lambda: running.exists() and running.read_text().strip(), 300, "the job's GPU task running",
                 interval=0.5)
        ran_on = running.read_text().strip()
        assert c.machines() == {ran_on: c.planned}
        c.op.objects.patch_namespaced_custom_object("ray.io", "v1", NS, "rayjobs", job, {"spec": {"suspend": True}})
        c.ends_everything()
        wait_for(lambda: (get_job().get("status") or {}).get("jobDeploymentStatus") == "Suspended", 120,
                 "the RayJob Suspended (the operator's status)", interval=1)
        wait_for(lambda: not processes_of(ran_on), 30, "no Ray process of the machine left")
