#!/usr/bin/env python3
"""`make demo`: a local Ray cluster autoscaled by ray_nodeless, running a successive-halving sweep.

1. `ray up` on cluster-configs/local-cpu-head.yaml (a CPU-only head; GPU workers {CPU: 4, GPU: 1} planned
   cheapest-fit from the AWS us-west-2 catalog, spot first), after printing the plan (`ray-nodeless plan`).
2. Runs examples/automl_sweep.py against it, while a watcher prints every scale-up (the instance chosen and why)
   and every scale-down.
3. Waits for the idle workers to be removed, prints a cost report: node-hours and dollars per instance type under
   ray_nodeless, against a fixed 3 x g4dn.4xlarge cluster held for the same wall time; then `ray down`.
Nothing is left running: `ray down` stops the head, and a final sweep stops anything this cluster started.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ray_nodeless.core.catalog import embedded  # noqa: E402
from ray_nodeless.core.cluster_plan import load_cluster_yaml, plan_cluster  # noqa: E402
from ray_nodeless.providers.base import TAG_CAPACITY, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_RULE, TAG_ZONE  # noqa: E402
from ray_nodeless.providers.local.backend import LocalBackend  # noqa: E402
from ray_nodeless.providers.local.scoped_stop import stop_marked_processes  # noqa: E402

BIN = Path(sys.executable).parent
ENV = dict(os.environ, RAY_AUTH_MODE="disabled", PATH=f"{BIN}:{os.environ.get('PATH', '')}")
BASELINE = ("g4dn.4xlarge", 3)


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Watcher(threading.Thread):
    """Polls the cluster's machines once a second; prints launches and terminations; records lifetimes."""

    def __init__(self, cfg: dict, plans: dict):
        super().__init__(daemon=True)
        self.backend = LocalBackend.from_provider(dict(cfg["provider"]), cfg["cluster_name"])
        self.plans = plans
        self.seen: dict[str, dict] = {}
        self.lifetimes: dict[str, list] = {}     # id -> [tags, start, end]
        self.stop_event = threading.Event()

    def workers(self) -> int:
        return sum(1 for v in self.lifetimes.values() if v[2] is None and v[0].get("ray-node-type") == "worker")

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.poll()
            self.stop_event.wait(1.0)
        self.poll()

    def poll(self) -> None:
        now = time.time()
        try:
            current = {m.id: m.tags for m in self.backend.list_machines()}
        except Exception as e:   # a demo must not die on one bad poll
            say(f"listing failed: {e}")
            return
        for mid, tags in sorted(current.items()):
            if mid in self.lifetimes:
                continue
            self.lifetimes[mid] = [tags, now, None]
            plan = self.plans.get(tags.get("ray-user-node-type", ""))
            why = ""
            if plan is not None:
                alts = ", ".join(f"{o.instance_type.name} {o.capacity} ${o.hourly_price:.4f}"
                                 for o in plan.top(4)[1:] if o.instance_type.name != tags.get(TAG_INSTANCE_TYPE))
                why = (f" - cheapest of {len(plan)} candidates for {plan.request.shape.describe()} under rule "
                       f"{tags.get(TAG_RULE)!r}" + (f" (next: {alts})" if alts else ""))
            say(f"scale-up: {tags.get('ray-node-type')} {mid} ({tags.get('ray-user-node-type')}) -> "
                f"{tags.get(TAG_INSTANCE_TYPE)} {tags.get(TAG_ZONE)} {tags.get(TAG_CAPACITY)} "
                f"${float(tags.get(TAG_PRICE, 0)):.4f}/h{why}")
        for mid, rec in sorted(self.lifetimes.items()):
            if rec[2] is None and mid not in current:
                rec[2] = now
                say(f"scale-down: {mid} ({rec[0].get(TAG_INSTANCE_TYPE)}) removed after {now - rec[1]:.0f} s")


