"""`registration: kubernetes` on the LOCAL backend, end to end: `ray up cluster-configs/local-k8s-cpu-head.yaml` (a
temp copy pointed at this test's control plane) with the real Ray autoscaler (v2), a REAL Kubernetes control plane
(kube-apiserver, kube-scheduler, kube-controller-manager, RBAC on; the provider runs as the ServiceAccount of
cluster-configs/kubernetes-rbac.yaml) and every machine's kubelet played from its kubeadm join user data.

A {GPU: 1} task brings up the planned instance; its Node registers with the labels and taint the user data carries
and becomes Ready (the controller-manager lifts the not-ready taint); the real scheduler binds the Ray pod to it; the
task runs in that pod's Ray process (RAY_CLOUD_INSTANCE_ID = the machine id, the only Ray process of the machine:
the local backend starts none for a machine with a boot script); the idle node goes (pod, Node, machine, process);
`ray down` leaves no Node, pod or process.

A watch on the cluster's Nodes and pods (admin) times each step: launch -> Node registered -> Ready -> schedulable
-> pod created -> bound -> Running; printed as `FIGURES`.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client, watch

from ray_nodeless.core.cluster_plan import plan_cluster
from ray_nodeless.providers.local.backend import LocalBackend
from ray_nodeless.providers.local.scoped_stop import stop_marked_processes
from ray_nodeless.providers.local.settings import default_state_dir
from ray_nodeless.registrations.kubernetes import labels as L
from tests.e2e.clusters import BIN, RAY_ENV, cluster_copy, cmdline, processes_of, write_config
from tests.registrations.kubernetes.conftest import cp, wait_for  # noqa: F401  (module-scoped control plane)

pytestmark = pytest.mark.e2e


def local_k8s_config(tmp_path: Path, cp, **provider) -> tuple[dict, Path]:  # noqa: F811
    """A temp copy of local-k8s-cpu-head.yaml: own cluster name, GCS port and state dir; kubeconfig = the control
    plane's ServiceAccount; the join endpoint = its API server; the played kubelets act as the admin (a kubelet's
    own identity; the ServiceAccount may not create Nodes)."""
    cfg = cluster_copy("local-k8s-cpu-head.yaml", "k8sl",
                       head_env=f"RAY_NODELESS_PLAYER_KUBECONFIG={cp.admin_kubeconfig}",
                       state_dir=str(tmp_path / "state"), **provider)
    k = cfg["provider"]["kubernetes"]
    k["kubeconfig"] = str(cp.sa_kubeconfig)
    k["join"] = dict(k["join"], endpoint=cp.server)
    k["pod_grace_s"] = 5
    return cfg, write_config(cfg, tmp_path)


class Timeline:
    """Watches one cluster's Nodes and Ray pods and records, per machine id, when each step was first seen:
    node_added, node_ready (Ready=True), node_schedulable (Ready, no not-ready taint), pod_added, pod_bound
    (spec.nodeName set by the scheduler), pod_running."""

    STEPS = ("node_added", "node_ready", "node_schedulable", "pod_added", "pod_bound", "pod_running")

    def __init__(self, api: client.ApiClient, cluster: str, namespace: str = "ray"):
        self.core = client.CoreV1Api(api)
        self.selector = L.cluster_selector(cluster)
        self.namespace = namespace
        self.times: dict[str, dict[str, float]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in ("nodes", "pods")]
        for t in self._threads:
            t.start()

    def _mark(self, mid: str | None, step: str) -> None:
        if mid:
            with self._lock:
                self.times.setdefault(mid, {}).setdefault(step, time.time())

    def _loop(self, kind: str) -> None:
        # the bound methods themselves: watch.Watch reads the return type from their docstring
        fn, args = (self.core.list_node, ()) if kind == "nodes" else (self.core.list_namespaced_pod, (self.namespace,))
        while not self._stop.is_set():
            try:
                w = watch.Watch()
                for ev in w.stream(fn, *args, label_selector=self.selector, timeout_seconds=5, _request_timeout=15):
                    obj = ev["object"]
                    if ev["type"] in ("ADDED", "MODIFIED") and not isinstance(obj, dict):
                        (self._node if kind == "nodes" else self._pod)(obj)
                    if self._stop.is_set():
                        w.stop()
                        break
            except Exception:
                self._stop.wait(0.2)

    def _node(self, node) -> None:
        mid = L.machine_id_of_node(node)
        self._mark(mid, "node_added")
        ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
        if ready:
            self._mark(mid, "node_ready")
            if not any(t.key == L.NOT_READY_TAINT for t in (node.spec.taints or [])):
                self._mark(mid, "node_schedulable")

    def _pod(self, pod) -> None:
        mid = (pod.metadata.labels or {}).get(L.MACHINE_ID)
        self._mark(mid, "pod_added")
        if pod.spec.node_name:
            self._mark(mid, "pod_bound")
        if pod.status and pod.status.phase == "Running":
            self._mark(mid, "pod_running")
        if pod.status and pod.status.phase == "Failed":
            self._mark(mid, "pod_failed")

    def of(self, mid: str) -> dict[str, float]:
        with self._lock:
            return dict(self.times.get(mid, {}))

    def steps(self, mid: str, launched_at: float) -> dict[str, float]:
        """Seconds between consecutive steps, from the machine's launch."""
        t = self.of(mid)
        out, prev, prev_t = {}, "launch", launched_at
        for s in self.STEPS:
            if s in t:
                out[f"{prev}->{s}"] = t[s] - prev_t
                prev, prev_t = s, t[s]
        return out

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)


