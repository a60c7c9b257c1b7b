#!/usr/bin/env python3
"""Launch latency of `registration: kubernetes` vs `registration: vm`, both on the local backend: time from a pending
{GPU: 1, CPU: 1} task to that task running, same workload, same autoscaler (v2), one run, interleaved reps, reported
as medians and their ratio (issue 11's target: kubernetes / vm <= 1.5).

    .venv/bin/python benches/bench_k8s_registration.py              # 3 interleaved reps each
    .venv/bin/python benches/bench_k8s_registration.py --reps 5 --json

Setup: the two clusters of `bench_launch_latency.py`'s "ours" (head with CPU 0 started through the provider and the
backend's command runner, AUTOSCALER_UPDATE_INTERVAL_S=1, one worker type `gpu_worker` {CPU: 1, GPU: 1}, max 1,
idle_timeout 0.1 min), which differ only in the provider block:
- vm: the local backend starts the worker's `ray start --block` itself (local-cpu-head.yaml's provider);
- kubernetes: the `registration:` / `kubernetes:` keys of cluster-configs/local-k8s-cpu-head.yaml (kubeadm join,
  `played: true`), pointed at a REAL control plane this bench starts (etcd, kube-apiserver, kube-scheduler,
  kube-controller-manager; ray_nodeless/testing/k8s_control_plane.py, binaries from scripts/k8s/build_go.sh), the
  provider running as the ServiceAccount of cluster-configs/kubernetes-rbac.yaml. The machine is a process-less
  record; the autoscaler's kubelet player registers its Node from the user data, the controller-manager lifts the
  not-ready taint, the registration's watch creates the Ray pod, the real scheduler binds it, the player runs it as
  `ray start --block` (the only Ray process of the machine).
Measurement (bench_launch_latency's driver, one subprocess per rep): the task returns `time.time()` when it starts;
latency = start - submission. For kubernetes, a watch on the cluster's Nodes and pods times each step from the
machine's launch (the record's creation): Node registered, Ready, schedulable (not-ready taint gone), pod created,
bound, Running. Between reps the bench waits until the worker (and, for kubernetes, its pod and Node) is gone.

Clean-up: heads stopped by their marker (scoped `ray stop`), worker machines terminated through the backend, the
played pods' Ray processes stopped through their records, this cluster's Nodes and pods deleted, the control plane
stopped (its process groups only).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_launch_latency as lat  # noqa: E402  (benches/ sibling; puts the repo root on sys.path)
import registration_runs as runs  # noqa: E402

from kubernetes import client, watch  # noqa: E402

from ray_nodeless.providers.local.processes import LocalNodeProcesses  # noqa: E402
from ray_nodeless.providers.local.settings import default_state_dir  # noqa: E402
from ray_nodeless.registrations.kubernetes import labels as L  # noqa: E402
from ray_nodeless.testing.k8s_control_plane import ControlPlane  # noqa: E402

ROOT = lat.ROOT
K8S_CONFIG = ROOT / "cluster-configs" / "local-k8s-cpu-head.yaml"
RBAC = ROOT / "cluster-configs" / "kubernetes-rbac.yaml"
TARGET = 1.5



def stop_played_pods(cluster: str, gcs: str) -> None:
    """Stop the Ray processes of the played pods of `cluster` (the process that played them is gone by now) and
    remove their state directory."""
    state = default_state_dir(cluster, "-kubelet")
    if not state.exists():
        return
    procs = LocalNodeProcesses(state, gcs)
    try:
        ids = [r.id for r in procs._all_records()]
        if ids:
            procs.stop(ids)
    finally:
        procs.close()
    shutil.rmtree(state, ignore_errors=True)

class Timeline:
    """First time each step was seen per machine id, from a watch on the cluster's Nodes and pods."""

    def __init__(self, api: client.ApiClient, cluster: str):
        self.core = client.CoreV1Api(api)
        self.selector = L.cluster_selector(cluster)
        self.times: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in ("nodes", "pods")]
        for t in self._threads:
            t.start()

    def _mark(self, mid, step):
        if mid:
            with self._lock:
                self.times.setdefault(mid, {}).setdefault(step, time.time())

    def _loop(self, kind):
        # the bound methods themselves: watch.Watch reads the return type from their docstring
        fn, args = (self.core.list_node, ()) if kind == "nodes" else (self.core.list_namespaced_pod, ("ray",))
        while not self._stop.is_set():
            try:
                w = watch.Watch()
                for ev in w.stream(fn, *args, label_selector=self.selector, timeout_seconds=5, _request_timeout=15):
                    o = ev["object"]
                    if ev["type"] in ("ADDED", "MODIFIED") and not isinstance(o, dict):
                        if kind == "nodes":
                            mid = L.machine_id_of_node(o)
                            self._mark(mid, "node_added")
                            if any(c.type == "Ready" and c.status == "True" for c in (o.status.conditions or [])):
                                self._mark(mid, "node_ready")
                                if not any(t.key == L.NOT_READY_TAINT for t in (o.spec.taints or [])):
                                    self._mark(mid, "node_schedulable")
                        else:
                            mid = (o.metadata.labels or {}).get(L.MACHINE_ID)
                            self._mark(mid, "pod_added")
                            if o.spec.node_name:
                                self._mark(mid, "pod_bound")
                            if o.status and o.status.phase == "Running":
                                self._mark(mid, "pod_running")
                    if self._stop.is_set():
                        w.stop()
                        break
            except Exception:
                self._stop.wait(0.2)

    def of(self, mid):
        with self._lock:
            return dict(self.times.get(mid, {}))

    def close(self):
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)


