"""Why a GCE instance left the listing, from the zone's record of operations (`zoneOperations.list`).

GCE keeps no state reason on a deleted instance (EC2 keeps `StateReason` on a terminated one for about an hour), but
the zone records what happened to it as operations: a delete call from anyone (this or another provider object
of the cluster, a laptop's `ray down --workers-only`, the console) is an operation of type `delete`; a spot or
preemptible instance the system took back is `compute.instances.preempted` (user `system`), whatever its
termination action (DELETE, or STOP: then the instance stays, stopped, and is not listed). So the reason is the
cloud's, not one provider object's memory: another object's deletion never reads as an interruption.
"""
from __future__ import annotations

from typing import Any, Iterable

from ray_nodeless.providers.gcp.instance_body import resource_name

OP_PREEMPTED = "compute.instances.preempted"
OP_DELETE = "delete"
# Instance names per `targetLink eq` filter (a list filter has a length limit).
REASON_CHUNK = 50


def target_filter(names: Iterable[str]) -> str:
    """A zoneOperations.list filter for the operations on these instances (GCE's `eq` takes an RE2 regex that
    must match the whole field; instance names are RFC 1035 labels, no regex metacharacters)."""
    return f'targetLink eq ".*/instances/({"|".join(sorted(names))})"'


def reasons(operations: Iterable[Any], names: Iterable[str]) -> dict[str, str]:
    """name -> "interrupted" (a preemption recorded) or "terminated" (a delete recorded, none of the first); names
    with neither are left out (not told: the caller keeps its default)."""
    wanted = set(names)
    kinds: dict[str, set[str]] = {}
    for op in operations:
        name = resource_name(op.target_link or "")
        if name in wanted:
            kinds.setdefault(name, set()).add(op.operation_type)
    out = {}
    for name, seen in kinds.items():
        if OP_PREEMPTED in seen:
            out[name] = "interrupted"
        elif OP_DELETE in seen:
            out[name] = "terminated"
    return out