def cleanup(backend: LocalBackend, core: client.CoreV1Api, cluster: str, machine_ids: list[str]) -> None:
    """Whatever a failed test left: machines, played pods' Ray processes, the head's processes, Nodes and pods."""
    sel = L.cluster_selector(cluster)
    try:
        ids = [m.id for m in backend.list_machines()]
        if ids:
            backend.terminate(ids)
    finally:
        for mid in machine_ids:
            for pid in processes_of(mid):
                try:
                    os.killpg(pid, 9)
                except OSError:
                    pass
        stop_marked_processes(backend.runner_marker, force=True)
        for n in core.list_node(label_selector=sel).items:
            core.delete_node(n.metadata.name)
        core.delete_collection_namespaced_pod("ray", label_selector=sel, grace_period_seconds=0)
        # the played kubelets' records (default_state_dir(cluster, "-kubelet")): empty by now
        shutil.rmtree(default_state_dir(cluster, "-kubelet"), ignore_errors=True)


def ray_cli(verb: str, path: Path, env: dict, timeout: float) -> None:
    out = subprocess.run([str(BIN / "ray"), verb, "-y", str(path)], env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def scheduled_by(core: client.CoreV1Api, pod_name: str, namespace: str = "ray") -> list[str]:
    """The components that reported a `Scheduled` event for the pod (the real scheduler: default-scheduler)."""
    evs = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod_name}").items
    # 1.20's scheduler records events.k8s.io/v1 events: the core/v1 view names it in reportingComponent
    return [e.reporting_component or (e.source.component if e.source else None) for e in evs
            if e.reason == "Scheduled"]