def report(watcher: Watcher, wall_s: float, region: str) -> None:
    hours: dict[str, float] = defaultdict(float)
    cost: dict[str, float] = defaultdict(float)
    end_now = time.time()
    for tags, start, end in watcher.lifetimes.values():
        h = ((end or end_now) - start) / 3600
        key = f"{tags.get(TAG_INSTANCE_TYPE)} ({tags.get(TAG_CAPACITY)})"
        hours[key] += h
        cost[key] += h * float(tags.get(TAG_PRICE, 0))
    rc = embedded().region("aws", region)
    base = rc.find(BASELINE[0], sorted(rc.zones)[0], "on-demand")
    fixed = base.hourly_price * BASELINE[1] * wall_s / 3600
    total = sum(cost.values())
    print()
    print(f"Cost report ({wall_s:.0f} s of cluster wall time; prices from the AWS {region} catalog)")
    print(f"  {'instance type':30} {'node-hours':>11} {'USD':>10}")
    for key in sorted(hours):
        print(f"  {key:30} {hours[key]:11.4f} {cost[key]:10.5f}")
    print(f"  {'ray_nodeless total':30} {sum(hours.values()):11.4f} {total:10.5f}")
    print(f"  {'fixed 3 x g4dn.4xlarge':30} {BASELINE[1] * wall_s / 3600:11.4f} {fixed:10.5f}"
          f"   (${base.hourly_price:.3f}/h each, held for the same wall time)")
    if fixed:
        print(f"  ray_nodeless cost {100 * (1 - total / fixed):.1f} % less than the fixed cluster")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "cluster-configs" / "local-cpu-head.yaml"))
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--rung-seconds", type=float, default=4.0)
    ap.add_argument("--scale-down-timeout", type=float, default=90.0)
    args = ap.parse_args()

    cfg = load_cluster_yaml(args.config)
    cp = plan_cluster(cfg)
    say("plan (ray-nodeless plan " + os.path.relpath(args.config) + "):")
    subprocess.run([str(BIN / "ray-nodeless"), "plan", args.config], env=ENV, check=True)
    watcher = Watcher(cfg, cp.plans)
    t_up = time.time()
    try:
        say("ray up ...")
        up = subprocess.run([str(BIN / "ray"), "up", "-y", args.config], env=ENV, capture_output=True, text=True)
        if up.returncode != 0:
            print(up.stdout[-3000:], up.stderr[-3000:], file=sys.stderr)
            say("ray up failed")
            return 1
        say(f"cluster up in {time.time() - t_up:.0f} s")
        watcher.start()
        address = cfg["provider"]["gcs_address"]
        sweep = subprocess.run([sys.executable, str(ROOT / "examples" / "automl_sweep.py"), "--address", address,
                                "--trials", str(args.trials), "--rung-seconds", str(args.rung_seconds)], env=ENV)
        if sweep.returncode != 0:
            say("the sweep failed")
            return 1
        say("sweep finished; waiting for idle workers to be removed (idle_timeout_minutes "
            f"{cfg.get('idle_timeout_minutes')})")
        deadline = time.time() + args.scale_down_timeout
        while watcher.workers() and time.time() < deadline:
            time.sleep(1)
        wall = time.time() - t_up
        watcher.stop_event.set()
        watcher.join(timeout=5)
        say("status (ray-nodeless status):")
        subprocess.run([str(BIN / "ray-nodeless"), "status", args.config], env=ENV, check=False)
        report(watcher, wall, cp.settings.region)
        return 0
    finally:
        watcher.stop_event.set()
        say("ray down ...")
        subprocess.run([str(BIN / "ray"), "down", "-y", args.config], env=ENV, capture_output=True, text=True)
        backend = LocalBackend.from_provider(dict(cfg["provider"]), cfg["cluster_name"])
        left = [m.id for m in backend.list_machines()]
        if left:
            backend.terminate(left)
        stopped = stop_marked_processes(backend.runner_marker, force=True)
        say(f"cluster down; {len(left)} machine(s) and {stopped} process(es) were left and have been stopped"
            if left or stopped else "cluster down; nothing left running")


if __name__ == "__main__":
    sys.exit(main())
