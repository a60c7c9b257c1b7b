"""What bench_k8s_registration.py and bench_kubelet_join.py share: their command line, the interleaved run of a
`registration: vm` cluster next to a Kubernetes one (bench_launch_latency.run_interleaved), the per-metric summary
and report, the per-rep note of the Kubernetes steps, and the table. The two benches differ only in the Kubernetes
side (played kubelet vs real kubelet), its keys and the table's title.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import bench_launch_latency as lat

STEPS = ("node_added", "node_ready", "node_schedulable", "pod_added", "pod_bound", "pod_running")


def add_step_times(r: dict, timeline: dict, launched_at: float) -> None:
    """Into the rep's result `r`: each Kubernetes step's seconds after the one before it (`<prev>_to_<step>`, the
    first from the machine's launch at `launched_at`) and, once the pod ran, `pod_running_to_start`."""
    prev, prev_t = "launch", launched_at
    for s in STEPS:
        if s in timeline:
            r[f"{prev}_to_{s}"] = timeline[s] - prev_t
            prev, prev_t = s, timeline[s]
    if "pod_running" in timeline:
        r["pod_running_to_start"] = r["start"] - timeline["pod_running"]


def parse_args(doc: str, timeout: float) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions per registration (interleaved); default 3")
    ap.add_argument("--timeout", type=float, default=timeout, help="per task, seconds")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs) after the run")
    return ap.parse_args()


def steps_note(k8s_name: str) -> Callable[[object, dict], str]:
    """The rep line's note for the Kubernetes bench: each step's seconds after the one before it."""
    def note(b, r: dict) -> str:
        if b.name != k8s_name:
            return ""
        return " (" + ", ".join(f"{s} +{r[k]:.2f}" for s in STEPS for k in r if k.endswith(f"_to_{s}")) + ")"
    return note


def run(args: argparse.Namespace, make_benches: Callable[[Path], list], *, prefix: str, dirs: Sequence[str],
        k8s_name: str, keys: Sequence[str], idle_timeout: float,
        teardown: Callable[[Path], None]) -> tuple[int, dict]:
    """Interleaved reps of the benches `make_benches(root)` returns, in a new work dir with `dirs` (a short path:
    Ray's and containerd's sockets live under it); `teardown(root)` after their clean-up. Returns (exit status,
    report): each registration's summary over `keys` (median, min, max, n) and its runs."""
    reproduce = f"{os.path.relpath(sys.executable, lat.ROOT)} {shlex.join(sys.argv)}  (from {lat.ROOT})"
    root = Path(tempfile.mkdtemp(prefix=prefix))
    for d in dirs:
        (root / d).mkdir()
    t_all = time.monotonic()
    rc, head_s, benches = lat.run_interleaved(lambda: make_benches(root), args.reps, root, args.keep,
                                              rep_note=steps_note(k8s_name), idle_timeout=idle_timeout,
                                              teardown=lambda: teardown(root))
    summ = {b.name: {k: s for k in keys if (s := lat.summarize(b.results, k))} for b in benches}
    report = {"autoscaler": "v2", "update_interval_s": 1, "reps": args.reps, "interleaved": True,
              "instance_type": benches[0].instance_type if benches else None, "head_start_s": head_s,
              "wall_s": time.monotonic() - t_all, "reproduce": reproduce,
              "registrations": {b.name: {"summary": summ[b.name], "runs": b.results} for b in benches}}
    return rc, report


def print_table(report: dict, name_width: int) -> None:
    """One row per registration and metric: median, min, max and count, in seconds."""
    print(f"{'registration':{name_width}s} {'metric':32s} {'median':>8s} {'min':>8s} {'max':>8s}  n")
    for name, reg in report["registrations"].items():
        for k, s in reg["summary"].items():
            print(f"{name:{name_width}s} {k:32s} {s['median']:8.2f} {s['min']:8.2f} {s['max']:8.2f}  {s['n']}")


def print_footer(report: dict) -> None:
    print(f"wall {report['wall_s']:.0f} s")
    print(f"reproduce: {report['reproduce']}")