def test_ray_up_local_k8s_gpu_task_runs_in_a_bound_pod_idle_removal_and_ray_down(cp, tmp_path: Path) -> None:  # noqa: F811
    cfg, path = local_k8s_config(tmp_path, cp)
    cluster = cfg["cluster_name"]
    env = RAY_ENV
    admin = cp.api_client()
    core = client.CoreV1Api(admin)
    sel = L.cluster_selector(cluster)
    backend = LocalBackend.from_provider(dict(cfg["provider"]), cluster)
    planned = plan_cluster(cfg).plans["gpu_worker"]
    timeline = Timeline(admin, cluster)

    def machines() -> dict[str, dict]:
        return {m.id: m for m in backend.list_machines()}

    worker = None
    try:
        up = subprocess.run([str(BIN / "ray"), "up", "-y", str(path)], env=env, capture_output=True, text=True,
                            timeout=300)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        [head] = machines().values()
        assert head.tags["ray-node-type"] == "head"
        assert not core.list_node(label_selector=sel).items      # no worker yet: no Node

        t0 = time.time()
        driver = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import os, time, ray
            ray.init(address="{cfg['provider']['gcs_address']}", logging_level="ERROR", log_to_driver=False)
            @ray.remote(num_gpus=1)
            def f():
                return time.time(), os.environ["RAY_CLOUD_INSTANCE_ID"]
            t, mid = ray.get(f.remote())
            print("RESULT", t, mid)
        """)], env=env, capture_output=True, text=True, timeout=300)
        assert driver.returncode == 0, driver.stderr[-3000:]
        started, worker = next(line.split()[1:] for line in driver.stdout.splitlines() if line.startswith("RESULT "))
        task_s = float(started) - t0

        # The planned instance was launched, as a machine of the local backend (a record, no process of its own).
        m = machines()[worker]
        tags = m.tags
        assert tags["nodeless-instance-type"] == planned.chosen.instance_type.name
        assert tags["nodeless-rule"] == "gpu-workers-spot-first"
        rec = backend.nodes.get(worker)
        assert rec.pid is None, "the local backend must not start Ray for a machine that joins Kubernetes"

        # Its Node: registered from the kubeadm user data with the labels and the cluster's taint, Ready.
        [node] = core.list_node(label_selector=f"{L.MACHINE_ID}={worker}").items
        lab = node.metadata.labels
        assert node.metadata.name == worker                             # kubeadm: nodeRegistration.name
        expect = {L.INSTANCE_TYPE: tags["nodeless-instance-type"], L.ZONE: tags["nodeless-zone"],
                  L.REGION: "us-west-2", L.ARCH: "amd64", L.CLUSTER: cluster, L.NODE_TYPE: "gpu_worker",
                  L.MACHINE_ID: worker, L.CAPACITY_TYPE: tags["nodeless-capacity"],
                  L.RULE: "gpu-workers-spot-first", L.JOIN_METHOD: "kubeadm"}
        assert {k: lab.get(k) for k in expect} == expect
        ann = wait_for(lambda: core.read_node(node.metadata.name).metadata.annotations or {}, 10, "annotations")
        assert ann.get(L.PRICE) == tags["nodeless-hourly-price"] and ann.get(L.CATALOG) == tags["nodeless-catalog"]
        taints = {(t.key, t.value, t.effect) for t in node.spec.taints or []}
        assert (L.TAINT_KEY, cluster, "NoSchedule") in taints
        assert not any(t[0] == L.NOT_READY_TAINT for t in taints)       # lifted by the node lifecycle controller
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
        assert node.status.allocatable.get(L.GPU_RESOURCE) == str(planned.chosen.instance_type.gpu_count)

        # Its Ray pod: bound to that Node by the real scheduler (nodeSelector + toleration, no nodeName from us).
        [pod] = core.list_namespaced_pod("ray", label_selector=f"{L.MACHINE_ID}={worker}").items
        assert pod.spec.node_name == node.metadata.name and pod.status.phase == "Running"
        assert pod.spec.node_selector == {L.MACHINE_ID: worker}
        assert "default-scheduler" in scheduled_by(core, pod.metadata.name)
        assert pod.spec.containers[0].resources.limits[L.GPU_RESOURCE] == node.status.allocatable[L.GPU_RESOURCE]
        env_of_pod = {e.name: e.value for e in pod.spec.containers[0].env}
        assert env_of_pod["RAY_CLOUD_INSTANCE_ID"] == worker
        # The task ran in that pod's Ray node: the machine's only raylet is the played pod's.
        assert len(processes_of(worker, "raylet")) == 1

        steps = timeline.steps(worker, m.launched_at)
        print(f"\nFIGURES local-k8s e2e: pending GPU task -> running {task_s:.1f} s; "
              + "; ".join(f"{k} {v:.2f} s" for k, v in steps.items()))
        assert set(Timeline.STEPS) <= set(timeline.of(worker)), timeline.of(worker)

        # Idle scale-down: pod, Node, machine and Ray process all go.
        wait_for(lambda: not core.list_namespaced_pod("ray", label_selector=sel).items
                 and not core.list_node(label_selector=sel).items, 180, "idle worker's pod and Node gone", interval=1)
        wait_for(lambda: worker not in machines(), 60, "the idle machine terminated", interval=1)
        wait_for(lambda: not processes_of(worker), 30, "worker Ray processes gone", interval=1)

        down = subprocess.run([str(BIN / "ray"), "down", "-y", str(path)], env=env, capture_output=True, text=True,
                              timeout=180)
        assert down.returncode == 0, down.stderr[-2000:]
        assert machines() == {}
        assert not core.list_node(label_selector=sel).items
        assert not core.list_namespaced_pod("ray", label_selector=sel).items
        assert stop_marked_processes(backend.runner_marker) == 0, "ray down left the head's processes behind"
    finally:
        timeline.close()
        try:
            cleanup(backend, core, cluster, [worker] if worker else [])
        finally:
            admin.close()


def test_a_killed_ray_pod_ends_its_machine_and_the_task_finishes_on_a_replacement(cp, tmp_path: Path) -> None:  # noqa: F811
    """The Ray process of a worker's pod dies (like an OOM-killed container): the played kubelet reports the pod
    Failed (restartPolicy Never), the machine is ended (pod, Node, machine, process), and the retried task brings up
    a replacement that joins, gets its own pod and runs it."""
    cfg, path = local_k8s_config(tmp_path, cp)
    cluster = cfg["cluster_name"]
    env = RAY_ENV
    admin = cp.api_client()
    core = client.CoreV1Api(admin)
    sel = L.cluster_selector(cluster)
    backend = LocalBackend.from_provider(dict(cfg["provider"]), cluster)
    timeline = Timeline(admin, cluster)
    status = tmp_path / "running"
    seen: list[str] = []
    try:
        ray_cli("up", path, env, 300)
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import os, time, ray
            ray.init(address="{cfg['provider']['gcs_address']}", logging_level="ERROR", log_to_driver=False)
            @ray.remote(num_gpus=1, max_retries=3)
            def long_task():
                open("{status}", "a").write(os.environ["RAY_CLOUD_INSTANCE_ID"] + "\\n")
                time.sleep(8)
                return os.environ["RAY_CLOUD_INSTANCE_ID"]
            print("RESULT", ray.get(long_task.remote()))
        """)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        victim = wait_for(lambda: status.exists() and status.read_text().split(), 180, "the task to start",
                          interval=0.5)[0]
        seen.append(victim)
        [raylet] = processes_of(victim, "raylet")
        os.killpg(os.getpgid(raylet), 9)            # the pod's Ray node dies
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        survivor = next(line.split()[1] for line in out.splitlines() if line.startswith("RESULT "))
        seen.append(survivor)
        assert survivor != victim
        # the victim is ended: no pod, Node, machine or process left of it
        wait_for(lambda: not core.list_namespaced_pod("ray", label_selector=f"{L.MACHINE_ID}={victim}").items
                 and not core.list_node(label_selector=f"{L.MACHINE_ID}={victim}").items, 60, "victim's pod and Node")
        assert victim not in {m.id for m in backend.list_machines()}
        assert not processes_of(victim)
        assert "pod_failed" in timeline.of(victim), timeline.of(victim)     # reported by its kubelet, not deleted
        assert {"pod_bound", "pod_running"} <= set(timeline.of(survivor))
        print(f"\nFIGURES local-k8s pod failure: victim pod Failed -> replacement pod Running "
              f"{timeline.of(survivor)['pod_running'] - timeline.of(victim)['pod_failed']:.1f} s")
        ray_cli("down", path, env, 180)
        assert backend.list_machines() == []
        assert not core.list_node(label_selector=sel).items
        assert not core.list_namespaced_pod("ray", label_selector=sel).items
        # A pod's processes are stopped by its kubelet before it confirms the pod's deletion; Ray's task workers
        # may outlive their raylet by a moment (they notice it is gone on their next check), so allow a short drain.
        deadline = time.monotonic() + 30
        while (left := {pid: cmdline(pid) for mid in seen for pid in processes_of(mid)}) and \
                time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"processes of ended machines still running 30 s after ray down: {left}"
        assert stop_marked_processes(backend.runner_marker) == 0, "ray down left the head's processes behind"
    finally:
        timeline.close()
        try:
            cleanup(backend, core, cluster, seen)
        finally:
            admin.close()
