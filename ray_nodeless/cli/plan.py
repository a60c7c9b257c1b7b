"""`ray-nodeless plan`: the instance each node type of a cluster YAML gets, and why, or one ad-hoc shape's; on a
shape-open cluster the shapes it can serve and their cheapest fits; with `--demand`, what one Ray demand gets.

It never launches anything: it is the cost preview. The demand answers are `cli/plan_open.py`'s, from the monitor's
own fitter.
"""
from __future__ import annotations

import datetime
import json
import sys
from typing import Any

import click

from ray_nodeless.cli.errors import BAD_INPUT, user_errors
from ray_nodeless.cli.formatting import demand_dict, demand_lines, menu_lines, offer_price
from ray_nodeless.cli.plan_open import OpenPreview, offering_dict, parse_cli_demand
from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.demand import Demand
from ray_nodeless.core.idle import SOURCE_BREAK_EVEN, SOURCE_CLUSTER, SOURCE_NODE_TYPE, IdleTimeout
from ray_nodeless.core.cluster_plan import ClusterPlan, load_cluster_yaml, planner_for
from ray_nodeless.core.planner import Plan
from ray_nodeless.core.settings import CoreSettings
from ray_nodeless.core.requirements import GIB, Request, Shape, parse_requirements
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers import price_clouds


def _plan_lines(name: str | None, plan: Plan, alternatives: int = 3) -> list[str]:
    o = plan.chosen
    t = o.instance_type
    gpu = f", {t.gpu_count}x{t.gpu_model}" if t.gpu_count else ""
    head = f"{name}: " if name else ""
    lines = [
        f"{head}{plan.request.shape.describe()} -> {t.name} ({t.vcpus:g} vCPU, {t.memory_gib:g} GiB{gpu}) "
        f"{o.zone} {o.capacity} {offer_price(o)}",
        f"    rule: {plan.request.rule}; {len(plan)} candidates of {plan.considered} offerings; "
        f"rejected: " + (", ".join(f"{k}={v}" for k, v in plan.rejected.items()) or "none"),
    ]
    for alt in plan.top(alternatives + 1)[1:]:
        lines.append(f"    alternative: {alt.instance_type.name} {alt.zone} {alt.capacity} {offer_price(alt)}")
    return lines


@click.command("plan")
@click.argument("cluster_yaml", required=False, type=click.Path(dir_okay=False))
@click.option("--cloud", type=click.Choice(price_clouds()), help="Ad-hoc shape: the catalog's cloud.")
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
@click.option("--demand", help='With CLUSTER_YAML: one Ray demand, e.g. \'{"GPU": 2}\' or '
                                 '\'{"GPU": 1, "accelerator_type:L4": 0.001}\' (memory in bytes or "64GiB").')
@click.option("--label-selector", "label_selectors", multiple=True,
              help='With --demand: a Ray label selector, e.g. \'{"ray.io/market-type": "on-demand"}\' ("v", "!v", '
                   '"in(a,b)", "!in(a,b)"); repeat for fallbacks, in order.')
@click.option("--reservations", "live_reservations", is_flag=True,
              help="With CLUSTER_YAML: list the cloud's capacity reservations now (a call to the cloud) and show "
                   "the one each node type whose rule lists `reserved` would use.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def plan_command(cluster_yaml: str | None, cloud: str | None, region: str | None, cpu: float, gpu: int, memory: float,
         families, exclude_families, instance_types, gpus, exclude_gpus, capacity, arch, zones, max_price,
         alternatives: int, demand: str | None, label_selectors: tuple[str, ...], live_reservations: bool,
         as_json: bool) -> None:
    """Show the instance each node type of CLUSTER_YAML gets, and why (on a shape-open cluster, the shapes it can
    serve); with --demand, what one demand gets; or plan one ad-hoc shape."""
    with user_errors():
        if label_selectors and demand is None:
            raise ConfigError("--label-selector", "goes with --demand")
        if demand is not None and not cluster_yaml:
            raise ConfigError("--demand", "needs CLUSTER_YAML (its rules decide what the demand gets)")
        if cluster_yaml:
            if cloud or region:
                raise ConfigError("--cloud/--region", "give either CLUSTER_YAML or an ad-hoc shape, not both")
            if demand is not None:
                d = parse_cli_demand(demand, label_selectors)    # bad input fails before the YAML is read
                sys.exit(_plan_demand(cluster_yaml, d, alternatives, as_json))
            _plan_cluster(cluster_yaml, alternatives, as_json, live_reservations)
            return
        if live_reservations:
            raise ConfigError("--reservations", "goes with CLUSTER_YAML (its provider block says which cloud)")
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


