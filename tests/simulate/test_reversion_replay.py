"""Spot capacity, fallbacks and on-demand -> spot reversion in the replay (simulate/reversion.py): interruptions put
the offering in the capacity memory, a drought sends launches to on demand, reversion replaces those fallbacks by
spot once spot is out of the memory (spot first, the fallback drained only when idle, bounded in flight, within
max_hourly_cost), and repeated interruptions make a type prefer on-demand."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli import main
from ray_nodeless.simulate.config import config_from_cluster
from ray_nodeless.simulate.engine import Simulator, simulate
from ray_nodeless.trace.model import MS_PER_HOUR, parse_trace
from tests.simulate.test_simulate import CPU_HEAD, TRACE

MIN = 60_000
LAUNCH = 3 * MIN


def _yaml(tmp_path: Path, *, reversion: dict | None = None, idle_s: float = 3600, min_workers: int = 0,
          max_hourly_cost: float | None = None) -> str:
    provider = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws", "region": "us-west-2",
                "rules": [{"name": "head", "match": {"node_kind": "head"}, "capacity": ["on-demand"]},
                          {"name": "workers", "match": {}, "capacity": ["spot", "on-demand"]}],
                "reversion": {"min_age_s": 600, "interval_s": 60, **(reversion or {})}}
    if max_hourly_cost is not None:
        provider["max_hourly_cost"] = max_hourly_cost
    doc = {"cluster_name": "t", "max_workers": 4, "upscaling_speed": 1.0, "idle_timeout_minutes": 60,
           "provider": provider, "auth": {"ssh_user": "ubuntu"},
           "available_node_types": {
               "head": {"resources": {"CPU": 4}, "node_config": {}},
               "worker": {"resources": {"CPU": 4, "GPU": 1}, "min_workers": min_workers, "max_workers": 4,
                          "idle_timeout_s": idle_s, "node_config": {}}},
           "head_node_type": "head", "file_mounts": {}, "cluster_synced_files": [], "initialization_commands": [],
           "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
           "head_start_ray_commands": [], "worker_start_ray_commands": []}
    p = tmp_path / f"c{len(list(tmp_path.iterdir()))}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def _trace(*tasks):
    return parse_trace({"version": 1, "name": "t", "jobs": [{"name": "j", "tasks": [
        {"name": n, "resources": {"GPU": 1}, "minutes": m, "submit_at_minutes": at} for n, m, at in tasks]}]})


def _workers(r):
    return [n for n in r.nodes if not n.is_head]


def _min_live_workers(r, lo, hi):
    """The fewest workers up (launched, not ended) at any change between lo and hi."""
    times = sorted({t for n in _workers(r) for t in (n.launch_ms, n.end_ms) if lo <= t <= hi} | {lo})
    return min(sum(1 for n in _workers(r) if n.launch_ms <= t < (n.end_ms or 1e18)) for t in times)


# A 60-min trial, and a 120-min one submitted at 80 min. The first trial's spot worker (node 1) is interrupted at
# 10 min in a 20-min drought: the trial reruns on an on-demand fallback (node 2, ready 13 min, busy until 73 min).
# Spot is back at 30 min (+ the memory): reversion launches a spot worker, which waits (its idle timeout is an hour)
# until the fallback finishes; then the fallback is drained idle and terminated, and the second trial runs on spot.
SCENARIO = dict(interrupt_at={1: 10 * MIN}, spot_outage_ms=20 * MIN, launch_latency_ms=LAUNCH)


def test_a_drought_falls_back_to_on_demand_and_reversion_brings_spot_back_without_killing_work(tmp_path):
    trace = _trace(("a", 60, 0), ("b", 120, 80))
    on = simulate(trace, config_from_cluster(_yaml(tmp_path), "all-parallel", False), **SCENARIO)
    off = simulate(trace, config_from_cluster(_yaml(tmp_path), "all-parallel", False, reversion=False), **SCENARIO)
    for r in (on, off):
        first, fallback = _workers(r)[:2]
        assert first.offer.capacity == "spot" and first.end_ms == 10 * MIN
        assert fallback.offer.capacity == "on-demand" and fallback.fallback and fallback.launch_ms == 10 * MIN
        a, b = r.tasks
        assert a.state == "done" and a.attempts == 2 and a.ran_on == fallback.seq
        assert a.lost_ms == 10 * MIN - LAUNCH              # lost once, to the interruption only
        assert b.state == "done" and b.attempts == 1 and b.lost_ms == 0
    assert off.policy_stats == {} and len(_workers(off)) == 2
    rev = on.policy_stats["SimReverter"]
    assert rev["started"] == 1 and rev["replaced"] == 1 and rev["refused_busy"] > 0
    first, fallback, spot = _workers(on)
    assert spot.offer.capacity == "spot" and spot.launch_ms >= 30 * MIN and spot.launch_ms < fallback.end_ms
    # Drained only once idle: after its trial's end, at the first reversion tick (every 60 s).
    done = fallback.ready_ms + 60 * MIN
    assert done <= fallback.end_ms <= done + MIN
    assert _min_live_workers(on, 10 * MIN, fallback.end_ms) >= 1     # a worker up throughout the replacement
    assert on.tasks[1].ran_on == spot.seq


def test_reversion_pays_off_for_the_work_that_comes_after(tmp_path):
    # The second trial: with reversion it runs on the spot worker, without on the fallback.
    trace = _trace(("a", 60, 0), ("b", 120, 80))
    cfg_on = config_from_cluster(_yaml(tmp_path), "all-parallel", False)
    cfg_off = config_from_cluster(_yaml(tmp_path), "all-parallel", False, reversion=False)
    on, off = simulate(trace, cfg_on, **SCENARIO), simulate(trace, cfg_off, **SCENARIO)
    b_on, b_off = on.tasks[1], off.tasks[1]
    assert on.nodes[b_on.ran_on].offer.capacity == "spot" and off.nodes[b_off.ran_on].offer.capacity == "on-demand"
    assert on.workload_cost < off.workload_cost
    fb_on = sum(on.node_ms(n) for n in on.nodes if n.fallback) / MS_PER_HOUR
    fb_off = sum(off.node_ms(n) for n in off.nodes if n.fallback) / MS_PER_HOUR
    assert fb_on < fb_off
    assert on.to_dict()["fallback_node_hours"] == pytest.approx(fb_on, abs=1e-6)


def test_in_flight_bound_and_min_workers(tmp_path):
    # Two trials on the two min_workers, both interrupted in the drought: two fallbacks (busy until 73 and 103 min),
    # replaced one at a time. The second is still busy when the workload ends: reversion stops with the run.
    trace = _trace(("a", 60, 0), ("b", 90, 0))
    cfg = config_from_cluster(_yaml(tmp_path, min_workers=2), "all-parallel", False)
    r = simulate(trace, cfg, interrupt_at={1: 10 * MIN, 2: 10 * MIN}, spot_outage_ms=20 * MIN,
                 launch_latency_ms=LAUNCH)
    rev = r.policy_stats["SimReverter"]
    assert rev["started"] == 2 and rev["replaced"] == 1
    first_spots = [n for n in _workers(r) if n.launch_ms == 0]
    assert [n.offer.capacity for n in first_spots] == ["spot", "spot"]     # min_workers come up with the cluster
    spots = [n for n in _workers(r) if n.offer.capacity == "spot" and n.launch_ms > 10 * MIN]
    fallbacks = [n for n in _workers(r) if n.fallback]
    assert len(spots) == 2 and len(fallbacks) == 2
    # max_in_flight 1: the second spot replacement is launched only after the first fallback is gone.
    assert spots[1].launch_ms >= min(n.end_ms for n in fallbacks)
    # Never below min_workers once the fallbacks were up, through both replacements.
    assert _min_live_workers(r, 10 * MIN, r.elapsed_ms - 1) >= 2
    assert all(t.state == "done" and t.attempts == 2 for t in r.tasks)
    assert all(n.end_ms <= r.elapsed_ms for n in fallbacks)


def test_a_replacement_the_cost_cap_has_no_room_for_waits(tmp_path):
    trace = _trace(("a", 60, 0), ("b", 120, 80))
    probe = simulate(trace, config_from_cluster(_yaml(tmp_path), "all-parallel", False), **SCENARIO)
    head, _, fallback, spot = (probe.nodes[i] for i in range(4))
    # Room for the head and the fallback, not for a spot worker beside them.
    cap = head.offer.hourly_price + fallback.offer.hourly_price + spot.offer.hourly_price / 2
    r = simulate(trace, config_from_cluster(_yaml(tmp_path, max_hourly_cost=cap), "all-parallel", False), **SCENARIO)
    rev = r.policy_stats["SimReverter"]
    assert rev["started"] == 0 and rev["capped"] > 0
    # The cap is the launcher's for reversion: the fallback stays and runs the second trial too.
    assert len(_workers(r)) == 2 and r.tasks[1].ran_on == r.tasks[0].ran_on == 2
    assert all(t.state == "done" for t in r.tasks)


def test_repeated_interruptions_make_a_type_prefer_on_demand(tmp_path):
    # Limit 2 within an hour: after the second interruption the next worker is on-demand first (not a fallback, so
    # not reverted); without reversion settings' history it would be spot again.
    trace = _trace(("a", 60, 0))
    path = _yaml(tmp_path, reversion={"interruption_limit": 2, "interruption_window_s": 3600})
    kw = dict(interrupt_at={1: 10 * MIN, 2: 20 * MIN}, launch_latency_ms=LAUNCH)
    on = simulate(trace, config_from_cluster(path, "all-parallel", False), **kw)
    off = simulate(trace, config_from_cluster(path, "all-parallel", False, reversion=False), **kw)
    assert [n.offer.capacity for n in _workers(on)] == ["spot", "spot", "on-demand"]
    assert not _workers(on)[2].fallback and on.policy_stats["SimReverter"]["preferred_on_demand"] == 1
    assert on.policy_stats["SimReverter"]["started"] == 0
    assert [n.offer.capacity for n in _workers(off)] == ["spot", "spot", "spot"]
    # The second spot worker is another offering: the first one's is in the capacity memory.
    assert _workers(on)[1].offer != _workers(on)[0].offer


def test_seeded_interruptions_with_a_drought_and_reversion_on_the_published_trace():
    from ray_nodeless.trace.model import load_trace
    trace = load_trace(TRACE)
    kw = dict(spot_interruptions_per_hour=0.1, seed=0, spot_outage_ms=30 * MIN)
    a = simulate(trace, config_from_cluster(str(CPU_HEAD), trace.default_schedule, False), **kw)
    b = simulate(trace, config_from_cluster(str(CPU_HEAD), trace.default_schedule, False), **kw)
    assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)
    d = a.to_dict()
    assert d["spot_interruptions"] > 0 and d["fallback_node_hours"] > 0 and d["reversion"]["started"] > 0
    assert d["distance_to_bound_pct"] > 0
    # Nothing ran twice at once and every trial ended: the replay's own bookkeeping.
    assert all(t.state in ("done", "cut", "cancelled") for t in a.tasks)


def test_cli_replays_with_and_without_reversion(tmp_path):
    out = CliRunner().invoke(main, ["simulate", str(TRACE), "--config", str(CPU_HEAD), "--reversion", "both",
                                    "--spot-interruptions-per-hour", "0.1", "--spot-outage-minutes", "30", "--json"])
    assert out.exit_code == 0, out.output
    confs = json.loads(out.output)["configurations"]
    assert set(confs) == {"aws-cpu-head", "aws-cpu-head:no-reversion"}
    assert confs["aws-cpu-head:no-reversion"]["reversion"] is None
    assert confs["aws-cpu-head"]["reversion"]["started"] > 0
    for c in confs.values():
        assert c["distance_to_bound_pct"] is not None
    bad = CliRunner().invoke(main, ["simulate", str(TRACE), "--config", str(CPU_HEAD), "--launch-concurrency", "0"])
    assert bad.exit_code != 0 and "--launch-concurrency" in bad.output


def test_a_policy_sees_the_scripted_interruption(tmp_path):
    seen = []

    class Watch:
        def attach(self, sim):
            sim.on_interrupt.append(lambda s, n: seen.append((s.now, n.seq)))

        def on_tick(self, sim):
            pass

    Simulator(_trace(("a", 30, 0)), config_from_cluster(_yaml(tmp_path), "all-parallel", False, reversion=False),
              policies=[Watch()], interrupt_at={1: 5 * MIN}, launch_latency_ms=LAUNCH).run()
    assert seen == [(5 * MIN, 1)]
