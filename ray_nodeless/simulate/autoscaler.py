"""The Simulator's autoscaler: one update on a tick, as the monitor's: idle termination per type, Ray's own v1
`ResourceDemandScheduler` for what the declared types hold (through a small provider view), the shape-open packing
for the rest, then the policies; and which tick needs evaluating next (only ticks after a change, and idle
timeouts coming due).
"""
from __future__ import annotations

import logging
from typing import Mapping

from ray_nodeless.core.demand import NodeCapacity
from ray_nodeless.ray_compat.scheduler import demand_scheduler, no_availability, quiet_scheduler
from ray_nodeless.simulate.model import Offer, SimNode, TaskRun
from ray_nodeless.simulate.nodes import NodeBook
from ray_nodeless.trace.model import MS_PER_HOUR

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



class Autoscaler(NodeBook):
    """The autoscaler's update on a tick, and the scheduling of the next tick."""

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
                    self.cfg.learn_types.add(t.name)
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
            timeout = self.idle_timeout_ms(n.node_type)
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
            if n.is_head or n.running or n.idle_since_ms is None:
                continue
            timeout = self.idle_timeout_ms(n.node_type)
            if timeout < 0:
                continue
            # A type at its min_workers floor terminates nothing, so its idle workers need no tick: asking for
            # one would ask again at every tick, forever once the workload has ended. When the type grows
            # above its floor, that launch happens on a tick, and this runs again after it.
            if workers[n.node_type] <= self.cfg.node_types[n.node_type]["min_workers"]:
                continue
            due = max(n.idle_since_ms + timeout, self.now + (1 if ran_tick else 0))
            want.append(-(-due // self.tick_ms) * self.tick_ms)
            if self.gaps is not None and n.node_type in self.cfg.learn_types:
                # The learned timeout may shorten when an open gap turns long, with nothing else happening.
                change = self.gaps.changes_at(n.node_type, self.now / 1000)
                if change is not None:
                    at = max(int(change * 1000) + 1, self.now + (1 if ran_tick else 0))
                    want.append(-(-at // self.tick_ms) * self.tick_ms)
        for t in want:
            self._tick_at(t)

