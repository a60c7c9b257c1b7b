"""An in-memory MachineBackend with fault injection, like Karpenter's fake CloudProvider.

It is a backend, not a mock of our code: the provider under test runs unchanged, through the public
registry (`register_backend`; `provider.cloud: fake`). Machines live in one module-level `CLOUD` so that several
provider instances (ray up's and the monitor's) share one "cloud". Knobs:
- `reset()` a fresh cloud;
- `capacity_faults` a capacity error for every launch of matching offerings; `list_failures` failed listings;
- `next_errors[method]` exceptions raised by the next calls of `launch` / `list` / `terminate` / `set_tags`;
- `hooks[method]` a callable run at the start of each call, outside the lock (to force an interleaving);
- `recheck` answers by id from the records, past `hide` (the second query a listing is checked with), except
  for what `hide_from_lookup` hides;
- `gates[method]` a callable run with the call's argument (the LaunchSpec of a launch) before the call, outside the
  lock: it may block on an event, to hold one particular call in the cloud;
- `delay_s[method]` seconds each call takes (a slow cloud: `delay_s["list"] = 30`), waited on `wake`, so that
  `wake.set()` lets every waiting call finish at once (a test or bench that ends);
- `calls` a count per method and `call_log` every call in order, `launches` every LaunchSpec.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from ray_nodeless.errors import CapacityError, ForeignMachineError, TransientBackendError
from ray_nodeless.providers import register_backend
from ray_nodeless.providers.base import TAG_CLUSTER, LaunchSpec, Machine, MachineBackend, Recheck, tag_update

logger = logging.getLogger(__name__)


@dataclass
class Cloud:
    machines: dict[str, Machine] = field(default_factory=dict)
    tokens: dict[str, list[str]] = field(default_factory=dict)
    gone: dict[str, str] = field(default_factory=dict)      # machine id -> "terminated" | "interrupted"
    # (instance type or "*", zone or "*", capacity or "*") -> error code (or (code, scope)), for every launch that
    # matches
    capacity_faults: dict[tuple[str, str, str], str] = field(default_factory=dict)
    list_failures: int = 0
    lost_responses: int = 0      # the next launches create their machines, then the response is lost
    calls: dict[str, int] = field(default_factory=dict)
    call_log: list[tuple[str, Any]] = field(default_factory=list)
    launches: list[LaunchSpec] = field(default_factory=list)
    next_errors: dict[str, list[Exception]] = field(default_factory=dict)
    hooks: dict[str, Callable[[], None]] = field(default_factory=dict)
    gates: dict[str, Callable[[Any], None]] = field(default_factory=dict)
    delay_s: dict[str, float] = field(default_factory=dict)
    wake: threading.Event = field(default_factory=threading.Event)
    # Machines a listing leaves out while this says so (an eventually consistent listing, an empty glitch page).
    hide: Callable[[Machine], bool] | None = None
    # Machines the lookups by id (`recheck`) show nothing of while this says so (neither live nor gone: a cloud
    # whose reads lag everywhere, as EC2's right after RunInstances).
    hide_from_lookup: Callable[[Machine], bool] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, name: str, arg: Any = None, gate_arg: Any = None) -> None:
        """Run the method's hook and gate, take its delay (outside the lock), log the call, raise its next queued
        error if any."""
        hook = self.hooks.get(name)
        if hook is not None:
            hook()
        gate = self.gates.get(name)
        if gate is not None:
            gate(arg if gate_arg is None else gate_arg)
        delay = self.delay_s.get(name, 0.0)
        if delay > 0:
            self.wake.wait(delay)
        with self.lock:
            self.calls[name] = self.calls.get(name, 0) + 1
            self.call_log.append((name, arg))
            queued = self.next_errors.get(name)
            if queued:
                raise queued.pop(0)


CLOUD = Cloud()


def reset() -> Cloud:
    global CLOUD
    CLOUD = Cloud()
    return CLOUD


class FakeBackend(MachineBackend):
    cloud = "fake"

    def launch(self, spec: LaunchSpec) -> list[str]:
        c = CLOUD
        c.enter("launch", spec.request_token, gate_arg=spec)
        with c.lock:
            c.launches.append(spec)
            o = spec.offering
            for (t, z, cap), code in c.capacity_faults.items():
                if t in ("*", o.instance_type.name) and z in ("*", o.zone) and cap in ("*", o.capacity):
                    code, scope = code if isinstance(code, tuple) else (code, "zone")
                    raise CapacityError(f"no {o.instance_type.name} in {o.zone}", category=code, scope=scope)
            if spec.request_token in c.tokens:        # idempotent on the token, as EC2/GCE are
                return list(c.tokens[spec.request_token])
            lose = c.lost_responses > 0
            c.lost_responses -= int(lose)
            ids = []
            for _ in range(spec.count):
                mid = "fake-" + uuid.uuid4().hex[:8]
                c.machines[mid] = Machine(id=mid, tags=dict(spec.tags), internal_ip=f"10.0.0.{len(c.machines) + 1}",
                                          launched_at=time.time())
                ids.append(mid)
            c.tokens[spec.request_token] = ids
            if lose:
                raise TransientBackendError("connection reset after the launch was sent", category="RequestTimeout")
            return ids

    def list_machines(self) -> list[Machine]:
        c = CLOUD
        c.enter("list")
        with c.lock:
            if c.list_failures:
                c.list_failures -= 1
                raise TransientBackendError("RequestLimitExceeded", category="RequestLimitExceeded")
            return [Machine(m.id, dict(m.tags), m.state, m.internal_ip, m.external_ip, m.launched_at)
                    for m in c.machines.values() if m.tags.get(TAG_CLUSTER) == self.cluster_name
                    and not (c.hide is not None and c.hide(m))]

    def terminate(self, machine_ids: list[str]) -> None:
        c = CLOUD
        c.enter("terminate", tuple(machine_ids))
        foreign = []
        with c.lock:
            for mid in dict.fromkeys(machine_ids):
                m = c.machines.get(mid)
                if m is None:
                    continue                      # gone: ignored
                if m.tags.get(TAG_CLUSTER) != self.cluster_name:
                    foreign.append(mid)
                    continue
                del c.machines[mid]
                c.gone[mid] = "terminated"
        if foreign:
            raise ForeignMachineError(f"terminate: {foreign} are not machines of cluster {self.cluster_name!r}; "
                                      f"not touched", foreign)

    def recheck(self, machine_ids: list[str] | None) -> Recheck:
        """The cloud's records by id (or all of this cluster's), a query the listing's knobs (`hide`, an empty
        page) do not reach: what a lookup by id answers on EC2 (DescribeInstances by instance id) or GCE
        (instances.get). Raises the next queued `recheck` error, if any."""
        c = CLOUD
        c.enter("recheck", None if machine_ids is None else tuple(machine_ids))
        with c.lock:
            unseen = {mid for mid, m in c.machines.items()
                      if c.hide_from_lookup is not None and c.hide_from_lookup(m)}
            mine = {mid: m for mid, m in c.machines.items()
                    if m.tags.get(TAG_CLUSTER) == self.cluster_name and mid not in unseen}
            copy = {mid: Machine(m.id, dict(m.tags), m.state, m.internal_ip, m.external_ip, m.launched_at)
                    for mid, m in mine.items()}
            if machine_ids is None:
                return Recheck(live=[copy[i] for i in sorted(copy)])
            return Recheck(live=[copy[i] for i in machine_ids if i in copy],
                           gone={i: c.gone.get(i, "") for i in machine_ids if i not in copy and i not in unseen
                                 and (i in c.gone or i not in c.machines)})

    def vanished_reasons(self, machine_ids: list[str]) -> dict[str, str]:
        c = CLOUD
        with c.lock:
            return {mid: c.gone[mid] for mid in machine_ids if mid in c.gone}

    def reclaim(self, machine_id: str) -> None:
        """The cloud takes a machine back (a spot interruption)."""
        c = CLOUD
        with c.lock:
            del c.machines[machine_id]
            c.gone[machine_id] = "interrupted"

    def set_tags(self, machine_id: str, tags: dict[str, str]) -> bool:
        c = CLOUD
        c.enter("set_tags", machine_id)
        tags = tag_update(self.cluster_name, machine_id, tags)
        with c.lock:
            m = c.machines.get(machine_id)
            if m is None:
                logger.info("set_tags: %s is gone; not tagging", machine_id)
                return False
            if m.tags.get(TAG_CLUSTER) != self.cluster_name:
                raise ForeignMachineError(f"set_tags: {machine_id} is not a machine of cluster "
                                          f"{self.cluster_name!r}", [machine_id])
            m.tags.update(tags)
            return True


register_backend("fake", __name__, "FakeBackend")
