"""`ray-nodeless`: plan, catalog, status. Keep these interfaces stable: other tools build on them.

Every `--json` output is one JSON document (keys documented in README.md). Errors print one line naming the
offending key and exit with status 2 (bad input) or 1 (anything else).
"""
from __future__ import annotations

import json
import logging
import sys
from contextlib import contextmanager
from typing import Any, Iterator

import click

from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.cluster_plan import ClusterPlan, load_catalog, load_cluster_yaml, plan_cluster, planner_for
from ray_nodeless.errors import CatalogError, ConfigError, NodelessError, NoFeasibleOffering
from ray_nodeless.core.planner import Plan
from ray_nodeless.core.requirements import GIB, Request, Shape, parse_requirements


def _fail(e: Exception, code: int) -> None:
    click.echo(f"ray-nodeless: error: {e}", err=True)
    sys.exit(code)


@contextmanager
def user_errors(other: type[BaseException] | tuple[type[BaseException], ...] = NodelessError) -> Iterator[None]:
    """The CLI's error convention: one line naming the key; bad input exits 2, any other failure (`other`) 1."""
    try:
        yield
    except (ConfigError, NoFeasibleOffering, CatalogError) as e:
        _fail(e, 2)
    except other as e:
        _fail(e, 1)


def _price(p: float | None) -> str:
    return "unknown" if p is None else f"${p:.4f}/h"


