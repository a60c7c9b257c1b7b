"""Replay a workload trace under cluster configurations: elapsed time, cost, idle cost, node-hours.

The replay runs the same decision code the provider runs in production, and imitates nothing it can reuse:
- which node types to launch: Ray's own v1 `ResourceDemandScheduler.get_nodes_to_launch` (bin-packing, per-type
  and global `max_workers`, `min_workers`, the pending-launch cap `max(5, upscaling_speed * running)`), called
  through a small in-memory stand-in for the node provider;
- which instance each node type gets: `plan_cluster(config).plans[node_type].chosen` (our planner and rules).

What is modelled, and how (the "why" is in docs/trace-format.md):
- time is whole milliseconds; the autoscaler ticks every `AUTOSCALER_UPDATE_INTERVAL_S` (5 s) on a fixed grid and
  is only evaluated on ticks after something changed (its answer is a function of the state, so the skipped
  ticks would return the same thing);
- a launched node is billed from the launch request and can run tasks `launch_latency` later;
- a worker that has run nothing for `idle_timeout_minutes` is terminated on the next tick (never below
  `min_workers`); the head is up for the whole run and billed until the workload ends;
- tasks are placed FIFO on ready nodes where they fit (head first, then oldest node; CPU-only tasks avoid GPU
  nodes as Ray's `scheduler_avoid_gpu_nodes` does); a task that fits nowhere does not block the others;
- head-only phases run on the head, one at a time, outside Ray's resource accounting (they are driver code);
- spot nodes may be interrupted (Poisson, `--spot-interruptions-per-hour`, RNG seeded per configuration and
  node): the work of the tasks on them is lost and they rerun from the start.
"""
from __future__ import annotations

import copy
import heapq
import json
import logging
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import click

from ray_nodeless.core.catalog import Catalog
from ray_nodeless.core.cluster_plan import load_catalog, load_cluster_yaml, plan_cluster
from ray_nodeless.errors import ConfigError, NodelessError
from ray_nodeless.core.requirements import GIB
from ray_nodeless.trace.model import MS_PER_HOUR, JobSpec, TaskSpec, Trace, load_trace, stages_of

logger = logging.getLogger(__name__)

TICK_MS = 5_000                      # Ray's AUTOSCALER_UPDATE_INTERVAL_S
DEFAULT_LAUNCH_MINUTES = 3.0         # request -> Ray node ready (boot + `ray start`); see docs/trace-format.md
_EPS = 1e-9


class SimulationError(NodelessError):
    """The trace cannot complete under a configuration (a task fits no node type, ...)."""


# ------------------------------------------------------------------------------------------------------------
# Configurations


@dataclass(frozen=True)
class Offer:
    """The instance a node type runs on, as decided by the planner (or fixed by a baseline)."""

    instance_type: str
    capacity: str
    zone: str
    hourly_price: float

    @property
    def key(self) -> str:
        """Key of `node_hours`: the instance type, `:spot` appended for spot capacity."""
        return self.instance_type if self.capacity == "on-demand" else f"{self.instance_type}:{self.capacity}"


@dataclass
class SimConfig:
    label: str
    kind: str                                  # "autoscaled" | "fixed"
    schedule: str
    head_node_type: str
    node_types: dict[str, dict[str, Any]]      # Ray's `available_node_types` subset: resources/min/max_workers
    offers: dict[str, Offer]                   # node type -> instance
    max_workers: int
    upscaling_speed: float
    idle_timeout_ms: int
    idle_cost_per_hour: float
    fixed_count: int = 0                       # fixed baselines: this many nodes of the head type, always on
    source: str = ""


def _force_on_demand(cfg: dict[str, Any]) -> dict[str, Any]:
    """Every rule and node_config that names a capacity gets `[on-demand]` (the default for the rest)."""
    cfg = copy.deepcopy(cfg)
    prov = cfg.get("provider") or {}
    for rule in prov.get("rules") or []:
        if isinstance(rule, dict) and "capacity" in rule:
            rule["capacity"] = ["on-demand"]
    for nt in (cfg.get("available_node_types") or {}).values():
        if isinstance(nt, dict) and isinstance(nt.get("node_config"), dict) and "capacity" in nt["node_config"]:
            nt["node_config"]["capacity"] = ["on-demand"]
    return cfg


