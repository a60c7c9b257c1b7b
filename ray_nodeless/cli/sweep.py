"""`ray-nodeless sweep`: end what a cluster whose head died left running (machines, Kubernetes Nodes and pods,
local records and processes). Lists first; asks unless -y, as `ray down` does; exits 1 naming what it could not end."""
from __future__ import annotations

import json
import sys

import click

from ray_nodeless.cli.errors import BAD_INPUT, FAILURE, fail, user_errors
from ray_nodeless.cli.formatting import price
from ray_nodeless.core.cluster_plan import load_cluster_yaml
from ray_nodeless.errors import ConfigError


@click.command("sweep")
@click.argument("cluster_yaml", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="List what would be ended; end nothing.")
@click.option("--workers-only", "--keep-head", "workers_only", is_flag=True,
              help="Keep the head machine (and its processes); end only the workers and their Nodes and pods.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation (required when stdin is not a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (progress goes to stderr).")
def sweep_command(cluster_yaml: str, dry_run: bool, workers_only: bool, yes: bool, as_json: bool) -> None:
    """End every machine, Kubernetes Node and Ray pod, and local record and process of a cluster whose head
    died: only what is tagged with the cluster's name, whatever the rules say now (it never plans, needs no Ray).
    The head too, unless --workers-only. Exits 1 if anything could not be ended: run it again."""
    from ray_nodeless.operate.sweep import Sweep

    def say(msg: str) -> None:
        click.echo(msg, err=as_json)     # with --json, stdout carries only the document

    with user_errors():
        sweep = Sweep(load_cluster_yaml(cluster_yaml), workers_only=workers_only,
                      progress=lambda msg: say(f"sweep: {msg}"))
    try:
        with user_errors():
            listed = sweep.targets()
        targets, kept, failures = listed
        if not as_json:
            _print_listing(sweep.cluster_name, targets, kept, dry_run)
        for f in failures:
            say(f"sweep: cannot list {f['kind']}: {f['error']}")
        if targets and not dry_run and not yes:
            what = f"{len(targets)} thing(s) of cluster {sweep.cluster_name}"
            if not (sys.stdin is not None and sys.stdin.isatty()):
                fail(ConfigError("--yes", f"refusing to end {what} without confirmation: stdin is not a terminal "
                                          "(pass -y, or --dry-run to list only)"), BAD_INPUT)
            click.confirm(f"End {what}?", abort=True, err=as_json)
        with user_errors():
            result = sweep.run(dry_run=dry_run, listed=listed)
    finally:
        sweep.close()
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        _print_result(result, cluster_yaml)
    if not result.ok:
        sys.exit(FAILURE)


def _print_listing(cluster: str, targets: list, kept: list, dry_run: bool) -> None:
    if not targets and not kept:
        return      # the result says "nothing to end"
    machines = [t for t in targets if t.kind == "machine"]
    cost = sum(t.hourly_price or 0.0 for t in machines)
    verb = "would end" if dry_run else "to end"
    click.echo(f"cluster {cluster}: {verb}: {len(machines)} machine(s) (${cost:.4f}/h), "
               f"{len(targets) - len(machines)} other resource(s)" + (f"; keeping {len(kept)}" if kept else ""))
    for t in targets:
        click.echo("  " + _row(t))
    for t in kept:
        click.echo("  kept: " + _row(t))


def _row(t) -> str:
    if t.kind == "machine":
        up = "-" if t.uptime_s is None else f"{t.uptime_s:.0f}s"
        return (f"machine  {t.id:24} {t.node_kind or '-':6} {t.node_type or '-':14} {t.instance_type or '-':18} "
                f"{t.zone or '-':14} {t.capacity or '-':9} {t.state:8} up {up:>8} {price(t.hourly_price):>14}")
    return f"{t.kind:8} {t.id:24} {t.node_kind or '-':6} machine {t.machine_id or '-'} {t.state or '-'}"


def _print_result(result, cluster_yaml: str) -> None:
    if result.dry_run:
        click.echo("dry run: nothing ended")
        return
    if not result.targets:
        click.echo(f"cluster {result.cluster_name}: nothing to end")
    elif result.ended:
        click.echo(f"ended {len(result.ended)}: {', '.join(result.ended)}")
    for f in result.failures:
        click.echo(f"NOT ENDED {f['kind']} {f['id']}: {f['error']}".replace("  ", " "))
    if not result.ok:
        click.echo(f"sweep of cluster {result.cluster_name} incomplete ({len(result.failures)} not ended); run "
                   f"`ray-nodeless sweep {cluster_yaml}` again")
