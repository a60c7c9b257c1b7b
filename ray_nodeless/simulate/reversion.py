"""On-demand -> spot reversion in a replay: launch/reversion.py's `Reverter`, step for step, on simulated nodes.

The live Reverter works on machines and Ray's drain API; this one on `SimNode`s through the Simulator's policy hook
(`on_tick` after every autoscaler update, `attach` for the interruption hook and the launcher's on-demand
preference). The settings and the interruption history are the live ones (core/reversion.py), so the replay
answers "what would reversion, as configured, have done on this workload":

- a *fallback* is a worker launched on demand because every spot offering of its type was in the capacity memory
  (`SimNode.fallback`, the live TAG_FALLBACK); once it is `min_age_s` old and a spot offering of its type is out
  of the memory and cheaper, a spot worker of the same type is launched first (`max_in_flight` at once, and only
  when the cluster's hourly cost with it stays within `max_hourly_cost`);
- when that spot worker is ready, the fallback is drained with the idle reason: accepted only when it runs
  nothing (a busy one is asked again at the next reversion tick, never preempted), then terminated (billed the
  scale-down latency); after `drain_patience_s` of refusals it is kept and stops being a fallback;
- a spot worker not ready within `ready_timeout_s` is terminated and that fallback waits `ready_timeout_s`;
  a fallback that ends otherwise (Ray's idle release) or a spot worker interrupted ends the replacement;
- nothing is started or drained after the workload ends (the replay bills the cluster up to there);
- `interruption_limit` spot interruptions of a type within `interruption_window_s`: the type launches on-demand
  first and is not reverted for `prefer_on_demand_s`.
The worker count never drops during a replacement (the spot worker is up before its fallback goes), so never below
`min_workers`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ray_nodeless.core.reversion import InterruptionHistory, ReversionSettings
from ray_nodeless.simulate.model import SimNode

SPOT_ONLY = frozenset({"spot"})


@dataclass
class Flight:
    on_demand: SimNode
    spot: SimNode
    started_ms: int


@dataclass
class ReversionStats:
    started: int = 0                # spot replacements launched
    replaced: int = 0               # fallbacks drained and terminated after their spot worker was ready
    refused_busy: int = 0           # drain attempts refused because the fallback ran work
    kept: int = 0                   # fallbacks kept after drain_patience_s of refusals
    ended: dict[str, int] = field(default_factory=dict)    # other ends of a replacement, by reason
    capped: int = 0                 # replacements max_hourly_cost had no room for (at that tick)
    preferred_on_demand: int = 0    # times a type started preferring on-demand after repeated interruptions

    def to_dict(self) -> dict[str, Any]:
        return {"started": self.started, "replaced": self.replaced, "refused_busy": self.refused_busy,
                "kept": self.kept, "ended": dict(sorted(self.ended.items())), "capped": self.capped,
                "preferred_on_demand": self.preferred_on_demand}


class SimReverter:
    def __init__(self, settings: ReversionSettings):
        self.settings = settings
        self.history = InterruptionHistory(settings)
        self.flights: dict[int, Flight] = {}          # fallback's node seq -> its replacement
        self._backoff: dict[int, int] = {}
        self._last_ms: int | None = None
        self.stats = ReversionStats()
        self.max_hourly_cost_seen = 0.0

    # -- hooks ----------------------------------------------------------------------------------------------
    def attach(self, sim: Any) -> None:
        sim.prefer_on_demand = lambda node_type: self.history.prefers_on_demand(node_type, sim.now / 1000)
        sim.on_interrupt.append(self._interrupted)

    def _interrupted(self, sim: Any, n: SimNode) -> None:
        if n.offer.capacity == "spot" and self.history.record(n.node_type, sim.now / 1000):
            self.stats.preferred_on_demand += 1

    def on_tick(self, sim: Any) -> None:
        if sim.workload_end is not None:
            return          # the replay's horizon: what runs after the workload is not the run's to change
        s = self.settings
        interval_ms = int(round(s.interval_s * 1000))
        if self._last_ms is not None and sim.now - self._last_ms < interval_ms:
            self._wake(sim, self._last_ms + interval_ms)
            return
        self._last_ms = sim.now
        for seq in sorted(self.flights):
            self._advance(sim, self.flights[seq])
        if len(self.flights) < s.max_in_flight:
            self._start(sim)
        self.max_hourly_cost_seen = max(self.max_hourly_cost_seen, sim.hourly_cost())
        self._wake(sim, sim.now + max(interval_ms, 1))

    def _wake(self, sim: Any, at_ms: int) -> None:
        """Ask for a tick then while there is something to do: the replay skips ticks where nothing changed, the
        live listing path does not."""
        if self.flights or any(n.fallback and n.end_ms is None for n in sim.live.values()):
            sim.wake_at(at_ms)

    # -- the steps ------------------------------------------------------------------------------------------
    def _end(self, f: Flight, why: str | None) -> None:
        self.flights.pop(f.on_demand.seq, None)
        if why is not None:
            self.stats.ended[why] = self.stats.ended.get(why, 0) + 1

    def _advance(self, sim: Any, f: Flight) -> None:
        s = self.settings
        od, spot = f.on_demand, f.spot
        if od.end_ms is not None:
            self._end(f, "the on-demand worker ended first")
            return
        if spot.end_ms is not None:
            self._end(f, "the spot worker ended")
            return
        if spot.ready_ms > sim.now:
            if sim.now - f.started_ms > s.ready_timeout_s * 1000:
                sim.release(spot)
                self._backoff[od.seq] = sim.now + int(s.ready_timeout_s * 1000)
                self._end(f, "the spot worker was not ready within ready_timeout_s")
            return
        if od.running:
            # Ray refuses an idle-reason drain of a node that runs work: ask again at the next tick.
            self.stats.refused_busy += 1
            if sim.now - f.started_ms > s.drain_patience_s * 1000:
                od.fallback = False
                self.stats.kept += 1
                self._end(f, None)
            return
        sim.release(od)
        self.stats.replaced += 1
        self._end(f, None)

    def _start(self, sim: Any) -> None:
        s = self.settings
        fallbacks = sorted(
            (n for n in sim.live.values()
             if n.fallback and not n.is_head and n.offer.capacity != "spot" and n.ready_ms <= sim.now
             and n.seq not in self.flights and sim.now - n.launch_ms >= s.min_age_s * 1000
             and self._backoff.get(n.seq, -1) <= sim.now),
            key=lambda n: (-n.offer.hourly_price, n.seq))       # the dearest first: the most saved per replacement
        for od in fallbacks:
            if len(self.flights) >= s.max_in_flight:
                return
            if sim.prefer_on_demand(od.node_type) or not sim.spot_available(od.node_type):
                continue
            offer, _ = sim.choose_offer(od.node_type, SPOT_ONLY)
            if offer is None or offer.hourly_price >= od.offer.hourly_price:
                continue
            cap = sim.cfg.max_hourly_cost
            if cap is not None and sim.hourly_cost() + offer.hourly_price > cap + 1e-9:
                self.stats.capped += 1
                continue
            spot = sim.launch(od.node_type, SPOT_ONLY)
            if spot is None:
                continue
            self.stats.started += 1
            self.flights[od.seq] = Flight(on_demand=od, spot=spot, started_ms=sim.now)
