"""Record a trace from a finished run on a live Ray cluster.

Reads Ray's state API (`ray.util.state.list_tasks` / `list_nodes`), which is served by the dashboard's API server:
the cluster must run with the dashboard. The result is a trace document (`ray_nodeless.trace.model`'s format) and
the node lifetimes Ray reported, from which the run's measured node-hours are computed.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ray_nodeless.errors import ConfigError
from ray_nodeless.trace.model import MS_PER_HOUR, TRACE_VERSION

logger = logging.getLogger(__name__)

# Resource names that pin a demand to a node rather than describe its size; the autoscaler ignores them too.
_PINNING_PREFIXES = ("node:",)


@dataclass
class RecordedNode:
    node_id: str
    is_head: bool
    resources: dict[str, float]
    start_ms: int
    end_ms: int | None               # None: still alive when recorded


@dataclass
class Recording:
    """What `record_trace` saw: the trace document plus the measured figures the replay is checked against."""

    doc: dict[str, Any]
    nodes: list[RecordedNode]
    window_start_ms: int
    window_end_ms: int

    @property
    def measured_node_hours(self) -> float:
        """Σ over Ray nodes of the time each was alive inside the run window (first task demand to last task end).

        Node lifetimes outside the window (the cluster sitting idle before the driver started or after it ended)
        are not the workload's and are left out; a replay bills the same window (plus its own idle timeouts).
        """
        total = 0
        for n in self.nodes:
            lo = max(n.start_ms, self.window_start_ms)
            hi = min(n.end_ms if n.end_ms else self.window_end_ms, self.window_end_ms)
            total += max(0, hi - lo)
        return total / MS_PER_HOUR


# A task or actor in a placement group (every Tune trial) asks for its bundle's resources under the group's names:
# `GPU_group_<pg id>` (any bundle) or `GPU_group_<index>_<pg id>`, plus Ray's `bundle_group_...` marker. Its size is
# the plain resource; the marker sizes nothing.
_GROUP = re.compile(r"^(?P<base>.+?)_group_(?:\d+_)?[0-9a-f]{16,}$")


def _sizing_resources(required: Mapping[str, float] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in sorted((required or {}).items()):
        if not v or any(k.startswith(p) for p in _PINNING_PREFIXES) or k == "object_store_memory":
            continue
        m = _GROUP.match(k)
        if m:
            if m.group("base") == "bundle":
                continue
            k = m.group("base")
        # Both group names of one resource may be present: the same demand, not twice as much.
        out[k] = max(out.get(k, 0.0), float(v))
    return out


def _demand_time_ms(t: Any) -> int:
    """When the task became a resource demand: entering PENDING_NODE_ASSIGNMENT (its arguments were ready), else
    its creation. Using the creation time would replay tasks that waited for other tasks' results too early."""
    for e in getattr(t, "events", None) or []:
        if e.get("state") == "PENDING_NODE_ASSIGNMENT" and e.get("created_ms"):
            return int(e["created_ms"])
    return int(t.creation_time_ms or t.start_time_ms)


