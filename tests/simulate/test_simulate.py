"""Replays of traces through Ray's resource-demand scheduler and our planner (no cloud, no Ray cluster)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli import main
from ray_nodeless.core.cluster_plan import load_catalog, load_cluster_yaml, plan_cluster
from ray_nodeless.errors import ConfigError
from ray_nodeless.simulate.config import build_configs, config_from_cluster, config_from_fixed, force_on_demand
from ray_nodeless.simulate.engine import Simulator, simulate
from ray_nodeless.simulate.model import TICK_MS, SimulationError
from ray_nodeless.trace.model import MS_PER_HOUR, load_trace, parse_trace, write_trace
from tests import REPO_ROOT

ROOT = REPO_ROOT
TRACE = ROOT / "examples" / "traces" / "automl-published.yaml"
GPU_HEAD = ROOT / "cluster-configs" / "aws-gpu-head.yaml"
CPU_HEAD = ROOT / "cluster-configs" / "aws-cpu-head.yaml"


@pytest.fixture(scope="module")
def catalog():
    return load_catalog("embedded")


@pytest.fixture(scope="module")
def trace():
    return load_trace(TRACE)


@pytest.fixture(scope="module")
def published(trace, catalog):
    """The published trace under the fixed baseline and both cluster configs, on-demand and as configured."""
    cfgs = build_configs(trace, [str(GPU_HEAD), str(CPU_HEAD)], ["fixed:3xg4dn.4xlarge"], "both", None, catalog)
    return {c.label: simulate(trace, c) for c in cfgs}


def _cluster_yaml(tmp_path: Path, *, head_res: dict, worker_res: dict | None, max_workers: int = 4,
                  min_workers: int = 0, idle_minutes: float = 5, capacity=("on-demand",)) -> str:
    types = {"head": {"resources": head_res, "node_config": {}}}
    if worker_res is not None:
        types["worker"] = {"resources": worker_res, "min_workers": min_workers, "max_workers": max_workers,
                           "node_config": {}}
    doc = {
        "cluster_name": "t", "max_workers": max_workers, "upscaling_speed": 1.0, "idle_timeout_minutes": idle_minutes,
        "provider": {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws",
                     "region": "us-west-2", "rules": [{"name": "all", "match": {}, "capacity": list(capacity)}]},
        "auth": {"ssh_user": "ubuntu"}, "available_node_types": types, "head_node_type": "head",
        "file_mounts": {}, "cluster_synced_files": [], "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }
    p = tmp_path / f"cluster-{len(list(tmp_path.iterdir()))}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


# -- the published figures -------------------------------------------------------------------------------------

def test_fixed_baseline_reproduces_published_figures(published, trace):
    r = published["fixed:3xg4dn.4xlarge"]
    assert r.config.schedule == "sequential"
    # 21 h of Tune (each run's survivors keep it busy to the end of its budget) + 1.6 h head-only.
    assert r.elapsed_ms == 22.6 * MS_PER_HOUR
    assert r.head_phase_ms == 1.6 * MS_PER_HOUR
    assert round(r.workload_cost, 2) == 81.63
    assert round(r.config.idle_cost_per_hour, 3) == 3.612
    assert r.node_hours() == {"g4dn.4xlarge": pytest.approx(3 * 22.6)}
    # The head ran trials too (it has the GPU the fixed cluster counts on); every trial started in time.
    head = next(n for n in r.nodes if n.is_head)
    assert any(t.ran_on == head.seq for t in r.tasks)
    assert sum(1 for t in r.tasks if t.state in ("done", "cut")) == 90


def test_fixed_figures_come_from_the_replay(trace, catalog):
    """Shorten every survivor: the budget no longer binds, so the fixed figure must move (nothing is hard-coded)."""
    doc = yaml.safe_load(TRACE.read_text())
    for j in doc["jobs"]:
        for t in j["tasks"]:
            if t["name"] == "survivor":
                t["minutes"] = t["minutes"] / 2
    shorter = parse_trace(doc)
    r = simulate(shorter, config_from_fixed("fixed:3xg4dn.4xlarge", "sequential", catalog))
    assert r.elapsed_hours < 22.6 - 1
    assert r.workload_cost < 81.63


def test_configs_use_planner_choice_and_on_demand_override(published):
    for label, od in (("aws-gpu-head", False), ("aws-gpu-head:on-demand", True)):
        r = published[label]
        cfg = load_cluster_yaml(GPU_HEAD)
        if od:
            cfg = force_on_demand(cfg)
        cp = plan_cluster(cfg)
        for name, offer in r.config.offers.items():
            chosen = cp.plans[name].chosen
            assert (offer.instance_type, offer.capacity, offer.hourly_price) == (
                chosen.instance_type.name, chosen.capacity, chosen.hourly_price)
        assert r.config.idle_cost_per_hour == cp.cost.idle_cost_per_hour
    assert published["aws-gpu-head:on-demand"].config.offers["gpu_worker"].capacity == "on-demand"
    assert published["aws-gpu-head"].config.offers["gpu_worker"].capacity == "spot"


def test_head_variants(published):
    gpu, cpu = published["aws-gpu-head:on-demand"], published["aws-cpu-head:on-demand"]
    gpu_head = next(n for n in gpu.nodes if n.is_head)
    cpu_head = next(n for n in cpu.nodes if n.is_head)
    # A GPU head runs trials; a CPU head runs none (the trials need a GPU), only the head-only phases.
    assert sum(1 for t in gpu.tasks if t.ran_on == gpu_head.seq) > 0
    assert sum(1 for t in cpu.tasks if t.ran_on == cpu_head.seq) == 0
    gpu_worker_hours = sum(n.end_ms - n.launch_ms for n in gpu.nodes if not n.is_head)
    cpu_worker_hours = sum(n.end_ms - n.launch_ms for n in cpu.nodes if not n.is_head)
    # The GPU head carries trials, so the CPU-head cluster needs more GPU worker-hours for the same trace.
    assert cpu_worker_hours > gpu_worker_hours
    # Cheaper to idle with a CPU head.
    assert cpu.config.idle_cost_per_hour < gpu.config.idle_cost_per_hour


def test_beats_published_and_respects_bounds(published):
    base = published["fixed:3xg4dn.4xlarge"]
    for label, r in published.items():
        assert r.lower_bound() <= r.workload_cost + 1e-9, label
        if r.config.kind == "autoscaled":
            # Published: -54 % with the GPU head; the planner's cheaper worker must do at least as well.
            assert r.workload_cost < 0.46 * base.workload_cost, label
            assert r.elapsed_hours < base.elapsed_hours
            workers = [n for n in r.nodes if not n.is_head]
            peak = max(sum(1 for n in workers if n.launch_ms <= t < n.end_ms) for t in {n.launch_ms for n in workers})
            assert peak <= r.config.node_types["gpu_worker"]["max_workers"]
    assert published["aws-gpu-head:on-demand"].config.idle_cost_per_hour == pytest.approx(1.204)


class _EveryTick(Simulator):
    """The autoscaler evaluated on every tick of the 5-s grid while anything can still change: the brute-force
    reference for the replay, which only evaluates ticks after a change."""

    def _next_tick(self, ran_tick: bool) -> None:
        # After the workload ends only idle terminations remain, down to each type's min_workers: stop there.
        workers = [n.node_type for n in self.live.values() if not n.is_head]
        if self.workload_end is None or any(workers.count(t) > self.cfg.node_types[t]["min_workers"]
                                            for t in set(workers)):
            grid = -(-self.now // TICK_MS) * TICK_MS          # the first tick at or after now ...
            self._tick_at(grid + TICK_MS if ran_tick and grid == self.now else grid)   # ... that has not run


def _staggered_cluster(tmp_path: Path) -> tuple:
    """Bursts of GPU work with gaps longer than the idle timeout, a min_workers floor and a cap: workers launch,
    idle out mid-run (never below the floor) and launch again."""
    trace = parse_trace(_one_job([
        {"name": "a", "resources": {"GPU": 1}, "minutes": 20, "count": 3},
        {"name": "b", "resources": {"GPU": 1}, "minutes": 10, "count": 4, "submit_at_minutes": 45},
        {"name": "c", "resources": {"CPU": 2}, "minutes": 7, "count": 5, "submit_at_minutes": 100},
    ]))
    path = _cluster_yaml(tmp_path, head_res={"CPU": 4}, worker_res={"CPU": 4, "GPU": 1}, max_workers=3,
                         min_workers=1, idle_minutes=5)
    return trace, config_from_cluster(path, "all-parallel", False)


@pytest.mark.parametrize("case", ["gpu-head-spot-interrupted", "cpu-head-on-demand", "staggered-min-workers"])
def test_evaluating_only_changed_ticks_equals_evaluating_every_tick(case, trace, catalog, tmp_path):
    """The replay skips ticks where nothing changed, because the scheduler's answer is a function of the state.
    That shortcut must not change any figure: same nodes, same times, byte-identical report, while the scheduler
    is consulted far less often than the brute-force reference does."""
    kw = {}
    if case == "gpu-head-spot-interrupted":
        cfg = build_configs(trace, [str(GPU_HEAD)], [], "as-configured", None, catalog)[0]
        kw = {"spot_interruptions_per_hour": 0.5, "seed": 7}
        tr = trace
    elif case == "cpu-head-on-demand":
        cfg = build_configs(trace, [str(CPU_HEAD)], [], "on-demand", None, catalog)[0]
        tr = trace
    else:
        tr, cfg = _staggered_cluster(tmp_path)
    fast = simulate(tr, cfg, **kw)
    brute = _EveryTick(tr, cfg, **kw).run()
    nodes = [(n.node_type, n.launch_ms, n.ready_ms, n.end_ms) for n in fast.nodes]
    assert nodes == [(n.node_type, n.launch_ms, n.ready_ms, n.end_ms) for n in brute.nodes]
    assert json.dumps(fast.to_dict(), sort_keys=True) == json.dumps(brute.to_dict(), sort_keys=True)
    assert [(t.state, t.ran_on, t.useful_ms, t.lost_ms) for t in fast.tasks] == \
        [(t.state, t.ran_on, t.useful_ms, t.lost_ms) for t in brute.tasks]
    assert 0 < fast.scheduler_calls * 10 < brute.scheduler_calls
    if case == "gpu-head-spot-interrupted":
        assert fast.interruptions > 0
    if case == "staggered-min-workers":
        # Workers did idle out between bursts and relaunch, and the floor of one worker held throughout.
        workers = [n for n in fast.nodes if not n.is_head]
        assert any(n.end_ms < fast.elapsed_ms for n in workers)
        assert any(n.launch_ms > 0 for n in workers)
        for t in range(0, fast.elapsed_ms, TICK_MS):
            assert sum(1 for n in workers if n.launch_ms <= t < n.end_ms) >= 1, t


# -- mechanics on small traces -----------------------------------------------------------------------------------

def _one_job(tasks: list[dict], **job) -> dict:
    return {"version": 1, "name": "t", "jobs": [{"name": "j", "tasks": tasks, **job}]}


def test_launch_latency_and_idle_timeout_exact(tmp_path):
    trace = parse_trace(_one_job([{"name": "g", "resources": {"GPU": 1}, "hours": 1}]))
    path = _cluster_yaml(tmp_path, head_res={"CPU": 4}, worker_res={"CPU": 4, "GPU": 1}, idle_minutes=5)
    # Ray v1's one idle_timeout_minutes (the per-type break-even is tests/simulate/test_idle_release.py's).
    r = simulate(trace, config_from_cluster(path, "all-parallel", False, idle_release="cluster-wide"),
                 launch_latency_ms=180_000)
    worker = next(n for n in r.nodes if not n.is_head)
    # Tick at t=0 launches; ready 3 min later; runs 1 h; idle 5 min; terminated on the 5-s tick grid.
    assert worker.launch_ms == 0 and worker.ready_ms == 180_000
    assert r.elapsed_ms == 180_000 + MS_PER_HOUR
    assert worker.end_ms == 180_000 + MS_PER_HOUR + 300_000
    head_price = r.config.offers["head"].hourly_price
    w_price = r.config.offers["worker"].hourly_price
    assert r.workload_cost == pytest.approx(head_price * 1.05 + w_price * (4_080_000 / MS_PER_HOUR))
    assert r.scheduler_calls >= 1


@pytest.mark.timeout(60)
def test_min_workers_floor_does_not_stall_the_replay(tmp_path):
    """A worker kept by min_workers idles at the end of every workload. It can never be terminated, so it must not
    keep asking for idle ticks: the replay used to loop forever on any cluster with min_workers >= 1."""
    trace = parse_trace(_one_job([{"name": "g", "resources": {"GPU": 1}, "minutes": 20}]))
    path = _cluster_yaml(tmp_path, head_res={"CPU": 4}, worker_res={"CPU": 4, "GPU": 1}, min_workers=1)
    r = simulate(trace, config_from_cluster(path, "all-parallel", False))
    (worker,) = [n for n in r.nodes if not n.is_head]
    # The floor worker comes up with the cluster, runs the task at once, and is billed until the workload ends.
    assert (worker.launch_ms, worker.ready_ms, worker.end_ms) == (0, 0, 20 * 60_000)
    assert r.elapsed_ms == 20 * 60_000 and r.tasks[0].ran_on == worker.seq


def test_max_workers_and_ray_scheduler_is_used(tmp_path, monkeypatch):
    from ray.autoscaler._private import resource_demand_scheduler as rds
    calls = []
    orig = rds.ResourceDemandScheduler.get_nodes_to_launch

    def spy(self, *a, **kw):
        out = orig(self, *a, **kw)
        calls.append(dict(out[0]))
        return out

    monkeypatch.setattr(rds.ResourceDemandScheduler, "get_nodes_to_launch", spy)
    trace = parse_trace(_one_job([{"name": "g", "resources": {"CPU": 1, "GPU": 1}, "minutes": 30, "count": 12}]))
    path = _cluster_yaml(tmp_path, head_res={"CPU": 4}, worker_res={"CPU": 4, "GPU": 1}, max_workers=3)
    r = simulate(trace, config_from_cluster(path, "all-parallel", False))
    assert calls and sum(sum(c.values()) for c in calls) == len([n for n in r.nodes if not n.is_head])
    assert r.peak_nodes() == 1 + 3
    assert r.elapsed_ms == 180_000 + 4 * 30 * 60_000       # 12 trials, 3 GPUs, 4 rounds


def test_concurrency_limit_and_budget(tmp_path, catalog):
    trace = parse_trace(_one_job([{"name": "g", "resources": {"GPU": 1}, "minutes": 40, "count": 4}],
                                 max_concurrent=1, time_budget_hours=1))
    r = simulate(trace, config_from_fixed("fixed:2xg4dn.xlarge", "all-parallel", catalog))
    states = [t.state for t in r.tasks]
    assert states == ["done", "cut", "cancelled", "cancelled"]
    assert r.elapsed_ms == MS_PER_HOUR
    assert r.useful_task_hours == pytest.approx(1.0)
    # Bound: 1 useful GPU-hour on the cheapest node of the config, here the fixed type itself.
    assert r.lower_bound() == pytest.approx(r.config.offers["fixed"].hourly_price)
    assert r.lower_bound() <= r.workload_cost


def test_lower_bound_below_cost_when_schedules_swap(trace, catalog):
    cfgs = build_configs(trace, [f"{GPU_HEAD}#sequential"], ["fixed:3xg4dn.4xlarge#parallel"], "on-demand", None,
                         catalog)
    for c in cfgs:
        r = simulate(trace, c)
        assert 0 < r.lower_bound() <= r.workload_cost, c.label


def test_infeasible_task_is_an_error(tmp_path):
    trace = parse_trace(_one_job([{"name": "g", "resources": {"GPU": 8}, "hours": 1}]))
    path = _cluster_yaml(tmp_path, head_res={"CPU": 4}, worker_res={"CPU": 4, "GPU": 1})
    with pytest.raises(SimulationError, match="cannot complete"):
        simulate(trace, config_from_cluster(path, "all-parallel", False))


def test_spot_interruptions_rerun_lost_work_deterministically(trace, catalog):
    cfg = build_configs(trace, [str(GPU_HEAD)], [], "as-configured", None, catalog)[0]
    assert cfg.offers["gpu_worker"].capacity == "spot"
    quiet = simulate(trace, cfg)
    a = simulate(trace, cfg, spot_interruptions_per_hour=0.5, seed=7)
    b = simulate(trace, cfg, spot_interruptions_per_hour=0.5, seed=7)
    c = simulate(trace, cfg, spot_interruptions_per_hour=0.5, seed=8)
    assert a.interruptions > 0 and a.lost_task_hours > 0
    assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())
    assert json.dumps(a.to_dict()) != json.dumps(c.to_dict())
    assert quiet.interruptions == 0 and quiet.lost_task_hours == 0
    # Every task still ends (finished or cut by its budget), nothing is silently dropped.
    assert {t.state for t in a.tasks} <= {"done", "cut", "cancelled"}


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_written_trace_reads_back(suffix, trace, tmp_path):
    """`trace record` writes with `write_trace`; whatever it writes, `load_trace` must read back unchanged."""
    doc = yaml.safe_load(TRACE.read_text())
    out = tmp_path / f"t{suffix}"
    write_trace(doc, out)
    if suffix == ".json":
        assert json.loads(out.read_text()) == doc
    assert load_trace(out) == trace


def test_trace_validation_errors():
    with pytest.raises(ConfigError, match="unknown key"):
        parse_trace(_one_job([{"name": "g", "resources": {"GPU": 1}, "hours": 1}], bogus=1))
    with pytest.raises(ConfigError, match="unknown job"):
        parse_trace({"jobs": [{"name": "a", "tasks": []}], "schedules": {"s": [["b"]]}})
    with pytest.raises(ConfigError, match="needs one of"):
        parse_trace(_one_job([{"name": "g", "resources": {"GPU": 1}}]))


# -- the command ------------------------------------------------------------------------------------------------

def test_cli_json_is_deterministic_and_complete(tmp_path):
    args = ["simulate", str(TRACE), "--baseline", "fixed:3xg4dn.4xlarge", "--config", str(GPU_HEAD),
            "--config", str(CPU_HEAD), "--capacity", "both", "--json"]
    runner = CliRunner()
    r1 = runner.invoke(main, args)
    r2 = runner.invoke(main, args)
    assert r1.exit_code == 0, r1.output
    assert r1.output == r2.output
    doc = json.loads(r1.output)
    confs = doc["configurations"]
    assert set(confs) == {"fixed:3xg4dn.4xlarge", "aws-gpu-head", "aws-gpu-head:on-demand", "aws-cpu-head",
                          "aws-cpu-head:on-demand"}
    for c in confs.values():
        assert {"elapsed_hours", "workload_cost", "idle_cost_per_hour", "node_hours", "lower_bound_cost",
                "gpu_utilisation"} <= set(c)
    assert confs["fixed:3xg4dn.4xlarge"]["elapsed_hours"] == 22.6
    assert round(confs["fixed:3xg4dn.4xlarge"]["workload_cost"], 2) == 81.63
    assert confs["fixed:3xg4dn.4xlarge"]["idle_cost_per_hour"] == 3.612
    assert doc["trace"] == "automl-published" and doc["published"]
    assert doc["parameters"] == {"launch_minutes": 3.0, "spot_interruptions_per_hour": 0.0, "seed": 0,
                                 "capacity": "both", "tick_seconds": 5, "idle_release": "as-configured",
                                 "autoscaler": "ray v1 ResourceDemandScheduler.get_nodes_to_launch",
                                 "reversion": "as-configured", "spot_outage_minutes": 0.0, "launch_concurrency": None,
                                 "task_start_seconds": 0.0, "scale_down_seconds": 0.0}


def test_cli_text_plot_and_errors(tmp_path):
    png = tmp_path / "t.png"
    r = CliRunner().invoke(main, ["simulate", str(TRACE), "--baseline", "fixed:3xg4dn.4xlarge",
                                  "--config", f"{GPU_HEAD}#sequential", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "trace automl-published: 9 jobs, 90 tasks"
    base_row = next(line for line in lines if line.startswith("fixed:3xg4dn.4xlarge "))
    assert base_row.split()[1:4] == ["sequential", "22.600", "81.63"]
    # The config replays the sequential schedule too, so it is compared against the baseline in `vs base`.
    row = next(line for line in lines if line.startswith("aws-gpu-head "))
    assert row.split()[1] == "sequential" and row.split()[4].startswith("-") and row.split()[4].endswith("%")
    assert lines[-1] == f"plot: {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,key", [
    (["--baseline", "fixed:3xnope.huge"], "--baseline: nope.huge has no on-demand price in aws us-west-2"),
    (["--baseline", "three g4dn"], "--baseline: 'three g4dn' is not fixed:<N>x<instance type>[@region]"),
    ([], "--config/--baseline: give at least one configuration"),
    (["--baseline", "fixed:1xg4dn.xlarge", "--launch-minutes", "-1"], "--launch-minutes: must be >= 0"),
    (["--baseline", "fixed:1xg4dn.xlarge", "--scale-down-seconds", "-2"], "--scale-down-seconds: must be >= 0"),
    (["--baseline", "fixed:1xg4dn.xlarge", "--launch-concurrency", "0"], "--launch-concurrency: must be >= 1"),
    (["--config", str(GPU_HEAD), "--schedule", "nightly"], "'nightly' is not one of the trace's schedules"),
])
def test_cli_bad_input_exits_2_naming_the_key(args, key):
    r = CliRunner().invoke(main, ["simulate", str(TRACE), *args])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("ray-nodeless: error: ") and key in r.output
    assert len(r.output.splitlines()) == 1


def test_cli_bad_trace_names_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_one_job([{"name": "g", "resources": {"GPU": 1}, "hours": -1}])))
    r = CliRunner().invoke(main, ["simulate", str(bad), "--baseline", "fixed:1xg4dn.xlarge"])
    assert r.exit_code == 2, r.output
    assert f"ray-nodeless: error: {bad}.jobs[0].tasks[0].hours: must be a number >= 0" in r.output


def test_cli_infeasible_workload_exits_1(tmp_path):
    """A trace that cannot complete is not a bad option: the replay ran and failed, exit 1 with the reason."""
    t = tmp_path / "big.yaml"
    t.write_text(yaml.safe_dump(_one_job([{"name": "g", "resources": {"GPU": 8}, "hours": 1}])))
    r = CliRunner().invoke(main, ["simulate", str(t), "--baseline", "fixed:1xg4dn.xlarge"])
    assert r.exit_code == 1, r.output
    assert "ray-nodeless: error: fixed:1xg4dn.xlarge: the workload cannot complete" in r.output


def test_fixed_baseline_other_region(catalog):
    c = config_from_fixed("fixed:3xg4dn.4xlarge@us-east-1", "sequential", catalog)
    rc = catalog.region("aws", "us-east-1")
    prices = [o.hourly_price for o in rc.offerings()
              if o.instance_type.name == "g4dn.4xlarge" and o.capacity == "on-demand"]
    assert c.offers["fixed"].hourly_price == min(prices)
    assert c.idle_cost_per_hour == pytest.approx(3 * min(prices))
