"""`ray-nodeless status`: the live machines of a cluster, read from its backend's listing."""
from __future__ import annotations

import json

import click

from ray_nodeless.cli.errors import user_errors
from ray_nodeless.cli.formatting import price
from ray_nodeless.core.cluster_plan import load_cluster_yaml


@click.command("status")
@click.argument("cluster_yaml", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--events", "events", is_flag=True,
              help="The provider's decisions (launches, fallbacks, capacity errors, cost-cap refusals, "
                   "interruptions, drains, unservable demands) instead of the machines.")
@click.option("--since", default=None, metavar="AGE", help="With --events: only the last AGE (30s, 10m, 2h, 1d).")
def status_command(cluster_yaml: str, as_json: bool, events: bool, since: str | None) -> None:
    """The live machines of a cluster: node type, instance, zone, capacity, price, uptime, cost so far."""
    # Imported here: only `status` lists machines; the other commands start without the launch layer.
    from ray_nodeless.operate.status import events_document, status_document

    if since is not None and not events:
        raise click.UsageError("--since goes with --events")
    if events:
        age = _age(since)
        from ray_nodeless.ray_compat.ray_status import run_on_head

        with user_errors():
            # The head's log, where this machine does not hold it: read on the head as `ray exec` runs a command.
            doc = events_document(load_cluster_yaml(cluster_yaml), age,
                                  read_head=lambda command: run_on_head(cluster_yaml, command))
        _print_events(doc, as_json)
        return
    with user_errors():
        doc = status_document(load_cluster_yaml(cluster_yaml))
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    listed = doc.get("list_hourly_cost")
    at_list = (f" (list ${listed:.4f}/h)" if listed is not None and abs(listed - doc["hourly_cost"]) > 5e-7 else "")
    click.echo(f"cluster {doc['cluster_name']}: {len(doc['nodes'])} machine(s), ${doc['hourly_cost']:.4f}/h{at_list}, "
               f"${doc['accumulated_cost']:.4f} so far")
    for n in doc["nodes"]:
        click.echo(f"  {n['node_id']:24} {n['kind']:6} {n['node_type']:14} {n['instance_type']:18} {n['zone']:14} "
                   f"{n['capacity']:9} {price(n['hourly_price']):>14}{_list(n)} up {n['uptime_s']:>8.0f}s "
                   f"${(n['cost'] or 0):.4f}  rule {n['rule']}" + _k8s(n))
    for n in doc["nodes"]:
        if n.get("unserved"):
            # Reported by the autoscaler's provider (shape-open clusters): these demands wait for a change of rules.
            click.echo(f"unserved demands: {n['unserved']}")


def _list(n: dict) -> str:
    """The list price beside the effective one, where a price override made them differ."""
    lp, p = n.get("list_price"), n.get("hourly_price")
    return f" (list {price(lp)})" if lp is not None and p is not None and abs(lp - p) > 5e-7 else ""


def _k8s(n: dict) -> str:
    """The Kubernetes columns, for clusters with `registration: kubernetes`."""
    if "k8s_node" not in n:
        return ""
    ready = {True: "Ready", False: "NotReady", None: "-"}[n["k8s_ready"]]
    return f"  node {n['k8s_node'] or '-'} {ready}  pod {n['pod'] or '-'} {n['pod_phase'] or '-'}"


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _age(text: str | None) -> float | None:
    if text is None:
        return None
    t = text.strip()
    try:
        n = float(t[:-1]) if t and t[-1] in _UNITS else float(t)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an age like 30s, 10m, 2h or 1d", param_hint="--since") from None
    if n < 0:
        raise click.BadParameter(f"{text!r} is negative", param_hint="--since")
    return n * _UNITS.get(t[-1], 1)


def _print_events(doc: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    import datetime

    if doc["log_found"]:
        where = f"log {doc['log']}" + (" on the head" if doc["log_source"] == "head" else "")
    elif doc.get("log_error"):
        where = f"log {doc['log']} unreadable ({doc['log_error']}): machine tags only"
    else:
        where = f"log {doc['log']} not found: machine tags only"
    click.echo(f"cluster {doc['cluster_name']}: {len(doc['events'])} event(s) ({where})")
    for e in doc["events"]:
        when = datetime.datetime.fromtimestamp(e["ts"], datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        click.echo(f"  {when} {e['kind']:19} {e['message']}")
