"""The state of one replay (simulate/engine.py) and its event queue: what the parts of the Simulator share.

The Simulator is this state and four parts, each a class over it (imports going one way): nodes.py (launching,
terminating, interrupting nodes and placing tasks on them), jobs.py (jobs' phases, the head's queue, task
submission and completion), autoscaler.py (idle termination, Ray's scheduler, shape-open packing, policies, when
to tick next), and engine.py (the event loop and the result).
"""
from __future__ import annotations

import dataclasses
import heapq
from typing import Any, Mapping, Sequence

from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.idle_gaps import GapLearner
from ray_nodeless.simulate.model import DEFAULT_LAUNCH_MINUTES, JobRun, SimConfig, SimNode, SimulationError, \
    TaskRun
from ray_nodeless.trace.model import Trace, stages_of


class SimState:
    """A replay's clock, configuration, nodes, jobs and tasks, and its event queue (time, sequence, kind,
    payload): events at the same time run in the order they were queued."""

    def __init__(self, trace: Trace, config: SimConfig, *,
                 launch_latency_ms: int = int(DEFAULT_LAUNCH_MINUTES * 60_000),
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
                                       idle_timeout_ms_by_type=dict(config.idle_timeout_ms_by_type),
                                       learn_types=set(config.learn_types))
        # The live provider's gap learner (core/idle_gaps.py) on the replay's clock, fed by nodes.py's events.
        self.gaps = GapLearner(*self.cfg.idle_learning) if self.cfg.idle_learning is not None else None
        self.on_interrupt: list[Any] = []           # callables (sim, node) run after a spot interruption
        # The launcher's capacity memory (the live class, on the replay's clock), spot droughts (node type -> no
        # spot capacity until) and the on-demand preference after repeated interruptions (a reversion policy sets
        # it). `capacity_errors`: launch attempts that met a drought (each a wasted cloud call in production).
        self.unavailable = UnavailableOfferings(self.cfg.unavailable_ttl_ms / 1000, lambda: self.now / 1000,
                                                cap_s=self.cfg.unavailable_cap_ms / 1000,
                                                probes=self.cfg.unavailable_probes)
        self.capacity_errors = 0
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

