"""`simulate` on a shape-open cluster: the replay launches what the monitor's packing decides (issue 17, "Preview":
simulate goes through the same code), checked against the monitor's own step (`OpenTypes.step`) and a brute-force
search of the catalog."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli import main
from ray_nodeless.core.catalog import embedded
from ray_nodeless.core.cluster_plan import load_catalog, planner_for
from ray_nodeless.core.demand import parse_demand
from ray_nodeless.core.open_pack import Packer
from ray_nodeless.core.open_plan import OpenFitter
from ray_nodeless.core.settings import Resolver
from ray_nodeless.launch.open_types import OpenTypes, Snapshot
from ray_nodeless.operate.config import load_provider
from ray_nodeless.simulate.config import config_from_cluster
from ray_nodeless.simulate.engine import simulate
from ray_nodeless.simulate.model import SimulationError
from ray_nodeless.trace.model import parse_trace
from tests import REPO_ROOT

NODELESS = REPO_ROOT / "cluster-configs" / "local-nodeless.yaml"
TASKS = [{"name": "big", "resources": {"CPU": 16}, "minutes": 30},
         {"name": "pair", "resources": {"GPU": 2}, "minutes": 30},
         {"name": "small", "resources": {"CPU": 1}, "minutes": 30, "count": 5},
         {"name": "l4", "resources": {"GPU": 1, "accelerator_type:L4": 0.001}, "minutes": 30}]


def _trace(tasks):
    return parse_trace({"version": 1, "name": "t", "jobs": [{"name": "j", "tasks": tasks}]})


class DictStore:
    """The config file the monitor re-reads, in memory."""

    def __init__(self, config):
        self.config = config

    def read(self):
        return json.loads(json.dumps(self.config))

    def write(self, config):
        self.config = config


def monitor_first_step(path: Path, tasks) -> dict[str, int]:
    """What the running monitor decides for these pending tasks on a fresh cluster: OpenTypes.step, built as
    NodelessProvider._open_types builds it."""
    cfg = yaml.safe_load(path.read_text())
    bundle = load_provider(cfg["provider"])
    s = bundle.core
    fitter = OpenFitter(Resolver(s, bundle.requirement_overrides), planner_for(load_catalog(s.catalog)), None,
                        s.open_node_config)
    step = OpenTypes(s, Packer(fitter, s.single_zone_gangs), DictStore(cfg))
    # Ray's GCS reports pending requests by count (ResourceRequestByCount): equal shapes are one demand.
    demands = [dataclasses.replace(parse_demand(t["resources"]), count=t.get("count", 1)) for t in tasks]
    return {k: v for k, v in step.step(Snapshot(demands, []), {}).quotas.items() if v}


def test_replay_launches_what_the_monitor_decides():
    cfg = config_from_cluster(str(NODELESS), "all-parallel", False)
    assert cfg.open is not None and cfg.node_types.keys() == {"head"}
    r = simulate(_trace(TASKS), cfg, launch_latency_ms=60_000)
    launched: dict[str, int] = {}
    for n in r.nodes:
        if not n.is_head:
            assert n.launch_ms == 0            # all on the first tick: nothing was relaunched
            launched[n.node_type] = launched.get(n.node_type, 0) + 1
    assert launched == monitor_first_step(NODELESS, TASKS)
    assert r.elapsed_ms == 60_000 + 30 * 60_000
    assert all(t.state == "done" for t in r.tasks)
    # The input config is untouched (a config is replayed more than once); the run's copy has the opened types.
    assert cfg.node_types.keys() == {"head"}
    assert set(r.config.offers) == {"head", *launched}


def test_a_two_gpu_task_gets_its_brute_force_cheapest_fit():
    """Spot first, then price, name, zone (docs/rules.md's order) over x86_64 offerings with a known price."""
    best = min((o for o in embedded().region("aws", "us-west-2").offerings()
                if o.capacity == "spot" and o.hourly_price is not None and o.instance_type.gpu_count >= 2
                and o.instance_type.arch == "x86_64" and o.instance_type.gpu_model not in ("M60", "K80")),
               key=lambda o: (o.hourly_price, o.instance_type.name, o.zone))
    r = simulate(_trace([TASKS[1]]), config_from_cluster(str(NODELESS), "all-parallel", False))
    (worker,) = [n for n in r.nodes if not n.is_head]
    assert (worker.offer.instance_type, worker.offer.zone, worker.offer.capacity, worker.offer.hourly_price) == (
        best.instance_type.name, best.zone, "spot", best.hourly_price)
    assert r.config.node_types[worker.node_type]["labels"]["ray.io/market-type"] == "spot"


def test_small_tasks_share_a_machine_and_idle_ones_go(tmp_path):
    """Eight 1-CPU tasks: the packing opens what serves them cheapest in all (not eight machines), and the idle
    timeout ends them after the workload."""
    trace = _trace([{"name": "s", "resources": {"CPU": 1}, "minutes": 10, "count": 8}])
    r = simulate(trace, config_from_cluster(str(NODELESS), "all-parallel", False))
    workers = [n for n in r.nodes if not n.is_head]
    assert workers == [n for n in workers if n.launch_ms == 0]
    assert monitor_first_step(NODELESS, [{"resources": {"CPU": 1}, "count": 8}]) == \
        {n.node_type: sum(1 for w in workers if w.node_type == n.node_type) for n in workers}
    per_task = min(n.offer.hourly_price for n in workers)
    assert sum(n.offer.hourly_price for n in workers) <= 8 * per_task + 1e-9
    # The break-even (180 s) is longer than this config's idle_timeout_minutes (0.5), which therefore holds.
    assert all(r.config.idle_ms(n.node_type) == 30_000 for n in workers)
    assert all(n.end_ms is not None and n.end_ms >= r.elapsed_ms for n in workers)
    assert all(n.end_ms - r.elapsed_ms <= r.config.idle_ms(n.node_type) + 5_000 for n in workers)


def test_max_workers_bounds_the_opened_machines(tmp_path):
    doc = yaml.safe_load(NODELESS.read_text())
    doc["max_workers"] = 2
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    trace = _trace([{"name": "g", "resources": {"GPU": 1}, "minutes": 30, "count": 4}])
    r = simulate(trace, config_from_cluster(str(path), "all-parallel", False), launch_latency_ms=0)
    assert r.peak_nodes() == 1 + 2
    assert all(t.state == "done" for t in r.tasks)
    assert r.elapsed_ms == 2 * 30 * 60_000


def test_a_forbidden_demand_fails_the_replay_naming_why():
    trace = _trace([{"name": "old", "resources": {"GPU": 1, "accelerator_type:K80": 0.001}, "minutes": 5}])
    with pytest.raises(SimulationError, match=r"shape-open: cannot serve \{GPU: 1, accelerator_type:K80"):
        simulate(trace, config_from_cluster(str(NODELESS), "all-parallel", False))


def test_cli_simulate_a_shape_open_cluster(tmp_path):
    trace_path = tmp_path / "t.yaml"
    trace_path.write_text(yaml.safe_dump({"version": 1, "name": "t", "jobs": [{"name": "j", "tasks": TASKS}]}))
    r = CliRunner().invoke(main, ["simulate", str(trace_path), "--config", str(NODELESS), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)["configurations"]["local-nodeless"]
    instances = res["instances"]
    assert set(instances) - {"head"} == set(monitor_first_step(NODELESS, TASKS))
    assert res["launches"] == sum(monitor_first_step(NODELESS, TASKS).values())


def test_declared_types_come_first_on_a_shape_open_cluster(tmp_path):
    """`open_shapes: true` with a declared GPU worker: 1-GPU tasks are Ray's (its scheduler scales gpu_worker), a
    2-GPU task, which gpu_worker cannot hold, gets its own cheapest fit."""
    doc = yaml.safe_load((REPO_ROOT / "cluster-configs" / "local-cpu-head.yaml").read_text())
    doc["provider"]["open_shapes"] = True
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    trace = _trace([{"name": "one", "resources": {"GPU": 1}, "minutes": 30, "count": 2},
                    {"name": "two", "resources": {"GPU": 2}, "minutes": 30}])
    r = simulate(trace, config_from_cluster(str(path), "all-parallel", False))
    kinds = sorted(n.node_type for n in r.nodes if not n.is_head)
    assert kinds == ["gpu_worker", "gpu_worker", *monitor_first_step(path, [{"resources": {"GPU": 2}}])]
    assert all(t.state == "done" for t in r.tasks)
    two = next(t for t in r.tasks if t.spec.name == "two")
    assert r.nodes[two.ran_on].node_type.startswith("nl-")
