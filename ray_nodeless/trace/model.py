"""Workload traces: what a workload asks of a cluster, independent of the cluster it ran on.

A trace is a YAML (or JSON) document, described in `docs/trace-format.md`:

    version: 1
    name: my-workload
    default_schedule: parallel          # schedule used for cluster configs (optional; default: the first)
    baseline_schedule: sequential       # schedule used for fixed baselines (optional; default: default_schedule)
    jobs:
      - name: ds1-1h
        time_budget_hours: 1            # optional: tasks still running this long after the task phase began stop
        max_concurrent: 10              # optional: at most this many tasks of the job submitted at once
        delay_hours: 0                  # optional: start this long after its stage starts
        head_before: [{name: preprocess, minutes: 8}]   # head-only phases, in order, before the tasks
        head_after: [{name: evaluate, minutes: 2}]      # head-only phases after the task phase
        tasks:
          - {name: t0, resources: {CPU: 1, GPU: 1}, hours: 1.0, count: 1, submit_at_hours: 0}
    schedules:                          # name -> stages; a stage is jobs run in parallel; stages run in order
      sequential: [[ds1-1h], [ds2-1h]]
      parallel: [[ds1-1h, ds2-1h]]

All durations are stored as whole milliseconds (`*_ms`), so that replays are exact integer arithmetic: the same
trace gives byte-identical reports on every machine.

`record_trace` builds a trace from a finished run on a live Ray cluster through Ray's state API
(`ray.util.state.list_tasks` / `list_nodes`), which needs the dashboard's API server.
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import click
import yaml

from ray_nodeless.errors import ConfigError

logger = logging.getLogger(__name__)

TRACE_VERSION = 1
MS_PER_HOUR = 3_600_000
# Resource names that pin a demand to a node rather than describe its size; the autoscaler ignores them too.
_PINNING_PREFIXES = ("node:",)


@dataclass(frozen=True)
class HeadPhase:
    """Work that only the head runs (data loading, pre-processing, evaluation). Head phases never overlap."""

    name: str
    duration_ms: int


@dataclass(frozen=True)
class TaskSpec:
    """One task or trial. `duration_ms` is how long it runs uncut; a job's time budget may cut it shorter."""

    name: str
    resources: tuple[tuple[str, float], ...]     # sorted (name, amount): hashable and ordered
    duration_ms: int
    submit_at_ms: int = 0                        # offset from the start of the job's task phase

    @property
    def resource_dict(self) -> dict[str, float]:
        return dict(self.resources)


@dataclass(frozen=True)
class JobSpec:
    name: str
    tasks: tuple[TaskSpec, ...]
    head_before: tuple[HeadPhase, ...] = ()
    head_after: tuple[HeadPhase, ...] = ()
    time_budget_ms: int | None = None
    max_concurrent: int | None = None
    delay_ms: int = 0


@dataclass(frozen=True)
class Trace:
    name: str
    jobs: dict[str, JobSpec]
    schedules: dict[str, tuple[tuple[str, ...], ...]]
    default_schedule: str
    baseline_schedule: str
    description: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def task_hours(self) -> float:
        """Uncut task-hours (what the trace asks for if no budget cut anything)."""
        return sum(t.duration_ms for j in self.jobs.values() for t in j.tasks) / MS_PER_HOUR


def _duration_ms(d: Mapping[str, Any], key: str, *, required: bool = True, prefix: str = "") -> int | None:
    """`hours:` or `minutes:` or `seconds:` (exactly one) -> whole milliseconds."""
    units = {f"{prefix}hours": MS_PER_HOUR, f"{prefix}minutes": 60_000, f"{prefix}seconds": 1000}
    given = [u for u in units if u in d and d[u] is not None]
    if not given:
        if required:
            raise ConfigError(key, f"needs one of {sorted(units)}")
        return None
    if len(given) > 1:
        raise ConfigError(key, f"give only one of {given}")
    v = d[given[0]]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ConfigError(f"{key}.{given[0]}", f"must be a number >= 0, got {v!r}")
    return int(round(v * units[given[0]]))


def _phases(data: Any, key: str) -> tuple[HeadPhase, ...]:
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ConfigError(key, "must be a list of {name, hours|minutes|seconds}")
    out = []
    for i, p in enumerate(data):
        if not isinstance(p, Mapping):
            raise ConfigError(f"{key}[{i}]", "must be a mapping")
        out.append(HeadPhase(name=str(p.get("name", f"phase-{i}")), duration_ms=_duration_ms(p, f"{key}[{i}]")))
    return tuple(out)


