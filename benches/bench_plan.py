#!/usr/bin/env python3
"""Cold catalog load (one region, every region), a cold `ray-nodeless plan` command, and plan throughput.

    .venv/bin/python benches/bench_plan.py            # or: make bench
    .venv/bin/python benches/bench_plan.py --runs 9 --skip-throughput

Measures, in one run (every cold figure is the median of `--runs` fresh interpreters; interpreter start-up is
excluded unless said otherwise):
- cold load of one region: import the catalog module, load the embedded catalog, build aws us-west-2's arrays (what
  a `plan` of a us-west-2 cluster needs); with the numpy import, without it (every command imports numpy anyway:
  this is the catalog's own part), and the load alone (index + region file + arrays, the module already imported);
- cold load of every region: the same, then every region of every cloud (what the old one-file catalog always paid
  before its first plan);
- a cold `ray-nodeless plan cluster-configs/aws-gpu-head.yaml`: the whole command as a subprocess, wall time
  including interpreter start-up and every import; next to it, a bare interpreter start (`python -c pass`);
- distinct shapes resolved per second with the plan cache defeated (every request new), over every region and over
  the six regions of the first catalog (comparable with the older figures), without and with the explanation's
  rejection counts (computed on first use; a launch never asks for them);
- steady-state resolutions per second when the autoscaler asks for shapes it asked for before (cache hits);
- each throughput figure on both planner paths, in the same run: numpy, and plain Python (core/planner_py.py), which
  a process takes when it has not imported numpy; and which path the running monitor takes (a fresh interpreter
  importing what a v2/v1 monitor of a ray_nodeless cluster imports: `import ray` does not import numpy).
Targets: >= 10,000 resolutions/s (issue 2); cold plan of one region: catalog part <= 300 ms.

The subprocesses import ray_nodeless from this file's repository (PYTHONPATH), so copying this script into another
checkout measures that checkout with the same method.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ray_nodeless.core import catalog as catalog_mod  # noqa: E402
from ray_nodeless.errors import NoFeasibleOffering  # noqa: E402
from ray_nodeless.core.planner import Planner  # noqa: E402
from ray_nodeless.core.requirements import Request, Requirements, Shape  # noqa: E402

PLAN_CONFIG = "cluster-configs/aws-gpu-head.yaml"
FIRST_SIX = [("aws", "eu-west-1"), ("aws", "us-east-1"), ("aws", "us-west-2"),
             ("gcp", "europe-west4"), ("gcp", "us-central1"), ("gcp", "us-west1")]

# Each prints "<s from before the numpy import> <s from after it> <s from after the catalog module's import>".
_COLD = ("import time; t0 = time.perf_counter(); import numpy; t1 = time.perf_counter(); "
         "from ray_nodeless.core import catalog as c; t2 = time.perf_counter(); k = c.embedded(); {work}; "
         "t3 = time.perf_counter(); print(t3 - t0, t3 - t1, t3 - t2)")
COLD_ONE_REGION = _COLD.format(work="k.region('aws', 'us-west-2')")
COLD_ALL_REGIONS = _COLD.format(work="[k.region(cl, r) for cl in k.clouds for r in k.regions(cl)]")
# Which planner path a process takes (core/planner.py `_compute`): numpy only when the process has imported it.
PATHS = {True: "numpy", False: "plain Python", None: "default (numpy iff imported)"}
# The modules a running v2/v1 monitor of a ray_nodeless cluster has imported: does any of them import numpy?
MONITOR_IMPORTS = ("import sys, ray, ray.autoscaler.v2.monitor, ray.autoscaler._private.monitor, "
                   "ray_nodeless.ray_adapter.provider; print('numpy' in sys.modules)")
PLAN_COMMAND = "import sys; from ray_nodeless.cli import main; sys.argv[0] = 'ray-nodeless'; main()"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def cold_ms(code: str, runs: int) -> tuple[float, float, float]:
    """Medians over `runs` fresh interpreters, in ms: (with the numpy import, without it, the load alone: without
    the import of the catalog module either)."""
    samples: list[list[float]] = [[], [], []]
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                           env=_env())
        for s, x in zip(samples, r.stdout.split()):
            s.append(float(x) * 1000)
    return statistics.median(samples[0]), statistics.median(samples[1]), statistics.median(samples[2])


def wall_ms(argv: list[str], runs: int) -> tuple[float, float]:
    """Median (wall time, CPU time: user + system) of a subprocess in ms, start-up included. On a shared machine the
    CPU time is the steadier of the two."""
    wall, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True, cwd=ROOT, env=_env())
        wall.append((time.perf_counter() - t) * 1000)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def shapes(n: int, regions: list[tuple[str, str]], seed: int = 7) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        cloud, region = regions[i % len(regions)]
        shape = Shape(cpu=rng.choice([1, 2, 4, 8, 16, 32, 64]), gpu=rng.choice([0, 0, 0, 1, 1, 2, 4, 8]),
                      memory_gib=rng.choice([0, 2, 8, 16, 32, 64, 128, 256]) + i * 1e-6)   # + i*1e-6: all distinct
        req = Requirements(capacity=rng.choice([("on-demand",), ("spot", "on-demand")]),
                           exclude_gpus=frozenset({"M60", "K80"}))
        out.append(Request(cloud=cloud, region=region, shape=shape, requirements=req, rule="bench"))
    return out


def warmed(cat: catalog_mod.Catalog, regions: list[tuple[str, str]], cache_size: int,
           vectorized: bool | None = None) -> Planner:
    """A planner whose per-region indexes are built (one request per region), so that only planning is timed.
    `vectorized`: the planner's path (True numpy, False plain Python, None: numpy iff this process imported it)."""
    p = Planner(cat, cache_size=cache_size, vectorized=vectorized)
    for cloud, region in regions:
        try:
            p.plan(Request(cloud, region, Shape(cpu=1), Requirements(), rule="warm"))
        except NoFeasibleOffering:
            pass
    return p


