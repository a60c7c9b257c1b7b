"""The published AutoML replay under one idle timeout T for the GPU workers, and the launch latency the break-even
rule would need (BENCHMARKS.md, issue 19): how far idle release alone can bring a config to its bound.

For each T: launches, GPU node-hours launching and idle, cost, and the distance to the bound (useful task-hours on
their cheapest offering + the head). Then, for launch latencies L, the break-even rule (idle_timeout_s = L, no fixed
relaunch cost) with the replay's launch latency L too. Then the policies side by side (`policies`): the break-even
alone, the learned release (`provider.idle.learn_gaps`, core/idle_gaps.py: the default), the best fixed timeout in
hindsight (T = 0) and a clairvoyant one, estimated from the T = 0 replay: every release whose type's next launch
came within a launch latency of the machine going idle is kept instead (it saves that launch's billing before ready,
less the idle time kept); the others are released at once, as at T = 0.

    .venv/bin/python benches/bench_idle_release.py [--config cluster-configs/aws-cpu-head.yaml] [--json out.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ray_nodeless.simulate.config import config_from_cluster  # noqa: E402
from ray_nodeless.simulate.engine import simulate  # noqa: E402
from ray_nodeless.trace.model import load_trace  # noqa: E402

TIMEOUTS_MIN = (0, 0.5, 1, 2, 3, 5, 10)
LATENCIES_S = (60, 90, 120, 180)


def row(r) -> dict:
    worker_h, launch_h, idle_h = r.worker_hours()
    return {"launches": sum(1 for n in r.nodes if not n.is_head), "launching_h": round(launch_h, 2),
            "idle_h": round(idle_h, 2), "cost": round(r.workload_cost, 2),
            "bound_with_head": round(r.bound_with_head, 2),
            "vs_bound_pct": round(r.distance_to_bound * 100, 2)}


def clairvoyant(zero, launch_ms: int) -> dict:
    """The T = 0 replay's figures with every release whose type's next launch came within `launch_ms` of the
    machine going idle kept instead (see the module docstring)."""
    workers = sorted((n for n in zero.nodes if not n.is_head), key=lambda n: n.launch_ms)
    saved_usd, kept = 0.0, 0
    for n in workers:
        if n.end_ms is None or n.end_ms >= zero.elapsed_ms:
            continue
        idle_from = n.end_ms - n.idle_ms
        nxt = next((m.launch_ms for m in workers if m.node_type == n.node_type and m.launch_ms >= n.end_ms), None)
        if nxt is not None and nxt - idle_from < launch_ms:
            kept += 1
            saved_usd += n.offer.hourly_price * (launch_ms - (nxt - idle_from)) / 3_600_000
    cost = zero.workload_cost - saved_usd
    return {"launches": sum(1 for n in workers) - kept, "kept": kept, "cost": round(cost, 2),
            "bound_with_head": round(zero.bound_with_head, 2),
            "vs_bound_pct": round((cost / zero.bound_with_head - 1) * 100, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(ROOT / "examples/traces/automl-published.yaml"))
    ap.add_argument("--config", default=str(ROOT / "cluster-configs/aws-cpu-head.yaml"))
    ap.add_argument("--json")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    trace = load_trace(args.trace)
    out = {"timeouts": {}, "latencies": {}}
    # On demand (capacity forced), one timeout for every worker type as Ray v1 would apply it.
    base = config_from_cluster(args.config, trace.default_schedule, True, idle_release="cluster-wide")
    for t in TIMEOUTS_MIN:
        r = simulate(trace, dataclasses.replace(base, idle_timeout_ms=int(t * 60_000)))
        out["timeouts"][f"{t:g} min"] = row(r)
    per_type = config_from_cluster(args.config, trace.default_schedule, True, idle_release="break-even")
    for lat in LATENCIES_S:
        cfg = dataclasses.replace(per_type, idle_timeout_ms_by_type={k: lat * 1000
                                                                     for k in per_type.idle_timeout_ms_by_type})
        out["latencies"][f"{lat} s"] = row(simulate(trace, cfg, launch_latency_ms=lat * 1000))
    zero = simulate(trace, dataclasses.replace(base, idle_timeout_ms=0))
    learned = config_from_cluster(args.config, trace.default_schedule, True)
    out["policies"] = {"break-even": row(simulate(trace, per_type)), "learned": row(simulate(trace, learned)),
                       "T = 0": row(zero), "clairvoyant (est.)": clairvoyant(zero, 180_000)}
    for part, rows in out.items():
        print(f"{part}:")
        for k, v in rows.items():
            print(f"  {k:8} " + "  ".join(f"{a} {b}" for a, b in v.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
