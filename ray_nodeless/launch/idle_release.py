"""The monitor's idle release that learns the gaps (core/idle_gaps.py; `provider.idle.learn_gaps`, on by default).

Ray ends an idle worker after its node type's timeout: the break-even `bootstrap_config` wrote (v2), or
`idle_timeout_minutes` (v1). Where a type's recent gaps say the machine will stay idle longer than a launch, that
wait is pure cost, so `tick` (the provider loop's idle lane, every few seconds) ends such a machine sooner, the way
Ray's own idle termination does: it asks Ray to drain the node with the *idle* reason, which Ray accepts only when
the node runs nothing (and then schedules nothing new on it), and terminates the machine once accepted. A busy node
is refused and never preempted; a refused drain is asked again at the next pass.

What it feeds the learner (Ray's view of the nodes, `IdleSource`, each pass): a worker seen busy, then idle since t
(a gap opens at t); busy again (the gap closes); gone while idle (its gap stays open until the type's next launch,
which `launched` reports from the provider's `create_node`). A machine that has not run anything yet is Ray's
business: its first idle time is not a gap.

What it never does: end a machine of a type whose idle timeout the user set (`IdlePlan.learn` false: the user's
choice wins), end a type below its `min_workers`, end the head, or end a machine later than Ray would (the learned
timeout is only ever shorter than the type's own). Errors (the GCS restarting, a refused terminate) are logged and
the pass ends: the next one tries again. Thread-safety: `tick` runs on the idle lane's one thread; `launched` is
called from Ray's launch threads and only appends under the lock.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Generic, Mapping, Protocol

from ray_nodeless.core.idle_gaps import GapLearner
from ray_nodeless.errors import DrainError, NodelessError
from ray_nodeless.launch.reversion import Drainer, N
from ray_nodeless.providers.base import MACHINE_RUNNING, TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE, Machine

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TypeIdle:
    """One worker node type's idle release as the cluster config has it now."""

    timeout_s: float | None        # its timeout in Ray (its idle_timeout_s, else the cluster's; None: never)
    min_workers: int
    learn: bool                    # False: the user set this type's timeout, which always wins


class IdleSource(Protocol):
    def idle_seconds(self) -> Mapping[str, float | None]:
        """Ray's live worker nodes by cloud instance id: how long each has run nothing (None: busy). Raises
        DrainError when Ray cannot be asked."""
        ...


class IdlePlan(Protocol):
    def types(self) -> Mapping[str, TypeIdle]: ...


@dataclass(frozen=True)
class Release:
    machine_id: str
    node_type: str
    idle_s: float
    timeout_s: float                # the learned one it was ended after
    type_timeout_s: float | None    # the type's own in Ray (None: never), which it would have waited for

    def describe(self) -> str:
        ray = "never" if self.type_timeout_s is None else f"after {self.type_timeout_s:.0f} s"
        return (f"ended {self.machine_id} ({self.node_type}) after {self.idle_s:.0f} s idle (Ray's timeout: {ray}): "
                f"its type's recent idle gaps were longer than a launch")


