#!/usr/bin/env python3
"""The KubeRay bridge's launch latency next to a VM registration, same run: time from a pending {GPU: 1, CPU: 1}
task to that task running, and for the bridge the pending Ray pod's own time (pod created -> Running).

    .venv/bin/python benches/bench_kuberay_bridge.py              # 3 interleaved reps each
    .venv/bin/python benches/bench_kuberay_bridge.py --reps 5 --json

- vm: bench_launch_latency's "ours" (local backend, `registration: vm`: the backend starts the worker's
  `ray start --block` itself), autoscaler v1 (as the bridge's head below runs it).
- kuberay: a REAL control plane (ray_nodeless/testing/k8s_control_plane.py) with KubeRay's RayCluster CRD; the
  operator's part played (ray_nodeless/testing/kuberay.py: head pod object, head service, status, its Role); a
  local `ray start --head --no-monitor` as the head pod's Ray; `ray-nodeless kuberay-autoscaler` as the autoscaler
  container, as the head's ServiceAccount; the RayCluster's gpu-group {CPU: 1, GPU: 1} -> the cheapest-fit machine
  (local backend, AWS us-west-2 prices), its Node registered by the played kubelet from the kubeadm user data, the
  group's Ray pod created by the registration, bound by the real scheduler, run by the played kubelet.
Measurement: bench_launch_latency's driver (latency = task start - submission); for kuberay a watch on the
cluster's Nodes and pods times launch -> Node added -> Ready -> schedulable -> pod added -> bound -> Running
(`pod_added_to_pod_running` is the pending-pod-to-running time). Between reps each waits until its worker is gone.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_k8s_registration as kreg  # noqa: E402  (benches/ siblings; put the repo root on sys.path)
import bench_launch_latency as lat  # noqa: E402
import registration_runs as runs  # noqa: E402

from kubernetes import client  # noqa: E402

from ray_nodeless.providers.local.backend import LocalBackend  # noqa: E402
from ray_nodeless.kuberay import bridge as K  # noqa: E402
from ray_nodeless.ray_compat.kuberay import derive_config  # noqa: E402
from ray_nodeless.registrations.kubernetes import labels as L  # noqa: E402
from ray_nodeless.testing.k8s_control_plane import ControlPlane  # noqa: E402
from ray_nodeless.testing.kuberay import NS, Bridge, Operator, install_kuberay, raycluster  # noqa: E402
from ray_nodeless.testing.ray_processes import head_process  # noqa: E402

ROOT = lat.ROOT


class KubeRay(lat.Bench):
    name = "kuberay"

    def __init__(self, work: Path, timeout: float, cp: ControlPlane, sa_kubeconfig: Path):
        super().__init__(work, "v1", timeout)
        self.cp = cp
        self.cluster = f"bench-kr-{uuid.uuid4().hex[:6]}"
        self.rc = raycluster(self.cluster, self.port, work / "state", sa_kubeconfig, cp.server, gpu_cpus="1",
                             gpu_memory="1Gi", idle_s=6)
        cfg = K.bridge_config(dict(self.rc, metadata=dict(self.rc["metadata"], uid="x")), derive_config(self.rc))
        cfg["provider"].pop("kuberay")
        self.backend = LocalBackend.from_provider(dict(cfg["provider"]), self.cluster)
        self.admin = cp.api_client()
        self.core = client.CoreV1Api(self.admin)
        self.op = Operator(self.admin)
        self.selector = L.cluster_selector(self.cluster)
        self.timeline = kreg.Timeline(self.admin, self.cluster)
        self.bridge = Bridge.command(self.cluster, self.gcs, sa_kubeconfig, cp.admin_kubeconfig, work / "bridge.log")
        self._head = None
        self.instance_type = ""

    def start(self) -> float:
        t = time.monotonic()
        self.op.apply(self.rc)
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        env = dict(lat.BASE_ENV, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
        self._head = head_process(env, self.port, str(self.temp_dir), ("--no-monitor",))
        self._head.__enter__()
        self.bridge.env["AUTOSCALER_METRIC_PORT"] = str(self.metrics_port)
        self.bridge.start()
        deadline = time.monotonic() + 120
        while K.FINALIZER not in (self.op.get(self.cluster)["metadata"].get("finalizers") or []):
            if time.monotonic() > deadline:
                raise RuntimeError(f"kuberay: the bridge did not start:\n{self.bridge.tail()}")
            time.sleep(0.5)
        return time.monotonic() - t

    def worker_gone(self) -> bool:
        return (not self.backend.list_machines() and super().worker_gone()
                and not self.core.list_node(label_selector=self.selector).items
                and not self.core.list_namespaced_pod(NS, label_selector=self.selector).items)

    def breakdown(self, r: dict) -> None:
        rec = self.backend.nodes.get(r["instance"] or "")
        if rec is None:
            return
        self.instance_type = rec.tags.get("nodeless-instance-type", "")
        t = self.timeline.of(r["instance"])
        runs.add_step_times(r, t, rec.started_at)
        if "pod_added" in t and "pod_running" in t:
            r["pod_added_to_pod_running"] = t["pod_running"] - t["pod_added"]

    def cleanup(self) -> None:
        try:
            self.bridge.stop()
            ids = [m.id for m in self.backend.list_machines()]
            if ids:
                self.backend.terminate(ids)
            for n in self.core.list_node(label_selector=self.selector).items:
                self.core.delete_node(n.metadata.name)
            self.core.delete_collection_namespaced_pod(NS, label_selector=f"ray.io/cluster={self.cluster}",
                                                       grace_period_seconds=0)
            if self.op.get(self.cluster) is not None:
                self.op.patch(self.cluster, {"metadata": {"finalizers": []}})
                self.op.delete(self.cluster)
        finally:
            kreg.stop_played_pods(self.cluster, self.gcs)   # the bridge that played them is gone
            if self._head is not None:
                self._head.__exit__(None, None, None)
            self.timeline.close()
            self.admin.close()


KEYS = ["latency", "submit_to_registered", "registered_to_start", "launch_to_node_added", "node_added_to_node_ready",
        "node_ready_to_node_schedulable", "node_schedulable_to_pod_added", "pod_added_to_pod_bound",
        "pod_bound_to_pod_running", "pod_added_to_pod_running", "pod_running_to_start"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions per registration (interleaved); default 3")
    ap.add_argument("--timeout", type=float, default=180, help="per task, seconds")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs) after the run")
    args = ap.parse_args()
    reproduce = f"{os.path.relpath(sys.executable, ROOT)} {shlex.join(sys.argv)}  (from {ROOT})"
    root = Path(tempfile.mkdtemp(prefix="rnkr-"))   # short: Ray's socket paths live under --temp-dir
    for d in ("vm", "kr", "cp"):
        (root / d).mkdir()
    t_all = time.monotonic()
    cp: ControlPlane | None = None

    def make_benches() -> list:
        nonlocal cp
        cp = ControlPlane(root / "cp")
        cp.start()
        sa = install_kuberay(cp, root / "cp")
        return [kreg.Vm(root / "vm", "v1", args.timeout, None), KubeRay(root / "kr", args.timeout, cp, sa)]

    rc, head_s, benches = lat.run_interleaved(make_benches, args.reps, root, args.keep, idle_timeout=180,
                                              teardown=lambda: cp.stop() if cp else None)
    summ = {b.name: {k: s for k in KEYS if (s := lat.summarize(b.results, k))} for b in benches}
    report = {"autoscaler": "v1", "update_interval_s": 1, "reps": args.reps, "interleaved": True,
              "instance_types": {b.name: b.instance_type for b in benches}, "head_start_s": head_s,
              "wall_s": time.monotonic() - t_all, "reproduce": reproduce,
              "registrations": {b.name: {"summary": summ[b.name], "runs": b.results} for b in benches}}
    med = {n: s.get("latency", {}).get("median") for n, s in summ.items()}
    if len(med) == 2 and all(med.values()):
        report["ratio_of_medians"] = med["kuberay"] / med["vm"]
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(f"Pending {{GPU: 1, CPU: 1}} task -> running: the KubeRay bridge (real API server + scheduler, played "
              f"kubelet) vs registration vm, local backend, autoscaler v1, update interval 1 s, {args.reps} "
              f"interleaved reps; instances {report['instance_types']}")
        print(f"{'registration':12s} {'metric':32s} {'median':>8s} {'min':>8s} {'max':>8s}  n")
        for b in benches:
            for k, s in summ[b.name].items():
                print(f"{b.name:12s} {k:32s} {s['median']:8.2f} {s['min']:8.2f} {s['max']:8.2f}  {s['n']}")
        if "ratio_of_medians" in report:
            print(f"ratio of medians (kuberay / vm): {report['ratio_of_medians']:.2f}")
        print(f"reproduce: {reproduce}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
