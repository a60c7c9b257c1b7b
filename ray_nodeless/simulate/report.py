"""Reports of a set of replays of one trace: one JSON document, or a table for people."""
from __future__ import annotations

from typing import Any, Mapping

from ray_nodeless.simulate.model import TICK_MS
from ray_nodeless.simulate.results import SimResult
from ray_nodeless.trace.model import MS_PER_HOUR, Trace


def report_params(*, launch_minutes: float, spot_interruptions_per_hour: float, seed: int,
                  capacity: str, idle_release: str = "as-configured") -> dict[str, Any]:
    """The `parameters` of a report: the run's options and the autoscaler model they were replayed with."""
    return {"launch_minutes": launch_minutes, "spot_interruptions_per_hour": spot_interruptions_per_hour,
            "seed": seed, "capacity": capacity, "idle_release": idle_release,
            "autoscaler": "ray v1 ResourceDemandScheduler.get_nodes_to_launch",
            "tick_seconds": TICK_MS // 1000}


def report_dict(trace: Trace, results: list[SimResult], params: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "trace": trace.name,
        "trace_task_hours_uncut": round(trace.task_hours(), 6),
        "parameters": dict(params),
        "configurations": {r.config.label: r.to_dict() for r in results},
        "published": list(trace.meta.get("published") or []),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def report_text(trace: Trace, results: list[SimResult], baseline: SimResult | None) -> str:
    lines = [f"trace {trace.name}: {len(trace.jobs)} jobs, "
             f"{sum(len(j.tasks) for j in trace.jobs.values())} tasks"]
    hdr = (f"{'configuration':34} {'schedule':11} {'elapsed h':>9} {'cost $':>9} {'vs base':>8} {'idle $/h':>9} "
           f"{'GPU util':>8} {'bound $':>8} {'+head $':>8} {'vs bound':>8}")
    lines.append(hdr)
    for r in results:
        vs = ""
        if baseline is not None and baseline is not r and baseline.workload_cost > 0:
            vs = f"{(r.workload_cost / baseline.workload_cost - 1) * 100:+.1f}%"
        gpu = r.gpu_utilisation
        lines.append(f"{r.config.label:34} {r.config.schedule:11} {r.elapsed_hours:9.3f} {r.workload_cost:9.2f} "
                     f"{vs:>8} {r.config.idle_cost_per_hour:9.3f} "
                     f"{'-' if gpu is None else f'{gpu * 100:.1f}%':>8} {r.lower_bound():8.2f} "
                     f"{r.bound_with_head:8.2f} {_pct(r.distance_to_bound):>8}")
    published = trace.meta.get("published") or []
    if published:
        lines.append("published reference (from the trace's meta.published):")
        for p in published:
            vs = p.get("vs_fixed_pct")
            cost = p.get("workload_cost")
            lines.append(f"  {str(p.get('configuration', '?')):32} {'':11} {p.get('elapsed_hours', float('nan')):9.3f} "
                         f"{'-' if cost is None else f'{cost:.2f}':>9} {'-' if vs is None else f'{vs:+.1f}%':>8} "
                         f"{p.get('idle_cost_per_hour', float('nan')):9.3f}")
    lines.append("")
    for r in results:
        inst = ", ".join(f"{k}={o.instance_type} {o.capacity} ${o.hourly_price:.4f}/h"
                         for k, o in sorted(r.config.offers.items()))
        nh = ", ".join(f"{k}: {v:.2f}" for k, v in r.node_hours().items())
        worker_h, launch_h, idle_h = r.worker_hours()
        extra = ""
        if worker_h > 0:
            idle = ", ".join(f"{k} {'never' if v < 0 else f'{v / 1000:g} s'}"
                             for k, v in sorted(r.config.idle_timeout_ms_by_type.items()))
            extra += (f"; workers {worker_h:.2f} h = launching {launch_h:.2f} + idle {idle_h:.2f} "
                      f"({idle_h / worker_h * 100:.1f} %) + busy; idle release: "
                      + (idle or f"idle_timeout_minutes {r.config.idle_timeout_ms / 60_000:g}"
                         if r.config.idle_timeout_ms >= 0 else idle or "never"))
            if r.config.idle_learning is not None and r.config.learn_types:
                extra += (f", learned: {r.config.idle_learning[2]:g} s for "
                          f"{', '.join(sorted(r.config.learn_types))} once its gaps are longer than a launch")
        if r.interruptions:
            extra = f"; {r.interruptions} spot interruptions, {r.lost_task_hours:.2f} task-hours lost and rerun"
        fb = sum(r.node_ms(n) for n in r.nodes if n.fallback) / MS_PER_HOUR
        rev = r.policy_stats.get("SimReverter")
        if fb or (rev and any(v for v in rev.values())):
            extra += f"; on-demand fallbacks {fb:.2f} node-h"
            if rev:
                extra += (f"; reversion: {rev['started']} spot replacements launched, {rev['replaced']} fallbacks "
                          f"replaced, {rev['refused_busy']} drains refused (busy), {rev['kept']} kept, "
                          f"{rev['preferred_on_demand']} on-demand preferences")
        lines.append(f"{r.config.label}: {inst}")
        lines.append(f"    node-hours: {nh}; useful task-hours {r.useful_task_hours:.2f}; "
                     f"head-only {r.head_phase_ms / MS_PER_HOUR:.2f} h{extra}")
    lines.append("bound $ = lower bound: every useful task-hour on the cheapest allowed offering for its shape, no "
                 "launch latency, no idle time, no head; +head $ adds the head for the run; vs bound = cost over it.")
    return "\n".join(lines)
