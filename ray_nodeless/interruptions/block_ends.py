"""Capacity Blocks end on a date: their machines are drained through Ray before it, so work moves off them in time.

EC2 starts terminating a Capacity Block's instances 30 minutes before the block's end (AWS_TERMINATION_LEAD_S).
In the monitor's listing pass, `tick` drains every machine of this cluster launched into a block (its
`nodeless-reservation` tag names the block) once the block ends within `drain_before_s`
(`provider.reservations.block_drain_s`, which is also how close to its end a block takes no new machine): Ray's
preemption drain (interruptions/drain.py), with EC2's termination time as the deadline Ray reports. Ray schedules
nothing new on the node and moves retried work elsewhere; the autoscaler launches replacements on the rule's next
capacity types for the demand that remains; EC2 ends the instances. A drain that fails (GCS unreachable) is tried at
the next pass; each machine is drained once. Never raises.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Mapping

from ray_nodeless.errors import DrainError
from ray_nodeless.interruptions.drain import NODE_ALIVE, RayDrainer
from ray_nodeless.interruptions.notices import Notice
from ray_nodeless.providers.base import TAG_RESERVATION, Machine

logger = logging.getLogger(__name__)

AWS_TERMINATION_LEAD_S = 1800.0       # EC2 begins terminating a block's instances this long before its end
SOURCE = "capacity-block"


class BlockEnds:
    def __init__(self, ends: Callable[[], Mapping[str, float]], drainer: RayDrainer, drain_before_s: float,
                 clock: Callable[[], float] = time.time):
        self.ends = ends                  # capacity block id -> its end (epoch seconds)
        self.drainer = drainer
        self.drain_before_s = drain_before_s
        self.clock = clock
        self.drained: set[str] = set()

    def tick(self, machines: Mapping[str, Machine]) -> list[str]:
        """Drain the machines whose block ends soon; the ids drained now."""
        ours = {mid: m for mid, m in machines.items() if m.tags.get(TAG_RESERVATION) and mid not in self.drained}
        if not ours:
            return []
        try:
            ends = self.ends()
        except Exception as e:       # the listing of reservations failed: next pass
            logger.warning("capacity blocks: could not read their ends (%s); next pass", e)
            return []
        now = self.clock()
        out: list[str] = []
        for mid, m in sorted(ours.items()):
            end = ends.get(m.tags[TAG_RESERVATION])
            if end is None or end - now > self.drain_before_s:
                continue
            notice = Notice(machine_id=mid, deadline=max(now, end - AWS_TERMINATION_LEAD_S), source=SOURCE)
            try:
                node = self.drainer.find(instance_id=mid, ip=m.internal_ip)
                if node is not None and node.state == NODE_ALIVE:
                    self.drainer.drain(node, notice)
            except DrainError as e:
                logger.warning("capacity block %s ends at %.0f: draining %s failed (%s); next pass",
                               m.tags[TAG_RESERVATION], end, mid, e)
                continue
            self.drained.add(mid)
            out.append(mid)
            logger.warning("capacity block %s ends in %.0f s: drained %s (%s)", m.tags[TAG_RESERVATION], end - now,
                           mid, notice.describe())
        return out