def _checked(path: str) -> tuple[dict[str, Any], Any, ClusterPlan, OpenPreview]:
    """The YAML as `ray up` prepares and checks it, its plan, and the monitor's fitter for it."""
    from ray_nodeless.operate.config import check_cluster, load_provider, prepare_like_ray_up
    from ray_nodeless.launch.open_types import shape_open
    from ray_nodeless.ray_adapter.bootstrap import settle_images

    manifest = _kuberay(path)
    if manifest is not None:
        # A KubeRay manifest: the config the bridge derives from it (kuberay/convert.py plan_manifest).
        cfg, cp = manifest
        bundle = load_provider(cfg.get("provider"))
    else:
        cfg = prepare_like_ray_up(load_cluster_yaml(path))
        bundle = load_provider(cfg.get("provider"))
        bundle = settle_images(cfg, bundle)    # Ray's default image, as bootstrap_config sets it
        cp = check_cluster(cfg, bundle=bundle)
    is_open = shape_open(cp.settings, cfg.get("available_node_types") or {}, cp.head_node_type)
    head_price = cp.plans[cp.head_node_type].chosen.hourly_price or 0.0
    return cfg, bundle, cp, OpenPreview(cfg, bundle, cp.head_node_type, is_open, head_price)


_KUBERAY_NOTES: dict[str, list[str]] = {}


def _kuberay(path: str) -> tuple[dict[str, Any], ClusterPlan] | None:
    """(config, plan) of a KubeRay manifest (RayCluster / RayJob / RayService) as the bridge derives it; None for
    a cluster YAML."""
    from pathlib import Path

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None                  # load_cluster_yaml names the problem
    if "ray.io/" not in text:
        return None                  # a cluster YAML: the cold plan imports nothing of convert (issue 10)
    from ray_nodeless.kuberay import convert as KC

    try:
        docs = KC.load_documents(text, path)
    except ConfigError:
        return None
    idx = KC.kuberay_indexes(docs)
    if not idx:
        return None
    if len(idx) > 1:
        raise ConfigError(f"documents[{idx[1]}]", f"one KubeRay cluster per file (documents {idx})")
    ray_cr, spec_key = KC.ray_cluster(docs[idx[0]], "" if len(idx) == 1 else f"documents[{idx[0]}]")
    notes: list[str] = []
    cfg, cp = KC.plan_manifest(ray_cr, spec_key, notes=notes)
    _KUBERAY_NOTES[path] = notes
    return cfg, cp