def _resources(data: Any, key: str) -> tuple[tuple[str, float], ...]:
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(key, "must be a non-empty mapping of Ray resource name -> amount")
    out = []
    for k in sorted(data):
        v = data[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ConfigError(f"{key}.{k}", f"must be a number >= 0, got {v!r}")
        if v > 0:
            out.append((str(k), float(v)))
    return tuple(out)


def _job(data: Any, key: str) -> JobSpec:
    if not isinstance(data, Mapping) or not isinstance(data.get("name"), str):
        raise ConfigError(key, "a job must be a mapping with a `name`")
    known = {"name", "tasks", "head_before", "head_after", "time_budget_hours", "time_budget_minutes",
             "time_budget_seconds", "max_concurrent", "delay_hours", "delay_minutes", "delay_seconds", "note"}
    for k in data:
        if k not in known:
            raise ConfigError(f"{key}.{k}", f"unknown key; allowed keys are {sorted(known)}")
    tasks: list[TaskSpec] = []
    raw = data.get("tasks") or []
    if not isinstance(raw, list):
        raise ConfigError(f"{key}.tasks", "must be a list")
    for i, t in enumerate(raw):
        tkey = f"{key}.tasks[{i}]"
        if not isinstance(t, Mapping):
            raise ConfigError(tkey, "must be a mapping")
        count = t.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"{tkey}.count", f"must be an integer >= 1, got {count!r}")
        res = _resources(t.get("resources"), f"{tkey}.resources")
        dur = _duration_ms(t, tkey)
        submit = _duration_ms(t, tkey, required=False, prefix="submit_at_") or 0
        name = str(t.get("name", f"task-{i}"))
        for c in range(count):
            tasks.append(TaskSpec(name=name if count == 1 else f"{name}-{c}", resources=res, duration_ms=dur,
                                  submit_at_ms=submit))
    mc = data.get("max_concurrent")
    if mc is not None and (isinstance(mc, bool) or not isinstance(mc, int) or mc < 1):
        raise ConfigError(f"{key}.max_concurrent", f"must be an integer >= 1, got {mc!r}")
    budget_keys = {k: data[k] for k in data if k.startswith("time_budget_")}
    budget = _duration_ms({k.replace("time_budget_", ""): v for k, v in budget_keys.items()},
                          f"{key}.time_budget", required=False)
    delay = _duration_ms({k.replace("delay_", ""): v for k, v in data.items() if k.startswith("delay_")},
                         f"{key}.delay", required=False) or 0
    return JobSpec(name=data["name"], tasks=tuple(tasks), head_before=_phases(data.get("head_before"),
                   f"{key}.head_before"), head_after=_phases(data.get("head_after"), f"{key}.head_after"),
                   time_budget_ms=budget, max_concurrent=mc, delay_ms=delay)


def parse_trace(doc: Any, source: str = "trace") -> Trace:
    if not isinstance(doc, Mapping):
        raise ConfigError(source, "a trace must be a mapping")
    if doc.get("version", TRACE_VERSION) != TRACE_VERSION:
        raise ConfigError(f"{source}.version", f"only version {TRACE_VERSION} is understood")
    raw_jobs = doc.get("jobs")
    if not isinstance(raw_jobs, list) or not raw_jobs:
        raise ConfigError(f"{source}.jobs", "must be a non-empty list of jobs")
    jobs: dict[str, JobSpec] = {}
    for i, j in enumerate(raw_jobs):
        job = _job(j, f"{source}.jobs[{i}]")
        if job.name in jobs:
            raise ConfigError(f"{source}.jobs[{i}].name", f"duplicate job name {job.name!r}")
        jobs[job.name] = job
    raw_sched = doc.get("schedules") or {"all-parallel": [list(jobs)]}
    if not isinstance(raw_sched, Mapping):
        raise ConfigError(f"{source}.schedules", "must be a mapping of name -> list of stages")
    schedules: dict[str, tuple[tuple[str, ...], ...]] = {}
    for name, stages in raw_sched.items():
        skey = f"{source}.schedules.{name}"
        if not isinstance(stages, list) or not all(isinstance(s, list) and s for s in stages):
            raise ConfigError(skey, "must be a list of stages, each a non-empty list of job names")
        seen: list[str] = []
        for s in stages:
            for j in s:
                if j not in jobs:
                    raise ConfigError(skey, f"unknown job {j!r}")
                if j in seen:
                    raise ConfigError(skey, f"job {j!r} appears twice")
                seen.append(j)
        schedules[str(name)] = tuple(tuple(s) for s in stages)
    default = doc.get("default_schedule") or next(iter(schedules))
    baseline = doc.get("baseline_schedule") or default
    for k, v in (("default_schedule", default), ("baseline_schedule", baseline)):
        if v not in schedules:
            raise ConfigError(f"{source}.{k}", f"{v!r} is not one of schedules {sorted(schedules)}")
    return Trace(name=str(doc.get("name", Path(source).stem)), jobs=jobs, schedules=schedules,
                 default_schedule=default, baseline_schedule=baseline, description=str(doc.get("description", "")),
                 meta=dict(doc.get("meta") or {}))


def load_trace(path: str | Path) -> Trace:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(str(path), f"cannot read trace: {e}") from e
    try:
        doc = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ConfigError(str(path), f"not valid YAML/JSON: {e}") from e
    return parse_trace(doc, str(path))


# --------------------------------------------------------------------------------------------------------------
# Recording from a live cluster


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


def _sizing_resources(required: Mapping[str, float] | None) -> dict[str, float]:
    return {k: float(v) for k, v in (required or {}).items()
            if v and not any(k.startswith(p) for p in _PINNING_PREFIXES) and k != "object_store_memory"}


