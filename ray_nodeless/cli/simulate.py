"""`ray-nodeless simulate`: replay a workload trace under cluster configurations and fixed baselines.

The replay itself is `ray_nodeless.simulate`; this module only reads the options and prints the report.
"""
from __future__ import annotations

import json
from typing import Any

import click

from ray_nodeless.cli.errors import user_errors
from ray_nodeless.core.cluster_plan import load_catalog
from ray_nodeless.errors import ConfigError
from ray_nodeless.simulate import calibrate
from ray_nodeless.simulate.config import CAPACITY_VARIANTS, IDLE_RELEASE, REVERSION_VARIANTS, build_configs
from ray_nodeless.simulate.engine import simulate
from ray_nodeless.simulate.model import DEFAULT_LAUNCH_MINUTES
from ray_nodeless.simulate.plot import plot_results
from ray_nodeless.simulate.report import report_dict, report_params, report_text
from ray_nodeless.trace.model import load_trace


@click.command("simulate")
@click.argument("trace_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--config", "configs", multiple=True,
              help="Cluster YAML to replay under (repeatable). Append #SCHEDULE to pick the trace schedule.")
@click.option("--baseline", "baselines", multiple=True,
              help="Fixed cluster, e.g. fixed:3xg4dn.4xlarge or fixed:3xg4dn.4xlarge@us-east-1 (repeatable; "
                   "#SCHEDULE as for --config; default schedule: the trace's baseline_schedule).")
@click.option("--capacity", type=click.Choice(list(CAPACITY_VARIANTS)), default="as-configured",
              show_default=True, help="on-demand: force capacity [on-demand] for every node type; both: report "
                                      "each config both ways.")
@click.option("--schedule", default=None, help="Trace schedule for --config (default: the trace's default_schedule).")
@click.option("--launch-minutes", type=float, default=DEFAULT_LAUNCH_MINUTES, show_default=True,
              help="Launch request -> node ready to run tasks.")
@click.option("--spot-interruptions-per-hour", type=float, default=0.0, show_default=True,
              help="Per spot node; lost work reruns.")
@click.option("--seed", type=int, default=0, show_default=True, help="RNG seed (spot interruptions).")
@click.option("--catalog", "catalog_spec", default="embedded", show_default=True,
              help="Catalog pricing the fixed baselines ('embedded' or a file). Cluster configs use their own.")
@click.option("--idle-release", type=click.Choice(IDLE_RELEASE + ("both", "all")), default="as-configured",
              show_default=True, help="as-configured: each worker type's idle timeout as the plan decides it (the "
                                      "per-type idle_timeout_s Ray v2 reads: cost-aware break-even unless the type "
                                      "sets one) and the monitor's learned release of types whose gaps were longer "
                                      "than a launch (provider.idle.learn_gaps); break-even: the same without the "
                                      "learning; cluster-wide: Ray v1's one idle_timeout_minutes; both: "
                                      "as-configured and cluster-wide; all: the three.")
@click.option("--reversion", type=click.Choice(list(REVERSION_VARIANTS)), default="as-configured",
              show_default=True, help="On-demand -> spot reversion (provider.reversion): as configured (on by "
                                      "default), off, or both (spot configs replayed each way).")
@click.option("--spot-outage-minutes", type=float, default=0.0, show_default=True,
              help="After a spot interruption, no spot capacity for the node type this long (launches fall back "
                   "to on demand; reversion brings them back).")
@click.option("--launch-concurrency", type=int, default=None,
              help="At most this many nodes start at once (default: any number; the local backend starts one).")
@click.option("--task-start-seconds", type=float, default=0.0, show_default=True,
              help="A task holds its node this long before its recorded run begins (worker process start).")
@click.option("--scale-down-seconds", type=float, default=0.0, show_default=True,
              help="A terminated worker is billed this much longer (drain, terminate call).")
