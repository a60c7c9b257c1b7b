"""The replay's timing model for recorded runs: the autoscaler's loop period from the config, launches that start
one at a time, the time a task holds its node before its recorded run, the scale-down latency; and the timing
measured from a recorded run (simulate/calibrate.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli import main

from ray_nodeless.simulate.calibrate import measured_timing, task_start_gaps_ms
from ray_nodeless.simulate.config import autoscaler_tick_ms, config_from_cluster
from ray_nodeless.simulate.engine import simulate
from ray_nodeless.simulate.model import SimulationError
from ray_nodeless.trace.model import parse_trace
from tests.simulate.test_simulate import _cluster_yaml, _one_job

GPU_TASK = {"resources": {"GPU": 1}}


def _cfg(tmp_path, **kw):
    return config_from_cluster(_cluster_yaml(tmp_path, head_res={"CPU": 4}, worker_res={"CPU": 4, "GPU": 1}, **kw),
                               "all-parallel", False, idle_release="cluster-wide")


def test_the_loop_period_is_the_one_the_head_starts_ray_with(tmp_path):
    assert autoscaler_tick_ms({"head_start_ray_commands": ["ray stop", "RAY_X=1 AUTOSCALER_UPDATE_INTERVAL_S=1 "
                                                           "ray start --head"]}) == 1000
    assert autoscaler_tick_ms({"head_start_ray_commands": ["AUTOSCALER_UPDATE_INTERVAL_S=2.5 ray start"]}) == 2500
    assert autoscaler_tick_ms({"head_start_ray_commands": ["ray start --head"]}) == 5000     # Ray's default
    assert autoscaler_tick_ms({}) == 5000
    path = _cluster_yaml(tmp_path, head_res={"CPU": 4}, worker_res={"CPU": 4, "GPU": 1}, idle_minutes=0.25)
    doc = yaml.safe_load(open(path))
    doc["head_start_ray_commands"] = ["AUTOSCALER_UPDATE_INTERVAL_S=1 ray start --head"]
    open(path, "w").write(yaml.safe_dump(doc))
    cfg = config_from_cluster(path, "all-parallel", False, idle_release="cluster-wide")
    assert cfg.tick_ms == 1000
    trace = parse_trace(_one_job([{"name": "g", **GPU_TASK, "seconds": 10.5}]))
    r = simulate(trace, cfg, launch_latency_ms=7_000)
    worker = next(n for n in r.nodes if not n.is_head)
    # Ready at 7 s, done at 17.5 s, idle 15 s: terminated on the first 1-s tick at or after 32.5 s (5-s grid: 35 s).
    assert worker.end_ms == 33_000


def test_launches_start_one_at_a_time_and_are_billed_from_their_start(tmp_path):
    trace = parse_trace(_one_job([{"name": "g", **GPU_TASK, "minutes": 10, "count": 3}]))
    cfg = _cfg(tmp_path, max_workers=3)
    parallel = simulate(trace, cfg, launch_latency_ms=60_000)
    serial = simulate(trace, cfg, launch_latency_ms=60_000, launch_concurrency=1)
    pw = [n for n in parallel.nodes if not n.is_head]
    sw = [n for n in serial.nodes if not n.is_head]
    assert [(n.launch_ms, n.ready_ms) for n in pw] == [(0, 60_000)] * 3
    assert [(n.launch_ms, n.ready_ms) for n in sw] == [(0, 60_000), (60_000, 120_000), (120_000, 180_000)]
    # Each is billed its own launch latency, run and idle tail: the same worker-hours, a later end.
    assert serial.worker_hours() == pytest.approx(parallel.worker_hours())
    assert serial.elapsed_ms == parallel.elapsed_ms + 120_000
    two = simulate(trace, cfg, launch_latency_ms=60_000, launch_concurrency=2)
    assert [n.ready_ms for n in two.nodes if not n.is_head] == [60_000, 60_000, 120_000]
    with pytest.raises(SimulationError):
        simulate(trace, cfg, launch_concurrency=0)


def test_a_task_holds_its_node_for_its_start_before_its_recorded_run(tmp_path):
    trace = parse_trace(_one_job([{"name": "g", **GPU_TASK, "minutes": 10, "count": 2}], max_concurrent=1))
    cfg = _cfg(tmp_path, max_workers=1)
    r = simulate(trace, cfg, launch_latency_ms=60_000, task_start_ms=3_000)
    a, b = r.tasks
    assert a.start_ms == 63_000 and b.start_ms == 63_000 + 600_000 + 3_000
    assert r.elapsed_ms == b.start_ms + 600_000
    assert r.useful_task_hours == pytest.approx(20 / 60)         # the start is overhead, not useful work


def test_a_terminated_worker_is_billed_its_scale_down(tmp_path):
    trace = parse_trace(_one_job([{"name": "g", **GPU_TASK, "minutes": 10}]))
    cfg = _cfg(tmp_path, idle_minutes=1)
    now = simulate(trace, cfg, launch_latency_ms=60_000)
    later = simulate(trace, cfg, launch_latency_ms=60_000, scale_down_ms=2_500)
    w0, w1 = (next(n for n in r.nodes if not n.is_head) for r in (now, later))
    assert w1.end_ms == w0.end_ms + 2_500
    assert later.worker_hours()[2] == pytest.approx(now.worker_hours()[2] + 2.5 / 3600)    # an idle tail
    assert later.elapsed_ms == now.elapsed_ms


def _recorded(starts_and_ends, tasks):
    nodes = [{"node_id": "head", "is_head": True, "resources": {"CPU": 8.0}, "start_ms": 0, "end_ms": None}]
    nodes += [{"node_id": f"w{i}", "is_head": False, "resources": {"CPU": 4.0, "GPU": 1.0}, "start_ms": s,
               "end_ms": e} for i, (s, e) in enumerate(starts_and_ends)]
    return {"meta": {"recorded_nodes": nodes, "recorded_tasks": [
        {"node_id": n, "resources": {"CPU": 1.0, "GPU": 1.0}, "demand_ms": d, "start_ms": s, "end_ms": e}
        for n, d, s, e in tasks]}}


def test_the_timing_of_a_recorded_run_is_measured_from_it():
    # Three workers started one after another (listed at 0, 6.5, 13 s; Ray up 6, 12.5, 24 s after the run's start),
    # three trials each waiting 3 s after a free GPU, the workers gone 2 s after their Ray node ended.
    doc = _recorded([(1006_000, 1040_000), (1012_500, 1045_000), (1024_000, 1045_000)],
                    [("w0", 1000_000, 1009_000, 1016_000), ("w0", 1000_000, 1019_000, 1030_000),
                     ("w1", 1000_000, 1015_500, 1020_000), ("w2", 1000_000, 1027_000, 1033_000)])
    assert task_start_gaps_ms(doc) == [3_000, 3_000, 3_000, 3_000]
    t = measured_timing(doc, [(1000.0, 1042.0), (1006.5, 1047.0), (1013.0, 1047.0)])
    assert t.launch_latency_ms == round((6_000 + 6_000 + 11_000) / 3)
    assert t.launch_concurrency == 1                 # no two starts overlapped
    assert t.task_start_ms == 3_000 and t.scale_down_ms == 2_000
    assert t.kwargs()["launch_concurrency"] == 1
    # Starts that all overlapped: a cloud booting side by side, no bound.
    par = measured_timing(doc, [(1000.0, None), (1000.5, None), (1001.0, None)])
    assert par.launch_concurrency is None and par.scale_down_ms == 0
    # A node that holds two trials at once: two slots free at its start.
    two = {"meta": {"recorded_nodes": [{"node_id": "w", "is_head": False, "resources": {"GPU": 2.0},
                                        "start_ms": 100, "end_ms": None}],
                    "recorded_tasks": [{"node_id": "w", "resources": {"GPU": 1.0}, "demand_ms": 0, "start_ms": s,
                                        "end_ms": e} for s, e in ((1100, 5000), (1600, 3000), (3500, 4000))]}}
    assert task_start_gaps_ms(two) == [1000, 1500, 500]


def test_cli_replays_a_recorded_run_with_its_measured_timing(tmp_path):
    # A synthetic recording in the demo's format (not a real run): one job of three 1-GPU trials, the recorder's
    # nodes and tasks, the cloud's listing of the workers.
    doc = _recorded([(1006_000, 1040_000), (1012_500, 1045_000), (1024_000, 1045_000)],
                    [("w0", 1000_000, 1009_000, 1016_000), ("w1", 1000_000, 1015_500, 1020_000),
                     ("w2", 1000_000, 1027_000, 1033_000)])
    doc["meta"]["cloud_machines"] = [{"listed_s": 1000.0, "gone_s": 1042.0}, {"listed_s": 1006.5, "gone_s": 1047.0},
                                     {"listed_s": 1013.0, "gone_s": 1047.0}]
    doc.update(version=1, name="rec", default_schedule="recorded", schedules={"recorded": [["j"]]},
               jobs=[{"name": "j", "tasks": [{"name": f"t{i}", "resources": {"CPU": 1, "GPU": 1}, "seconds": s,
                                              "submit_at_seconds": 0} for i, s in enumerate((7, 4.5, 6))]}])
    trace = tmp_path / "rec.yaml"
    trace.write_text(yaml.safe_dump(doc))
    cfg = str(Path(__file__).resolve().parents[2] / "cluster-configs" / "local-cpu-head.yaml")
    out = CliRunner().invoke(main, ["simulate", str(trace), "--config", cfg, "--measured-timing", "--json"])
    assert out.exit_code == 0, out.output
    rep = json.loads(out.output)
    p = rep["parameters"]
    assert p["measured_timing"] is True and p["launch_concurrency"] == 1
    assert (p["task_start_seconds"], p["scale_down_seconds"]) == (3.0, 2.0)
    assert p["launch_minutes"] == pytest.approx(round((6_000 + 6_000 + 11_000) / 3) / 60_000)
    [conf] = rep["configurations"].values()
    assert conf["tick_seconds"] == 1.0                    # the local config's AUTOSCALER_UPDATE_INTERVAL_S=1
    plain = json.loads(CliRunner().invoke(main, ["simulate", str(trace), "--config", cfg, "--json",
                                                 "--launch-minutes", str(p["launch_minutes"])]).output)
    [pconf] = plain["configurations"].values()
    # One start at a time, each trial 3 s later than its node is free, 2 s more per worker: a longer replay.
    assert conf["elapsed_hours"] > pconf["elapsed_hours"]
    assert sum(conf["node_hours"].values()) > sum(pconf["node_hours"].values())
    del doc["meta"]["cloud_machines"]
    trace.write_text(yaml.safe_dump(doc))
    bad = CliRunner().invoke(main, ["simulate", str(trace), "--config", cfg, "--measured-timing"])
    assert bad.exit_code == 2 and "--measured-timing" in bad.output


def test_the_billed_node_hours_of_a_recording_are_the_head_window_and_the_workers_listings():
    from ray_nodeless.simulate.calibrate import billed_node_hours
    doc = {"meta": {"window_ms": [1000_000, 1036_000],
                    "cloud_machines": [{"listed_s": 1000.5, "gone_s": 1046.0}, {"listed_s": 1007.0, "gone_s": None}]}}
    # Head 36 s; workers 45.5 s and (still listed) 29 s to the window's end.
    assert billed_node_hours(doc) == pytest.approx((36 + 45.5 + 29) / 3600)


RECORDED = Path(__file__).resolve().parents[2] / "examples" / "traces" / "tune-sweep-recorded.yaml"


def test_the_recorded_tune_sweep_replays_within_the_trace_tolerance(tmp_path):
    """A real recorded run (examples/traces/tune-sweep-recorded.yaml) replayed with the timing measured in it lands
    within the trace tests' tolerance of what its cloud billed; with Ray's default timing (no queue of starts, no
    trial start, no scale-down) it does not: that is the gap these figures close."""
    from ray_nodeless.simulate.calibrate import billed_node_hours, cloud_machines
    doc = yaml.safe_load(RECORDED.read_text())
    trace = parse_trace(doc, str(RECORDED))
    cfg_doc = yaml.safe_load((RECORDED.parents[2] / "cluster-configs" / "local-cpu-head.yaml").read_text())
    cfg_doc["idle_timeout_minutes"] = 0.2              # the run's (tests/e2e/clusters.cluster_copy)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg_doc))
    cfg = config_from_cluster(str(path), trace.default_schedule, False)
    timing = measured_timing(doc, cloud_machines(doc))
    assert timing.launch_concurrency == 1 and timing.task_start_ms > 1000 and timing.scale_down_ms > 0
    measured = billed_node_hours(doc)        # 0.044065 node-hours, as the demo measured it in the run
    nodes = len(doc["meta"]["recorded_nodes"])
    replay = sum(simulate(trace, cfg, **timing.kwargs()).node_hours().values())
    assert replay == pytest.approx(measured, rel=0.10, abs=4.0 * nodes / 3600)
    before = sum(simulate(trace, cfg, launch_latency_ms=timing.launch_latency_ms).node_hours().values())
    assert before < measured * 0.9 - 4.0 * nodes / 3600