class Vm(lat.Ours):
    name = "vm"


class Kubernetes(lat.Ours):
    name = "kubernetes"

    def __init__(self, work: Path, timeout: float, cp: ControlPlane, sa_kubeconfig: Path):
        super().__init__(work, "v2", timeout, None)
        self.cfg["cluster_name"] = f"bench-k8s-{uuid.uuid4().hex[:6]}"
        k8s = yaml.safe_load(K8S_CONFIG.read_text())["provider"]
        block = dict(k8s["kubernetes"], kubeconfig=str(sa_kubeconfig), pod_grace_s=5)
        block["join"] = dict(block["join"], endpoint=cp.server)
        self.cfg["provider"].update(registration="kubernetes", kubernetes=block)
        self.cp = cp
        self.admin = cp.api_client()
        self.core = client.CoreV1Api(self.admin)
        self.selector = L.cluster_selector(self.cfg["cluster_name"])
        self.timeline = Timeline(self.admin, self.cfg["cluster_name"])

    def _unwrap(self) -> None:
        """The provider's backend is the played-machines decorator (providers/local/played.py), whose runner_marker
        is its player's: the machine records (`nodes`) and the head's command runner, whose marker the clean-up
        stops, are its inner local backend's."""
        self.backend = getattr(self.backend, "inner", self.backend)

    def start(self) -> float:
        try:
            return super().start()
        finally:
            self._unwrap()

    def worker_gone(self) -> bool:
        return (super().worker_gone() and not self.core.list_node(label_selector=self.selector).items
                and not self.core.list_namespaced_pod("ray", label_selector=self.selector).items)

    def breakdown(self, r: dict) -> None:
        super().breakdown(r)
        rec = self.backend.nodes.get(r["instance"] or "")
        if rec is None:
            return
        r["machine_has_own_process"] = rec.pid is not None
        t = self.timeline.of(r["instance"])
        runs.add_step_times(r, t, rec.started_at)
        if "node_added" in t and "node_schedulable" in t:
            r["join_to_schedulable"] = t["node_schedulable"] - t["node_added"]

    def cleanup(self) -> None:
        try:
            super().cleanup()
        finally:
            self.timeline.close()
            cluster = self.cfg["cluster_name"]
            stop_played_pods(cluster, self.gcs)
            try:
                for n in self.core.list_node(label_selector=self.selector).items:
                    self.core.delete_node(n.metadata.name)
                self.core.delete_collection_namespaced_pod("ray", label_selector=self.selector,
                                                           grace_period_seconds=0)
            finally:
                self.admin.close()


def start_control_plane(work: Path) -> tuple[ControlPlane, Path]:
    cp = ControlPlane(work)
    cp.start()
    try:
        cp.apply_manifest(RBAC)
        return cp, cp.service_account_kubeconfig("ray", "ray-nodeless", work / "sa.kubeconfig")
    except BaseException:
        cp.stop()
        raise


KEYS = ["latency", "submit_to_registered", "registered_to_start", "requested_to_registered", "submit_to_queued",
        "queued_to_requested", "requested_to_allocated", "allocated_to_ray_running", "submit_to_create",
        "create_to_registered", "launch_to_node_added", "node_added_to_node_ready", "node_ready_to_node_schedulable",
        "node_schedulable_to_pod_added", "pod_added_to_pod_bound", "pod_bound_to_pod_running",
        "join_to_schedulable", "pod_running_to_start"]


def main() -> int:
    args = runs.parse_args(__doc__, timeout=180)
    cp: ControlPlane | None = None

    def make_benches(root: Path) -> list[lat.Ours]:
        nonlocal cp
        t = time.monotonic()
        cp, sa = start_control_plane(root / "cp")
        print(f"# control plane up in {time.monotonic() - t:.1f} s ({cp.server})", file=sys.stderr, flush=True)
        # The played kubelets register Nodes as the admin (a kubelet's own identity); the monitor inherits this
        # from the command runner that starts the head.
        os.environ["RAY_NODELESS_PLAYER_KUBECONFIG"] = str(cp.admin_kubeconfig)
        return [Vm(root / "vm", "v2", args.timeout, None), Kubernetes(root / "k8s", args.timeout, cp, sa)]

    # short prefix: Ray's socket paths live under --temp-dir
    rc, report = runs.run(args, make_benches, prefix="rnk8s-", dirs=("vm", "k8s", "cp"), k8s_name="kubernetes",
                          keys=KEYS, idle_timeout=180, teardown=lambda root: cp.stop() if cp else None)
    med = {n: reg["summary"].get("latency", {}).get("median") for n, reg in report["registrations"].items()}
    if len(med) == 2 and all(med.values()):
        report["ratio_of_medians"] = med["kubernetes"] / med["vm"]
        report["target"] = TARGET
        report["meets_target"] = report["ratio_of_medians"] <= TARGET
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(f"Launch latency, pending {{GPU: 1, CPU: 1}} task -> running, local backend: registration kubernetes "
              f"(real API server + scheduler, played kubelet) vs vm; autoscaler v2, update interval 1 s, "
              f"{args.reps} interleaved reps; instance {report['instance_type']}")
        runs.print_table(report, 12)
        if "ratio_of_medians" in report:
            print(f"ratio of medians (kubernetes / vm): {report['ratio_of_medians']:.2f}  "
                  f"(target <= {TARGET}: {'met' if report['meets_target'] else 'NOT met'})")
        runs.print_footer(report)
    return rc


if __name__ == "__main__":
    sys.exit(main())
