"""The timing a recorded run had, measured from the run, for its replay: launch latency, how many nodes started at
once, the time between a node having room for a task and the task running, and the scale-down latency.

A trace records what the workload asked for (shapes, durations, demand times); how fast the cluster answered is the
cluster's, not the workload's. To replay a recorded run faithfully, the replay gets the run's own figures, each
measured, none fitted to the measured node-hours:

- `launch_latency_ms`: machine listed by the cloud -> its Ray node started (mean over workers; listings and starts
  paired in time order, as both are first-come);
- `launch_concurrency`: the most machines seen starting at once (the local backend starts one node process at a
  time under a host-wide lock, so its launches queue; a cloud boots them side by side: None, unbounded, when every
  start overlapped every other);
- `task_start_ms`: for each task, its start less the moment it could have been placed (its demand, or its node's
  start, or the end of the task before it in the same slot of that node, whichever is last), averaged: for a Tune
  trial, the placement group's commit, Tune creating the trial actor and the actor's worker process starting;
- `scale_down_ms`: a worker's Ray node ending (the autoscaler's drain, its decision) -> the machine gone from the
  cloud's listing (mean over workers that ended): the drain, the terminate call, the listing catching up.

Pure: the inputs are the trace document `ray_nodeless.trace.record` wrote (its `meta.recorded_nodes` and
`meta.recorded_tasks`) and the cloud's machine lifetimes as the caller saw them (examples/demo.py keeps them in the
trace as `meta.cloud_machines`, so `ray-nodeless simulate --measured-timing` replays a recorded run on its own).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ray_nodeless.simulate.model import EPS


@dataclass(frozen=True)
class ReplayTiming:
    launch_latency_ms: int
    launch_concurrency: int | None
    task_start_ms: int
    scale_down_ms: int

    def kwargs(self) -> dict[str, Any]:
        """The `Simulator` keyword arguments."""
        return {"launch_latency_ms": self.launch_latency_ms, "launch_concurrency": self.launch_concurrency,
                "task_start_ms": self.task_start_ms, "scale_down_ms": self.scale_down_ms}

    def to_dict(self) -> dict[str, Any]:
        return {"launch_latency_s": self.launch_latency_ms / 1000, "launch_concurrency": self.launch_concurrency,
                "task_start_s": self.task_start_ms / 1000, "scale_down_s": self.scale_down_ms / 1000}


def _mean_ms(values: Sequence[float]) -> int:
    return int(round(sum(values) / len(values))) if values else 0


def _max_overlap(intervals: Sequence[tuple[float, float]]) -> int:
    """The most intervals [start, end) open at one moment."""
    edges = sorted([(s, 1) for s, e in intervals if e > s] + [(e, -1) for s, e in intervals if e > s],
                   key=lambda x: (x[0], x[1]))
    best = cur = 0
    for _, d in edges:
        cur += d
        best = max(best, cur)
    return best


def _slots(node_res: Mapping[str, float], need: Mapping[str, float]) -> int:
    """How many tasks of shape `need` a node of `node_res` holds at once (at least one: the task did run there)."""
    fits = [math.floor(node_res.get(k, 0.0) / v + EPS) for k, v in need.items() if v > 0]
    return max(1, min(fits, default=1))


def _gaps(slots: list[int], tasks: list[Mapping[str, Any]]) -> list[int]:
    """Tasks in start order each take the earliest-freed slot (nodes take pending work as soon as room frees); the
    gap is its start less the later of that slot's freeing and its demand."""
    free = list(slots)
    heapq.heapify(free)
    out = []
    for t in sorted(tasks, key=lambda t: (t["start_ms"], t["end_ms"])):
        slot = heapq.heappop(free) if free else int(t["start_ms"])
        out.append(max(0, int(t["start_ms"]) - max(slot, int(t["demand_ms"]))))
        heapq.heappush(free, int(t["end_ms"]))
    return out


