"""`ray-nodeless catalog`: list a region's offerings, show the embedded catalog, refresh a live one from a cloud's
APIs (through the backend's `live_catalog` hook and the one refresh policy, `core/catalog/refresh.py`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ray_nodeless.cli.errors import FAILURE, user_errors
from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.catalog.refresh import CACHE_DIR_ENV, SOURCE_LIVE, resolve_live, summarize
from ray_nodeless.core.cluster_plan import load_catalog
from ray_nodeless.core.schema import parse_section
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers import backend_config, price_clouds


@click.group("catalog")
def catalog_group() -> None:
    """Inspect or refresh the instance catalog."""


@catalog_group.command("list")
@click.option("--cloud", type=click.Choice(price_clouds()), required=True)
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


# The provider-block keys `catalog refresh` takes as options (a backend's live_catalog hook reads them).
REFRESH_OPTIONS = {"endpoint_url": "--endpoint-url", "project_id": "--project-id", "api_endpoint": "--api-endpoint"}


@catalog_group.command("refresh")
@click.option("--cloud", type=click.Choice(price_clouds()), required=True)
@click.option("--region", required=True)
@click.option("--out", type=click.Path(dir_okay=False),
              help="Also write the catalog there, for `provider.catalog: <path>` (gzip if it ends in .gz).")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help=f"The live-catalog cache (default: ${CACHE_DIR_ENV}, else ~/.cache/ray-nodeless/catalog).")
@click.option("--endpoint-url", help="AWS: API endpoint (default: AWS_ENDPOINT_URL or the real one).")
@click.option("--project-id", help="GCP: the project to read machine types from.")
@click.option("--api-endpoint", help="GCP: Compute API endpoint.")
@click.option("--json", "as_json", is_flag=True)
def catalog_refresh(cloud: str, region: str, out: str | None, cache_dir: str | None, endpoint_url: str | None,
                    project_id: str | None, api_endpoint: str | None, as_json: bool) -> None:
    """Read a region's catalog from the cloud's APIs now, into the cache `provider.catalog: live` reads.

    Exit status 1 when the cloud could not be read (the last good cache file, if any, is kept and nothing is
    written to --out); 2 for bad input."""
    options = {"endpoint_url": endpoint_url, "project_id": project_id, "api_endpoint": api_endpoint}
    provider = {"cloud": cloud, "region": region, **{k: v for k, v in options.items() if v}}
    with user_errors(other=()):
        try:   # the options as the backend's own section (what its live_catalog hook reads), parsed once
            config = backend_config(cloud)
            live = config.live_catalog(parse_section(config.settings_model, provider, "provider"), region)
        except ConfigError as e:   # name the option, not the provider key it stands for
            option = REFRESH_OPTIONS.get(e.key.removeprefix("provider."))
            raise (ConfigError(option, str(e).split(": ", 1)[1]) if option else e) from None
    result = resolve_live(live, ttl_s=0, cache_dir=cache_dir, force=True)
    summary = summarize(result, cloud, region)
    summary["written"] = None
    if out and result.source == SOURCE_LIVE:
        doc = result.catalog.doc
        raw = catalog_mod.dump_bytes(doc) if out.endswith(".gz") else \
            json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        catalog_mod.write_atomic(Path(out), raw)
        summary["written"] = str(out)
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True, default=str))
    else:
        for k in sorted(summary):
            click.echo(f"{k}: {summary[k]}")
    if result.source != SOURCE_LIVE:
        click.echo(f"ray-nodeless: error: {result.reason}", err=True)
        sys.exit(FAILURE)


@catalog_group.command("info")
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
