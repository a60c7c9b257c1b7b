#!/usr/bin/env python3
"""Launch latency of a machine that joins Kubernetes through a REAL kubelet (kubeadm join, containerd, the Ray pod
run in a container) next to `registration: vm`, both on the local backend, same workload, same autoscaler (v2), one
run, interleaved reps: pending {GPU: 1, CPU: 1} task -> running, and for the real kubelet the steps from the
machine's launch: Node registered, Ready, schedulable, pod created, bound, Running (pending pod -> running).

    .venv/bin/python benches/bench_kubelet_join.py              # 3 interleaved reps each (about 5 min)
    .venv/bin/python benches/bench_kubelet_join.py --reps 5 --json

Needs root and the node binaries (scripts/k8s/build_node.sh, `make k8s`). Setup: bench_k8s_registration.py's two
clusters, the kubernetes one with `local_real_kubelet` for its worker type (providers/local/real_kubelet.py): the
machine boots its generated kubeadm user data unchanged (JoinConfiguration v1beta2 for the v1.20.2 API server) on
this host's real kubelet v1.20.2 + containerd 1.6.20, against a control plane with bootstrap-token joins
(`ControlPlane(node_joins=True)`, kubeadm's init phases by testing/real_kubelet.py prepare_kubeadm_cluster). The Ray
pod is testing/real_kubelet.py's ray_host_pod_template (local image, hostNetwork, the venv hostPath-mounted). Each
rep's machine is a new boot: containerd started, images imported, kubeadm join, kubelet TLS bootstrap; between reps
the bench waits until the machine's pod, Node, kubelet and containerd are gone.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_k8s_registration as bk  # noqa: E402  (benches/ sibling; puts the repo root on sys.path)
import bench_launch_latency as lat  # noqa: E402

from ray_nodeless.providers.local.real_kubelet import RealKubeletMachine, node_dir  # noqa: E402
from ray_nodeless.testing.k8s_control_plane import ControlPlane  # noqa: E402
from ray_nodeless.testing.real_kubelet import (  # noqa: E402
    ensure_node_binaries, prepare_kubeadm_cluster, ray_host_pod_template,
)

ROOT = lat.ROOT
NODE_IP = "127.0.0.77"
PORT_BASE = 24500


class RealKubelet(bk.Kubernetes):
    name = "real-kubelet"

    def __init__(self, work: Path, timeout: float, cp: ControlPlane, sa: Path, machine_dir: Path, keys):
        super().__init__(work, timeout, cp, sa)
        block = self.cfg["provider"]["kubernetes"]
        block["join"] = keys.join_block()
        block["pod_template"] = ray_host_pod_template(node_ip=NODE_IP, port_base=PORT_BASE)
        block["join_timeout_s"] = 240
        self.cfg["provider"]["local_real_kubelet"] = {"node_type": "gpu_worker", "workdir": str(machine_dir),
                                                      "node_dir": str(node_dir())}
        self.machine = RealKubeletMachine(machine_dir)

    def worker_gone(self) -> bool:
        return super().worker_gone() and self.machine.machine_id() is None and not self.machine.live()

    def breakdown(self, r: dict) -> None:
        # the machines' records are the local backend's, inside the played-machines decorator
        self.backend = getattr(self.backend, "inner", self.backend)
        super().breakdown(r)
        log = self.machine.logs / "kubelet.log"
        r["real_kubelet"] = log.exists()

    def cleanup(self) -> None:
        try:
            super().cleanup()
        finally:
            self.machine.stop()


KEYS = ["latency", "launch_to_node_added", "node_added_to_node_ready", "node_ready_to_node_schedulable",
        "node_schedulable_to_pod_added", "pod_added_to_pod_bound", "pod_bound_to_pod_running", "pod_running_to_start",
        "submit_to_create", "create_to_registered"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions per registration (interleaved); default 3")
    ap.add_argument("--timeout", type=float, default=240, help="per task, seconds")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs) after the run")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("a real kubelet needs root", file=sys.stderr)
        return 2
    reproduce = f"{os.path.relpath(sys.executable, ROOT)} {shlex.join(sys.argv)}  (from {ROOT})"
    ensure_node_binaries()
    root = Path(tempfile.mkdtemp(prefix="rnkj-"))   # short: Ray's and containerd's sockets live under it
    for d in ("vm", "k8s", "cp", "m"):
        (root / d).mkdir()
    t_all = time.monotonic()
    cp: ControlPlane | None = None

    def make_benches() -> list[lat.Ours]:
        nonlocal cp
        t = time.monotonic()
        cp = ControlPlane(root / "cp", node_joins=True)
        cp.start()
        cp.apply_manifest(bk.RBAC)
        sa = cp.service_account_kubeconfig("ray", "ray-nodeless", root / "cp" / "sa.kubeconfig")
        keys = prepare_kubeadm_cluster(cp, root / "m")
        print(f"# control plane up and readied for kubeadm joins in {time.monotonic() - t:.1f} s", file=sys.stderr,
              flush=True)
        os.environ["RAY_NODELESS_PLAYER_KUBECONFIG"] = str(cp.admin_kubeconfig)
        return [bk.Vm(root / "vm", "v2", args.timeout, None),
                RealKubelet(root / "k8s", args.timeout, cp, sa, root / "m", keys)]

    def steps(b, r: dict) -> str:
        if b.name != "real-kubelet":
            return ""
        return " (" + ", ".join(f"{s} +{r[k]:.2f}" for s in bk.STEPS for k in r if k.endswith(f"_to_{s}")) + ")"

    def teardown() -> None:
        RealKubeletMachine(root / "m").stop()
        if cp:
            cp.stop()

    rc, head_s, benches = lat.run_interleaved(make_benches, args.reps, root, args.keep, rep_note=steps,
                                              idle_timeout=240, teardown=teardown)
    summ = {b.name: {k: s for k in KEYS if (s := lat.summarize(b.results, k))} for b in benches}
    report = {"autoscaler": "v2", "update_interval_s": 1, "reps": args.reps, "interleaved": True,
              "instance_type": benches[0].instance_type if benches else None, "head_start_s": head_s,
              "wall_s": time.monotonic() - t_all, "reproduce": reproduce,
              "registrations": {b.name: {"summary": summ[b.name], "runs": b.results} for b in benches}}
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(f"Launch latency, pending {{GPU: 1, CPU: 1}} task -> running, local backend: a real kubelet "
              f"(kubeadm join, containerd) vs registration vm; autoscaler v2, {args.reps} interleaved reps")
        print(f"{'registration':13s} {'metric':32s} {'median':>8s} {'min':>8s} {'max':>8s}  n")
        for b in benches:
            for k, s in summ[b.name].items():
                print(f"{b.name:13s} {k:32s} {s['median']:8.2f} {s['min']:8.2f} {s['max']:8.2f}  {s['n']}")
        print(f"wall {report['wall_s']:.0f} s")
        print(f"reproduce: {reproduce}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