def task_start_gaps_ms(doc: Mapping[str, Any]) -> list[int]:
    """Per recorded task, the time between it being placeable and it running (see the module docstring). Each
    node's slots for the task's shape free at the node's start and at each earlier task's end on it, earliest
    first. Tasks recorded without their node (an older recording) share the slots of every node their shape fits,
    per shape."""
    meta = doc.get("meta") or {}
    nodes = {n["node_id"]: n for n in meta.get("recorded_nodes") or []}
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    unplaced: dict[tuple, list[Mapping[str, Any]]] = {}
    for t in meta.get("recorded_tasks") or []:
        if t.get("node_id") in nodes:
            by_node.setdefault(t["node_id"], []).append(t)
        else:
            unplaced.setdefault(tuple(sorted((t.get("resources") or {}).items())), []).append(t)
    gaps: list[int] = []
    for node_id in sorted(by_node):
        node = nodes[node_id]
        tasks = by_node[node_id]
        gaps += _gaps([int(node["start_ms"])] * _slots(node.get("resources") or {}, tasks[0]["resources"]), tasks)
    for shape in sorted(unplaced):
        need = dict(shape)
        fit = [n for _, n in sorted(nodes.items())
               if all((n.get("resources") or {}).get(k, 0.0) + EPS >= v for k, v in need.items())]
        slots = [int(n["start_ms"]) for n in fit for _ in range(_slots(n.get("resources") or {}, need))]
        gaps += _gaps(slots, unplaced[shape])
    return gaps


def cloud_machines(doc: Mapping[str, Any]) -> list[tuple[float, float | None]]:
    """The workers' (listed, gone) a recorder kept in the trace (`meta.cloud_machines`, as examples/demo.py writes
    them: the cloud's listing, epoch seconds)."""
    return [(float(m["listed_s"]), None if m.get("gone_s") is None else float(m["gone_s"]))
            for m in (doc.get("meta") or {}).get("cloud_machines") or []]


def measured_timing(doc: Mapping[str, Any], machines: Sequence[tuple[float, float | None]]) -> ReplayTiming:
    """The replay timing of a recorded run. `machines`: each worker machine's (listed, gone) as the cloud's listing
    showed them, epoch seconds (gone None: still there)."""
    meta = doc.get("meta") or {}
    workers = [n for n in meta.get("recorded_nodes") or [] if not n.get("is_head")]
    starts = sorted(n["start_ms"] / 1000 for n in workers)
    listed = sorted(m[0] for m in machines)
    pairs = list(zip(listed, starts))
    latency = _mean_ms([max(0.0, st - la) * 1000 for la, st in pairs])
    overlap = _max_overlap(pairs)
    concurrency = None if overlap >= len(pairs) and len(pairs) > 1 else max(1, overlap)
    ray_ends = sorted(n["end_ms"] / 1000 for n in workers if n.get("end_ms"))
    gone = sorted(m[1] for m in machines if m[1] is not None)
    scale_down = _mean_ms([max(0.0, g - e) * 1000 for e, g in zip(ray_ends, gone)])
    return ReplayTiming(launch_latency_ms=latency, launch_concurrency=concurrency,
                        task_start_ms=_mean_ms(task_start_gaps_ms(doc)), scale_down_ms=scale_down)


def billed_node_hours(doc: Mapping[str, Any]) -> float:
    """What the recorded run's cloud billed from its first demand on, as `examples/demo.py` measures it: the head
    for the run window (first demand to last task end), each worker from its listing to its leaving the listing
    (`meta.cloud_machines`; one still listed counts to the window's end). The figure a replay with the measured
    timing is checked against."""
    meta = doc.get("meta") or {}
    lo, hi = (w / 1000 for w in meta["window_ms"])
    workers = sum(max(0.0, (hi if gone is None else gone) - max(listed, lo)) for listed, gone in cloud_machines(doc))
    return ((hi - lo) + workers) / 3600
