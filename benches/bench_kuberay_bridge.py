#!/usr/bin/env python3
"""The KubeRay bridge's launch latency next to a VM registration, same run: time from a pending {GPU: 1, CPU: 1}
task to that task running, and for the bridge the pending Ray pod's own time (pod created -> Running).

    .venv/bin/python benches/bench_kuberay_bridge.py              # 3 interleaved reps each, the real operator
    .venv/bin/python benches/bench_kuberay_bridge.py --reps 5 --json
    .venv/bin/python benches/bench_kuberay_bridge.py --operator played    # the operator's part played instead

- vm: bench_launch_latency's "ours" (local backend, `registration: vm`: the backend starts the worker's
  `ray start --block` itself), autoscaler v1 (as the bridge's head below runs it).
- kuberay: a REAL control plane (ray_nodeless/testing/k8s_control_plane.py) with KubeRay's RayCluster CRD; the
  operator's part played (ray_nodeless/testing/kuberay.py: head pod object, head service, status, its Role); a
  local `ray start --head --no-monitor` as the head pod's Ray; `ray-nodeless kuberay-autoscaler` as the autoscaler
  container, as the head's ServiceAccount; the RayCluster's gpu-group {CPU: 1, GPU: 1} -> the cheapest-fit machine
  (local backend, AWS us-west-2 prices), its Node registered by the played kubelet from the kubeadm user data, the
  group's Ray pod created by the registration, bound by the real scheduler, run by the played kubelet.
- kuberay-op (the default, `--operator real`; kuberay is `--operator played`, since the real operator reconciles
  every RayCluster of the namespace and a run has one or the other): the same with the REAL KubeRay operator
  v1.5.0 (testing/kuberay_operator.py RealOperator, built by `make k8s`): the operator creates the head pod, its
  service and the status; the head pod's kubelet is played (HeadPodStandIn: the Ray head a local process, the
  bridge's container the pod's own command and env), the workers' as for kuberay.
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
from typing import Any

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
from ray_nodeless.testing.kuberay_operator import HEAD_HOST_LABEL, HeadPodStandIn, RealOperator  # noqa: E402
from ray_nodeless.providers.local.players import PLAYER_KUBECONFIG_ENV  # noqa: E402
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
        self.await_bridge()
        return time.monotonic() - t

    def await_bridge(self, timeout_s: float = 120) -> None:
        """Until the bridge has marked the RayCluster with its finalizer (it checked the cluster and runs)."""
        deadline = time.monotonic() + timeout_s
        while K.FINALIZER not in (self.op.get(self.cluster)["metadata"].get("finalizers") or []):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: the bridge did not start:\n{self.bridge.tail()}")
            time.sleep(0.5)

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


class KubeRayOperator(KubeRay):
    """kuberay-op: the same RayCluster with the REAL KubeRay operator (v1.5.0, testing/kuberay_operator.py
    RealOperator): the operator creates the head pod, its service and the status; the head pod's kubelet is played
    (HeadPodStandIn: the Ray head as a local process, the bridge's container run as the pod's own command and env)."""
    name = "kuberay-op"

    def __init__(self, work: Path, timeout: float, cp: ControlPlane, sa_kubeconfig: Path):
        super().__init__(work, timeout, cp, sa_kubeconfig)
        self.op = Operator(self.admin, played=False)
        head = self.rc["spec"]["headGroupSpec"]["template"]["spec"]
        head["nodeSelector"] = {HEAD_HOST_LABEL: self.cluster}      # the Node played for the head pod
        head["tolerations"] = [{"key": HEAD_HOST_LABEL, "operator": "Equal", "value": self.cluster,
                                "effect": "NoSchedule"}]
        self.stand_in = HeadPodStandIn(self.admin, self.cluster, work, sa_kubeconfig, extra_env={
            PLAYER_KUBECONFIG_ENV: str(cp.admin_kubeconfig), "AUTOSCALER_METRIC_PORT": str(self.metrics_port)})
        self._running: Any = None

    def start(self) -> float:
        t = time.monotonic()
        self.op.apply(self.rc)
        self._running = self.stand_in.running()
        self._running.__enter__()
        assert self.stand_in.bridge is not None
        self.bridge = self.stand_in.bridge
        self.await_bridge()
        return time.monotonic() - t

    def cleanup(self) -> None:
        running, self._running = self._running, None
        try:
            super().cleanup()
        finally:
            if running is not None:
                running.__exit__(None, None, None)


KEYS = ["latency", "submit_to_registered", "registered_to_start", "launch_to_node_added", "node_added_to_node_ready",
        "node_ready_to_node_schedulable", "node_schedulable_to_pod_added", "pod_added_to_pod_bound",
        "pod_bound_to_pod_running", "pod_added_to_pod_running", "pod_running_to_start"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions per registration (interleaved); default 3")
    ap.add_argument("--timeout", type=float, default=180, help="per task, seconds")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs) after the run")
    ap.add_argument("--operator", choices=("real", "played"), default="real",
                    help="the KubeRay operator: the real one (v1.5.0, `make k8s`; default) or the test's played one")
    args = ap.parse_args()
    reproduce = f"{os.path.relpath(sys.executable, ROOT)} {shlex.join(sys.argv)}  (from {ROOT})"
    root = Path(tempfile.mkdtemp(prefix="rnkr-"))   # short: Ray's socket paths live under --temp-dir
    for d in ("vm", "kr", "ko", "cp"):
        (root / d).mkdir()
    t_all = time.monotonic()
    cp: ControlPlane | None = None

    operator: RealOperator | None = None

    def make_benches() -> list:
        nonlocal cp, operator
        cp = ControlPlane(root / "cp")
        cp.start()
        sa = install_kuberay(cp, root / "cp")
        vm = kreg.Vm(root / "vm", "v1", args.timeout, None)
        if args.operator == "played":
            return [vm, KubeRay(root / "kr", args.timeout, cp, sa)]
        # The real operator reconciles every RayCluster of the namespace: a played operator's beside it would
        # collide with it (both create the head service), so a run has one or the other.
        operator = RealOperator(cp, root / "op").start()
        return [vm, KubeRayOperator(root / "ko", args.timeout, cp, sa)]

    def teardown() -> None:
        if operator is not None:
            operator.stop()
        if cp is not None:
            cp.stop()

    rc, head_s, benches = lat.run_interleaved(make_benches, args.reps, root, args.keep, idle_timeout=180,
                                              teardown=teardown)
    summ = {b.name: {k: s for k in KEYS if (s := lat.summarize(b.results, k))} for b in benches}
    report = {"autoscaler": "v1", "operator": args.operator, "update_interval_s": 1, "reps": args.reps,
              "interleaved": True,
              "instance_types": {b.name: b.instance_type for b in benches}, "head_start_s": head_s,
              "wall_s": time.monotonic() - t_all, "reproduce": reproduce,
              "registrations": {b.name: {"summary": summ[b.name], "runs": b.results} for b in benches}}
    med = {n: s.get("latency", {}).get("median") for n, s in summ.items()}
    report["ratio_of_medians"] = {f"{n} / vm": med[n] / med["vm"] for n in ("kuberay", "kuberay-op")
                                  if med.get(n) and med.get("vm")}
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(f"Pending {{GPU: 1, CPU: 1}} task -> running: the KubeRay bridge (real API server + scheduler, played "
              f"kubelets; kuberay: the operator's part played, kuberay-op: the real KubeRay operator) vs "
              f"registration vm, local backend, autoscaler v1, update interval 1 s, {args.reps} interleaved reps; "
              f"instances {report['instance_types']}")
        print(f"{'registration':12s} {'metric':32s} {'median':>8s} {'min':>8s} {'max':>8s}  n")
        for b in benches:
            for k, s in summ[b.name].items():
                print(f"{b.name:12s} {k:32s} {s['median']:8.2f} {s['min']:8.2f} {s['max']:8.2f}  {s['n']}")
        for what, ratio in report["ratio_of_medians"].items():
            print(f"ratio of medians ({what}): {ratio:.2f}")
        print(f"reproduce: {reproduce}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