def _plan_lines(name: str | None, plan: Plan, alternatives: int = 3) -> list[str]:
    o = plan.chosen
    t = o.instance_type
    gpu = f", {t.gpu_count}x{t.gpu_model}" if t.gpu_count else ""
    head = f"{name}: " if name else ""
    lines = [
        f"{head}{plan.request.shape.describe()} -> {t.name} ({t.vcpus:g} vCPU, {t.memory_gib:g} GiB{gpu}) "
        f"{o.zone} {o.capacity} {_price(o.hourly_price)}",
        f"    rule: {plan.request.rule}; {len(plan)} candidates of {plan.considered} offerings; "
        f"rejected: " + (", ".join(f"{k}={v}" for k, v in plan.rejected.items()) or "none"),
    ]
    for alt in plan.top(alternatives + 1)[1:]:
        lines.append(f"    alternative: {alt.instance_type.name} {alt.zone} {alt.capacity} {_price(alt.hourly_price)}")
    return lines


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages.")
def main(verbose: bool) -> None:
    """ray_nodeless: cheapest-fit instances for Ray clusters, under ordered rules."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


@main.command()
@click.argument("cluster_yaml", required=False, type=click.Path(dir_okay=False))
@click.option("--cloud", type=click.Choice(["aws", "gcp"]), help="Ad-hoc shape: the cloud.")
@click.option("--region", help="Ad-hoc shape: the region.")
@click.option("--cpu", type=float, default=0, show_default=True, help="Ad-hoc shape: vCPUs.")
@click.option("--gpu", type=int, default=0, show_default=True, help="Ad-hoc shape: GPUs.")
@click.option("--memory", type=float, default=0, show_default=True, help="Ad-hoc shape: memory in GiB.")
@click.option("--family", "families", multiple=True, help="Allowed family (repeatable).")
@click.option("--exclude-family", "exclude_families", multiple=True, help="Excluded family (repeatable).")
@click.option("--instance-type", "instance_types", multiple=True, help="Allowed instance type glob (repeatable).")
@click.option("--gpu-model", "gpus", multiple=True, help="Allowed GPU model (repeatable).")
@click.option("--exclude-gpu", "exclude_gpus", multiple=True, help="Excluded GPU model (repeatable).")
@click.option("--capacity", multiple=True, type=click.Choice(list(catalog_mod.CAPACITY_TYPES)),
              help="Capacity types in order of preference (repeatable). Default: on-demand.")
@click.option("--arch", type=click.Choice(["x86_64", "arm64", "any"]), help="CPU architecture (default x86_64).")
@click.option("--zone", "zones", multiple=True, help="Allowed zone (repeatable).")
@click.option("--max-price", type=float, help="Maximum USD per hour.")
@click.option("--alternatives", type=int, default=3, show_default=True, help="Alternatives to show.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def plan(cluster_yaml: str | None, cloud: str | None, region: str | None, cpu: float, gpu: int, memory: float,
         families, exclude_families, instance_types, gpus, exclude_gpus, capacity, arch, zones, max_price,
         alternatives: int, as_json: bool) -> None:
    """Show the instance each node type of CLUSTER_YAML gets, and why; or plan one ad-hoc shape."""
    with user_errors():
        if cluster_yaml:
            if cloud or region:
                raise ConfigError("--cloud/--region", "give either CLUSTER_YAML or an ad-hoc shape, not both")
            _plan_cluster(cluster_yaml, alternatives, as_json)
            return
        if not cloud or not region:
            raise ConfigError("--cloud/--region", "an ad-hoc shape needs --cloud and --region (or give CLUSTER_YAML)")
        data: dict[str, Any] = {}
        for key, val in (("families", families), ("exclude_families", exclude_families),
                         ("instance_types", instance_types), ("gpus", gpus), ("exclude_gpus", exclude_gpus),
                         ("capacity", capacity), ("zones", zones)):
            if val:
                data[key] = list(val)
        if arch:
            data["arch"] = arch
        if max_price is not None:
            data["max_hourly_price"] = max_price
        req = parse_requirements(data, "options")
        shape = Shape.from_resources({"CPU": cpu, "GPU": gpu, "memory": memory * GIB}, "options")
        p = planner_for(catalog_mod.embedded()).plan(
            Request(cloud=cloud, region=region, shape=shape, requirements=req, rule="command-line"))
        if as_json:
            click.echo(json.dumps(p.explain(alternatives), indent=2, sort_keys=True))
        else:
            click.echo("\n".join(_plan_lines(None, p, alternatives)))
            click.echo(f"catalog: {p.catalog_id}")


def _plan_cluster(path: str, alternatives: int, as_json: bool) -> None:
    cfg = load_cluster_yaml(path)
    cp: ClusterPlan = plan_cluster(cfg)
    if as_json:
        click.echo(json.dumps(cp.to_dict(), indent=2, sort_keys=True))
        return
    s = cp.settings
    where = f"{s.cloud} {s.region}" + (f" (priced as {s.price_cloud})" if s.cloud == "local" else "")
    click.echo(f"cluster {cfg.get('cluster_name', '?')}: {where}, catalog {cp.catalog_id}")
    # The head first, then worker types by name.
    for name in sorted(cp.plans, key=lambda n: (n != cp.head_node_type, n)):
        p = cp.plans[name]
        nt = cp.node_types[name]
        if name == cp.head_node_type:
            role = "head"
        else:
            role = f"workers {int(nt.get('min_workers', 0))}..{int(nt.get('max_workers', cp.global_max_workers))}"
        lines = _plan_lines(name, p, alternatives)
        lines[0] = f"[{role}] " + lines[0]
        click.echo("\n".join(lines))
    c = cp.cost
    click.echo(f"idle cost: ${c.idle_cost_per_hour:.4f}/h (head + min_workers); "
               f"ceiling: ${c.ceiling_cost_per_hour:.4f}/h (at max_workers)")


@main.group()
def catalog() -> None:
    """Inspect or refresh the instance catalog."""


@catalog.command("list")
@click.option("--cloud", type=click.Choice(["aws", "gcp"]), required=True)
@click.option("--region", required=True)
@click.option("--catalog", "catalog_spec", default="embedded", show_default=True,
              help="'embedded' or a path to a catalog file.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def catalog_list(cloud: str, region: str, catalog_spec: str, as_json: bool) -> None:
    """Every offering of a region, with its specs and price, in ranking order."""
    with user_errors(other=()):
        cat = load_catalog(catalog_spec)
        rc = cat.region(cloud, region)
    if as_json:
        click.echo(json.dumps({"catalog_id": cat.catalog_id, "cloud": cloud, "region": region,
                               "offerings": [o.to_dict() for o in rc.offerings()]}, indent=1))
        return
    click.echo(f"# catalog {cat.catalog_id}: {cloud} {region}, {len(rc)} offerings")
    click.echo(f"{'instance_type':28} {'vcpus':>6} {'mem_gib':>8} {'gpu':>10} {'arch':7} {'zone':16} "
               f"{'capacity':9} {'usd_per_hour':>12}")
    for o in rc.offerings():
        t = o.instance_type
        gpu = f"{t.gpu_count}x{t.gpu_model}" if t.gpu_count else "-"
        price = "unknown" if o.hourly_price is None else f"{o.hourly_price:.4f}"
        click.echo(f"{t.name:28} {t.vcpus:>6g} {t.memory_gib:>8g} {gpu:>10} {t.arch:7} {o.zone:16} "
                   f"{o.capacity:9} {price:>12}")


@catalog.command("refresh")
@click.option("--cloud", type=click.Choice(["aws", "gcp"]), required=True)
@click.option("--region", required=True)
@click.option("--out", type=click.Path(dir_okay=False), help="Where to write the catalog file "
              "(default: catalog-<cloud>-<region>.json.gz); use it with `provider.catalog: <path>`.")
@click.option("--endpoint-url", help="AWS: API endpoint (default: AWS_ENDPOINT_URL or the real one).")
@click.option("--project-id", help="GCP: the project to read machine types from.")
@click.option("--api-endpoint", help="GCP: Compute API endpoint.")
@click.option("--json", "as_json", is_flag=True)
def catalog_refresh(cloud: str, region: str, out: str | None, endpoint_url: str | None, project_id: str | None,
                    api_endpoint: str | None, as_json: bool) -> None:
    """Rebuild a region's catalog from the cloud's APIs (cached on disk); falls back to the last good one."""
    out = out or f"catalog-{cloud}-{region}.json.gz"
    if cloud == "aws":
        from ray_nodeless.providers.aws.catalog import refresh_cli

        summary = refresh_cli(region, out, endpoint_url=endpoint_url)
    else:
        from pathlib import Path

        from ray_nodeless.providers.gcp.catalog import refresh_gcp_catalog_with_summary

        if not project_id:
            _fail(ConfigError("--project-id", "required for --cloud gcp"), 2)
        cat, summary = refresh_gcp_catalog_with_summary(region, project_id, api_endpoint=api_endpoint)
        Path(out).write_bytes(catalog_mod.dump_bytes(cat.doc))
        summary = dict(summary, written=str(out))
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True, default=str))
    else:
        for k in sorted(summary):
            click.echo(f"{k}: {summary[k]}")


@catalog.command("info")
@click.option("--json", "as_json", is_flag=True)
def catalog_info(as_json: bool) -> None:
    """The embedded catalog's id, sha256 and coverage."""
    cat = catalog_mod.embedded()
    info = {"catalog_id": cat.catalog_id, "sha256": cat.sha256, "built": cat.built,
            "regions": {c: cat.regions(c) for c in cat.clouds}}
    if as_json:
        click.echo(json.dumps(info, indent=2, sort_keys=True))
    else:
        click.echo(f"{cat.catalog_id} (sha256 {cat.sha256}), data of {cat.built}")
        for c in cat.clouds:
            click.echo(f"  {c}: {', '.join(cat.regions(c))}")