def config_from_cluster(path: str, schedule: str, on_demand: bool, catalog: Catalog | None = None) -> SimConfig:
    raw = load_cluster_yaml(path)
    cfg = _force_on_demand(raw) if on_demand else raw
    cp = plan_cluster(cfg, catalog=catalog)
    node_types: dict[str, dict[str, Any]] = {}
    offers: dict[str, Offer] = {}
    for name, nt in cp.node_types.items():
        is_head = name == cp.head_node_type
        res = {k: float(v) for k, v in (nt.get("resources") or {}).items()}
        node_types[name] = {"resources": res,
                            "min_workers": 0 if is_head else int(nt.get("min_workers", 0)),
                            "max_workers": 0 if is_head else int(nt.get("max_workers", cp.global_max_workers))}
        o = cp.plans[name].chosen
        offers[name] = Offer(instance_type=o.instance_type.name, capacity=o.capacity, zone=o.zone,
                             hourly_price=float(o.hourly_price or 0.0))
    idle_min = raw.get("idle_timeout_minutes")
    if idle_min is None:
        # Under v2 a missing idle_timeout_minutes means never; v1 would KeyError. Say so rather than guess.
        logger.warning("%s has no idle_timeout_minutes: idle workers are never terminated in the replay", path)
        idle_ms = -1
    else:
        idle_ms = int(round(float(idle_min) * 60_000))
    label = Path(path).stem + (":on-demand" if on_demand else "")
    return SimConfig(label=label, kind="autoscaled", schedule=schedule, head_node_type=cp.head_node_type,
                     node_types=node_types, offers=offers, max_workers=cp.global_max_workers,
                     upscaling_speed=float(raw.get("upscaling_speed", 1.0)), idle_timeout_ms=idle_ms,
                     idle_cost_per_hour=cp.cost.idle_cost_per_hour, source=str(path))


_FIXED = re.compile(r"^fixed:(\d+)x([A-Za-z0-9.\-_+]+?)(?:@([a-z0-9\-]+))?$")


def config_from_fixed(spec: str, schedule: str, catalog: Catalog, cloud: str = "aws",
                      default_region: str = "us-west-2") -> SimConfig:
    """`fixed:3xg4dn.4xlarge[@region]`: N nodes always on, the first is the head, all run tasks; on-demand price."""
    m = _FIXED.match(spec)
    if not m:
        raise ConfigError("--baseline", f"{spec!r} is not fixed:<N>x<instance type>[@region]")
    n, itype, region = int(m.group(1)), m.group(2), m.group(3) or default_region
    if n < 1:
        raise ConfigError("--baseline", "needs at least one node")
    rc = catalog.region(cloud, region)
    prices = sorted((o.hourly_price, o.zone) for o in rc.offerings()
                    if o.instance_type.name == itype and o.capacity == "on-demand" and o.hourly_price is not None)
    if not prices:
        raise ConfigError("--baseline", f"{itype} has no on-demand price in {cloud} {region} "
                                        f"(catalog {catalog.catalog_id})")
    price, zone = prices[0]
    t = catalog.instance_type(cloud, itype)
    assert t is not None
    res = {"CPU": float(t.vcpus), "memory": float(t.memory_gib * GIB)}
    if t.gpu_count:
        res["GPU"] = float(t.gpu_count)
    return SimConfig(label=spec, kind="fixed", schedule=schedule, head_node_type="fixed",
                     node_types={"fixed": {"resources": res, "min_workers": 0, "max_workers": 0}},
                     offers={"fixed": Offer(itype, "on-demand", zone, float(price))}, max_workers=0,
                     upscaling_speed=1.0, idle_timeout_ms=-1, idle_cost_per_hour=n * float(price), fixed_count=n,
                     source=spec)


# ------------------------------------------------------------------------------------------------------------
# Simulation state


@dataclass
class SimNode:
    seq: int
    node_type: str
    is_head: bool
    offer: Offer
    total: dict[str, float]
    available: dict[str, float]
    launch_ms: int
    ready_ms: int
    end_ms: int | None = None
    running: set[int] = field(default_factory=set)
    idle_since_ms: int | None = None
    interrupt_ms: int | None = None

    @property
    def node_id(self) -> str:
        return f"sim-{self.seq}"

    @property
    def ip(self) -> str:
        return f"10.{self.seq // 65536 % 256}.{self.seq // 256 % 256}.{self.seq % 256}"


@dataclass
class TaskRun:
    seq: int
    job: str
    spec: TaskSpec
    state: str = "waiting"          # waiting | pending | running | done | cut | cancelled
    submit_ms: int = 0
    node: int | None = None
    ran_on: int | None = None       # the node of the last attempt (kept after the task ends)
    start_ms: int = 0
    useful_ms: int = 0              # work that counted (finished, or cut by the budget)
    lost_ms: int = 0                # work lost to spot interruptions
    attempts: int = 0


@dataclass
class JobRun:
    spec: JobSpec
    state: str = "waiting"          # waiting | before | tasks | after | done
    phase_idx: int = 0
    tasks: list[TaskRun] = field(default_factory=list)
    next_task: int = 0
    in_flight: int = 0
    tasks_start_ms: int = 0
    end_ms: int | None = None


