"""On-demand -> spot reversion, safe for Ray work (settings: `provider.reversion`, core/reversion.py).

A worker launched on demand only because spot had no capacity carries `TAG_FALLBACK` (launch/launcher.py). Once a
spot offering of its node type is out of the capacity memory and cheaper, `tick` replaces it, at most
`max_in_flight` at once. In the monitor `tick` runs on the provider's own loop, in a lane of its own
(ray_adapter/loop.py): its launch, which may walk the candidates for up to `launch_timeout_s`, runs neither in
Ray's listing call nor beside Ray's launches' locks (Ray's `create_node` goes to the launcher on Ray's thread; the
launcher's shared state, the cost reservation and the view, are each under their own short lock). Thread-safety:
`tick` runs on one thread at a time (the lane); what Ray's threads call (`prefers_on_demand` from the launcher,
`on_interrupted` from a listing) reads or writes the interruption history only, under its lock.
1. a spot machine of the same node type is launched first, through the launcher (so `max_hourly_cost` counts the
   on-demand machine and the new one together: a replacement the cap has no room for waits), tagged
   `TAG_REPLACES` = the on-demand machine's id, which is how a restarted provider finds the replacements under way
   and never launches a second one for the same machine;
2. when that spot machine's Ray node is alive, the on-demand node is drained through Ray's drain API with the
   *idle* reason: Ray accepts only a node that runs nothing (and then schedules nothing new on it), so a busy node
   is refused and asked again at the next tick, never preempted; accepted, the machine is terminated. Refused,
   another fallback of the same node type that Ray does let go (idle) is retired in its place, so one long task
   does not hold the slot; the busy one is replaced later;
3. a spot machine that never joins Ray within `ready_timeout_s` is terminated (no leak); a fallback Ray refuses to
   drain for `drain_patience_s` is left alone (tag removed) and its spot machine becomes an ordinary worker.
The count of workers never drops: the spot machine is up before its on-demand one goes (so never below
`min_workers`). After `interruption_limit` spot interruptions of a node type within `interruption_window_s`, that
type launches on-demand first and is not reverted for `prefer_on_demand_s` (`InterruptionHistory`).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Generic, Mapping, Protocol, TypeVar

from ray_nodeless.core.documents import Document
from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.reversion import InterruptionHistory, ReversionSettings
from ray_nodeless.errors import DrainError, LaunchError
from ray_nodeless.launch.launcher import TAG_FALLBACK, Launcher
from ray_nodeless.launch.machine_view import MachineView, pending_machine
from ray_nodeless.providers.base import (
    MACHINE_RUNNING, TAG_CAPACITY, TAG_PRICE, TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE, Machine,
)

logger = logging.getLogger(__name__)

# On a spot machine launched to replace an on-demand fallback: the fallback's machine id.
TAG_REPLACES = "nodeless-replaces"
SPOT_ONLY = frozenset({"spot"})


class DrainNode(Protocol):
    @property
    def state(self) -> str: ...           # Ray's node state: "ALIVE", ...


N = TypeVar("N", bound=DrainNode)


class Drainer(Protocol[N]):
    """What reversion needs of Ray's drain API (interruptions/drain.RayDrainer): a machine's node, and its drain."""

    def find(self, instance_id: str | None = None) -> N | None: ...

    def drain_idle(self, node: N, why: str) -> tuple[bool, str]: ...


@dataclass
class Flight:
    """One replacement under way: the on-demand machine and the spot machine launched for it."""

    on_demand: str
    spot: str
    started: float


def _price(m: Machine) -> float:
    try:
        return float(m.tags.get(TAG_PRICE, "0"))
    except ValueError:
        return 0.0


class Reverter(Generic[N]):
    def __init__(self, settings: ReversionSettings, launcher: Launcher, view: MachineView,
                 unavailable: UnavailableOfferings, drainer: Drainer[N], terminate: Callable[[list[str]], object],
                 resources_of: Callable[[str], Document], node_config_of: Callable[[str], Document | None],
                 clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.launcher = launcher
        self.view = view
        self.unavailable = unavailable
        self.drainer = drainer            # interruptions/drain.RayDrainer (find, drain_idle)
        self.terminate = terminate        # the provider's terminate path
        self.resources_of = resources_of
        self.node_config_of = node_config_of   # the node_config Ray last launched the type with (None: not yet)
        self.clock = clock
        self.history = InterruptionHistory(settings)
        self.flights: dict[str, Flight] = {}
        self._first_seen: dict[str, float] = {}
        self._backoff: dict[str, float] = {}      # fallback -> no new replacement before then
        self._last_tick: float | None = None
        self.replaced = 0
        launcher.prefer_on_demand = self.prefers_on_demand

    # ----- hooks ------------------------------------------------------------------------------------------------

    def prefers_on_demand(self, node_type: str) -> bool:
        return self.history.prefers_on_demand(node_type, self.clock())

    def on_interrupted(self, tags: Mapping[str, str]) -> None:
        if tags.get(TAG_CAPACITY) == "spot" and tags.get(TAG_RAY_USER_NODE_TYPE):
            node_type = tags[TAG_RAY_USER_NODE_TYPE]
            if self.history.record(node_type, self.clock()):
                logger.warning("node type %s: %d spot interruptions within %.0f s; launching it on-demand first "
                               "for %.0f s", node_type, self.settings.interruption_limit,
                               self.settings.interruption_window_s, self.settings.prefer_on_demand_s)

    # ----- the loop's reversion lane ----------------------------------------------------------------------------

    def tick(self, machines: Mapping[str, Machine]) -> None:
        """Advance the replacements and start new ones; at most every `interval_s`; never raises (outside the
        monitor a test's listing call runs it inline)."""
        if not self.settings.enabled:
            return
        now = self.clock()
        if self._last_tick is not None and now - self._last_tick < self.settings.interval_s:
            return
        self._last_tick = now
        try:
            self._tick(dict(machines), now)
        except Exception as e:      # never let reversion break the listing; the next tick tries again
            logger.warning("reversion tick failed: %s", e)

    def _tick(self, machines: dict[str, Machine], now: float) -> None:
        for mid in machines:
            self._first_seen.setdefault(mid, now)
        for mid in [m for m in self._first_seen if m not in machines]:
            del self._first_seen[mid]
        # Replacements a listing shows (after a restart too): the spot machine names the machine it replaces.
        for mid, m in sorted(machines.items()):
            target = m.tags.get(TAG_REPLACES)
            if target and target not in self.flights and target in machines:
                self.flights[target] = Flight(on_demand=target, spot=mid, started=self._first_seen[mid])
        for od_id in sorted(self.flights):
            self._advance(self.flights[od_id], machines, now)
        if len(self.flights) < self.settings.max_in_flight:
            self._start(machines, now)

    def _advance(self, f: Flight, machines: dict[str, Machine], now: float) -> None:
        od, spot = machines.get(f.on_demand), machines.get(f.spot)
        if od is None:                   # ended by someone else (Ray scaled it down): the spot one stays a worker
            self._end(f, "the on-demand machine is gone")
            return
        if spot is None:                 # interrupted or failed: the on-demand machine keeps running
            self._end(f, "the spot machine is gone")
            return
        try:
            spot_node = self.drainer.find(instance_id=f.spot) if spot.state == MACHINE_RUNNING else None
            if spot_node is None or spot_node.state != "ALIVE":
                if now - f.started > self.settings.ready_timeout_s:
                    logger.warning("reversion: spot machine %s did not join Ray within %.0f s; terminating it",
                                   f.spot, self.settings.ready_timeout_s)
                    self.terminate([f.spot])
                    machines.pop(f.spot, None)
                    self._backoff[f.on_demand] = now + self.settings.ready_timeout_s   # not every tick again
                    self._end(f, "the spot machine never joined Ray")
                return
            od_node = self.drainer.find(instance_id=f.on_demand)
            if od_node is None:
                return                   # not in Ray's node table (yet, or any more): Ray's own paths decide
            accepted, why = self.drainer.drain_idle(od_node, f"replaced by spot machine {f.spot}")
        except DrainError as e:
            logger.info("reversion of %s: %s; retrying later", f.on_demand, e)
            return
        if not accepted and self._swap(f, spot, machines, now):
            return
        if not accepted:
            if now - f.started > self.settings.drain_patience_s:
                logger.warning("reversion: Ray refused to drain %s for %.0f s (%s); keeping it, %s becomes an "
                               "ordinary worker", f.on_demand, self.settings.drain_patience_s, why, f.spot)
                self.view.set_tags(f.spot, {TAG_REPLACES: ""})
                self.view.set_tags(f.on_demand, {TAG_FALLBACK: ""})
                self._end(f, "drain refused for drain_patience_s")
            else:
                logger.info("reversion: Ray refused to drain %s (busy: %s); retrying later", f.on_demand, why)
            return
        self.terminate([f.on_demand])
        machines.pop(f.on_demand, None)      # this tick's listing must not offer it for replacement again
        self.replaced += 1
        self._end(f, "replaced")
        logger.warning("reversion: on-demand %s replaced by spot %s (drained idle, terminated)", f.on_demand, f.spot)

    def _swap(self, f: Flight, spot: Machine, machines: dict[str, Machine], now: float) -> bool:
        """Ray refused to drain the flight's on-demand machine (it runs work): retire another fallback of the same
        node type that Ray lets go instead, so one long task does not hold the replacement slot (and the idle spot
        machine, and both prices) for up to `drain_patience_s`. The spot machine then is an ordinary worker; the
        busy fallback gets a new replacement when a slot is free. True when one was retired."""
        node_type = machines[f.on_demand].tags.get(TAG_RAY_USER_NODE_TYPE)
        others = sorted((m for m in machines.values()
                         if m.id != f.on_demand and m.id not in self.flights and self._old_enough(m, now)
                         and m.tags.get(TAG_RAY_USER_NODE_TYPE) == node_type and _price(m) > _price(spot)),
                        key=lambda m: (-_price(m), m.id))
        for m in others:
            try:
                node = self.drainer.find(instance_id=m.id)
                if node is None or node.state != "ALIVE":
                    continue
                accepted, _ = self.drainer.drain_idle(node, f"replaced by spot machine {f.spot}")
            except DrainError as e:
                logger.info("reversion: cannot drain %s in place of %s: %s", m.id, f.on_demand, e)
                continue
            if not accepted:
                continue
            self.terminate([m.id])
            machines.pop(m.id, None)
            # Terminated first: a restart between the two steps finds the flight for the busy one, never a second
            # spot machine.
            self.view.set_tags(f.spot, {TAG_REPLACES: ""})
            self.replaced += 1
            self._end(f, f"Ray refused the drain; fallback {m.id} (idle) was replaced instead")
            logger.warning("reversion: on-demand %s replaced by spot %s (drained idle, terminated) in place of busy "
                           "%s", m.id, f.spot, f.on_demand)
            return True
        return False

    def _old_enough(self, m: Machine, now: float) -> bool:
        """A running on-demand worker launched as a spot fallback, running for `min_age_s` at least, not backing
        off: one that may be replaced now."""
        return (m.tags.get(TAG_FALLBACK) == "spot" and m.tags.get(TAG_CAPACITY) != "spot"
                and m.tags.get(TAG_RAY_NODE_KIND) == "worker" and m.state == MACHINE_RUNNING
                and now - self._first_seen.get(m.id, now) >= self.settings.min_age_s
                and self._backoff.get(m.id, float("-inf")) <= now)

    def _end(self, f: Flight, why: str) -> None:
        self.flights.pop(f.on_demand, None)
        logger.info("reversion of %s by %s ended: %s", f.on_demand, f.spot, why)

    def _start(self, machines: dict[str, Machine], now: float) -> None:
        s = self.settings
        fallbacks = sorted(
            (m for m in machines.values()
             if m.id not in self.flights and self._old_enough(m, now)),
            key=lambda m: (-_price(m), m.id))           # the dearest first: the most saved per replacement
        for m in fallbacks:
            if len(self.flights) >= s.max_in_flight:
                return
            node_type = m.tags.get(TAG_RAY_USER_NODE_TYPE, "")
            if self.prefers_on_demand(node_type):
                continue
            node_config = self.node_config_of(node_type)
            if node_config is None:
                continue                 # Ray has not launched this type through this provider yet
            resources = dict(self.resources_of(node_type) or {})
            try:
                plan = self.launcher.plan(node_type, resources, node_config, False)
            except LaunchError as e:
                logger.info("reversion of %s: cannot plan %s: %s", m.id, node_type, e)
                continue
            spot = [o for o in plan.candidates() if o.capacity == "spot" and self.unavailable.reason(o) is None
                    and (o.hourly_price or 0.0) < _price(m)]
            if not spot:
                continue                 # spot still in the capacity memory, or not cheaper
            ray_tags = {k: v for k, v in m.tags.items() if k.startswith("ray-")}
            ray_tags[TAG_REPLACES] = m.id
            try:
                launched = self.launcher.launch(node_type, node_config, ray_tags, 1, resources, {}, is_head=False,
                                                capacities=SPOT_ONLY)
            except LaunchError as e:     # no spot after all, or over max_hourly_cost: the next tick tries again
                logger.info("reversion of %s: no spot replacement now: %s", m.id, e)
                continue
            self.view.launched(pending_machine(mid, launched.spec.tags) for mid in launched.machine_ids)
            spot_id = launched.machine_ids[0]
            self._first_seen[spot_id] = now
            self.flights[m.id] = Flight(on_demand=m.id, spot=spot_id, started=now)
            logger.warning("reversion: launched spot %s (%s %s $%.4f/h) to replace on-demand %s ($%.4f/h)",
                           spot_id, launched.offering.instance_type.name, launched.offering.zone,
                           launched.offering.hourly_price or 0.0, m.id, _price(m))