@main.command()
@click.argument("cluster_yaml", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def status(cluster_yaml: str, as_json: bool) -> None:
    """The live machines of a cluster: node type, instance, zone, capacity, price, uptime, cost so far."""
    from ray_nodeless.launch.status import status_document

    with user_errors():
        doc = status_document(load_cluster_yaml(cluster_yaml))
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    click.echo(f"cluster {doc['cluster_name']}: {len(doc['nodes'])} machine(s), ${doc['hourly_cost']:.4f}/h, "
               f"${doc['accumulated_cost']:.4f} so far")
    for n in doc["nodes"]:
        click.echo(f"  {n['node_id']:24} {n['kind']:6} {n['node_type']:14} {n['instance_type']:18} {n['zone']:14} "
                   f"{n['capacity']:9} {_price(n['hourly_price']):>14} up {n['uptime_s']:>8.0f}s "
                   f"${(n['cost'] or 0):.4f}  rule {n['rule']}")


def _register_subcommands() -> None:
    # Imported here, not at the top: simulate and trace pull in Ray lazily, and keep `plan` start-up light.
    from ray_nodeless.simulate.engine import simulate_command
    from ray_nodeless.trace.model import trace_command

    main.add_command(simulate_command)
    main.add_command(trace_command)


_register_subcommands()

if __name__ == "__main__":  # pragma: no cover
    main()
