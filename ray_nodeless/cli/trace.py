"""`ray-nodeless trace`: record a workload trace from a live Ray cluster (replayed by `ray-nodeless simulate`)."""
from __future__ import annotations

import click

from ray_nodeless.cli.errors import user_errors
from ray_nodeless.trace.model import write_trace
from ray_nodeless.trace.record import record_trace


@click.group("trace")
def trace_group() -> None:
    """Workload traces: record one from a live Ray cluster (replay it with `ray-nodeless simulate`)."""


@trace_group.command("record")
@click.option("--address", default="auto", show_default=True,
              help="Ray cluster (GCS) address or dashboard URL (http://host:8265); the dashboard must be running.")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="Trace file to write (.yaml/.json).")
@click.option("--name", default="recorded", show_default=True, help="Trace name.")
def record_command(address: str, out: str, name: str) -> None:
    """Turn the finished tasks and actors of a live Ray cluster into a trace."""
    # The state API raises several unrelated exception types when the dashboard is down: all exit 1.
    with user_errors(other=Exception):
        rec = record_trace(address=address, name=name)
    write_trace(rec.doc, out)
    n_tasks = sum(len(j["tasks"]) for j in rec.doc["jobs"])
    click.echo(f"wrote {out}: {len(rec.doc['jobs'])} job(s), {n_tasks} task(s); measured node-hours in the run "
               f"window: {rec.measured_node_hours:.6f}")
