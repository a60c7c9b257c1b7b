"""The full replay table of examples/traces/automl-published.yaml (BENCHMARKS.md, issue 19): GPU head and CPU head,
on demand and spot first, without and with spot interruptions (seeded, plus a drought after each that sends
launches to on demand), without and with on-demand -> spot reversion; the distance to the bound in every row.

Rows with interruptions are the mean over `--seeds` seeds (the min-max of the distance beside it): one seed is one
draw of where the interruptions fall, not a trend.

    .venv/bin/python benches/bench_replay_table.py [--seeds 5] [--rate 0.1] [--outage-minutes 30] [--json out.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ray_nodeless.simulate.config import config_from_cluster, config_from_fixed  # noqa: E402
from ray_nodeless.core.cluster_plan import load_catalog  # noqa: E402
from ray_nodeless.simulate.engine import simulate  # noqa: E402
from ray_nodeless.trace.model import load_trace  # noqa: E402

CONFIGS = (("aws-gpu-head", "GPU head"), ("aws-cpu-head", "CPU head"))


def figures(r) -> dict:
    worker_h, launch_h, idle_h = r.worker_hours()
    rev = r.policy_stats.get("SimReverter") or {}
    return {"cost": r.workload_cost, "bound_with_head": r.bound_with_head, "vs_bound_pct": r.distance_to_bound * 100,
            "worker_h": worker_h, "launching_h": launch_h, "idle_h": idle_h, "useful_h": r.useful_task_hours,
            "lost_h": r.lost_task_hours, "n_interruptions": r.interruptions,
            "fallback_h": sum(r.node_ms(n) for n in r.nodes if n.fallback) / 3_600_000,
            "replacements": rev.get("started", 0), "replaced": rev.get("replaced", 0),
            "preferences": rev.get("preferred_on_demand", 0)}


def mean_row(runs: list[dict]) -> dict:
    out = {k: statistics.fmean(r[k] for r in runs) for k in runs[0]}
    out["vs_bound_min"] = min(r["vs_bound_pct"] for r in runs)
    out["vs_bound_max"] = max(r["vs_bound_pct"] for r in runs)
    out["runs"] = len(runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(ROOT / "examples/traces/automl-published.yaml"))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rate", type=float, default=0.1, help="spot interruptions per spot node-hour")
    ap.add_argument("--outage-minutes", type=float, default=30.0, help="no spot for the type after an interruption")
    ap.add_argument("--json")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    trace = load_trace(args.trace)
    rows: list[dict] = []
    for stem, head in CONFIGS:
        path = str(ROOT / "cluster-configs" / f"{stem}.yaml")
        od = config_from_cluster(path, trace.default_schedule, True)
        rows.append({"head": head, "capacity": "on demand", "interruptions": "none", "reversion": "-",
                     **figures(simulate(trace, od))})
        for label, rate, outage in (("none", 0.0, 0.0), (f"{args.rate:g}/node-h", args.rate, 0.0),
                                    (f"{args.rate:g}/node-h + {args.outage_minutes:g}-min drought", args.rate,
                                     args.outage_minutes)):
            for rev in (("off", "on", "on, no on-demand preference") if rate > 0 else ("off", "on")):
                cfg = config_from_cluster(path, trace.default_schedule, False, reversion=rev != "off")
                if rev == "on, no on-demand preference":
                    # The replacement step alone: the interruption limit out of reach.
                    cfg = dataclasses.replace(cfg, reversion=cfg.reversion.model_copy(
                        update={"interruption_limit": 10**9}))
                seeds = range(args.seeds) if rate > 0 else range(1)
                runs = [figures(simulate(trace, cfg, spot_interruptions_per_hour=rate, seed=s,
                                         spot_outage_ms=int(outage * 60_000))) for s in seeds]
                rows.append({"head": head, "capacity": "spot first", "interruptions": label,
                             "reversion": rev, **mean_row(runs)})
    fixed = config_from_fixed("fixed:3xg4dn.4xlarge", trace.baseline_schedule, load_catalog("embedded"))
    rows.append({"head": "fixed 3 x g4dn.4xlarge", "capacity": "on demand", "interruptions": "none",
                 "reversion": "-", **figures(simulate(trace, fixed))})
    print("| head | capacity | interruptions | reversion | cost | bound + head | vs bound | worker h = launching + "
          "idle + busy | lost task-h | interruptions | fallback h | replacements (done) | on-demand preferences |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        spread = (f" ({r['vs_bound_min']:+.1f} .. {r['vs_bound_max']:+.1f})"
                  if r.get("runs", 1) > 1 else "")
        busy = r["worker_h"] - r["launching_h"] - r["idle_h"]
        print(f"| {r['head']} | {r['capacity']} | {r['interruptions']} | {r['reversion']} | ${r['cost']:.2f} | "
              f"${r['bound_with_head']:.2f} | {r['vs_bound_pct']:+.2f} %{spread} | {r['worker_h']:.2f} = "
              f"{r['launching_h']:.2f} + {r['idle_h']:.2f} + {busy:.2f} | {r['lost_h']:.2f} | "
              f"{r['n_interruptions']:.1f} | {r['fallback_h']:.2f} | {r['replacements']:.1f} ({r['replaced']:.1f}) | "
              f"{r['preferences']:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
