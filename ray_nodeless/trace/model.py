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

`ray_nodeless.trace.record` builds a trace document from a finished run on a live Ray cluster.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from ray_nodeless.errors import ConfigError

TRACE_VERSION = 1
MS_PER_HOUR = 3_600_000


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
        duration = _duration_ms(p, f"{key}[{i}]")
        assert duration is not None      # required: a missing duration raised ConfigError
        out.append(HeadPhase(name=str(p.get("name", f"phase-{i}")), duration_ms=duration))
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
        assert dur is not None      # required: a missing duration raised ConfigError
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


def _is_json(path: str | Path) -> bool:
    """A trace file is JSON if its name ends in `.json`, YAML otherwise (reading and writing alike)."""
    return str(path).endswith(".json")


def load_trace(path: str | Path) -> Trace:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(str(path), f"cannot read trace: {e}") from e
    try:
        doc = json.loads(text) if _is_json(path) else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ConfigError(str(path), f"not valid YAML/JSON: {e}") from e
    return parse_trace(doc, str(path))


def write_trace(doc: Mapping[str, Any], path: str | Path) -> None:
    """Write a trace document where `load_trace` reads it back: JSON (sorted keys) for `.json`, else YAML in the
    document's own key order (a recorded trace reads top-down: version, name, jobs, schedules, meta)."""
    text = json.dumps(doc, indent=2, sort_keys=True) if _is_json(path) else yaml.safe_dump(dict(doc), sort_keys=False)
    Path(path).write_text(text)


def stages_of(trace: Trace, schedule: str) -> Sequence[Sequence[str]]:
    if schedule not in trace.schedules:
        raise ConfigError("schedule", f"{schedule!r} is not one of the trace's schedules {sorted(trace.schedules)}")
    return trace.schedules[schedule]