@dataclass
class SimResult:
    config: SimConfig
    elapsed_ms: int
    nodes: list[SimNode]
    tasks: list[TaskRun]
    head_phase_ms: int
    interruptions: int
    scheduler_calls: int

    # -- figures ------------------------------------------------------------------------------------------
    def node_ms(self, n: SimNode) -> int:
        end = n.end_ms if n.end_ms is not None else self.elapsed_ms
        return max(0, end - n.launch_ms)

    @property
    def elapsed_hours(self) -> float:
        return self.elapsed_ms / MS_PER_HOUR

    @property
    def workload_cost(self) -> float:
        return sum(n.offer.hourly_price * self.node_ms(n) for n in self.nodes) / MS_PER_HOUR

    def node_hours(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for n in self.nodes:
            out[n.offer.key] = out.get(n.offer.key, 0.0) + self.node_ms(n) / MS_PER_HOUR
        return dict(sorted(out.items()))

    @property
    def useful_task_hours(self) -> float:
        return sum(t.useful_ms for t in self.tasks) / MS_PER_HOUR

    @property
    def lost_task_hours(self) -> float:
        return sum(t.lost_ms for t in self.tasks) / MS_PER_HOUR

    @property
    def gpu_utilisation(self) -> float | None:
        provisioned = sum(n.total.get("GPU", 0.0) * self.node_ms(n) for n in self.nodes)
        busy = sum(t.spec.resource_dict.get("GPU", 0.0) * (t.useful_ms + t.lost_ms) for t in self.tasks)
        return None if provisioned <= 0 else busy / provisioned

    def slot_price(self, shape: Mapping[str, float]) -> float | None:
        """Cheapest $/h of one task of `shape`: per node type, the chosen offering's price over how many such tasks
        one node holds. `None` if no node type fits the shape."""
        best: float | None = None
        for name, nt in self.config.node_types.items():
            res = nt["resources"]
            slots = math.inf
            for k, v in shape.items():
                slots = min(slots, math.floor(res.get(k, 0.0) / v + _EPS))
            if not slots or slots == math.inf:
                continue
            p = self.config.offers[name].hourly_price / slots
            best = p if best is None else min(best, p)
        return best

    def lower_bound(self) -> float:
        """Every useful task-hour of this replay on the cheapest allowed offering for its shape: no launch latency,
        no idle time, no head. (Head-only phases are left out: a GPU head may run trials at the same time, so
        charging them too would not be a bound.)"""
        total = 0.0
        for t in self.tasks:
            p = self.slot_price(t.spec.resource_dict)
            if p is not None:
                total += p * t.useful_ms / MS_PER_HOUR
        return total

    def to_dict(self) -> dict[str, Any]:
        gpu = self.gpu_utilisation
        return {
            "kind": self.config.kind,
            "source": self.config.source,
            "schedule": self.config.schedule,
            "instances": {name: {"instance_type": o.instance_type, "capacity": o.capacity, "zone": o.zone,
                                 "hourly_price": o.hourly_price} for name, o in sorted(self.config.offers.items())},
            "elapsed_hours": round(self.elapsed_hours, 6),
            "workload_cost": round(self.workload_cost, 6),
            "idle_cost_per_hour": round(self.config.idle_cost_per_hour, 6),
            "node_hours": {k: round(v, 6) for k, v in self.node_hours().items()},
            "gpu_utilisation": None if gpu is None else round(gpu, 6),
            "lower_bound_cost": round(self.lower_bound(), 6),
            "useful_task_hours": round(self.useful_task_hours, 6),
            "lost_task_hours": round(self.lost_task_hours, 6),
            "head_only_hours": round(self.head_phase_ms / MS_PER_HOUR, 6),
            "launches": sum(1 for n in self.nodes if not n.is_head and self.config.kind == "autoscaled"),
            "peak_nodes": self.peak_nodes(),
            "spot_interruptions": self.interruptions,
        }

    def peak_nodes(self) -> int:
        return max((c for _, c in self.node_count_series()), default=0)

    def node_count_series(self) -> list[tuple[int, int]]:
        """(time ms, nodes up) at every change, nodes counted from launch request to termination."""
        deltas: dict[int, int] = {}
        for n in self.nodes:
            deltas[n.launch_ms] = deltas.get(n.launch_ms, 0) + 1
            end = n.end_ms if n.end_ms is not None else self.elapsed_ms
            deltas[end] = deltas.get(end, 0) - 1
        out, c = [], 0
        for t in sorted(deltas):
            c += deltas[t]
            out.append((t, c))
        return out


class _ProviderView:
    """Just enough of a NodeProvider for Ray's ResourceDemandScheduler: tags and IPs of the simulated nodes."""

    def __init__(self, nodes: Mapping[str, SimNode]):
        self._nodes = nodes

    def node_tags(self, node_id: str) -> dict[str, str]:
        from ray.autoscaler.tags import NODE_KIND_HEAD, NODE_KIND_WORKER, TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE
        n = self._nodes[node_id]
        return {TAG_RAY_NODE_KIND: NODE_KIND_HEAD if n.is_head else NODE_KIND_WORKER,
                TAG_RAY_USER_NODE_TYPE: n.node_type}

    def internal_ip(self, node_id: str) -> str:
        return self._nodes[node_id].ip


def _fits(avail: Mapping[str, float], need: Mapping[str, float]) -> bool:
    return all(avail.get(k, 0.0) + _EPS >= v for k, v in need.items())


class Simulator:
    """One replay of one trace schedule under one configuration. Deterministic: integer time, seeded RNG."""

    def __init__(self, trace: Trace, config: SimConfig, *, launch_latency_ms: int = int(DEFAULT_LAUNCH_MINUTES * 60_000),
                 spot_interruptions_per_hour: float = 0.0, seed: int = 0):
        self.trace = trace
        self.cfg = config
        self.launch_latency_ms = launch_latency_ms
        self.spot_rate = spot_interruptions_per_hour
        self.seed = seed
        self.now = 0
        self._events: list[tuple[int, int, str, Any]] = []
        self._eseq = 0
        self.nodes: list[SimNode] = []
        self.live: dict[str, SimNode] = {}
        self.jobs: dict[str, JobRun] = {}
        self.tasks: list[TaskRun] = []
        self.pending: list[TaskRun] = []
        self.head_queue: list[tuple[str, int]] = []       # (job, duration) waiting for the head
        self.head_busy_until: int | None = None
        self.head_phase_ms = 0
        self.stages = [list(s) for s in stages_of(trace, config.schedule)]
        self.stage_idx = -1
        self.workload_end: int | None = None
        self.interruptions = 0
        self.scheduler_calls = 0
        self._ticks: set[int] = set()
        self._dirty = True
        self._scheduler = None

    # -- events ---------------------------------------------------------------------------------------------
    def _at(self, t: int, kind: str, payload: Any = None) -> None:
        self._eseq += 1
        heapq.heappush(self._events, (t, self._eseq, kind, payload))

    def _tick_at(self, t: int) -> None:
        if t not in self._ticks:
            self._ticks.add(t)
            self._at(t, "tick")

    # -- nodes ----------------------------------------------------------------------------------------------
    def _add_node(self, node_type: str, is_head: bool, ready_ms: int) -> SimNode:
        res = dict(self.cfg.node_types[node_type]["resources"])
        n = SimNode(seq=len(self.nodes), node_type=node_type, is_head=is_head, offer=self.cfg.offers[node_type],
                    total=res, available=dict(res), launch_ms=self.now, ready_ms=ready_ms, idle_since_ms=ready_ms)
        self.nodes.append(n)
        self.live[n.node_id] = n
        if ready_ms > self.now:
            self._at(ready_ms, "ready", n.seq)
        if (n.offer.capacity == "spot" and self.spot_rate > 0 and not is_head):
            # One RNG per node, seeded by configuration and node number: adding a configuration or a node elsewhere
            # does not shift anyone else's draws.
            rng = random.Random(f"{self.seed}:{self.cfg.label}:{n.seq}")
            n.interrupt_ms = self.now + max(1, int(rng.expovariate(self.spot_rate) * MS_PER_HOUR))
            self._at(n.interrupt_ms, "interrupt", n.seq)
        return n

    def _terminate(self, n: SimNode) -> None:
        n.end_ms = self.now
        self.live.pop(n.node_id, None)

    # -- jobs -----------------------------------------------------------------------------------------------
    def _start_stage(self) -> None:
        self.stage_idx += 1
        if self.stage_idx >= len(self.stages):
            self.workload_end = self.now
            return
        for name in self.stages[self.stage_idx]:
            spec = self.trace.jobs[name]
            jr = JobRun(spec=spec)
            self.jobs[name] = jr
            self._at(self.now + spec.delay_ms, "job_start", name)

    def _job_advance(self, name: str) -> None:
        """Move a job to its next phase."""
        jr = self.jobs[name]
        spec = jr.spec
        if jr.state == "waiting":
            jr.state, jr.phase_idx = "before", 0
        if jr.state == "before":
            if self._next_head_phase(name, jr, spec.head_before):
                return
            jr.state = "tasks"
            jr.tasks_start_ms = self.now
            for ts in spec.tasks:
                tr = TaskRun(seq=len(self.tasks), job=name, spec=ts)
                self.tasks.append(tr)
                jr.tasks.append(tr)
            if spec.time_budget_ms is not None:
                self._at(self.now + spec.time_budget_ms, "budget", name)
            self._submit(name)
            if jr.tasks:
                return
        if jr.state == "tasks":
            jr.state, jr.phase_idx = "after", 0
        if jr.state == "after":
            if self._next_head_phase(name, jr, spec.head_after):
                return
            jr.state, jr.end_ms = "done", self.now
            if all(self.jobs[j].state == "done" for j in self.stages[self.stage_idx]):
                self._start_stage()

    def _next_head_phase(self, name: str, jr: JobRun, phases) -> bool:
        """Queue the job's next head-only phase of `phases` on the head; False when there is none left."""
        if jr.phase_idx >= len(phases):
            return False
        self._head_request(name, phases[jr.phase_idx].duration_ms)
        jr.phase_idx += 1
        return True

    def _submit(self, name: str) -> None:
        """Submit the job's tasks in order, as their offsets come due and the concurrency limit allows."""
        jr = self.jobs[name]
        limit = jr.spec.max_concurrent
        while jr.next_task < len(jr.tasks):
            tr = jr.tasks[jr.next_task]
            due = jr.tasks_start_ms + tr.spec.submit_at_ms
            if due > self.now:
                self._at(due, "submit", name)
                return
            if limit is not None and jr.in_flight >= limit:
                return
            tr.state, tr.submit_ms = "pending", self.now
            self.pending.append(tr)
            jr.in_flight += 1
            jr.next_task += 1
            self._dirty = True

    def _task_phase_over(self, jr: JobRun) -> bool:
        return jr.next_task >= len(jr.tasks) and jr.in_flight == 0

    def _head_request(self, job: str, duration_ms: int) -> None:
        self.head_queue.append((job, duration_ms))
        self._head_next()

    def _head_next(self) -> None:
        if self.head_busy_until is not None or not self.head_queue:
            return
        job, dur = self.head_queue.pop(0)
        self.head_busy_until = self.now + dur
        self.head_phase_ms += dur
        self._at(self.now + dur, "head_done", job)

    # -- tasks on nodes -------------------------------------------------------------------------------------
    def _node_order(self, need: Mapping[str, float]) -> list[SimNode]:
        ready = [n for n in self.live.values() if n.ready_ms <= self.now]
        wants_gpu = need.get("GPU", 0.0) > 0
        # CPU-only work avoids GPU nodes while others fit (Ray's scheduler_avoid_gpu_nodes); head first because
        # the driver runs there (Ray's hybrid policy prefers the local node), then the oldest node: packing.
        return sorted(ready, key=lambda n: ((not wants_gpu) and n.total.get("GPU", 0.0) > 0, not n.is_head, n.seq))

    def _place(self) -> None:
        still: list[TaskRun] = []
        for tr in self.pending:
            need = tr.spec.resource_dict
            node = next((n for n in self._node_order(need) if _fits(n.available, need)), None)
            if node is None:
                still.append(tr)
                continue
            for k, v in need.items():
                node.available[k] = node.available.get(k, 0.0) - v
            node.running.add(tr.seq)
            node.idle_since_ms = None
            tr.state, tr.node, tr.ran_on, tr.start_ms = "running", node.seq, node.seq, self.now
            tr.attempts += 1
            self._at(self.now + (tr.spec.duration_ms - 0), "task_done", (tr.seq, tr.attempts))
            self._dirty = True
        self.pending = still

    def _release(self, tr: TaskRun) -> None:
        n = self.nodes[tr.node] if tr.node is not None else None
        if n is not None and n.end_ms is None:
            for k, v in tr.spec.resource_dict.items():
                n.available[k] = n.available.get(k, 0.0) + v
            n.running.discard(tr.seq)
            if not n.running:
                n.idle_since_ms = self.now
        tr.node = None

    def _task_finished(self, tr: TaskRun, state: str) -> None:
        tr.useful_ms += self.now - tr.start_ms
        self._release(tr)
        tr.state = state
        jr = self.jobs[tr.job]
        jr.in_flight -= 1
        self._dirty = True
        if jr.state == "tasks":
            self._submit(tr.job)
            if self._task_phase_over(jr):
                self._job_advance(tr.job)

    def _budget(self, name: str) -> None:
        jr = self.jobs[name]
        if jr.state != "tasks":
            return
        for tr in jr.tasks:
            if tr.state == "running":
                tr.useful_ms += self.now - tr.start_ms
                self._release(tr)
                tr.state = "cut"
            elif tr.state in ("pending", "waiting"):
                tr.state = "cancelled"
        self.pending = [t for t in self.pending if t.state == "pending"]
        jr.next_task, jr.in_flight = len(jr.tasks), 0
        self._dirty = True
        self._job_advance(name)

    def _interrupt(self, n: SimNode) -> None:
        if n.end_ms is not None:
            return
        self.interruptions += 1
        lost = [self.tasks[s] for s in sorted(n.running)]
        self._terminate(n)
        for tr in lost:
            tr.lost_ms += self.now - tr.start_ms
            tr.state, tr.node = "pending", None
        # Lost work reruns from the start, ahead of later submissions (FIFO by first submission).
        self.pending = sorted(self.pending + lost, key=lambda t: (t.submit_ms, t.seq))
        self._dirty = True

    # -- the autoscaler -------------------------------------------------------------------------------------
    def _ray_scheduler(self):
        if self._scheduler is None:
            from ray.autoscaler._private.resource_demand_scheduler import ResourceDemandScheduler
            self._scheduler = ResourceDemandScheduler(
                _ProviderView(self.live), self.cfg.node_types, self.cfg.max_workers, self.cfg.head_node_type,
                self.cfg.upscaling_speed)
        return self._scheduler

    def _autoscale(self) -> None:
        # Idle termination first, as v1's update does before launching.
        if self.cfg.idle_timeout_ms >= 0:
            counts: dict[str, int] = {}
            for n in self.live.values():
                counts[n.node_type] = counts.get(n.node_type, 0) + (0 if n.is_head else 1)
            for n in sorted(self.live.values(), key=lambda n: n.seq):
                if n.is_head or n.running or n.idle_since_ms is None:
                    continue
                if self.now - n.idle_since_ms >= self.cfg.idle_timeout_ms and \
                        counts[n.node_type] > self.cfg.node_types[n.node_type]["min_workers"]:
                    counts[n.node_type] -= 1
                    self._terminate(n)
                    self._dirty = True
        min_short = any(
            nt["min_workers"] > sum(1 for n in self.live.values() if n.node_type == name and not n.is_head)
            for name, nt in self.cfg.node_types.items())
        if not self.pending and not min_short:
            return
        from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
        ready = [n for n in self.live.values() if n.ready_ms <= self.now]
        self.scheduler_calls += 1
        # Ray warns on every call while demand exceeds max_workers; in a replay that is expected, not news.
        rds_logger = logging.getLogger("ray.autoscaler._private.resource_demand_scheduler")
        level = rds_logger.level
        rds_logger.setLevel(logging.ERROR)
        try:
            to_launch, _ = self._ray_scheduler().get_nodes_to_launch(
                nodes=[n.node_id for n in sorted(self.live.values(), key=lambda n: n.seq)],
                launching_nodes={},
                resource_demands=[t.spec.resource_dict for t in self.pending],
                unused_resources_by_ip={n.ip: dict(n.available) for n in ready},
                pending_placement_groups=[],
                max_resources_by_ip={n.ip: dict(n.total) for n in ready},
                ensure_min_cluster_size=[],
                node_availability_summary=NodeAvailabilitySummary(node_availabilities={}),
            )
        finally:
            rds_logger.setLevel(level)
        for node_type in sorted(to_launch):
            for _ in range(int(to_launch[node_type])):
                self._add_node(node_type, False, self.now + self.launch_latency_ms)
                logger.debug("%s t=%.3fh launch %s (%s)", self.cfg.label, self.now / MS_PER_HOUR, node_type,
                             self.cfg.offers[node_type].key)

    def _next_tick(self, ran_tick: bool) -> None:
        if self.cfg.kind != "autoscaled":
            return
        want: list[int] = []
        if self._dirty and self.pending:
            g = -(-self.now // TICK_MS) * TICK_MS
            if g == self.now and ran_tick:
                g += TICK_MS
            want.append(g)
        if self.cfg.idle_timeout_ms >= 0:
            for n in self.live.values():
                if not n.is_head and not n.running and n.idle_since_ms is not None:
                    due = max(n.idle_since_ms + self.cfg.idle_timeout_ms, self.now + (1 if ran_tick else 0))
                    want.append(-(-due // TICK_MS) * TICK_MS)
        for t in want:
            self._tick_at(t)

    # -- main loop ------------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        if self.cfg.kind == "fixed":
            for i in range(self.cfg.fixed_count):
                self._add_node(self.cfg.head_node_type, i == 0, 0)
        else:
            self._add_node(self.cfg.head_node_type, True, 0)
            for name, nt in sorted(self.cfg.node_types.items()):
                for _ in range(int(nt.get("min_workers", 0))):
                    # min_workers come up with the cluster, before the workload starts.
                    self._add_node(name, False, 0)
        self._start_stage()
        while self._events:
            t = self._events[0][0]
            self.now = t
            ran_tick = False
            while self._events and self._events[0][0] == t:
                _, _, kind, payload = heapq.heappop(self._events)
                if kind == "tick":
                    ran_tick = True
                    self._ticks.discard(t)
                elif kind == "job_start":
                    self._job_advance(payload)
                elif kind == "head_done":
                    self.head_busy_until = None
                    self._job_advance(payload)
                    self._head_next()
                elif kind == "submit":
                    if self.jobs[payload].state == "tasks":
                        self._submit(payload)
                elif kind == "task_done":
                    seq, attempt = payload
                    tr = self.tasks[seq]
                    if tr.state == "running" and tr.attempts == attempt:
                        self._task_finished(tr, "done")
                elif kind == "budget":
                    self._budget(payload)
                elif kind == "ready":
                    self._dirty = True
                elif kind == "interrupt":
                    self._interrupt(self.nodes[payload])
            self._place()
            if ran_tick:
                self._autoscale()
                self._dirty = False
                self._place()
            self._next_tick(ran_tick)
        if self.workload_end is None:
            stuck = [t for t in self.tasks if t.state == "pending"]
            what = (f"task {stuck[0].spec.name!r} of job {stuck[0].job!r} needs {stuck[0].spec.resource_dict}"
                    if stuck else "a job never finished")
            raise SimulationError(f"{self.cfg.label}: the workload cannot complete: {what}, which no node type "
                                  f"can run (node types: { {k: v['resources'] for k, v in self.cfg.node_types.items()} })")
        # The head (and min_workers, fixed nodes) are billed until the workload ends; workers that were still up
        # were terminated by their idle timeout above, after the end, and are billed until then.
        for n in self.nodes:
            if n.end_ms is None:
                n.end_ms = max(self.workload_end, n.launch_ms)
        return SimResult(config=self.cfg, elapsed_ms=self.workload_end, nodes=self.nodes, tasks=self.tasks,
                         head_phase_ms=self.head_phase_ms, interruptions=self.interruptions,
                         scheduler_calls=self.scheduler_calls)


def simulate(trace: Trace, config: SimConfig, **kw: Any) -> SimResult:
    return Simulator(trace, config, **kw).run()


# ------------------------------------------------------------------------------------------------------------
# Reports


def report_dict(trace: Trace, results: list[SimResult], params: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "trace": trace.name,
        "trace_task_hours_uncut": round(trace.task_hours(), 6),
        "parameters": dict(params),
        "configurations": {r.config.label: r.to_dict() for r in results},
        "published": list(trace.meta.get("published") or []),
    }


def report_text(trace: Trace, results: list[SimResult], baseline: SimResult | None) -> str:
    lines = [f"trace {trace.name}: {len(trace.jobs)} jobs, "
             f"{sum(len(j.tasks) for j in trace.jobs.values())} tasks"]
    hdr = (f"{'configuration':34} {'schedule':11} {'elapsed h':>9} {'cost $':>9} {'vs base':>8} {'idle $/h':>9} "
           f"{'GPU util':>8} {'bound $':>8}")
    lines.append(hdr)
    for r in results:
        vs = ""
        if baseline is not None and baseline is not r and baseline.workload_cost > 0:
            vs = f"{(r.workload_cost / baseline.workload_cost - 1) * 100:+.1f}%"
        gpu = r.gpu_utilisation
        lines.append(f"{r.config.label:34} {r.config.schedule:11} {r.elapsed_hours:9.3f} {r.workload_cost:9.2f} "
                     f"{vs:>8} {r.config.idle_cost_per_hour:9.3f} "
                     f"{'-' if gpu is None else f'{gpu * 100:.1f}%':>8} {r.lower_bound():8.2f}")
    published = trace.meta.get("published") or []
    if published:
        lines.append("published reference (from the trace's meta.published):")
        for p in published:
            vs = p.get("vs_fixed_pct")
            cost = p.get("workload_cost")
            lines.append(f"  {str(p.get('configuration', '?')):32} {'':11} {p.get('elapsed_hours', float('nan')):9.3f} "
                         f"{'-' if cost is None else f'{cost:.2f}':>9} {'-' if vs is None else f'{vs:+.1f}%':>8} "
                         f"{p.get('idle_cost_per_hour', float('nan')):9.3f}")
    lines.append("")
    for r in results:
        inst = ", ".join(f"{k}={o.instance_type} {o.capacity} ${o.hourly_price:.4f}/h"
                         for k, o in sorted(r.config.offers.items()))
        nh = ", ".join(f"{k}: {v:.2f}" for k, v in r.node_hours().items())
        extra = ""
        if r.interruptions:
            extra = f"; {r.interruptions} spot interruptions, {r.lost_task_hours:.2f} task-hours lost and rerun"
        lines.append(f"{r.config.label}: {inst}")
        lines.append(f"    node-hours: {nh}; useful task-hours {r.useful_task_hours:.2f}; "
                     f"head-only {r.head_phase_ms / MS_PER_HOUR:.2f} h{extra}")
    lines.append("bound $ = lower bound: every useful task-hour on the cheapest allowed offering for its shape, no "
                 "launch latency, no idle time, no head.")
    return "\n".join(lines)


def plot_results(results: list[SimResult], out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(10, 2.4 * len(results) + 0.6), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        series = r.node_count_series()
        xs = [t / MS_PER_HOUR for t, _ in series]
        ys = [c for _, c in series]
        ax.step(xs, ys, where="post", color="tab:blue", label="nodes up")
        ax.set_ylabel("nodes")
        ax.set_ylim(0, max(ys + [1]) + 1)
        ax.set_title(f"{r.config.label} ({r.config.schedule}): {r.elapsed_hours:.2f} h, ${r.workload_cost:.2f}",
                     fontsize=9)
        # Cumulative cost: piecewise linear between the node-count change points.
        times = sorted({0} | {t for t, _ in series} | {r.elapsed_ms})
        cum, acc = [], 0.0
        for i, t in enumerate(times):
            if i:
                t0 = times[i - 1]
                mid = (t0 + t) / 2
                rate = sum(n.offer.hourly_price for n in r.nodes
                           if n.launch_ms <= mid < (n.end_ms if n.end_ms is not None else r.elapsed_ms))
                acc += rate * (t - t0) / MS_PER_HOUR
            cum.append(acc)
        ax2 = ax.twinx()
        ax2.plot([t / MS_PER_HOUR for t in times], cum, color="tab:red", label="cumulative cost")
        ax2.set_ylabel("USD", color="tab:red")
    axes[-1, 0].set_xlabel("hours")
    fig.tight_layout()
    fig.savefig(out, dpi=100, metadata={"Software": None})
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------------
# CLI


def _split_schedule(spec: str) -> tuple[str, str | None]:
    if "#" in spec:
        a, b = spec.rsplit("#", 1)
        return a, b
    return spec, None


def build_configs(trace: Trace, configs: Iterable[str], baselines: Iterable[str], capacity: str,
                  schedule: str | None, catalog: Catalog) -> list[SimConfig]:
    out: list[SimConfig] = []
    for spec in baselines:
        s, sched = _split_schedule(spec)
        out.append(config_from_fixed(s, sched or trace.baseline_schedule, catalog))
    for spec in configs:
        path, sched = _split_schedule(spec)
        sched = sched or schedule or trace.default_schedule
        variants = {"as-configured": [False], "on-demand": [True], "both": [True, False]}[capacity]
        for od in variants:
            out.append(config_from_cluster(path, sched, od, catalog=catalog))
    labels = [c.label for c in out]
    for c in out:
        if labels.count(c.label) > 1:
            c.label = f"{c.label}#{c.schedule}"
    return out


@click.command("simulate")
@click.argument("trace_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--config", "configs", multiple=True,
              help="Cluster YAML to replay under (repeatable). Append #SCHEDULE to pick the trace schedule.")
@click.option("--baseline", "baselines", multiple=True,
              help="Fixed cluster, e.g. fixed:3xg4dn.4xlarge or fixed:3xg4dn.4xlarge@us-east-1 (repeatable; "
                   "#SCHEDULE as for --config; default schedule: the trace's baseline_schedule).")
@click.option("--capacity", type=click.Choice(["as-configured", "on-demand", "both"]), default="as-configured",
              show_default=True, help="on-demand: force capacity [on-demand] for every node type; both: report "
                                      "each config both ways.")
@click.option("--schedule", default=None, help="Trace schedule for --config (default: the trace's default_schedule).")
@click.option("--launch-minutes", type=float, default=DEFAULT_LAUNCH_MINUTES, show_default=True,
              help="Launch request -> node ready to run tasks.")
@click.option("--spot-interruptions-per-hour", type=float, default=0.0, show_default=True,
              help="Per spot node; lost work reruns.")
@click.option("--seed", type=int, default=0, show_default=True, help="RNG seed (spot interruptions).")
@click.option("--catalog", "catalog_spec", default="embedded", show_default=True,
              help="Catalog pricing the fixed baselines ('embedded' or a file). Cluster configs use their own.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a timeline PNG.")
def simulate_command(trace_path: str, configs: tuple[str, ...], baselines: tuple[str, ...], capacity: str,
                     schedule: str | None, launch_minutes: float, spot_interruptions_per_hour: float, seed: int,
                     catalog_spec: str, as_json: bool, plot_path: str | None) -> None:
    """Replay TRACE under each --config and --baseline: elapsed time, cost, idle cost, node-hours."""
    from ray_nodeless.cli.main import user_errors  # the CLI's one-line error convention

    with user_errors():
        if not configs and not baselines:
            raise ConfigError("--config/--baseline", "give at least one configuration to replay under")
        if launch_minutes < 0 or spot_interruptions_per_hour < 0:
            raise ConfigError("--launch-minutes/--spot-interruptions-per-hour", "must be >= 0")
        trace = load_trace(trace_path)
        catalog = load_catalog(catalog_spec)
        cfgs = build_configs(trace, configs, baselines, capacity, schedule, catalog)
        kw = dict(launch_latency_ms=int(round(launch_minutes * 60_000)),
                  spot_interruptions_per_hour=spot_interruptions_per_hour, seed=seed)
        results = [simulate(trace, c, **kw) for c in cfgs]
    baseline = next((r for r in results if r.config.kind == "fixed"), None)
    params = {"launch_minutes": launch_minutes, "spot_interruptions_per_hour": spot_interruptions_per_hour,
              "seed": seed, "capacity": capacity, "autoscaler": "ray v1 ResourceDemandScheduler.get_nodes_to_launch",
              "tick_seconds": TICK_MS // 1000}
    if plot_path:
        plot_results(results, plot_path)
    if as_json:
        click.echo(json.dumps(report_dict(trace, results, params), indent=2, sort_keys=True))
    else:
        click.echo(report_text(trace, results, baseline))
        if plot_path:
            click.echo(f"plot: {plot_path}")
