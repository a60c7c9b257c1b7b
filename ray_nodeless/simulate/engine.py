"""Replay a workload trace under cluster configurations: elapsed time, cost, idle cost, node-hours.

The replay runs the same decision code the provider runs in production, and imitates nothing it can reuse:
- which node types to launch: Ray's own v1 `ResourceDemandScheduler.get_nodes_to_launch` (bin-packing, per-type
  and global `max_workers`, `min_workers`, the pending-launch cap `max(5, upscaling_speed * running)`), called
  through a small in-memory stand-in for the node provider;
- which instance each node type gets: `plan_cluster(config).plans[node_type].chosen` (our planner and rules);
- on a shape-open cluster, what to launch for the demands no declared worker type holds: the monitor's own
  first-fit-decreasing packing onto cheapest fits (`simulate/open.py`, `core/open_plan.py`), whose node types are
  added to the run's configuration as it opens them.

What is modelled, and how (the "why" is in docs/trace-format.md):
- time is whole milliseconds; the autoscaler ticks every `AUTOSCALER_UPDATE_INTERVAL_S` (5 s unless the config's
  head_start_ray_commands set it: `SimConfig.tick_ms`) on a fixed grid and is only evaluated on ticks after
  something changed (its answer is a function of the state, so the skipped ticks would return the same thing);
- a launched node is billed from the launch request and can run tasks `launch_latency` later; with
  `launch_concurrency` N only N nodes start at once (the local backend starts one node process at a time, under
  a host-wide lock): a node waits for a free start slot, unbilled, as its record does not exist yet, and is billed
  from its slot's start;
- a task placed on a node holds its resources `task_start` before its recorded run begins (a Tune trial: the
  placement group's commit, the trial actor's worker process starting; a trace records only the run);
- a worker the autoscaler terminates (idle, or a policy's release) stops taking work at once and is billed
  `scale_down` longer (Ray's drain, the terminate call, the machine leaving the cloud's listing);
- a worker that has run nothing for its node type's idle timeout is terminated on the next tick (never below
  `min_workers`): the per-type `idle_timeout_s` Ray v2 reads, as the cluster plan decides it (core/idle.py: the
  type's own value, the cost-aware break-even, or `idle_timeout_minutes`); `--idle-release cluster-wide` replays
  v1's single `idle_timeout_minutes`. The head is up for the whole run and billed until the workload ends;
- tasks are placed FIFO on ready nodes where they fit (head first, then oldest node; CPU-only tasks avoid GPU
  nodes as Ray's `scheduler_avoid_gpu_nodes` does); a task that fits nowhere does not block the others;
- head-only phases run on the head, one at a time, outside Ray's resource accounting (they are driver code);
- spot nodes may be interrupted (Poisson, `--spot-interruptions-per-hour`, RNG seeded per configuration and
  node; or at scripted times, `interrupt_at`): the work of the tasks on them is lost and they rerun from the
  start; the interrupted offering enters the capacity memory for the provider's `unavailable_ttl_s`, and with
  `spot_outage_ms` every spot offering of the type has no capacity that long (a drought: launches fall back to
  on demand, as the launcher's walk of the plan does, and those workers are fallbacks);
- `provider.reversion` (on by default) replays on-demand -> spot reversion and the on-demand preference after
  repeated interruptions (simulate/reversion.py, the live Reverter's steps);
- `policies`: objects with `on_tick(sim)`, called after every autoscaler update (idle release, launches), may
  launch (`sim.launch(node_type)`) and terminate (`sim.release(node)`) nodes: the hook a replacement policy such as
  on-demand -> spot reversion plugs into without changing the loop.
"""
from __future__ import annotations

import dataclasses
import heapq
import logging
import random
from typing import Any, Mapping, Sequence

from ray_nodeless.core.demand import NodeCapacity
from ray_nodeless.ray_compat.scheduler import demand_scheduler, no_availability, quiet_scheduler
from ray_nodeless.simulate.model import (
    DEFAULT_LAUNCH_MINUTES, EPS, JobRun, Offer, SimConfig, SimNode, SimulationError, TaskRun,
)
from ray_nodeless.simulate.results import SimResult
from ray_nodeless.trace.model import MS_PER_HOUR, Trace, stages_of

logger = logging.getLogger(__name__)


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
    return all(avail.get(k, 0.0) + EPS >= v for k, v in need.items())