def _plan_cluster(path: str, alternatives: int, as_json: bool, live_reservations: bool = False) -> None:
    cfg, bundle, cp, preview = _checked(path)
    backend = bundle.backend_config
    menu = preview.menu() if preview.shape_open else None
    reserved = reservation_plan(cfg, bundle, cp, live_reservations)
    if as_json:
        doc = cp.to_dict()
        for name, r in reserved.items():
            doc["node_types"][name]["reservation"] = r
        doc["shape_open"] = preview.shape_open
        if menu is not None:
            doc["menu"] = [{"demand": label, "resources": d.res, "fit": offering_dict(t)} for label, d, t in menu[0]]
            doc["forbidden"] = [{"demand": label, "resources": d.res, "reason": why} for label, d, why in menu[1]]
        doc["reversion"] = cp.settings.reversion.model_dump()
        if preview.shape_open and path not in _KUBERAY_NOTES:
            ceiling, why = open_ceiling(cp, preview)
            doc["summary"]["ceiling_cost_per_hour"] = ceiling      # the head's price alone is no ceiling here
            doc["summary"]["ceiling"] = why
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    s = cp.settings
    # A backend that is not a priced cloud (local, a test backend) is priced as `simulate_cloud`.
    where = f"{s.cloud} {s.region}" + (f" (priced as {s.price_cloud})" if s.price_cloud != s.cloud else "")
    click.echo(f"cluster {cfg.get('cluster_name', '?')}: {where}, catalog {cp.catalog_id}")
    # The head first, then worker types by name.
    for name in sorted(cp.plans, key=lambda n: (n != cp.head_node_type, n)):
        p = cp.plans[name]
        nt = cp.node_types[name]
        if name == cp.head_node_type and path in _KUBERAY_NOTES:
            click.echo(f"[head] {name}: KubeRay's head pod (the operator runs it on an existing Node; not launched "
                       "by ray_nodeless, not in the costs)")
            continue
        if name == cp.head_node_type:
            role = "head"
        else:
            role = f"workers {int(nt.get('min_workers', 0))}..{int(nt.get('max_workers', cp.global_max_workers))}"
        lines = _plan_lines(name, p, alternatives)
        lines[0] = f"[{role}] " + lines[0]
        if name in reserved:
            lines.append(f"    {reservation_line(reserved[name])}")
        if name in cp.idle:
            lines.append(f"    {_idle_line(cp.idle[name], cfg, cp.settings)}")
        if name in cp.left_out:
            o = cp.left_out[name]
            lines.append(f"    previous generation left out: {o.instance_type.name} {o.zone} {o.capacity} "
                         f"{offer_price(o)} would be cheaper (provider.allow_previous_generation: true allows it)")
        lines += [f"    {note}" for note in backend.plan_notes(nt.get("node_config") or {})]
        click.echo("\n".join(lines))
    if menu is not None:
        click.echo("\n".join(menu_lines(preview, *menu, max_workers=cp.global_max_workers)))
    click.echo(s.reversion.describe())      # provider.reversion (core/reversion.py)
    c = cp.cost
    if path in _KUBERAY_NOTES:
        head = cp.plans[cp.head_node_type].chosen.hourly_price or 0.0
        for note in _KUBERAY_NOTES[path]:
            click.echo(f"note: {note}")
        if preview.shape_open:
            ceiling, why = open_ceiling(cp, preview, head_launched=False)
            click.echo(f"idle cost: ${c.idle_cost_per_hour - head:.4f}/h (min_workers); ceiling: ${ceiling:.4f}/h "
                       f"({why}; the head pod not counted)")
            return
        click.echo(f"idle cost: ${c.idle_cost_per_hour - head:.4f}/h (min_workers); "
                   f"ceiling: ${c.ceiling_cost_per_hour - head:.4f}/h (at max_workers; the head pod not counted)")
        return
    if preview.shape_open:
        click.echo(f"idle cost: ${c.idle_cost_per_hour:.4f}/h (head + min_workers); {_open_ceiling(cp, preview)}")
        return
    at_list = ("" if c.list_idle_cost_per_hour is None else
               f" [list prices: idle ${c.list_idle_cost_per_hour:.4f}/h,"
               f" ceiling ${c.list_ceiling_cost_per_hour:.4f}/h]")
    click.echo(f"idle cost: ${c.idle_cost_per_hour:.4f}/h (head + min_workers); "
               f"ceiling: ${c.ceiling_cost_per_hour:.4f}/h (at max_workers){at_list}")


def open_ceiling(cp: ClusterPlan, preview: OpenPreview, head_launched: bool = True) -> tuple[float | None, str]:
    """A shape-open cluster's ceiling ($/h) and how it is reached: `max_hourly_cost` when set, else the head plus
    max_workers machines at the dearest offering a demand may get (OpenPreview.dearest_offering); None when
    unbounded by either (max_workers 0 is no machine: the head's price). `head_launched=False`: a KubeRay head
    pod, which ray_nodeless does not launch, is not counted."""
    head = (cp.plans[cp.head_node_type].chosen.hourly_price or 0.0) if head_launched else 0.0
    o = preview.dearest_offering()
    n = cp.global_max_workers
    at_max = None if o is None else head + n * (o.hourly_price or 0.0)
    what = ("no offering any demand may get" if o is None else
            (f"head ${head:.4f}/h + " if head_launched else "") +
            f"max_workers {n} x the dearest allowed offering, {o.instance_type.name} {o.zone} "
            f"{o.capacity} ${o.hourly_price:.4f}/h")
    cap = cp.settings.max_hourly_cost
    if cap is not None and (at_max is None or cap < at_max):
        return cap, f"provider.max_hourly_cost; {what}" + ("" if at_max is None else f" would be ${at_max:.4f}/h")
    return at_max if at_max is not None else head, what


def _open_ceiling(cp: ClusterPlan, preview: OpenPreview) -> str:
    ceiling, why = open_ceiling(cp, preview)
    return f"ceiling: ${ceiling:.4f}/h ({why})"


