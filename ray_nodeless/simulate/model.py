"""What a replay works on: the configurations it replays under, and the state of nodes, tasks and jobs in a run.

Time is whole milliseconds throughout (see `ray_nodeless.trace.model`), so a replay is exact integer arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ray_nodeless.errors import NodelessError
from ray_nodeless.trace.model import JobSpec, TaskSpec

TICK_MS = 5_000                      # Ray's AUTOSCALER_UPDATE_INTERVAL_S default (a config may set another)
DEFAULT_LAUNCH_MINUTES = 3.0         # request -> Ray node ready (boot + `ray start`); see docs/trace-format.md
EPS = 1e-9                           # resource amounts are floats: 0.1 + 0.2 must still fit in 0.3


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

    @property
    def remembered(self) -> "RememberedOffer":
        """This offer as the capacity memory keys it (the catalog's (instance type, zone, capacity))."""
        return RememberedOffer((self.instance_type, self.zone, self.capacity))


@dataclass(frozen=True)
class RememberedOffer:
    key: tuple[str, str, str]


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
    idle_timeout_ms: int                       # Ray's cluster-wide idle_timeout_minutes (-1: never)
    idle_cost_per_hour: float
    fixed_count: int = 0                       # fixed baselines: this many nodes of the head type, always on
    source: str = ""
    # A shape-open cluster: simulate/open.py's OpenCluster (the monitor's packing) decides its launches; the node
    # types it opens are added to a run's copy of node_types/offers as the replay goes.
    open: Any = None
    # Per worker node type: its idle timeout as the cluster plan decided it (core/idle.py: the node type's own
    # idle_timeout_s, the cost-aware break-even, or the cluster-wide one), -1 = never. A type not here (a fixed
    # baseline's) uses idle_timeout_ms. Ray v2 honours these; `--idle-release cluster-wide` replays v1's one timeout.
    idle_timeout_ms_by_type: dict[str, int] = field(default_factory=dict)
    # A shape-open cluster's generated types: the break-even idle timeout of an offering at a price (ms, or None
    # for the cluster-wide one), as launch/open_types.py gives the types it generates.
    open_idle_ms: Any = None
    # The autoscaler's loop period: Ray's AUTOSCALER_UPDATE_INTERVAL_S, 5 s unless the head's start command sets it.
    tick_ms: int = TICK_MS
    # Per node type, the plan's offerings in its order (the launcher walks them, skipping those in the capacity
    # memory); a type not here launches its one `offers` entry. How long an offering that failed or was
    # interrupted is skipped: the provider's capacity-error backoff (core/availability.py: unavailable_ttl_s,
    # doubled per error in a row up to unavailable_backoff_cap_s, unavailable_probes at once after it).
    candidates: dict[str, tuple[Offer, ...]] = field(default_factory=dict)
    unavailable_ttl_ms: int = 180_000
    unavailable_cap_ms: int = 600_000
    unavailable_probes: int = 1
    # The provider's `reversion` settings (core/reversion.ReversionSettings; None or disabled: no reversion, no
    # on-demand preference after interruptions) and `max_hourly_cost` (None: no cap).
    reversion: Any = None
    max_hourly_cost: float | None = None
    # The idle release that learns the gaps (core/idle_gaps.py, `provider.idle.learn_gaps`): the GapLearner's
    # (launch_s, window, min_gap_s), None when off; it applies to the types whose timeout is the plan's, not their own
    # idle_timeout_s (`learn_types`; shape-open types are added as they open).
    idle_learning: tuple[float, int, float] | None = None
    learn_types: set[str] = field(default_factory=set)

    def idle_ms(self, node_type: str) -> int:
        return self.idle_timeout_ms_by_type.get(node_type, self.idle_timeout_ms)


# ------------------------------------------------------------------------------------------------------------
# Run state


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
    fallback: bool = False            # launched on demand because no spot offering had capacity (TAG_FALLBACK)
    idle_ms: int = 0                  # ready and running nothing (the idle tails), up to its end

    def idle_until(self, now: int) -> None:
        """Count the idle time since `idle_since_ms` (from when it was ready) up to `now`."""
        if self.idle_since_ms is not None:
            self.idle_ms += max(0, now - max(self.idle_since_ms, self.ready_ms))

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