class Simulator:
    """One replay of one trace schedule under one configuration. Deterministic: integer time, seeded RNG."""

    def __init__(self, trace: Trace, config: SimConfig, *, launch_latency_ms: int = int(DEFAULT_LAUNCH_MINUTES * 60_000),
                 spot_interruptions_per_hour: float = 0.0, seed: int = 0, policies: Sequence[Any] = (),
                 launch_concurrency: int | None = None, task_start_ms: int = 0, scale_down_ms: int = 0,
                 tick_ms: int | None = None, spot_outage_ms: int = 0, interrupt_at: Mapping[int, int] | None = None):
        if launch_concurrency is not None and launch_concurrency < 1:
            raise SimulationError(f"launch_concurrency must be >= 1 (or None: unbounded), got {launch_concurrency}")
        if min(launch_latency_ms, task_start_ms, scale_down_ms, spot_outage_ms) < 0 or \
                (tick_ms is not None and tick_ms < 1):
            raise SimulationError("launch_latency_ms, task_start_ms, scale_down_ms and spot_outage_ms must be >= 0, "
                                  "tick_ms >= 1")
        self.trace = trace
        # The run's own copy: a shape-open cluster adds the node types it opens (the input config is reused).
        self.cfg = dataclasses.replace(config, node_types=dict(config.node_types), offers=dict(config.offers),
                                       idle_timeout_ms_by_type=dict(config.idle_timeout_ms_by_type))
        self.on_interrupt: list[Any] = []           # callables (sim, node) run after a spot interruption
        # The launcher's capacity memory (offering -> skipped until), spot droughts (node type -> no spot capacity
        # until) and the on-demand preference after repeated interruptions (a reversion policy sets it).
        self.unavailable: dict[Offer, int] = {}
        self.spot_outage_ms = spot_outage_ms
        self.outage_until: dict[str, int] = {}
        self.prefer_on_demand: Any = lambda node_type: False
        rev = self.cfg.reversion
        if rev is not None and rev.enabled:
            # As the provider builds its Reverter whenever reversion is on (the monitor's listing path ticks it).
            from ray_nodeless.simulate.reversion import SimReverter
            policies = (SimReverter(rev), *policies)
        self.policies = tuple(policies)
        self._opened: set[str] = set()
        self.launch_latency_ms = launch_latency_ms
        self.launch_concurrency = launch_concurrency
        self._start_slots: list[int] = []           # when each busy start slot frees (launch_concurrency)
        self.task_start_ms = task_start_ms
        self.scale_down_ms = scale_down_ms
        self.tick_ms = tick_ms if tick_ms is not None else self.cfg.tick_ms
        self.spot_rate = spot_interruptions_per_hour
        self.interrupt_at = dict(interrupt_at or {})     # node seq -> when it is interrupted (a scripted what-if)
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
        for p in self.policies:
            if hasattr(p, "attach"):          # a policy may hook interruptions and launches (simulate/reversion.py)
                p.attach(self)

    # -- events ---------------------------------------------------------------------------------------------
    def _at(self, t: int, kind: str, payload: Any = None) -> None:
        self._eseq += 1
        heapq.heappush(self._events, (t, self._eseq, kind, payload))

    def wake_at(self, t: int) -> None:
        """Run the autoscaler (and the policies) on the first tick at or after `t` (for `policies`)."""
        self._tick_at(-(-max(t, self.now) // self.tick_ms) * self.tick_ms)

    def _tick_at(self, t: int) -> None:
        if t not in self._ticks:
            self._ticks.add(t)
            self._at(t, "tick")

    # -- nodes ----------------------------------------------------------------------------------------------
    def _launch_window(self) -> tuple[int, int]:
        """(billed from, ready at) of a worker launched now: one launch latency, after a free start slot."""
        start = self.now
        if self.launch_concurrency is not None:
            busy = sorted(t for t in self._start_slots if t > self.now)
            if len(busy) >= self.launch_concurrency:
                start = busy[len(busy) - self.launch_concurrency]
            self._start_slots = busy + [start + self.launch_latency_ms]
        return start, start + self.launch_latency_ms

    def choose_offer(self, node_type: str, capacities: frozenset[str] | None = None) -> tuple[Offer | None, bool]:
        """The offering the launcher takes for `node_type` now, and whether it is an on-demand fallback: the plan's
        order (on-demand first while the type prefers it), skipping offerings in the capacity memory; a spot
        offering tried in a drought fails and enters the memory, as a CapacityError does in the launcher."""
        cands = self.cfg.candidates.get(node_type) or (self.cfg.offers[node_type],)
        if self.prefer_on_demand(node_type):
            cands = tuple(sorted(cands, key=lambda o: o.capacity == "spot"))      # stable: plan order otherwise
        spot_missed = False
        for o in cands:
            if capacities is not None and o.capacity not in capacities:
                continue
            if self.unavailable.get(o, -1) > self.now:
                spot_missed |= o.capacity == "spot"
                continue
            if o.capacity == "spot" and self.outage_until.get(node_type, -1) > self.now:
                self.unavailable[o] = self.now + self.cfg.unavailable_ttl_ms
                spot_missed = True
                continue
            return o, spot_missed and o.capacity != "spot"
        return None, False

    def spot_available(self, node_type: str) -> bool:
        """Whether a spot offering of `node_type` is out of the capacity memory (what reversion waits for)."""
        cands = self.cfg.candidates.get(node_type) or (self.cfg.offers[node_type],)
        return any(o.capacity == "spot" and self.unavailable.get(o, -1) <= self.now for o in cands)

    def hourly_cost(self) -> float:
        """What the nodes up or launching cost per hour now (the launcher's view for max_hourly_cost)."""
        return sum(n.offer.hourly_price for n in self.live.values())

    def _add_worker(self, node_type: str, capacities: frozenset[str] | None = None) -> SimNode | None:
        offer, fallback = self.choose_offer(node_type, capacities)
        if offer is None:
            # No offering has capacity now: look again on the first tick after one leaves the memory (a tick with
            # nothing changed would not be run otherwise).
            cands = self.cfg.candidates.get(node_type) or (self.cfg.offers[node_type],)
            back = [t for t in [self.unavailable.get(o, -1) for o in cands] if t > self.now]
            if back:
                self._tick_at(-(-min(back) // self.tick_ms) * self.tick_ms)
            return None
        start, ready = self._launch_window()
        n = self._add_node(node_type, False, ready, launch_ms=start, offer=offer)
        n.fallback = fallback
        return n

    def _add_node(self, node_type: str, is_head: bool, ready_ms: int, launch_ms: int | None = None,
                  offer: Offer | None = None) -> SimNode:
        res = dict(self.cfg.node_types[node_type]["resources"])
        launch_ms = self.now if launch_ms is None else launch_ms
        n = SimNode(seq=len(self.nodes), node_type=node_type, is_head=is_head,
                    offer=offer or self.cfg.offers[node_type], total=res, available=dict(res), launch_ms=launch_ms,
                    ready_ms=ready_ms, idle_since_ms=ready_ms)
        self.nodes.append(n)
        self.live[n.node_id] = n
        if ready_ms > self.now:
            self._at(ready_ms, "ready", n.seq)
        if n.offer.capacity == "spot" and not is_head and n.seq in self.interrupt_at:
            n.interrupt_ms = max(self.interrupt_at[n.seq], launch_ms + 1)
            self._at(n.interrupt_ms, "interrupt", n.seq)
        elif n.offer.capacity == "spot" and self.spot_rate > 0 and not is_head:
            # One RNG per node, seeded by configuration and node number: adding a configuration or a node elsewhere
            # does not shift anyone else's draws.
            rng = random.Random(f"{self.seed}:{self.cfg.label}:{n.seq}")
            n.interrupt_ms = launch_ms + max(1, int(rng.expovariate(self.spot_rate) * MS_PER_HOUR))
            self._at(n.interrupt_ms, "interrupt", n.seq)
        return n

    def launch(self, node_type: str, capacities: frozenset[str] | None = None) -> SimNode | None:
        """A worker of `node_type` requested now (only of `capacities` if given), ready one launch latency later;
        None when no offering has capacity (for `policies`)."""
        self._dirty = True
        return self._add_worker(node_type, capacities)

    def release(self, n: SimNode) -> None:
        """Terminate worker `n` now; its running tasks are lost and rerun, as on an interruption (for `policies`).
        Billed `scale_down` longer, as an idle termination (drain and terminate)."""
        if n.end_ms is None:
            self._end_and_requeue(n, self.scale_down_ms)

    def _terminate(self, n: SimNode, billed_ms: int = 0) -> None:
        """End `n` now: it takes no more work; billed `billed_ms` longer (the scale-down latency), idle meanwhile."""
        end = max(self.now + billed_ms, n.launch_ms)
        n.idle_until(end)
        n.idle_since_ms = None
        n.end_ms = end
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
            jr.state = "done"
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
            node.idle_until(self.now)
            node.idle_since_ms = None
            # The recorded run begins task_start later; the resources are held from now.
            tr.state, tr.node, tr.ran_on, tr.start_ms = "running", node.seq, node.seq, self.now + self.task_start_ms
            tr.attempts += 1
            self._at(tr.start_ms + tr.spec.duration_ms, "task_done", (tr.seq, tr.attempts))
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
        tr.useful_ms += max(0, self.now - tr.start_ms)
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
                tr.useful_ms += max(0, self.now - tr.start_ms)
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
        self._end_and_requeue(n)
        # As the launcher on a machine that vanished: its offering is skipped for unavailable_ttl_s; a drought
        # (spot_outage_ms) takes every spot offering of the type for that long.
        self.unavailable[n.offer] = self.now + self.cfg.unavailable_ttl_ms
        if self.spot_outage_ms > 0:
            self.outage_until[n.node_type] = self.now + self.spot_outage_ms
        for hook in self.on_interrupt:
            hook(self, n)

    def _end_and_requeue(self, n: SimNode, billed_ms: int = 0) -> None:
        """End worker `n` now (a policy's release, billed `billed_ms` longer, or an interruption): its running
        tasks are lost and pending again."""
        lost = [self.tasks[s] for s in sorted(n.running)]
        self._terminate(n, billed_ms)
        for tr in lost:
            tr.lost_ms += max(0, self.now - tr.start_ms)
            tr.state, tr.node = "pending", None
        # Lost work reruns from the start, ahead of later submissions (FIFO by first submission).
        self.pending = sorted(self.pending + lost, key=lambda t: (t.submit_ms, t.seq))
        self._dirty = True

    # -- the autoscaler -------------------------------------------------------------------------------------
    def _ray_scheduler(self):
        if self._scheduler is None:
            # Ray's scheduler scales the declared types only (a shape-open cluster's opened types are the packing's).
            declared = {k: v for k, v in self.cfg.node_types.items() if k not in self._opened}
            self._scheduler = demand_scheduler(
                _ProviderView(self.live), declared, self.cfg.max_workers, self.cfg.head_node_type,
                self.cfg.upscaling_speed)
        return self._scheduler

    def _open_launch(self, tasks: list[TaskRun]) -> None:
        """Shape-open: the monitor's packing of `tasks` over the free capacity of the nodes up or launching (a
        launching node's whole resources, as `OpenTypes._bins`); launch what it opens, within max_workers."""
        if not tasks:
            return
        bins = []
        for n in sorted(self.live.values(), key=lambda n: n.seq):
            free = n.available if n.ready_ms <= self.now else n.total
            labels = dict(self.cfg.node_types[n.node_type].get("labels") or {})
            bins.append(NodeCapacity(n.node_id, dict(free), labels, n.node_type, n.offer.zone,
                                     has_gpu=n.total.get("GPU", 0.0) > 0))
        room = self.cfg.max_workers - sum(1 for n in self.live.values() if not n.is_head)
        for t, count in self.cfg.open.plan([tr.spec.resource_dict for tr in tasks], bins, room):
            if t.name not in self.cfg.node_types:
                self._opened.add(t.name)
                self.cfg.node_types[t.name] = {"resources": {k: float(v) for k, v in t.resources},
                                               "labels": dict(t.labels), "min_workers": 0,
                                               "max_workers": self.cfg.max_workers}
                o = t.offering
                self.cfg.offers[t.name] = Offer(o.instance_type.name, o.capacity, o.zone, float(o.hourly_price or 0))
                if self.cfg.open_idle_ms is not None:
                    self.cfg.idle_timeout_ms_by_type[t.name] = self.cfg.open_idle_ms(o.hourly_price)
            for _ in range(count):
                self._add_worker(t.name)
                logger.debug("%s t=%.3fh open %s", self.cfg.label, self.now / MS_PER_HOUR, t.name)

    def _autoscale(self) -> None:
        # Idle termination first, as v1's update does before launching; each type's own timeout (-1: never).
        counts: dict[str, int] = {}
        for n in self.live.values():
            counts[n.node_type] = counts.get(n.node_type, 0) + (0 if n.is_head else 1)
        for n in sorted(self.live.values(), key=lambda n: n.seq):
            if n.is_head or n.running or n.idle_since_ms is None:
                continue
            timeout = self.cfg.idle_ms(n.node_type)
            if timeout >= 0 and self.now - n.idle_since_ms >= timeout and \
                    counts[n.node_type] > self.cfg.node_types[n.node_type]["min_workers"]:
                counts[n.node_type] -= 1
                self._terminate(n, self.scale_down_ms)
                self._dirty = True
        min_short = any(
            nt["min_workers"] > sum(1 for n in self.live.values() if n.node_type == name and not n.is_head)
            for name, nt in self.cfg.node_types.items())
        if not self.pending and not min_short:
            self._run_policies()
            return
        self.scheduler_calls += 1
        pending = self.pending
        if self.cfg.open is not None:
            # As the monitor: the packing takes what no declared worker type holds, Ray's scheduler the rest.
            pending = [t for t in self.pending if self.cfg.open.declared_holds(t.spec.resource_dict)]
            self._open_launch([t for t in self.pending if not self.cfg.open.declared_holds(t.spec.resource_dict)])
            if not pending and not min_short:
                self._run_policies()
                return
        # Ray's scheduler sees the nodes of the types it knows (a shape-open cluster's opened ones are not).
        known = [n for n in sorted(self.live.values(), key=lambda n: n.seq) if n.node_type not in self._opened]
        ready = [n for n in known if n.ready_ms <= self.now]
        with quiet_scheduler():
            to_launch, _ = self._ray_scheduler().get_nodes_to_launch(
                nodes=[n.node_id for n in known],
                launching_nodes={},
                resource_demands=[t.spec.resource_dict for t in pending],
                unused_resources_by_ip={n.ip: dict(n.available) for n in ready},
                pending_placement_groups=[],
                max_resources_by_ip={n.ip: dict(n.total) for n in ready},
                ensure_min_cluster_size=[],
                node_availability_summary=no_availability(),
            )
        for node_type in sorted(to_launch):
            for _ in range(int(to_launch[node_type])):
                self._add_worker(node_type)
                logger.debug("%s t=%.3fh launch %s (%s)", self.cfg.label, self.now / MS_PER_HOUR, node_type,
                             self.cfg.offers[node_type].key)
        self._run_policies()

    def _run_policies(self) -> None:
        for policy in self.policies:
            policy.on_tick(self)

    def _next_tick(self, ran_tick: bool) -> None:
        if self.cfg.kind != "autoscaled":
            return
        want: list[int] = []
        if self._dirty and self.pending:
            g = -(-self.now // self.tick_ms) * self.tick_ms
            if g == self.now and ran_tick:
                g += self.tick_ms
            want.append(g)
        workers: dict[str, int] = {}
        for n in self.live.values():
            if not n.is_head:
                workers[n.node_type] = workers.get(n.node_type, 0) + 1
        for n in self.live.values():
            if n.is_head or n.running or n.idle_since_ms is None or self.cfg.idle_ms(n.node_type) < 0:
                continue
            # A type at its min_workers floor terminates nothing, so its idle workers need no tick: asking for
            # one would ask again at every tick, forever once the workload has ended. When the type grows
            # above its floor, that launch happens on a tick, and this runs again after it.
            if workers[n.node_type] <= self.cfg.node_types[n.node_type]["min_workers"]:
                continue
            due = max(n.idle_since_ms + self.cfg.idle_ms(n.node_type), self.now + (1 if ran_tick else 0))
            want.append(-(-due // self.tick_ms) * self.tick_ms)
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
            if self.cfg.open is not None and self.cfg.open.infeasible:
                first = sorted(self.cfg.open.infeasible.items())[0]
                what += f" (shape-open: cannot serve {first[0]}: {first[1].splitlines()[0]})"
            raise SimulationError(f"{self.cfg.label}: the workload cannot complete: {what}, which no node type "
                                  f"can run (node types: { {k: v['resources'] for k, v in self.cfg.node_types.items()} })")
        # The head (and min_workers, fixed nodes) are billed until the workload ends; workers that were still up
        # were terminated by their idle timeout above, after the end, and are billed until then.
        for n in self.nodes:
            if n.end_ms is None:
                n.idle_until(max(self.workload_end, n.launch_ms))
                n.end_ms = max(self.workload_end, n.launch_ms)
        stats = {type(p).__name__: p.stats.to_dict() for p in self.policies if hasattr(p, "stats")}
        return SimResult(config=self.cfg, elapsed_ms=self.workload_end, nodes=self.nodes, tasks=self.tasks,
                         head_phase_ms=self.head_phase_ms, interruptions=self.interruptions,
                         scheduler_calls=self.scheduler_calls, policy_stats=stats)


def simulate(trace: Trace, config: SimConfig, **kw: Any) -> SimResult:
    return Simulator(trace, config, **kw).run()