@click.option("--measured-timing", is_flag=True,
              help="A recorded run: replay with the timing measured in it (launch latency and concurrency, task "
                   "start, scale-down), from the trace's meta.recorded_nodes/recorded_tasks/cloud_machines; "
                   "replaces --launch-minutes, --launch-concurrency, --task-start-seconds, --scale-down-seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a timeline PNG.")
def simulate_command(trace_path: str, configs: tuple[str, ...], baselines: tuple[str, ...], capacity: str,
                     schedule: str | None, launch_minutes: float, spot_interruptions_per_hour: float, seed: int,
                     catalog_spec: str, idle_release: str, reversion: str, spot_outage_minutes: float,
                     launch_concurrency: int | None, task_start_seconds: float, scale_down_seconds: float,
                     measured_timing: bool, as_json: bool, plot_path: str | None) -> None:
    """Replay TRACE under each --config and --baseline: elapsed time, cost, idle cost, node-hours."""
    with user_errors():
        if not configs and not baselines:
            raise ConfigError("--config/--baseline", "give at least one configuration to replay under")
        for key, v in (("--launch-minutes", launch_minutes), ("--spot-interruptions-per-hour",
                       spot_interruptions_per_hour), ("--spot-outage-minutes", spot_outage_minutes),
                       ("--task-start-seconds", task_start_seconds), ("--scale-down-seconds", scale_down_seconds)):
            if v < 0:
                raise ConfigError(key, f"must be >= 0, got {v}")
        if launch_concurrency is not None and launch_concurrency < 1:
            raise ConfigError("--launch-concurrency", f"must be >= 1, got {launch_concurrency}")
        trace = load_trace(trace_path)
        catalog = load_catalog(catalog_spec)
        idle = {"both": IDLE_RELEASE[:2], "all": IDLE_RELEASE}.get(idle_release, (idle_release,))
        cfgs = build_configs(trace, configs, baselines, capacity, schedule, catalog, idle_release=idle,
                             reversion=REVERSION_VARIANTS[reversion])
        timing: dict[str, Any] = {
                  "launch_latency_ms": int(round(launch_minutes * 60_000)), "launch_concurrency": launch_concurrency,
                  "task_start_ms": int(round(task_start_seconds * 1000)),
                  "scale_down_ms": int(round(scale_down_seconds * 1000)),
                  "spot_outage_ms": int(round(spot_outage_minutes * 60_000))}
        if measured_timing:
            meta = trace.meta
            if not (meta.get("recorded_tasks") and meta.get("cloud_machines")):
                raise ConfigError("--measured-timing", f"{trace_path} has no meta.recorded_tasks and "
                                                       "meta.cloud_machines (a run recorded by examples/demo.py has)")
            measured = calibrate.measured_timing({"meta": meta}, calibrate.cloud_machines({"meta": meta}))
            timing.update(measured.kwargs())
        results = [simulate(trace, c, spot_interruptions_per_hour=spot_interruptions_per_hour, seed=seed, **timing)
                   for c in cfgs]
    baseline = next((r for r in results if r.config.kind == "fixed"), None)
    if plot_path:
        plot_results(results, plot_path)
    if as_json:
        params = report_params(launch_minutes=launch_minutes, spot_interruptions_per_hour=spot_interruptions_per_hour,
                               seed=seed, capacity=capacity, idle_release=idle_release)
        params.update(reversion=reversion, spot_outage_minutes=spot_outage_minutes,
                      launch_concurrency=timing["launch_concurrency"],
                      task_start_seconds=timing["task_start_ms"] / 1000,
                      scale_down_seconds=timing["scale_down_ms"] / 1000)
        if measured_timing:
            params.update(measured_timing=True, launch_minutes=timing["launch_latency_ms"] / 60_000)
        click.echo(json.dumps(report_dict(trace, results, params), indent=2, sort_keys=True))
    else:
        click.echo(report_text(trace, results, baseline))
        if plot_path:
            click.echo(f"plot: {plot_path}")
