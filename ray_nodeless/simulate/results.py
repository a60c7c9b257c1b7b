"""The outcome of one replay, and the figures the report is made of (cost, node-hours, utilisation, bound)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ray_nodeless.simulate.model import EPS, SimConfig, SimNode, TaskRun
from ray_nodeless.trace.model import MS_PER_HOUR


@dataclass
class SimResult:
    config: SimConfig
    elapsed_ms: int
    nodes: list[SimNode]
    tasks: list[TaskRun]
    head_phase_ms: int
    interruptions: int
    scheduler_calls: int
    capacity_errors: int = 0        # launch attempts that met a spot drought (wasted cloud calls in production)
    policy_stats: dict[str, dict[str, Any]] = field(default_factory=dict)   # per policy class, e.g. SimReverter

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
                slots = min(slots, math.floor(res.get(k, 0.0) / v + EPS))
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

    @property
    def head_cost(self) -> float:
        """The head for the run: what the cluster costs even when nothing else runs (a fixed baseline's first
        node, which also runs tasks, is its head)."""
        return sum(n.offer.hourly_price * self.node_ms(n) for n in self.nodes if n.is_head) / MS_PER_HOUR

    def head_credit(self) -> float:
        """What the head could have run for free: per task shape, the useful task-hours the head's resources hold
        at once for the whole run (at most the shape's useful hours), at that shape's cheapest slot price. Zero for
        a head that holds none of the tasks (a CPU head under GPU trials); a GPU head or a fixed cluster's head
        runs trials, and the bound must not charge those hours twice (once as the head, once as task-hours)."""
        heads = [n for n in self.nodes if n.is_head]
        if not heads:
            return 0.0
        head = heads[0]
        hours: dict[tuple, float] = {}
        for t in self.tasks:
            key = tuple(sorted(t.spec.resource_dict.items()))
            hours[key] = hours.get(key, 0.0) + t.useful_ms / MS_PER_HOUR
        credit = 0.0
        for key in sorted(hours):
            shape = dict(key)
            slots = min((math.floor(head.total.get(k, 0.0) / v + EPS) for k, v in shape.items() if v > 0),
                        default=0)
            price = self.slot_price(shape)
            if slots > 0 and price is not None:
                credit += price * min(hours[key], slots * self.elapsed_hours)
        return credit

    @property
    def bound_with_head(self) -> float:
        """The lower bound the cluster is judged against: every useful task-hour on its cheapest allowed offering
        (`lower_bound`) plus the head for the run, less what the head itself could have run (`head_credit`)."""
        return max(self.lower_bound() - self.head_credit(), 0.0) + self.head_cost

    @property
    def distance_to_bound(self) -> float | None:
        """How far the workload cost is above `bound_with_head`, as a fraction (0.03 = 3 % over)."""
        b = self.bound_with_head
        return None if b <= 0 else self.workload_cost / b - 1.0

    def worker_hours(self) -> tuple[float, float, float]:
        """Workers' (node-hours, launch-latency hours: billed before ready, idle hours: ready and running
        nothing). What is neither is busy time."""
        workers = [n for n in self.nodes if not n.is_head]
        total = sum(self.node_ms(n) for n in workers)
        launching = sum(max(0, min(n.ready_ms, n.end_ms if n.end_ms is not None else self.elapsed_ms) - n.launch_ms)
                        for n in workers)
        idle = sum(n.idle_ms for n in workers)
        return total / MS_PER_HOUR, launching / MS_PER_HOUR, idle / MS_PER_HOUR

    def to_dict(self) -> dict[str, Any]:
        gpu = self.gpu_utilisation
        worker_h, launch_h, idle_h = self.worker_hours()
        dist = self.distance_to_bound
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
            "head_cost": round(self.head_cost, 6),
            "bound_with_head": round(self.bound_with_head, 6),
            "distance_to_bound_pct": None if dist is None else round(dist * 100, 4),
            "worker_node_hours": round(worker_h, 6),
            "launch_latency_hours": round(launch_h, 6),
            "idle_hours": round(idle_h, 6),
            "idle_timeouts_s": {k: (None if v < 0 else v / 1000)
                                for k, v in sorted(self.config.idle_timeout_ms_by_type.items())},
            "idle_learned": None if self.config.idle_learning is None else {
                "launch_s": self.config.idle_learning[0], "window": self.config.idle_learning[1],
                "min_gap_s": self.config.idle_learning[2], "types": sorted(self.config.learn_types)},
            "useful_task_hours": round(self.useful_task_hours, 6),
            "lost_task_hours": round(self.lost_task_hours, 6),
            "head_only_hours": round(self.head_phase_ms / MS_PER_HOUR, 6),
            "launches": sum(1 for n in self.nodes if not n.is_head and self.config.kind == "autoscaled"),
            "peak_nodes": self.peak_nodes(),
            "spot_interruptions": self.interruptions,
            "capacity_errors": self.capacity_errors,
            "tick_seconds": self.config.tick_ms / 1000,
            "fallback_node_hours": round(sum(self.node_ms(n) for n in self.nodes if n.fallback) / MS_PER_HOUR, 6),
            "reversion": self.policy_stats.get("SimReverter"),
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
