#!/usr/bin/env python3
"""Plan throughput on the whole embedded catalog, and cold catalog load time.

    .venv/bin/python benches/bench_plan.py            # or: make bench

Measures, in one run:
- cold load: a fresh interpreter imports ray_nodeless, loads the embedded catalog and builds all six regions'
  arrays (median of 5 subprocesses; interpreter start-up excluded, numpy import included);
- distinct shapes resolved per second with the plan cache defeated (every request new), over all six regions,
  without and with the explanation's rejection counts (computed on first use; a launch never asks for them);
- steady-state resolutions per second when the autoscaler asks for shapes it asked for before (cache hits),
  which is what a running cluster does every update.
Target (issue 2): >= 10,000 resolutions/s and cold load <= 300 ms.
"""
from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ray_nodeless.core import catalog as catalog_mod  # noqa: E402
from ray_nodeless.errors import NoFeasibleOffering  # noqa: E402
from ray_nodeless.core.planner import Planner  # noqa: E402
from ray_nodeless.core.requirements import Request, Requirements, Shape  # noqa: E402

COLD = ("import time; t=time.perf_counter(); from ray_nodeless.core import catalog as c; k=c.embedded();"
        "[k.region(cl, r) for cl in k.clouds for r in k.regions(cl)]; print(time.perf_counter()-t)")


def cold_load_ms(runs: int = 5) -> float:
    out = []
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", COLD], capture_output=True, text=True, check=True)
        out.append(float(r.stdout) * 1000)
    return statistics.median(out)


def shapes(n: int, seed: int = 7) -> list[Request]:
    rng = random.Random(seed)
    cat = catalog_mod.embedded()
    regions = [(c, r) for c in cat.clouds for r in cat.regions(c)]
    out = []
    for i in range(n):
        cloud, region = regions[i % len(regions)]
        shape = Shape(cpu=rng.choice([1, 2, 4, 8, 16, 32, 64]), gpu=rng.choice([0, 0, 0, 1, 1, 2, 4, 8]),
                      memory_gib=rng.choice([0, 2, 8, 16, 32, 64, 128, 256]) + i * 1e-6)   # + i*1e-6: all distinct
        req = Requirements(capacity=rng.choice([("on-demand",), ("spot", "on-demand")]),
                           exclude_gpus=frozenset({"M60", "K80"}))
        out.append(Request(cloud=cloud, region=region, shape=shape, requirements=req, rule="bench"))
    return out


def run(planner: Planner, requests: list[Request], explain: bool = False) -> tuple[float, int]:
    """Resolutions per second. `explain`: also count the rejections by reason (what `plan --json` shows; a launch
    does not need it, so the planner computes it on first use)."""
    infeasible = 0
    t = time.perf_counter()
    for r in requests:
        try:
            p = planner.plan(r)
            if explain:
                p.rejected
        except NoFeasibleOffering:
            infeasible += 1
    return len(requests) / (time.perf_counter() - t), infeasible


def main() -> None:
    cold = cold_load_ms()
    cat = catalog_mod.embedded()
    planner = Planner(cat, cache_size=100_000)
    distinct = shapes(6000)
    run(planner, shapes(60, seed=1))                     # warm the per-region indexes
    uncached, infeasible = run(Planner(cat, cache_size=1), distinct)
    explained, _ = run(Planner(cat, cache_size=1), distinct, explain=True)
    repeated = [distinct[i % 200] for i in range(100_000)]
    run(planner, repeated[:200])
    cached, _ = run(planner, repeated)
    result = {
        "catalog_id": cat.catalog_id,
        "offerings": sum(len(cat.region(c, r)) for c in cat.clouds for r in cat.regions(c)),
        "cold_load_ms": round(cold, 1),
        "distinct_shapes_per_s_uncached": round(uncached),
        "distinct_shapes_per_s_uncached_with_explanation": round(explained),
        "distinct_shapes_infeasible": infeasible,
        "repeated_shapes_per_s_cached": round(cached),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