def _group_requests_ms(groups: list[Any]) -> dict[str, int]:
    """Placement group id -> when the GCS received its creation request (epoch ms), from each group's stats."""
    out: dict[str, int] = {}
    for g in groups:
        stats = getattr(g, "stats", None) or {}
        ns = stats.get("creation_request_received_ns") if isinstance(stats, dict) else None
        if g.placement_group_id and ns:
            out[g.placement_group_id] = int(int(ns) // 1_000_000)
    return out


def _placed_demand_ms(t: Any, groups: Mapping[str, int]) -> int:
    """A task or actor in a placement group (a Tune trial) becomes pending only once its group is placed, that is
    once the autoscaler has launched a node for the group: the demand the autoscaler saw is the group's creation
    request. Without that, a replay would start the trial a launch latency late, and launch for it again."""
    own = _demand_time_ms(t)
    req = groups.get(getattr(t, "placement_group_id", None) or "")
    return min(own, req) if req and own - req < MS_PER_HOUR * 24 else own


# The state API server refuses larger limits unless RAY_MAX_LIMIT_FROM_API_SERVER is raised on the cluster.
STATE_API_LIMIT = 10_000


def record_trace(address: str | None = "auto", name: str = "recorded", limit: int = STATE_API_LIMIT) -> Recording:
    """Build a trace from the finished tasks and actors of a live Ray cluster.

    - Normal tasks: one trace task each, shape = their required resources, duration = end - start, submitted at
      the time they became a demand (see `_demand_time_ms`), relative to the job's first demand.
    - Actors (e.g. Tune trials): one trace task each, shape = the creation task's resources, running from the
      creation task's start to the end of the actor's last method call (Ray's state API has no actor death time).
    - Jobs: one trace job per Ray job id, all in one stage, each delayed by its first demand's offset from the
      run's first demand. No head-only phases are recorded (the state API does not say what ran on the head).
    """
    from ray.util.state import (  # imported here: the CLI must start without Ray's state deps
        list_actors, list_nodes, list_placement_groups, list_tasks,
    )

    tasks = list_tasks(address=address, detail=True, limit=limit, raise_on_missing_output=False)
    nodes = list_nodes(address=address, detail=True, limit=limit, raise_on_missing_output=False)
    groups = _group_requests_ms(list_placement_groups(address=address, detail=True, limit=limit,
                                                      raise_on_missing_output=False))
    if len(tasks) >= limit:
        # Ray also keeps only a bounded number of task events (RAY_task_events_max_num_task_in_gcs): a long run may
        # be missing its oldest tasks either way. Say so; a partial trace under-counts.
        logger.warning("the state API returned %d tasks, its limit: the trace may be missing tasks", len(tasks))
    # job, name, res, demand, start, end, node id
    items: list[tuple[str, str, dict[str, float], int, int, int, str]] = []
    actor_creation: dict[str, Any] = {}
    actor_last_end: dict[str, int] = {}
    actor_node: dict[str, str] = {}
    for t in tasks:
        if t.type == "ACTOR_CREATION_TASK" and t.actor_id:
            actor_creation[t.actor_id] = t
        if t.type in ("ACTOR_TASK", "ACTOR_CREATION_TASK") and t.actor_id and t.end_time_ms:
            actor_last_end[t.actor_id] = max(actor_last_end.get(t.actor_id, 0), int(t.end_time_ms))
        if t.actor_id and getattr(t, "node_id", None):
            actor_node.setdefault(t.actor_id, str(t.node_id))
    if any(a not in actor_node for a in actor_creation):
        # An actor creation task's own row may carry no node (seen on Ray 2.60 for Tune trials): the actor
        # table has it.
        try:
            for a in list_actors(address=address, detail=True, limit=limit, raise_on_missing_output=False):
                if a.actor_id and getattr(a, "node_id", None):
                    actor_node.setdefault(a.actor_id, str(a.node_id))
        except Exception as e:   # the trace does not need it; only a replay's timing measurement does
            logger.warning("listing actors for their nodes failed: %s", e)
    for t in tasks:
        if t.type != "NORMAL_TASK" or t.state not in ("FINISHED", "FAILED"):
            continue
        if not t.start_time_ms or not t.end_time_ms:
            continue
        items.append((t.job_id, t.name, _sizing_resources(t.required_resources), _placed_demand_ms(t, groups),
                      int(t.start_time_ms), int(t.end_time_ms), str(getattr(t, "node_id", None) or "")))
    for actor_id, t in actor_creation.items():
        if not t.start_time_ms or actor_id not in actor_last_end:
            continue
        items.append((t.job_id, t.name, _sizing_resources(t.required_resources), _placed_demand_ms(t, groups),
                      int(t.start_time_ms), actor_last_end[actor_id], actor_node.get(actor_id, "")))
    items = [i for i in items if i[2]]     # zero-resource tasks never drive scaling
    if not items:
        raise ConfigError("trace record", "the cluster has no finished tasks or actors with resources to record")
    items.sort(key=lambda i: (i[3], i[4], i[0], i[1]))
    t0 = items[0][3]
    by_job: dict[str, list[tuple[str, str, dict[str, float], int, int, int, str]]] = {}
    for it in items:
        by_job.setdefault(it[0], []).append(it)
    jobs_doc = []
    for job_id, its in by_job.items():
        j0 = its[0][3]
        jobs_doc.append({
            "name": f"job-{job_id}",
            "delay_seconds": round((j0 - t0) / 1000, 3),
            "tasks": [{"name": n, "resources": r, "seconds": round((e - s) / 1000, 3),
                       "submit_at_seconds": round((d - j0) / 1000, 3)} for _, n, r, d, s, e, _ in its],
        })
    window_end = max(i[5] for i in items)
    rec_nodes = []
    for n in nodes:
        if not n.start_time_ms:
            continue
        rec_nodes.append(RecordedNode(node_id=n.node_id, is_head=bool(n.is_head_node),
                                      resources=_sizing_resources(n.resources_total), start_ms=int(n.start_time_ms),
                                      end_ms=int(n.end_time_ms) if n.end_time_ms else None))
    rec = Recording(doc={}, nodes=rec_nodes, window_start_ms=t0, window_end_ms=window_end)
    rec.doc = {
        "version": TRACE_VERSION,
        "name": name,
        "description": "recorded from a live Ray cluster with `ray-nodeless trace record`",
        "default_schedule": "recorded",
        "jobs": jobs_doc,
        "schedules": {"recorded": [[j["name"] for j in jobs_doc]]},
        "meta": {
            "recorded_nodes": [{"node_id": n.node_id, "is_head": n.is_head, "resources": n.resources,
                                "start_ms": n.start_ms, "end_ms": n.end_ms} for n in rec_nodes],
            # Where and when each task ran (epoch ms), in the order of `jobs`: what a replay's timing is measured
            # from (simulate/calibrate.py: the time between a node having room and the task running).
            "recorded_tasks": [{"node_id": i[6], "resources": i[2], "demand_ms": i[3], "start_ms": i[4],
                                "end_ms": i[5]} for its in by_job.values() for i in its],
            "window_ms": [t0, window_end],
            "measured_node_hours": round(rec.measured_node_hours, 6),
        },
    }
    return rec
