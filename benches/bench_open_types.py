#!/usr/bin/env python3
"""Cost of shape-open provisioning (issue 17): one autoscaler v2 loop, shape-open vs a 3-node-type cluster.

    .venv/bin/python benches/bench_open_types.py                       # sizes 10, 100, 1000; 5 reps
    .venv/bin/python benches/bench_open_types.py --sizes 10,100 --reps 3 --json

Both clusters are `cluster-configs/local-nodeless.yaml` (AWS us-west-2 catalog, spot-first rules): the shape-open one
as it is (a CPU-0 head, no worker type; only the cluster's max_workers raised from the demo's 12 to 5,000 for
both, so no cap decides what is launched), the other with three declared worker types {CPU: 4}, {CPU: 4, GPU: 1} and
{CPU: 16} (what a user writes; not pinned, so Ray sees exactly these resources). Both get the same pending demands
of mixed shapes, as the GCS reports them (`ClusterResourceState`: requests grouped by count, placement groups as
gang requests): CPU 1/2/4/16, GPU 1/2, accelerator_type L4/A100, 64 GiB of memory, label selectors on market type
and zone (with a fallback), and a few STRICT_SPREAD placement groups.

One loop, as the v2 monitor runs it:
- Ray's config re-read (both): YAML parse of the cluster config + `AutoscalingConfig` (prepare_config,
  validate_config) + `get_node_type_configs()`; the shape-open file holds the generated types.
- Ray's scheduler (both): `ResourceDemandScheduler().schedule(SchedulingRequest(...))` built as `Reconciler` builds
  it, on the node types each cluster has (the shape-open one: the generated types with quotas).
- Ours (shape-open only): the GCS reply -> demands (`state_from_proto` + `snapshot_of`; the GCS RPC itself is not
  timed) and `OpenTypes.step` with an in-memory config store (the monitor's store is the YAML file: `step, YAML
  store` times that too).
Loops timed: "loop 1 cold" = first loop after the demands appear, the planner's plan cache empty (a burst of new
shapes); "loop 1 warm" = the same with the plan cache holding these shapes (shapes seen before); "loop 2" = the
demands still pending while the machines of loop 1 are launching (Ray: REQUESTED instances; ours: listed machines
that have not joined).

The planner runs on the path the monitor takes: plain Python (the monitor never imports numpy: `import ray` does
not; core/planner.py picks the numpy path only when numpy is imported). `--numpy` measures the numpy path instead.

Packing (costs per hour, AWS us-west-2 catalog): (a) every demand's own cheapest fit, summed; (b) our Packer's plan;
(c) what Ray's scheduler launches on the 3-type cluster, each of its types priced at its own cheapest fit; and
(check) what Ray's scheduler launches on the generated types, which must equal (b). (a) and (b) are also given on
the demands the 3-type cluster can serve at all, to compare with (c) on equal work.

Also `OpenFitter.fit` throughput: `--fit-shapes` distinct demand shapes (plan cache cold), on both planner paths.
"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from ray_nodeless.core.demand import Demand, canonical_resources  # noqa: E402
from ray_nodeless.core.open_pack import Packer  # noqa: E402
from ray_nodeless.core.open_plan import OpenFitter  # noqa: E402
from ray_nodeless.core.planner import Planner  # noqa: E402
from ray_nodeless.core.settings import Resolver  # noqa: E402
from ray_nodeless.errors import NoFeasibleOffering  # noqa: E402
from ray_nodeless.launch.open_types import OpenTypes  # noqa: E402
from ray_nodeless.operate.config import catalog_for, load_provider  # noqa: E402
from ray_nodeless.providers.base import TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE, Machine  # noqa: E402
from ray_nodeless.ray_compat.demand import state_from_proto  # noqa: E402
from ray_nodeless.ray_adapter.open_driver import YamlFileStore, snapshot_of  # noqa: E402

CONFIG = ROOT / "cluster-configs" / "local-nodeless.yaml"
GIB = 1024 ** 3
MAX_WORKERS = 5000
THREE_TYPES = {"cpu4": {"CPU": 4}, "gpu1": {"CPU": 4, "GPU": 1}, "cpu16": {"CPU": 16}}
MARKET, ZONE = "ray.io/market-type", "ray.io/availability-zone"
IN, NOT_IN = "in", "!in"
# (name, resources, label selectors as [[(key, op, values)], fallback, ...]). The first ones are the issue's
# demands that a two-type cluster could not serve, so even 10 demands hold every hard kind.
KINDS: list[tuple[str, dict[str, float], list]] = [
    ("cpu1", {"CPU": 1}, []),
    ("cpu16", {"CPU": 16}, []),
    ("gpu2", {"CPU": 1, "GPU": 2}, []),
    ("l4", {"CPU": 1, "GPU": 1, "accelerator_type:L4": 0.001}, []),
    ("a100", {"CPU": 1, "GPU": 1, "accelerator_type:A100": 0.001}, []),
    ("mem64", {"CPU": 1, "memory": 64 * GIB}, []),
    ("on-demand", {"CPU": 1}, [[(MARKET, IN, ["on-demand"])]]),
    ("zone-b", {"CPU": 1}, [[(ZONE, IN, ["us-west-2b"])]]),
    ("gpu1", {"CPU": 1, "GPU": 1}, []),
    ("cpu2", {"CPU": 2}, []),
    ("cpu4", {"CPU": 4}, []),
    ("spot-not-a-else-any", {"CPU": 2}, [[(MARKET, IN, ["spot"]), (ZONE, NOT_IN, ["us-west-2a"])], []]),
]
WEIGHTS = {"cpu1": 30, "cpu2": 15, "cpu4": 10, "cpu16": 5, "gpu1": 10, "gpu2": 4, "l4": 4, "a100": 1, "mem64": 4,
           "on-demand": 6, "zone-b": 6, "spot-not-a-else-any": 5}
GANGS = [[{"CPU": 1, "GPU": 1}] * 2, [{"CPU": 2}] * 3]      # STRICT_SPREAD bundles, alternating


# ----- the demands, as the GCS reports them ------------------------------------------------------------------------

def cluster_state(n: int, seed: int = 17):
    """A ClusterResourceState with `n` pending demands (placement-group bundles count) and a CPU-0 head."""
    from ray.autoscaler.v2.utils import ResourceRequestUtil
    from ray.core.generated import autoscaler_pb2, common_pb2

    ops = {IN: common_pb2.LabelSelectorOperator.LABEL_OPERATOR_IN,
           NOT_IN: common_pb2.LabelSelectorOperator.LABEL_OPERATOR_NOT_IN}
    rng = random.Random(seed)
    state = autoscaler_pb2.ClusterResourceState()
    head = state.node_states.add()
    head.node_id, head.instance_id, head.ray_node_type_name = b"head", "head-0", "head"
    head.status = autoscaler_pb2.NodeStatus.RUNNING
    head.total_resources["CPU"] = 0
    left = n
    for g in range(min(5, 1 + n // 100)):
        bundles = GANGS[g % len(GANGS)]
        if len(bundles) > left:
            break
        pg = f"{g + 1:032x}"
        gang = state.pending_gang_resource_requests.add()
        gang.details = f"{pg}:STRICT_SPREAD|PENDING"
        anti = [(ResourceRequestUtil.PlacementConstraintType.ANTI_AFFINITY, "_PG_" + pg, pg)]
        for b in bundles:
            gang.requests.append(ResourceRequestUtil.make(b, anti))
        left -= len(bundles)
    names = [k[0] for k in KINDS]
    picks = names[:left] + rng.choices(names, weights=[WEIGHTS[k] for k in names], k=max(0, left - len(names)))
    requests = []
    for name in picks:
        _, res, sels = next(k for k in KINDS if k[0] == name)
        requests.append(ResourceRequestUtil.make(res, label_selectors=[[(k, ops[op], v) for k, op, v in s]
                                                                       for s in sels] or None))
    state.pending_resource_requests.extend(ResourceRequestUtil.group_by_count(requests))
    return state


# ----- the two clusters ---------------------------------------------------------------------------------------------

class MemoryStore:
    """The config the autoscaler re-reads, in memory (read gives a fresh copy, as a file would)."""

    def __init__(self, config: dict[str, Any]):
        self.config = copy.deepcopy(config)

    def read(self) -> dict[str, Any]:
        return copy.deepcopy(self.config)

    def write(self, config: dict[str, Any]) -> None:
        self.config = copy.deepcopy(config)


def base_config() -> dict[str, Any]:
    config = yaml.safe_load(CONFIG.read_text())
    # The file caps the demo at 12 workers; a cap would decide what either cluster launches at 100 and 1,000
    # demands, so both get room for every machine they want.
    config["max_workers"] = MAX_WORKERS
    return config


def three_type_config() -> dict[str, Any]:
    config = base_config()
    for name, res in THREE_TYPES.items():
        config["available_node_types"][name] = {"min_workers": 0, "max_workers": MAX_WORKERS, "resources": dict(res),
                                                "node_config": {}}
    return config


class ShapeOpen:
    """The provider's shape-open parts as the monitor builds them (ray_adapter/provider.py `_open_types`)."""

    def __init__(self, vectorized: bool, store: str = "memory", tmp: Path | None = None,
                 config: dict[str, Any] | None = None):
        config = config or base_config()
        bundle = load_provider(config["provider"])
        self.settings = bundle.core
        self.planner = Planner(catalog_for(self.settings), vectorized=vectorized)
        resolver = Resolver(self.settings, bundle.requirement_overrides)
        self.fitter = OpenFitter(resolver, self.planner, None, self.settings.open_node_config)
        if store == "yaml":
            assert tmp is not None
            path = tmp / f"open-{id(self)}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            self.store: Any = YamlFileStore(str(path))
        else:
            self.store = MemoryStore(config)
        self.open_types = OpenTypes(self.settings, Packer(self.fitter, self.settings.single_zone_gangs), self.store)
        try:      # the region's columns/arrays are built once per process, not per loop: build them here
            self.planner.plan(resolver.request("open", {"CPU": 0.25}, {}, is_head=False))
        except NoFeasibleOffering:
            pass

    def config(self) -> dict[str, Any]:
        return self.store.read()

    def step(self, state, machines: dict[str, Machine]):
        return self.open_types.step(snapshot_of(state_from_proto(state)), machines)


