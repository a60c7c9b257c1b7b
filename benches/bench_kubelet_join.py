#!/usr/bin/env python3
"""Launch latency of a machine that joins Kubernetes through a REAL kubelet (kubeadm join, containerd, the Ray pod
run in a container) next to `registration: vm`, both on the local backend, same workload, same autoscaler (v2), one
run, interleaved reps: pending {GPU: 1, CPU: 1} task -> running, and for the real kubelet the steps from the
machine's launch: Node registered, Ready, schedulable, pod created, bound, Running (pending pod -> running).

    .venv/bin/python benches/bench_kubelet_join.py              # 3 interleaved reps each (about 5 min)
    .venv/bin/python benches/bench_kubelet_join.py --reps 5 --json

Needs root and the node binaries (scripts/k8s/build_node.sh, `make k8s`). Setup: bench_k8s_registration.py's two
clusters, the kubernetes one with `local_real_kubelet` for its worker type (providers/local/real_kubelet.py): the
machine boots its generated kubeadm user data unchanged (JoinConfiguration v1beta4 for the 1.36 API server) on
this host's real kubelet 1.36 + containerd 1.6.20, against a control plane with bootstrap-token joins
(`ControlPlane(node_joins=True)`, kubeadm's init phases by testing/real_kubelet.py prepare_kubeadm_cluster). The Ray
pod is testing/real_kubelet.py's ray_host_pod_template (local image, hostNetwork, the venv hostPath-mounted). Each
rep's machine is a new boot: containerd started, images imported, kubeadm join, kubelet TLS bootstrap; between reps
the bench waits until the machine's pod, Node, kubelet and containerd are gone.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_k8s_registration as bk  # noqa: E402  (benches/ sibling; puts the repo root on sys.path)
import bench_launch_latency as lat  # noqa: E402
import registration_runs as runs  # noqa: E402

from ray_nodeless.providers.local.real_kubelet import RealKubeletMachine, node_dir  # noqa: E402
from ray_nodeless.testing.k8s_control_plane import ControlPlane  # noqa: E402
from ray_nodeless.testing.real_kubelet import (  # noqa: E402
    ensure_node_binaries, prepare_kubeadm_cluster, ray_host_pod_template,
)

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
    args = runs.parse_args(__doc__, timeout=240)
    if os.geteuid() != 0:
        print("a real kubelet needs root", file=sys.stderr)
        return 2
    ensure_node_binaries()
    cp: ControlPlane | None = None

    def make_benches(root: Path) -> list[lat.Ours]:
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

    def teardown(root: Path) -> None:
        RealKubeletMachine(root / "m").stop()
        if cp:
            cp.stop()

    # short prefix: Ray's and containerd's sockets live under it
    rc, report = runs.run(args, make_benches, prefix="rnkj-", dirs=("vm", "k8s", "cp", "m"), k8s_name="real-kubelet",
                          keys=KEYS, idle_timeout=240, teardown=teardown)
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(f"Launch latency, pending {{GPU: 1, CPU: 1}} task -> running, local backend: a real kubelet "
              f"(kubeadm join, containerd) vs registration vm; autoscaler v2, {args.reps} interleaved reps")
        runs.print_table(report, 13)
        runs.print_footer(report)
    return rc


if __name__ == "__main__":
    sys.exit(main())
