"""Smoke runs of the issue-17 benchmarks at tiny sizes: they run end to end and their figures hold together.

Each bench runs as a subprocess, as a user runs it (its planner path must be the one it says, whatever this test
process has imported)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, str(ROOT / "benches" / script), *args], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout[r.stdout.index("{"):])      # the bench prints one JSON document


def test_bench_open_types_ten_demands():
    out = _run("bench_open_types.py", "--sizes", "10", "--reps", "1", "--fit-shapes", "20", "--json")
    assert out["numpy_imported_during_loops"] is False      # the monitor's path: plain Python
    [run] = out["runs"]
    assert (run["demands"], run["distinct_requests"], run["gangs"]) == (10, 8, 1)
    for loop in ("loop1_cold", "loop1_warm", "loop2"):
        figures = run["loops"][loop]
        assert figures["open_ms"] > 0 and figures["three_type_ms"] > 0
        assert figures["ratio"] == round(figures["open_ms"] / figures["three_type_ms"], 2)
    p = run["packing"]
    assert p["a_infeasible_demands"] == 0                   # every kind has an allowed offering
    assert p["b_packer_plan_per_h"] <= p["a_own_cheapest_fit_sum_per_h"] + 1e-9
    # The 3-type cluster serves the 1-CPU task, the 16-CPU task and the 2-bundle GPU gang, nothing else: it has
    # no 2-GPU type, no accelerator_type or memory resource and no labels.
    assert (p["c_demands_served"], p["c_demands_unserved"]) == (4, 6)
    assert p["c_launched"] == {"cpu16": 1, "gpu1": 2}
    assert sum(run["loop2_ray_launches_three"].values()) == 0   # its launches in flight hold the demands
    paths = [(f["path"], f["derive_sizes"]) for f in out["fit_throughput"]]
    assert paths == [("plain Python", True), ("plain Python", False), ("numpy", True), ("numpy", False)]
    assert all(f["shapes_per_s"] > 0 for f in out["fit_throughput"])


def test_bench_plan_reports_both_paths():
    out = _run("bench_plan.py", "--runs", "1", "--shapes", "60")
    assert out["monitor_imports_numpy"] is False and out["monitor_planner_path"] == "plain Python"
    for label, path in (("numpy", "numpy"), ("plain_python", "plain Python")):
        for where in ("every_region", "first_six_regions"):
            t = out[f"throughput_{where}_{label}"]
            assert t["path"] == path and t["distinct_shapes_per_s_uncached"] > 0


def test_bench_listing_small():
    out = _run("bench_listing.py", "--machines", "20", "--cloud-s", "10", "--calls", "20", "--sync-cloud-s", "0.05",
               "--sync-calls", "3", "--json")
    [run] = out["runs"]
    assert run["machines"] == 20 and run["loop"]["lane_held_in_cloud"] is True
    assert run["loop"]["listing"]["calls"] == 20 and run["sync"]["listing"]["calls"] == 3
    assert run["sync"]["listing"]["p50_ms"] >= 50          # each synchronous call waits for the cloud
    assert run["loop"]["listing"]["p99_ms"] < 10_000       # the loop's calls never wait for the held one