def node_type_configs(config_yaml: str) -> tuple[dict, Any]:
    """Ray's config re-read, as FileConfigReader does it every loop (the YAML text is in memory here)."""
    from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig

    ac = AutoscalingConfig(yaml.safe_load(config_yaml), skip_content_hash=True)
    return ac.get_node_type_configs(), ac


def schedule(state, ntc: dict, ac: Any, instances: list) -> Any:
    """One `ResourceDemandScheduler.schedule`, the request built as `Reconciler._scale_cluster` builds it."""
    from ray.autoscaler.v2.scheduler import ResourceDemandScheduler, SchedulingRequest

    request = SchedulingRequest(
        node_type_configs=ntc, max_num_nodes=ac.get_max_num_nodes(),
        resource_requests=state.pending_resource_requests,
        gang_resource_requests=state.pending_gang_resource_requests,
        cluster_resource_constraints=state.cluster_resource_constraints, current_instances=instances,
        idle_timeout_s=ac.get_idle_timeout_s(), pending_idle_timeout_s=ac.get_pending_idle_timeout_s(),
        disable_launch_config_check=ac.disable_launch_config_check())
    return ResourceDemandScheduler().schedule(request)


def head_instance(state) -> Any:
    from ray.autoscaler.v2.schema import AutoscalerInstance
    from ray.core.generated import instance_manager_pb2 as im

    return AutoscalerInstance(
        cloud_instance_id="head-0", ray_node=state.node_states[0],
        im_instance=im.Instance(instance_id="head-0", cloud_instance_id="head-0", node_id=b"head".hex(),
                                instance_type="head", status=im.Instance.RAY_RUNNING, node_kind=im.NodeKind.HEAD))