def run(planner: Planner, requests: list[Request], explain: bool = False) -> tuple[float, int]:
    """Resolutions per second. `explain`: also count the rejections by reason (what `plan --json` shows; a launch
    does not need it, so the planner computes it on first use)."""
    infeasible = 0
    t = time.perf_counter()
    for r in requests:
        try:
            p = planner.plan(r)
            if explain:
                _ = p.rejected      # the lazy explanation, built on first access: part of what is timed
        except NoFeasibleOffering:
            infeasible += 1
    return len(requests) / (time.perf_counter() - t), infeasible


def throughput(cat: catalog_mod.Catalog, regions: list[tuple[str, str]], vectorized: bool | None = None,
               n: int = 6000) -> dict:
    distinct = shapes(n, regions)
    uncached, infeasible = run(warmed(cat, regions, 1, vectorized), distinct)
    explained, _ = run(warmed(cat, regions, 1, vectorized), distinct, explain=True)
    planner = warmed(cat, regions, 100_000, vectorized)
    cycle = min(200, len(distinct))
    repeated = [distinct[i % cycle] for i in range(100_000)]
    run(planner, repeated[:cycle])
    cached, _ = run(planner, repeated)
    return {
        "path": PATHS[vectorized],
        "regions": len(regions),
        "offerings": sum(len(cat.region(c, r)) for c, r in regions),
        "distinct_shapes_per_s_uncached": round(uncached),
        "distinct_shapes_per_s_uncached_with_explanation": round(explained),
        "distinct_shapes_infeasible": infeasible,
        "repeated_shapes_per_s_cached": round(cached),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="fresh interpreters per cold figure (median)")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--shapes", type=int, default=6000, help="distinct requests per throughput figure")
    args = ap.parse_args()

    one, one_catalog_only, one_load = cold_ms(COLD_ONE_REGION, args.runs)
    every, every_catalog_only, every_load = cold_ms(COLD_ALL_REGIONS, args.runs)
    plan, plan_cpu = wall_ms([sys.executable, "-c", PLAN_COMMAND, "plan", PLAN_CONFIG], args.runs)
    bare, _ = wall_ms([sys.executable, "-c", "pass"], args.runs)
    cat = catalog_mod.embedded()
    everywhere = [(c, r) for c in cat.clouds for r in cat.regions(c)]
    result = {
        "catalog_id": cat.catalog_id,
        "regions": {c: len(cat.regions(c)) for c in cat.clouds},
        "cold_load_one_region_ms": round(one, 1),
        "cold_load_one_region_catalog_only_ms": round(one_catalog_only, 1),
        "cold_load_one_region_load_only_ms": round(one_load, 1),
        "cold_load_every_region_ms": round(every, 1),
        "cold_load_every_region_catalog_only_ms": round(every_catalog_only, 1),
        "cold_load_every_region_load_only_ms": round(every_load, 1),
        f"cold_plan_command_ms ({PLAN_CONFIG})": round(plan, 1),
        "cold_plan_command_cpu_ms": round(plan_cpu, 1),
        "bare_interpreter_start_ms": round(bare, 1),
    }
    monitor = subprocess.run([sys.executable, "-c", MONITOR_IMPORTS], capture_output=True, text=True, check=True,
                             cwd=ROOT, env=_env()).stdout.split()[-1] == "True"
    result["monitor_imports_numpy"] = monitor
    result["monitor_planner_path"] = PATHS[monitor]
    if not args.skip_throughput:
        # Both paths in this run, each chosen explicitly (this process's imports do not decide it).
        first_six = [cr for cr in FIRST_SIX if cr in everywhere]
        for vectorized in (True, False):
            label = "numpy" if vectorized else "plain_python"
            result[f"throughput_every_region_{label}"] = throughput(cat, everywhere, vectorized, args.shapes)
            result[f"throughput_first_six_regions_{label}"] = throughput(cat, first_six, vectorized, args.shapes)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
