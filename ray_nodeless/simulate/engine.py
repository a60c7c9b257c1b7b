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

import heapq
from typing import Any

from ray_nodeless.simulate.autoscaler import Autoscaler
from ray_nodeless.simulate.jobs import JobFlow
from ray_nodeless.simulate.model import SimConfig, SimulationError
from ray_nodeless.simulate.results import SimResult
from ray_nodeless.trace.model import Trace


class Simulator(JobFlow, Autoscaler):
    """One replay of one trace schedule under one configuration. Deterministic: integer time, seeded RNG.
    Its state and event queue are state.py's SimState, its parts nodes.py, jobs.py and autoscaler.py."""

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
            types = {k: v["resources"] for k, v in self.cfg.node_types.items()}
            raise SimulationError(f"{self.cfg.label}: the workload cannot complete: {what}, which no node type "
                                  f"can run (node types: {types})")
        # The head (and min_workers, fixed nodes) are billed until the workload ends; workers that were still up
        # were terminated by their idle timeout above, after the end, and are billed until then.
        for n in self.nodes:
            if n.end_ms is None:
                n.idle_until(max(self.workload_end, n.launch_ms))
                n.end_ms = max(self.workload_end, n.launch_ms)
        stats = {type(p).__name__: p.stats.to_dict() for p in self.policies if hasattr(p, "stats")}
        return SimResult(config=self.cfg, elapsed_ms=self.workload_end, nodes=self.nodes, tasks=self.tasks,
                         head_phase_ms=self.head_phase_ms, interruptions=self.interruptions,
                         scheduler_calls=self.scheduler_calls, policy_stats=stats,
                         capacity_errors=self.capacity_errors)



def simulate(trace: Trace, config: SimConfig, **kw: Any) -> SimResult:
    return Simulator(trace, config, **kw).run()