def _idle_line(idle: IdleTimeout, cfg: dict[str, Any], settings: CoreSettings) -> str:
    """How long an idle worker of the type is kept (core/idle.py), sooner where its gaps turn out long
    (core/idle_gaps.py), and what Ray's v1 autoscaler does instead."""
    when = "never released" if idle.seconds is None else f"{idle.seconds:g} s"
    why = {SOURCE_BREAK_EVEN: "break-even of keeping it idle against relaunching it",
           SOURCE_NODE_TYPE: "the node type's idle_timeout_s",
           SOURCE_CLUSTER: "idle_timeout_minutes"}[idle.source]
    line = f"idle release: {when} ({why})"
    if settings.cost_aware_idle and settings.idle.learn_gaps and idle.source != SOURCE_NODE_TYPE:
        line += f", or {settings.idle.learn_min_gap_s:g} s once the type's idle gaps are longer than a launch"
    if idle.source != SOURCE_CLUSTER:
        minutes = cfg.get("idle_timeout_minutes")
        line += f"; Ray v1 reads only idle_timeout_minutes ({'none' if minutes is None else f'{minutes:g} min'})"
    return line


def reservation_plan(cfg: dict[str, Any], bundle: Any, cp: ClusterPlan, live: bool) -> dict[str, dict[str, Any]]:
    """Per node type whose rule lists capacity `reserved`: the reservation a launch would use now (`live`: listed
    from the cloud through the backend, as the launcher lists them), else that they are listed at launch."""
    from ray_nodeless.launch.reservations import ReservationBook

    names = [n for n, p in cp.plans.items() if "reserved" in p.request.capacity]
    if not names:
        return {}
    if not live:
        return {n: {"listed": False} for n in names}
    r = cp.settings.reservations
    cloud = bundle.make_backend(str(cfg.get("cluster_name", "")))
    try:
        every = cloud.reservations()
    finally:
        cloud.close()
    book = ReservationBook(lambda: every, ids=r.ids, tags=r.tags, refresh_s=0, block_drain_s=r.block_drain_s)
    by_id = {x.id: x for x in every}
    out: dict[str, dict[str, Any]] = {}
    for n in names:
        cands = book.candidates(cp.plans[n], 1)
        first = cands[0] if cands else None
        use = by_id.get(book.reservation_of(first)) if first is not None else None
        out[n] = {"listed": True, "reservations": len(every), "selected": len(book.listed()),
                  "would_use": None if use is None else {
                      "id": use.id, "instance_type": use.instance_type, "zone": use.zone, "available": use.available,
                      "total": use.total, "match": use.match, "kind": use.kind, "end": use.end,
                      "hourly_price": first.hourly_price if first is not None else None}}
    return out


def reservation_line(r: dict[str, Any]) -> str:
    if not r["listed"]:
        return ("capacity reserved first: the region's capacity reservations are listed at launch "
                "(`ray-nodeless plan --reservations` lists them now)")
    use = r["would_use"]
    if use is None:
        return (f"capacity reserved: none of the {r['selected']} usable reservation(s) ({r['reservations']} listed) "
                "matches this type's plan with room: the rule's next capacity type")
    until = "" if use["end"] is None else f", ends {datetime.datetime.fromtimestamp(use['end']):%Y-%m-%d %H:%M}"
    return (f"capacity reserved: would use {use['id']} ({use['instance_type']} in {use['zone']}, {use['available']} "
            f"of {use['total']} free, {use['match']}, {use['kind']}{until}) at ${use['hourly_price']:.4f}/h, "
            "its on-demand price")


def _plan_demand(path: str, demand: Demand, alternatives: int, as_json: bool) -> int:
    """Print what `demand` gets on the cluster of `path`; the exit status: 0 when the cluster serves it, else 2."""
    _, _, cp, preview = _checked(path)
    p = preview.preview(demand, alternatives)
    instances = {d.name: cp.plans[d.name].chosen for d in p.declared}
    served = bool(p.declared) or p.on_head or (p.shape_open and p.fit is not None and not p.over_budget)
    if as_json:
        click.echo(json.dumps(demand_dict(p, instances, served), indent=2, sort_keys=True))
    else:
        click.echo("\n".join(demand_lines(p, instances)))
    if not served:
        if p.reason:
            why = p.reason
        elif p.shape_open:
            why = f"{demand.describe()}: {p.over_budget}"
        else:
            why = (f"no declared worker node type holds {demand.describe()} and the cluster is not shape-open "
                   f"(provider.open_shapes): Ray reports it as infeasible")
        click.echo(f"ray-nodeless: error: {why.splitlines()[0]}", err=True)
        return BAD_INPUT
    return 0