class LearnedRelease(Generic[N]):
    def __init__(self, learner: GapLearner, source: IdleSource, plan: IdlePlan, drainer: Drainer[N],
                 terminate: Callable[[list[str]], object], clock: Callable[[], float] = time.time,
                 on_release: Callable[[Release], None] | None = None):
        self.learner = learner
        self.source = source
        self.plan = plan
        self.drainer = drainer
        self.terminate = terminate
        self.clock = clock
        self.on_release = on_release
        self._lock = threading.Lock()
        self._launches: list[tuple[str, float]] = []       # (node type, when): from Ray's launch threads
        self._seen: dict[str, tuple[str, float | None]] = {}  # machine -> (type, idle since; None busy) last pass
        self._worked: set[str] = set()                      # machines seen running work (or between two passes)
        self.released: list[Release] = []                   # the last pass's releases (for status and tests)

    def launched(self, node_type: str) -> None:
        with self._lock:
            self._launches.append((node_type, self.clock()))

    def tick(self, machines: Mapping[str, Machine]) -> list[Release]:
        self.released = []
        try:
            idle = self.source.idle_seconds()
            plan = self.plan.types()
        except (DrainError, NodelessError, OSError, ValueError) as e:
            logger.warning("idle release: cannot read Ray's nodes or the config now (%s); next pass", e)
            return []
        now = self.clock()
        with self._lock:
            launches, self._launches = self._launches, []
        workers = {mid: m for mid, m in machines.items()
                   if m.tags.get(TAG_RAY_NODE_KIND) == "worker" and m.state == MACHINE_RUNNING}
        self._observe(workers, idle, launches, now)
        counts: dict[str, int] = {}
        for m in workers.values():
            t = m.tags.get(TAG_RAY_USER_NODE_TYPE, "")
            counts[t] = counts.get(t, 0) + 1
        for mid in sorted(workers, key=lambda i: -(idle.get(i) or 0.0)):      # the longest idle first
            t = workers[mid].tags.get(TAG_RAY_USER_NODE_TYPE, "")
            cfg = plan.get(t)
            idle_s = idle.get(mid)
            if cfg is None or not cfg.learn or idle_s is None or mid not in self._worked:
                continue
            timeout = self.learner.timeout_s(t, cfg.timeout_s, now)
            if timeout is None or (cfg.timeout_s is not None and timeout >= cfg.timeout_s):
                continue                           # not sooner than Ray would: Ray's own idle termination
            if idle_s < timeout or counts[t] <= cfg.min_workers:
                continue
            if cfg.timeout_s is not None and idle_s >= cfg.timeout_s:
                continue                           # Ray's own timeout is up: Ray's idle termination ends it now
            if self._release(Release(mid, t, idle_s, timeout, cfg.timeout_s), now):
                counts[t] -= 1
        return self.released

    def _observe(self, workers: Mapping[str, Machine], idle: Mapping[str, float | None],
                 launches: list[tuple[str, float]], now: float) -> None:
        for mid, (t, since) in list(self._seen.items()):
            if mid not in workers:                 # gone (Ray's idle termination, an interruption, ours)
                if since is not None:
                    self.learner.released(t, mid, now)
                else:
                    self.learner.forget(mid)
                del self._seen[mid]
                self._worked.discard(mid)
        for t, at in launches:
            self.learner.launched(t, at)
        for mid, m in workers.items():
            if mid not in idle:
                continue                           # not a Ray node yet (booting), or no longer
            t = m.tags.get(TAG_RAY_USER_NODE_TYPE, "")
            idle_s = idle[mid]
            before = self._seen.get(mid, (t, None))[1]
            if idle_s is None:
                self._worked.add(mid)
                self.learner.busy(t, mid, now)
                self._seen[mid] = (t, None)
                continue
            since = now - idle_s
            if before is not None and since > before + 1.0:
                self._worked.add(mid)              # it ran something between two passes
            if mid in self._worked:
                self.learner.idle(t, mid, since)
            self._seen[mid] = (t, since)

    def _release(self, r: Release, now: float) -> bool:
        mid, node_type = r.machine_id, r.node_type
        try:
            node = self.drainer.find(instance_id=mid)
            if node is None:
                return False
            accepted, why = self.drainer.drain_idle(
                node, f"idle {r.idle_s:.0f} s; {node_type}'s recent idle gaps were longer than a launch")
            if not accepted:
                logger.info("idle release: Ray keeps %s (%s): %s", mid, node_type, why)
                return False
            self.terminate([mid])
        except (DrainError, NodelessError) as e:
            logger.warning("idle release of %s failed (%s); next pass", mid, e)
            return False
        self.learner.released(node_type, mid, now)
        self._seen.pop(mid, None)
        self._worked.discard(mid)
        self.released.append(r)
        logger.info("idle release: %s", r.describe())
        if self.on_release is not None:
            self.on_release(r)
        return True