def in_flight(reply) -> tuple[list, dict[str, Machine]]:
    """The launches of a reply as the next loop sees them: REQUESTED instances (Ray) and listed machines (ours)."""
    from ray.autoscaler.v2.schema import AutoscalerInstance
    from ray.core.generated import instance_manager_pb2 as im

    instances, machines = [], {}
    for lr in sorted(reply.to_launch, key=lambda r: r.instance_type):
        for i in range(lr.count):
            iid = f"{lr.instance_type}-{i}"
            instances.append(AutoscalerInstance(im_instance=im.Instance(
                instance_id=iid, instance_type=lr.instance_type, status=im.Instance.REQUESTED,
                node_kind=im.NodeKind.WORKER)))
            machines[iid] = Machine(iid, {TAG_RAY_USER_NODE_TYPE: lr.instance_type, TAG_RAY_NODE_KIND: "worker"})
    return instances, machines


def launched(reply) -> dict[str, int]:
    return {lr.instance_type: lr.count for lr in sorted(reply.to_launch, key=lambda r: r.instance_type)}


# ----- timing -------------------------------------------------------------------------------------------------------

def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1000, out


def med(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


def measure(n: int, reps: int, vectorized: bool, tmp: Path) -> dict[str, Any]:
    state = cluster_state(n)
    head = head_instance(state)
    head_machine = {"head-0": Machine("head-0", {TAG_RAY_USER_NODE_TYPE: "head", TAG_RAY_NODE_KIND: "head"})}
    three_yaml = yaml.safe_dump(three_type_config(), sort_keys=False)
    rows: dict[str, list[float]] = {}

    def add(key: str, ms: float) -> None:
        rows.setdefault(key, []).append(ms)

    # 3-type cluster: Ray only.
    for _ in range(reps):
        ms, (ntc, ac) = timed(lambda: node_type_configs(three_yaml))
        add("three.config_reread", ms)
        ms, three_reply = timed(lambda: schedule(state, ntc, ac, [head]))
        add("three.l1.schedule", ms)
    three_instances, _ = in_flight(three_reply)
    for _ in range(reps):
        ms, three_reply2 = timed(lambda: schedule(state, ntc, ac, [head] + three_instances))
        add("three.l2.schedule", ms)

    # Shape-open: ours + Ray's scheduler on the generated types.
    for _ in range(reps):
        so = ShapeOpen(vectorized)
        ms, first = timed(lambda: so.step(state, dict(head_machine)))
        add("open.l1cold.step", ms)
        ms, _r = timed(lambda: so.step(state, dict(head_machine)))     # same loop again: plan cache warm
        add("open.l1warm.step", ms)
        so_yaml = yaml.safe_dump(so.config(), sort_keys=False)
        ms, (ontc, oac) = timed(lambda: node_type_configs(so_yaml))
        add("open.config_reread", ms)
        ms, open_reply = timed(lambda: schedule(state, ontc, oac, [head]))
        add("open.l1.schedule", ms)
    open_instances, open_machines = in_flight(open_reply)
    first_config = so.config()
    # The same cold loop with OpenFitter.derive_sizes off (every size the packer probes asks the planner): what
    # the step cost before it; once, it is slow.
    planner_only = ShapeOpen(vectorized)
    planner_only.fitter.derive_sizes = False
    ms, _r = timed(lambda: planner_only.step(state, dict(head_machine)))
    add("open.l1cold.step_derive_sizes_off_1rep", ms)
    machines = {**head_machine, **open_machines}
    for _ in range(reps):
        ms, second = timed(lambda: so.step(state, machines))
        add("open.l2.step", ms)
        ntc2, ac2 = node_type_configs(yaml.safe_dump(so.config(), sort_keys=False))   # timed in loop 1
        ms, open_reply2 = timed(lambda: schedule(state, ntc2, ac2, [head] + open_instances))
        add("open.l2.schedule", ms)
        so.store.write(first_config)       # back to loop 1's quotas: every rep is the same loop 2
    for _ in range(reps):     # the monitor's own store: the YAML file (read every loop, written when changed)
        yso = ShapeOpen(vectorized, "yaml", tmp)
        yso.step(state, dict(head_machine))
        ms, _r = timed(lambda: yso.step(state, dict(head_machine)))
        add("open.l1warm.step_yaml_store", ms)
        ms, _r = timed(lambda: yso.step(state, machines))
        add("open.l2.step_yaml_store", ms)

    m = {k: med(v) for k, v in sorted(rows.items())}
    loops = {}
    for loop, step_key, sched_key, three_key in (("loop1_cold", "open.l1cold.step", "open.l1.schedule",
                                                  "three.l1.schedule"),
                                                 ("loop1_warm", "open.l1warm.step", "open.l1.schedule",
                                                  "three.l1.schedule"),
                                                 ("loop2", "open.l2.step", "open.l2.schedule", "three.l2.schedule")):
        open_ms = m[step_key] + m[sched_key]
        open_full = open_ms + m["open.config_reread"]
        three_full = m[three_key] + m["three.config_reread"]
        loops[loop] = {"open_ms": round(open_ms, 2), "three_type_ms": m[three_key],
                       "ratio": round(open_ms / m[three_key], 2),
                       "open_with_config_reread_ms": round(open_full, 2),
                       "three_type_with_config_reread_ms": round(three_full, 2),
                       "ratio_with_config_reread": round(open_full / three_full, 2)}
    return {"demands": n, "distinct_requests": len(state.pending_resource_requests),
            "gangs": len(state.pending_gang_resource_requests),
            "generated_types": len([t for t in ontc if t.startswith("nl-")]),
            "machines_planned": sum(first.packing.new.values()),
            "ray_launched_loop1": sum(launched(open_reply).values()),
            "loop2_packer_new_machines": dict(sorted(second.packing.new.items())),
            "loop2_quota_increase": {t: q - first.quotas.get(t, 0) for t, q in sorted(second.quotas.items())
                                     if q != first.quotas.get(t, 0)},
            "loop2_ray_launches_open": launched(open_reply2),
            "loop2_ray_launches_three": launched(three_reply2),
            "loops": loops, "components_ms": m,
            "packing": packing_figures(state, so, first, open_reply, three_reply)}


# ----- packing figures ------------------------------------------------------------------------------------------------

def demand_units(state) -> list[tuple[Demand, bytes | None]]:
    """Every pending demand once per count, with the serialized Ray request of a task (None for a bundle)."""
    snap = snapshot_of(state_from_proto(state))
    singles = [d for d in snap.demands if not d.gang]
    out: list[tuple[Demand, bytes | None]] = []
    for d, r in zip(singles, state.pending_resource_requests):
        assert canonical_resources(dict(r.request.resources_bundle)) == d.resources
        out += [(d, r.request.SerializeToString())] * d.count
    out += [(d, None) for d in snap.demands if d.gang]
    return out


def own_fit_sum(fitter: OpenFitter, units: list[Demand]) -> tuple[float, int]:
    total, infeasible = 0.0, 0
    for d in units:
        for sel in d.selectors or (None,):
            try:
                total += fitter.fit(d, sel).price
                break
            except NoFeasibleOffering:
                continue
        else:
            infeasible += 1
    return total, infeasible


def packing_figures(state, so: ShapeOpen, first, open_reply, three_reply) -> dict[str, Any]:
    units = demand_units(state)
    own, own_infeasible = own_fit_sum(so.fitter, [d for d, _ in units])
    three_prices = {name: so.fitter.fit(Demand(canonical_resources(res))).price for name, res in THREE_TYPES.items()}
    three_hourly = sum(three_prices[t] * c for t, c in launched(three_reply).items())
    open_prices = {n: t.price for n, t in first.packing.types.items()}
    ray_on_open = sum(open_prices[t] * c for t, c in launched(open_reply).items())
    # The demands the 3-type cluster serves: all but Ray's infeasible requests (by count) and infeasible gangs.
    left_out: dict[bytes, int] = {}
    for r in three_reply.infeasible_resource_requests:
        key = r.SerializeToString()
        left_out[key] = left_out.get(key, 0) + 1
    bad_gangs = {g.details.split(":", 1)[0] for g in three_reply.infeasible_gang_resource_requests}
    served = []
    for d, key in units:
        if key is not None and left_out.get(key, 0) > 0:
            left_out[key] -= 1
        elif key is None and d.gang in bad_gangs:
            continue
        else:
            served.append(d)
    own_served, _ = own_fit_sum(so.fitter, served)
    packed_served = Packer(so.fitter, so.settings.single_zone_gangs).pack(_regroup(served), []).hourly
    return {
        "a_own_cheapest_fit_sum_per_h": round(own, 4), "a_infeasible_demands": own_infeasible,
        "b_packer_plan_per_h": round(first.packing.hourly, 4),
        "b_machines": dict(sorted(first.packing.new.items())),
        "check_ray_launches_on_generated_types_per_h": round(ray_on_open, 4),
        "c_ray_on_three_types_per_h": round(three_hourly, 4), "c_launched": launched(three_reply),
        "c_type_prices_per_h": three_prices,
        "c_demands_served": len(served), "c_demands_unserved": len(units) - len(served),
        "a_on_c_served_demands_per_h": round(own_served, 4), "b_on_c_served_demands_per_h": round(packed_served, 4),
    }


def _regroup(units: list[Demand]) -> list[Demand]:
    """Units back to demands with counts (gang bundles stay one per bundle)."""
    counts: dict[Demand, int] = {}
    out = []
    for d in units:
        if d.gang:
            out.append(d)
        else:
            counts[d] = counts.get(d, 0) + 1
    out += [Demand(d.resources, d.selectors, c) for d, c in counts.items()]
    return out


# ----- OpenFitter.fit throughput ------------------------------------------------------------------------------------

def distinct_demands(n: int, seed: int = 17) -> list[Demand]:
    """`n` demands of mixed kinds, every one a new planner shape (CPU + i * 1e-6)."""
    from ray_nodeless.core.demand import Constraint, Selector

    rng = random.Random(seed)
    out = []
    for i in range(n):
        _, res, sels = rng.choices(KINDS, weights=[WEIGHTS[k[0]] for k in KINDS])[0]
        res = dict(res, CPU=res.get("CPU", 0) + i * 1e-6)
        out.append(Demand(canonical_resources(res),
                          tuple(Selector(tuple(Constraint(k, op, tuple(v)) for k, op, v in s)) for s in sels)))
    return out


def fit_throughput(n: int, vectorized: bool, derive: bool = True) -> dict[str, Any]:
    """Distinct demand shapes per second through `OpenFitter.fit` (plan cache cold, region index built).
    `derive`: OpenFitter.derive_sizes (a shape's candidates from a smaller shape's plan under the same rule and
    requirements); False: every distinct shape is a planner evaluation."""
    so = ShapeOpen(vectorized)
    so.fitter.derive_sizes = derive
    demands = distinct_demands(n)
    infeasible = 0
    t = time.perf_counter()
    for d in demands:
        try:
            so.fitter.fit(d, d.selectors[0] if d.selectors else None)
        except NoFeasibleOffering:
            infeasible += 1
    s = time.perf_counter() - t
    return {"path": "numpy" if vectorized else "plain Python", "derive_sizes": derive,
            "distinct_shapes": n, "infeasible": infeasible,
            "shapes_per_s": round(n / s), "ms_for_all": round(s * 1000, 1)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,100,1000", help="pending demands per run, comma-separated")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per figure (median)")
    ap.add_argument("--numpy", action="store_true", help="plan on the numpy path (the monitor does not)")
    ap.add_argument("--json", action="store_true", help="print JSON on one line")
    ap.add_argument("--fit-shapes", type=int, default=1000,
                    help="distinct demand shapes for the OpenFitter.fit throughput, both paths (0: skip)")
    args = ap.parse_args(argv)
    logging.getLogger("ray").setLevel(logging.ERROR)
    logging.getLogger("ray_nodeless").setLevel(logging.ERROR)
    if args.numpy:
        import numpy  # noqa: F401
    with tempfile.TemporaryDirectory() as tmp:
        measure(10, 1, args.numpy, Path(tmp))     # warm-up: first-use imports, Ray's schema compile
        runs = [measure(int(s), args.reps, args.numpy, Path(tmp)) for s in args.sizes.split(",")]
    result = {"planner_path": "numpy" if args.numpy else "plain Python (the monitor's)",
              "numpy_imported_during_loops": "numpy" in sys.modules, "reps": args.reps, "runs": runs}
    if args.fit_shapes:
        result["fit_throughput"] = [fit_throughput(args.fit_shapes, vectorized, derive)
                                    for vectorized in (False, True) for derive in (True, False)]
    print(json.dumps(result, indent=None if args.json else 2))
    return result


if __name__ == "__main__":
    main()