def _demand_time_ms(t: Any) -> int:
    """When the task became a resource demand: entering PENDING_NODE_ASSIGNMENT (its arguments were ready), else
    its creation. Using the creation time would replay tasks that waited for other tasks' results too early."""
    for e in getattr(t, "events", None) or []:
        if e.get("state") == "PENDING_NODE_ASSIGNMENT" and e.get("created_ms"):
            return int(e["created_ms"])
    return int(t.creation_time_ms or t.start_time_ms)


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
    from ray.util.state import list_nodes, list_tasks  # imported here: the CLI must start without Ray's state deps

    tasks = list_tasks(address=address, detail=True, limit=limit, raise_on_missing_output=False)
    nodes = list_nodes(address=address, detail=True, limit=limit, raise_on_missing_output=False)
    if len(tasks) >= limit:
        # Ray also keeps only a bounded number of task events (RAY_task_events_max_num_task_in_gcs): a long run may
        # be missing its oldest tasks either way. Say so; a partial trace under-counts.
        logger.warning("the state API returned %d tasks, its limit: the trace may be missing tasks", len(tasks))
    items: list[tuple[str, str, dict[str, float], int, int, int]] = []   # job, name, res, demand, start, end
    actor_creation: dict[str, Any] = {}
    actor_last_end: dict[str, int] = {}
    for t in tasks:
        if t.type == "ACTOR_CREATION_TASK" and t.actor_id:
            actor_creation[t.actor_id] = t
        if t.type in ("ACTOR_TASK", "ACTOR_CREATION_TASK") and t.actor_id and t.end_time_ms:
            actor_last_end[t.actor_id] = max(actor_last_end.get(t.actor_id, 0), int(t.end_time_ms))
    for t in tasks:
        if t.type != "NORMAL_TASK" or t.state not in ("FINISHED", "FAILED"):
            continue
        if not t.start_time_ms or not t.end_time_ms:
            continue
        items.append((t.job_id, t.name, _sizing_resources(t.required_resources), _demand_time_ms(t),
                      int(t.start_time_ms), int(t.end_time_ms)))
    for actor_id, t in actor_creation.items():
        if not t.start_time_ms or actor_id not in actor_last_end:
            continue
        items.append((t.job_id, t.name, _sizing_resources(t.required_resources), _demand_time_ms(t),
                      int(t.start_time_ms), actor_last_end[actor_id]))
    items = [i for i in items if i[2]]     # zero-resource tasks never drive scaling
    if not items:
        raise ConfigError("trace record", "the cluster has no finished tasks or actors with resources to record")
    items.sort(key=lambda i: (i[3], i[4], i[0], i[1]))
    t0 = items[0][3]
    by_job: dict[str, list[tuple[str, str, dict[str, float], int, int, int]]] = {}
    for it in items:
        by_job.setdefault(it[0], []).append(it)
    jobs_doc = []
    for job_id, its in by_job.items():
        j0 = its[0][3]
        jobs_doc.append({
            "name": f"job-{job_id}",
            "delay_seconds": round((j0 - t0) / 1000, 3),
            "tasks": [{"name": n, "resources": r, "seconds": round((e - s) / 1000, 3),
                       "submit_at_seconds": round((d - j0) / 1000, 3)} for _, n, r, d, s, e in its],
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
            "window_ms": [t0, window_end],
            "measured_node_hours": round(rec.measured_node_hours, 6),
        },
    }
    return rec


@click.group("trace")
def trace_command() -> None:
    """Workload traces: record one from a live Ray cluster (replay it with `ray-nodeless simulate`)."""


@trace_command.command("record")
@click.option("--address", default="auto", show_default=True,
              help="Ray cluster (GCS) address or dashboard URL (http://host:8265); the dashboard must be running.")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="Trace file to write (.yaml/.json).")
@click.option("--name", default="recorded", show_default=True, help="Trace name.")
def record_command(address: str, out: str, name: str) -> None:
    """Turn the finished tasks and actors of a live Ray cluster into a trace."""
    from ray_nodeless.cli.main import user_errors  # the CLI's one-line error convention

    # The state API raises several unrelated exception types when the dashboard is down: all exit 1.
    with user_errors(other=Exception):
        rec = record_trace(address=address, name=name)
    text = (json.dumps(rec.doc, indent=2, sort_keys=True) if out.endswith(".json")
            else yaml.safe_dump(rec.doc, sort_keys=False))
    Path(out).write_text(text)
    n_tasks = sum(len(j["tasks"]) for j in rec.doc["jobs"])
    click.echo(f"wrote {out}: {len(rec.doc['jobs'])} job(s), {n_tasks} task(s); measured node-hours in the run "
               f"window: {rec.measured_node_hours:.6f}")


def dump_trace_doc(doc: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(doc), sort_keys=False)


def stages_of(trace: Trace, schedule: str) -> Sequence[Sequence[str]]:
    if schedule not in trace.schedules:
        raise ConfigError("schedule", f"{schedule!r} is not one of the trace's schedules {sorted(trace.schedules)}")
    return trace.schedules[schedule]
