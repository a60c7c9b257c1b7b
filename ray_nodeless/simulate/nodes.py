"""The Simulator's nodes: which offering a launch takes (the plan's order, the capacity memory, spot droughts),
when a worker starts (launch latency, start slots), terminating and interrupting nodes, and placing pending tasks
on the nodes that are ready (FIFO, head first, then the oldest node; CPU-only work avoids GPU nodes).
"""
from __future__ import annotations

import random
from typing import Mapping

from ray_nodeless.simulate.model import EPS, Offer, SimNode, TaskRun
from ray_nodeless.simulate.state import SimState
from ray_nodeless.trace.model import MS_PER_HOUR


def _fits(avail: Mapping[str, float], need: Mapping[str, float]) -> bool:
    return all(avail.get(k, 0.0) + EPS >= v for k, v in need.items())



class NodeBook(SimState):
    """Nodes launched, up, terminated and interrupted, and the tasks placed on them."""

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
            if not self.unavailable.claim(o.remembered):
                spot_missed |= o.capacity == "spot"
                continue
            if o.capacity == "spot" and self.outage_until.get(node_type, -1) > self.now:
                self.capacity_errors += 1
                self.unavailable.mark(o.remembered, "drought")
                spot_missed = True
                continue
            self.unavailable.succeeded(o.remembered)
            return o, spot_missed and o.capacity != "spot"
        return None, False

    def spot_available(self, node_type: str) -> bool:
        """Whether a spot offering of `node_type` is out of the capacity memory (what reversion waits for)."""
        cands = self.cfg.candidates.get(node_type) or (self.cfg.offers[node_type],)
        return any(o.capacity == "spot" and self.unavailable.reason(o.remembered) is None for o in cands)

    def hourly_cost(self) -> float:
        """What the nodes up or launching cost per hour now (the launcher's view for max_hourly_cost)."""
        return sum(n.offer.hourly_price for n in self.live.values())

    def _add_worker(self, node_type: str, capacities: frozenset[str] | None = None) -> SimNode | None:
        offer, fallback = self.choose_offer(node_type, capacities)
        if offer is None:
            # No offering has capacity now: look again on the first tick after one leaves the memory (a tick with
            # nothing changed would not be run otherwise).
            cands = self.cfg.candidates.get(node_type) or (self.cfg.offers[node_type],)
            states = self.unavailable.states()
            back = [self.now + int(st.remaining_s * 1000) for o in cands
                    if (st := states.get(o.remembered.key)) is not None and st.remaining_s > 0]
            if back:
                self._tick_at(-(-min(back) // self.tick_ms) * self.tick_ms)
            return None
        start, ready = self._launch_window()
        n = self._add_node(node_type, False, ready, launch_ms=start, offer=offer)
        n.fallback = fallback
        if self.gaps is not None:
            self.gaps.launched(node_type, self.now / 1000)
        return n

    def idle_timeout_ms(self, node_type: str) -> int:
        """How long an idle worker of `node_type` is kept now (-1: never): the plan's timeout, or the gap
        learner's release at once where the type's gaps have been longer than a launch (as the monitor's idle lane
        does live)."""
        base = self.cfg.idle_ms(node_type)
        if self.gaps is None or node_type not in self.cfg.learn_types:
            return base
        s = self.gaps.timeout_s(node_type, None if base < 0 else base / 1000, self.now / 1000)
        return -1 if s is None else int(round(s * 1000))

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
        if self.gaps is not None and not n.is_head:
            if n.running:
                self.gaps.forget(n.node_id)
            else:
                self.gaps.released(n.node_type, n.node_id, self.now / 1000)
        n.idle_until(end)
        n.idle_since_ms = None
        n.end_ms = end
        self.live.pop(n.node_id, None)


    def _interrupt(self, n: SimNode) -> None:
        if n.end_ms is not None:
            return
        self.interruptions += 1
        self._end_and_requeue(n)
        # As the launcher on a machine that vanished: its offering enters the capacity memory (its backoff); a
        # drought (spot_outage_ms) takes every spot offering of the type for that long.
        self.unavailable.mark(n.offer.remembered, "interrupted")
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
            if self.gaps is not None and not node.is_head:
                self.gaps.busy(node.node_type, node.node_id, self.now / 1000)
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
                if self.gaps is not None and not n.is_head:
                    self.gaps.idle(n.node_type, n.node_id, self.now / 1000)
        tr.node = None

