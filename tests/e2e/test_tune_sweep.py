"""The published workload kind end to end: `examples/demo.py` runs a real Ray Tune sweep (ASHA, trials of
`{CPU: 1, GPU: 1}`) on a local Ray cluster autoscaled by ray_nodeless, records it with the trace recorder, replays it
with `simulate`'s engine, and reports the cost against the fixed 3 x g4dn.4xlarge cluster and the lower bound.

One run of the demo (a private copy of cluster-configs/local-cpu-head.yaml: own cluster name, GCS port, state dir)
feeds every assertion; the demo's own report.json holds the figures.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ray_nodeless.core.cluster_plan import load_cluster_yaml, plan_cluster
from ray_nodeless.providers.local.backend import LocalBackend
from ray_nodeless.providers.local.scoped_stop import stop_marked_processes
from ray_nodeless.trace.model import load_trace
from tests import REPO_ROOT
from tests.e2e.clusters import RAY_ENV, cluster_copy, end_local_cluster, write_config

pytestmark = pytest.mark.e2e

TRIALS, MAX_ITERATIONS = 6, 4


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tune")
    cfg = cluster_copy("local-cpu-head.yaml", "tune", state_dir=str(tmp / "state"))
    path = write_config(cfg, tmp)
    out = tmp / "out"
    try:
        proc = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "demo.py"), "--config", str(path),
                               "--trials", str(TRIALS), "--max-iterations", str(MAX_ITERATIONS),
                               "--iteration-seconds", "1.5", "--out", str(out)],
                              env=RAY_ENV, capture_output=True, text=True, timeout=540)
    finally:
        end_local_cluster(cfg)
    if not (out / "report.json").exists():
        pytest.fail(f"the demo did not report (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}")
    return cfg, path, out, proc, json.loads((out / "report.json").read_text())


def test_the_tune_sweep_ran_under_asha(demo_run):
    _, _, _, proc, rep = demo_run
    assert proc.returncode == 0, proc.stdout[-3000:]
    sweep = rep["sweep"]
    assert sweep["trials"] == TRIALS and sweep["errors"] == 0
    # ASHA (grace 1, reduction 2, max_t 4) stopped some trials at a rung: fewer iterations than trials x max_t.
    assert sweep["stopped_early"] >= 1
    assert sweep["iterations"] < TRIALS * MAX_ITERATIONS


def test_gpu_trials_scaled_the_cluster_up_on_the_planned_offering_and_down(demo_run):
    cfg, path, _, _, rep = demo_run
    chosen = plan_cluster(load_cluster_yaml(str(path))).plans["gpu_worker"].chosen
    workers = [m for m in rep["machines"] if m["node_type"] == "gpu_worker"]
    assert workers, rep["machines"]
    assert all(m["ended"] for m in workers)        # idle workers were removed before the report
    # Every worker is the planned cheapest fit, unless it fell back (a capacity miss on the local backend: none).
    assert {(m["instance_type"], m["capacity"]) for m in workers} == {(chosen.instance_type.name, chosen.capacity)}
    assert len(workers) <= cfg["available_node_types"]["gpu_worker"]["max_workers"] + TRIALS   # replacements allowed


def test_report_compares_with_fixed_cluster_and_lower_bound(demo_run):
    _, _, _, proc, rep = demo_run
    assert 0 < rep["bound"] <= rep["cost"] + 1e-9 < rep["fixed_cost"]
    assert rep["useful_task_hours"] > 0
    assert "lower bound" in proc.stdout and "fixed 3 x g4dn.4xlarge" in proc.stdout


def test_recorded_run_replays_within_the_trace_tolerance(demo_run):
    _, _, out, _, rep = demo_run
    trace = load_trace(out / "trace.yaml")
    tasks = [t for j in trace.jobs.values() for t in j.tasks]
    # One trace task per trial actor, sized as the trial asked (its placement group's bundle), not by group names.
    assert len(tasks) >= TRIALS
    assert {tuple(sorted(t.resource_dict.items())) for t in tasks} == {(("CPU", 1.0), ("GPU", 1.0))}
    # Replayed with the run's own timing, each figure measured in the run (simulate/calibrate.py): one node start
    # at a time on the local backend, a trial's start after its GPU is free, the scale-down latency.
    timing = rep["replay_timing"]
    assert timing["launch_concurrency"] == 1 and timing["task_start_s"] > 0 and timing["scale_down_s"] > 0
    # Every trial was recorded with its node (the trial start is measured per node).
    assert all(t["node_id"] for t in trace.meta["recorded_tasks"])
    # The tolerance of tests/e2e/test_trace_record.py: 10 %, or 4 node-seconds per recorded node (Ray's worker
    # process start-ups are in the run and not in the trace).
    nodes = len(trace.meta.get("recorded_nodes", []))
    assert rep["replayed_node_hours"] == pytest.approx(rep["measured_node_hours"], rel=0.10,
                                                       abs=4.0 * max(nodes, 1) / 3600)


def test_nothing_left_running(demo_run):
    cfg, _, _, proc, _ = demo_run
    assert "nothing left running" in proc.stdout
    backend = LocalBackend.from_provider(dict(cfg["provider"]), cfg["cluster_name"])
    assert backend.list_machines() == []
    assert stop_marked_processes(backend.runner_marker, force=True) == 0
