#!/usr/bin/env python3
"""`make demo`: a local Ray cluster autoscaled by ray_nodeless, running a Ray Tune sweep (ASHA, one GPU a trial).

1. `ray up` on cluster-configs/local-cpu-head.yaml (a CPU-only head; GPU workers {CPU: 4, GPU: 1} planned
   cheapest-fit from the AWS us-west-2 catalog, spot first), after printing the plan (`ray-nodeless plan`). The
   demo runs a copy of the config whose head also serves Ray's dashboard on 127.0.0.1 (the state API the trace
   recorder reads).
2. Runs examples/tune_sweep.py against it, while a watcher prints every scale-up (the instance chosen and why)
   and every scale-down.
3. Waits for the idle workers to be removed, records the run (`ray-nodeless trace record`), replays it with
   `ray-nodeless simulate`'s engine under the same config, and prints a cost report: node-hours and dollars per
   instance type under ray_nodeless, against a fixed 3 x g4dn.4xlarge cluster held for the same wall time and
   against the lower bound (every useful task-hour on its cheapest allowed offering, plus the head); then
   `ray down`.
Nothing is left running: `ray down` stops the head, and a final sweep stops anything this cluster started.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ray_nodeless.core.catalog import embedded  # noqa: E402
from ray_nodeless.core.cluster_plan import load_cluster_yaml, plan_cluster  # noqa: E402
from ray_nodeless.providers.base import TAG_CAPACITY, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_RULE, TAG_ZONE  # noqa: E402
from ray_nodeless.providers.local.backend import LocalBackend  # noqa: E402
from ray_nodeless.providers.local.scoped_stop import stop_marked_processes  # noqa: E402
from ray_nodeless.simulate.calibrate import cloud_machines, measured_timing  # noqa: E402
from ray_nodeless.simulate.config import config_from_cluster  # noqa: E402
from ray_nodeless.simulate.engine import simulate  # noqa: E402
from ray_nodeless.trace.model import parse_trace  # noqa: E402
from ray_nodeless.trace.record import record_trace  # noqa: E402

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_dashboard(cfg: dict, out_dir: Path) -> tuple[Path, int]:
    """A copy of the config whose head serves the dashboard on 127.0.0.1 (the trace recorder reads its state API)."""
    port = free_port()
    flags = f"--include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port={port}"
    cmds = []
    for c in cfg.get("head_start_ray_commands") or []:
        c = re.sub(r"--include-dashboard=\S+", "", c)
        cmds.append(c.replace("ray start --head", f"ray start --head {flags}", 1) if "ray start" in c else c)
    cfg = dict(cfg, head_start_ray_commands=cmds)
    path = out_dir / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path, port


def overlap_hours(start: float, end: float, lo: float, hi: float) -> float:
    return max(0.0, min(end, hi) - max(start, lo)) / 3600


def replay(config: Path, trace_doc: dict, watcher: Watcher, window_s: tuple[float, float]) -> dict:
    """The recorded run replayed under the same config, with this run's own timing, each figure measured in the run
    (simulate/calibrate.py: launch latency and how many nodes started at once, from the watcher's listings and the
    node table; the time from a node having room to a trial running; the scale-down latency). Both sides are
    billed the same way from the run's first demand (a trial's placement group request) on."""
    trace = parse_trace(trace_doc, "recorded run")
    timing = measured_timing(trace_doc, cloud_machines(trace_doc))
    r = simulate(trace, config_from_cluster(str(config), trace.default_schedule, False), **timing.kwargs())
    lo, hi = window_s
    # As the replay bills: the head for the run window, each worker from its launch to its end (idle tail
    # included: the replay models idle_timeout_minutes too).
    measured = sum(overlap_hours(s, e or time.time(), lo, hi if tags.get("ray-node-type") == "head" else 1e12)
                   for tags, s, e in watcher.lifetimes.values())
    return {"result": r, "launch_latency_s": timing.launch_latency_ms / 1000, "timing": timing.to_dict(),
            "measured_node_hours": measured, "replayed_node_hours": sum(r.node_hours().values())}


def report(watcher: Watcher, wall_s: float, region: str, head_price: float, rep: dict | None) -> dict:
    hours: dict[str, float] = defaultdict(float)
    cost: dict[str, float] = defaultdict(float)
    end_now = time.time()
    head_cost = 0.0
    for tags, start, end in watcher.lifetimes.values():
        h = ((end or end_now) - start) / 3600
        key = f"{tags.get(TAG_INSTANCE_TYPE)} ({tags.get(TAG_CAPACITY)})"
        hours[key] += h
        cost[key] += h * float(tags.get(TAG_PRICE, 0))
        if tags.get("ray-node-type") == "head":
            head_cost += h * float(tags.get(TAG_PRICE, 0))
    rc = embedded().region("aws", region)
    base = rc.find(BASELINE[0], sorted(rc.zones)[0], "on-demand")
    fixed = base.hourly_price * BASELINE[1] * wall_s / 3600
    total = sum(cost.values())
    out = {"wall_s": round(wall_s, 1), "cost": round(total, 6), "node_hours": round(sum(hours.values()), 6),
           "fixed_cost": round(fixed, 6)}
    print()
    print(f"Cost report ({wall_s:.0f} s of cluster wall time; prices from the AWS {region} catalog)")
    print(f"  {'instance type':30} {'node-hours':>11} {'USD':>10}")
    for key in sorted(hours):
        print(f"  {key:30} {hours[key]:11.4f} {cost[key]:10.5f}")
    print(f"  {'ray_nodeless total':30} {sum(hours.values()):11.4f} {total:10.5f}")
    print(f"  {'fixed 3 x g4dn.4xlarge':30} {BASELINE[1] * wall_s / 3600:11.4f} {fixed:10.5f}"
          f"   (${base.hourly_price:.3f}/h each, held for the same wall time)")
    if rep is not None:
        r = rep["result"]
        useful = r.useful_task_hours
        # The head as the cost table bills it (from when the cloud listed it, not from `ray up`'s start: billing
        # it for the whole wall time made the "bound" exceed the run's cost when ray up was slow).
        bound = r.lower_bound() + head_cost
        out.update(bound=round(bound, 6), useful_task_hours=round(useful, 6),
                   measured_node_hours=round(rep["measured_node_hours"], 6),
                   replayed_node_hours=round(rep["replayed_node_hours"], 6),
                   launch_latency_s=round(rep["launch_latency_s"], 2), replay_timing=rep["timing"],
                   replayed_cost=round(r.workload_cost, 6))
        print(f"  {'lower bound':30} {useful:11.4f} {bound:10.5f}   (useful task-hours on the cheapest allowed "
              f"offering, + the head ${head_price:.3f}/h)")
        if bound:
            print(f"  ray_nodeless is {100 * (total / bound - 1):.1f} % above the bound; the fixed cluster "
                  f"{100 * (fixed / bound - 1):.1f} %")
        tm = rep["timing"]
        print(f"Replay of the recorded run (simulate, timing as measured: launch {tm['launch_latency_s']:.1f} s, "
              f"{tm['launch_concurrency'] or 'any number'} at once, trial start {tm['task_start_s']:.1f} s, "
              f"scale-down {tm['scale_down_s']:.1f} s): "
              f"{rep['replayed_node_hours']:.4f} node-hours against {rep['measured_node_hours']:.4f} measured in "
              f"the run ({100 * (rep['replayed_node_hours'] / rep['measured_node_hours'] - 1):+.1f} %)"
              if rep["measured_node_hours"] else "Replay: nothing measured")
    if fixed:
        print(f"  ray_nodeless cost {100 * (1 - total / fixed):.1f} % less than the fixed cluster")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "cluster-configs" / "local-cpu-head.yaml"))
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--max-iterations", type=int, default=4)
    ap.add_argument("--iteration-seconds", type=float, default=1.5)
    ap.add_argument("--scale-down-timeout", type=float, default=90.0)
    ap.add_argument("--out", default=None, help="directory for the recorded trace, the config copy and "
                                                "report.json (default: a fresh temporary directory)")
    args = ap.parse_args()

    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="nodeless-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = load_cluster_yaml(args.config)
    config, dash_port = with_dashboard(cfg, out_dir)
    cp = plan_cluster(cfg)
    say("plan (ray-nodeless plan " + os.path.relpath(args.config) + "):")
    subprocess.run([str(BIN / "ray-nodeless"), "plan", args.config], env=ENV, check=True)
    watcher = Watcher(cfg, cp.plans)
    t_up = time.time()
    try:
        say("ray up ...")
        up = subprocess.run([str(BIN / "ray"), "up", "-y", str(config)], env=ENV, capture_output=True, text=True)
        if up.returncode != 0:
            print(up.stdout[-3000:], up.stderr[-3000:], file=sys.stderr)
            say("ray up failed")
            return 1
        say(f"cluster up in {time.time() - t_up:.0f} s")
        watcher.start()
        address = cfg["provider"]["gcs_address"]
        sweep = subprocess.Popen([sys.executable, str(ROOT / "examples" / "tune_sweep.py"), "--address", address,
                                  "--trials", str(args.trials), "--max-iterations", str(args.max_iterations),
                                  "--iteration-seconds", str(args.iteration_seconds)], env=ENV,
                                 stdout=subprocess.PIPE, text=True)
        sweep_summary: dict = {}
        for line in sweep.stdout:     # passed through; the last line is the sweep's JSON summary
            print(line, end="", flush=True)
            if line.startswith("[sweep] {"):
                sweep_summary = json.loads(line[len("[sweep] "):])
        if sweep.wait() != 0:
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
        subprocess.run([str(BIN / "ray-nodeless"), "status", str(config)], env=ENV, check=False)
        rep = None
        try:
            rec = record_trace(address=f"http://127.0.0.1:{dash_port}", name="demo-tune-sweep")
            # The workers' lives as the cloud listed them: with them the trace alone replays with this run's
            # timing (`ray-nodeless simulate --measured-timing`, simulate/calibrate.py).
            rec.doc["meta"]["cloud_machines"] = [
                {"listed_s": round(s, 3), "gone_s": None if e is None else round(e, 3)}
                for tags, s, e in sorted(watcher.lifetimes.values(), key=lambda v: v[1])
                if tags.get("ray-node-type") == "worker"]
            trace_path = out_dir / "trace.yaml"
            trace_path.write_text(yaml.safe_dump(rec.doc, sort_keys=False))
            say(f"recorded the run: {trace_path} (replay it: ray-nodeless simulate {trace_path} --config "
                f"{config} --measured-timing --baseline fixed:3xg4dn.4xlarge)")
            w0, w1 = rec.window_start_ms / 1000, rec.window_end_ms / 1000
            rep = replay(config, rec.doc, watcher, (w0, w1))
        except Exception as e:   # the report without the replay is still the demo's report
            say(f"recording or replaying the run failed: {e}")
        head = cp.plans[cp.head_node_type].chosen
        summary = report(watcher, wall, cp.settings.region, float(head.hourly_price or 0.0), rep)
        summary.update(sweep=sweep_summary, machines=sorted((
            {"id": mid, "node_type": tags.get("ray-user-node-type"), "instance_type": tags.get(TAG_INSTANCE_TYPE),
             "capacity": tags.get(TAG_CAPACITY), "seconds": round((end or time.time()) - start, 1),
             "ended": end is not None} for mid, (tags, start, end) in watcher.lifetimes.items()),
            key=lambda d: d["id"]))
        (out_dir / "report.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
        return 0
    finally:
        watcher.stop_event.set()
        say("ray down ...")
        subprocess.run([str(BIN / "ray"), "down", "-y", str(config)], env=ENV, capture_output=True, text=True)
        backend = LocalBackend.from_provider(dict(cfg["provider"]), cfg["cluster_name"])
        left = [m.id for m in backend.list_machines()]
        if left:
            backend.terminate(left)
        stopped = stop_marked_processes(backend.runner_marker, force=True)
        say(f"cluster down; {len(left)} machine(s) and {stopped} process(es) were left and have been stopped"
            if left or stopped else "cluster down; nothing left running")


if __name__ == "__main__":
    sys.exit(main())
