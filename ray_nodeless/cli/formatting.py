"""Text shared by several commands' human-readable output."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from ray_nodeless.cli.plan_open import DemandPreview, OpenPreview
    from ray_nodeless.core.catalog import Offering
    from ray_nodeless.core.open_plan import OpenType


def price(p: float | None) -> str:
    """An hourly price as the commands print it; `unknown` where the catalog has none."""
    return "unknown" if p is None else f"${p:.4f}/h"


def offer_price(o: Offering) -> str:
    """An offering's effective price, with its list price beside it where a price override changed it."""
    lp, p = o.listed, o.hourly_price
    if lp is not None and p is not None and abs(lp - p) > 5e-7:
        return f"{price(p)} (list {price(lp)})"
    return price(p)


# ----- `plan` of demands (cli/plan_open.py) -------------------------------------------------------------------------

def _labels(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none"


def _resources(res: Mapping[str, float]) -> str:
    def amount(k: str, v: float) -> str:
        return f"{v / 1024 ** 3:.4g} GiB" if k in ("memory", "object_store_memory") else f"{v:g}"
    return ", ".join(f"{k}: {amount(k, float(v))}" for k, v in sorted(res.items())) or "none"


def offering_text(o: Offering) -> str:
    t = o.instance_type
    gpu = f", {t.gpu_count}x{t.gpu_model}" if t.gpu_count else ""
    return f"{t.name} ({t.vcpus:g} vCPU, {t.memory_gib:g} GiB{gpu}) {o.zone} {o.capacity} {offer_price(o)}"


def open_type_lines(t: OpenType, indent: str = "    ") -> list[str]:
    return [f"{indent}node type {t.name}: {offering_text(t.offering)}, rule {t.rule!r}",
            f"{indent}labels (the node carries them): {_labels(dict(t.labels))}",
            f"{indent}resources: {_resources(dict(t.resources))}"]


def demand_lines(p: DemandPreview, instances: Mapping[str, Offering]) -> list[str]:
    """What one demand gets: the declared node type Ray scales for it, or the shape-open cheapest fit, and why."""
    d = p.demand
    lines = [f"demand {d.describe()}"]
    if p.on_head:
        lines.append("  the head node type holds it: Ray runs it there while the head has it free")
    if p.declared:
        best = p.declared[0]
        lines.append(f"  declared node type {best.name!r} holds it: Ray launches it (Ray's v2 scheduler scores "
                     f"declared types by labels, GPU avoidance, utilisation and priority; never by price)")
        lines.append(f"    instance: {offering_text(instances[best.name])}")
        lines.append(f"    resources: {_resources(best.resources)}; labels: {_labels(best.labels)}")
        for other in p.declared[1:]:
            lines.append(f"    also holds it: {other.name!r} {offering_text(instances[other.name])}")
    if p.fit is not None:
        f = p.fit
        if p.declared or p.on_head:
            lines.append("  for comparison, its own cheapest fit under the rules (what shape-open provisioning "
                         "launches for a demand no declared type holds):")
        elif p.shape_open:
            lines.append("  the cluster is shape-open: it launches the cheapest fit under the rules")
        else:
            lines.append("  no declared worker node type holds it; with provider.open_shapes: true the cluster would "
                         "launch the cheapest fit under the rules:")
        lines += open_type_lines(f.chosen)
        if p.over_budget:
            lines.append(f"    over budget: {p.over_budget}")
        for i, why in enumerate(f.skipped):
            lines.append(f"    label selector {i} gets nothing: {why.removeprefix(d.describe() + ': ')}")
        if f.selector is not None:
            which = "its label selector 0" if f.fallback == 0 else f"its fallback label selector {f.fallback}"
            lines.append(f"    matches {which}: {f.selector.describe()}")
        for alt in f.alternatives:
            lines.append(f"    alternative: {offering_text(alt.offering)} ({alt.name})")
    elif p.declared or p.on_head:
        lines.append(f"  no offering would serve it without the declared types: "
                     f"{p.reason.removeprefix(d.describe() + ': ')}")
    else:
        lines.append(f"  nothing allowed can serve it: {p.reason.removeprefix(d.describe() + ': ')}")
    return lines


def demand_dict(p: DemandPreview, instances: Mapping[str, Offering], served: bool) -> dict[str, Any]:
    from ray_nodeless.cli.plan_open import offering_dict

    d = p.demand
    fit = None
    if p.fit is not None:
        fit = offering_dict(p.fit.chosen)
        fit["selector"] = p.fit.selector.describe() if p.fit.selector is not None else None
        fit["fallback"] = p.fit.fallback
    return {"demand": d.describe(), "resources": d.res, "label_selectors": [s.describe() for s in d.selectors],
            "shape_open": p.shape_open, "served": served, "on_head": p.on_head,
            "declared": [{"node_type": x.name, "resources": x.resources, "labels": x.labels,
                          "instance_type": instances[x.name].instance_type.name, "zone": instances[x.name].zone,
                          "capacity": instances[x.name].capacity, "hourly_price": instances[x.name].hourly_price}
                         for x in p.declared],
            "fit": fit, "alternatives": [offering_dict(a) for a in (p.fit.alternatives if p.fit else [])],
            "reason": p.reason or None, "over_budget": p.over_budget or None}


def menu_lines(preview: OpenPreview, served: list, forbidden: list, max_workers: int) -> list[str]:
    """The shape-open cluster's menu: representative demands, their cheapest fits, and what is forbidden."""
    s = preview.settings
    lines = [f"shape-open: every pending demand no declared worker type holds gets its cheapest fit "
             f"(up to max_workers {max_workers}"
             + (f", max_hourly_cost ${s.max_hourly_cost:.4f}/h" if s.max_hourly_cost else "")
             + (", a placement group's machines in one zone" if s.single_zone_gangs else "") + ")"]
    rows = [("demand", "node type", "instance", "zone", "market", "$/h", "rule")]
    for label, _, t in served:
        o = t.offering
        rows.append((label, t.name, o.instance_type.name, o.zone, o.capacity,
                     f"{o.hourly_price:.4f}" if o.hourly_price is not None else "unknown", t.rule))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if forbidden:
        lines.append("forbidden:")
        lines += [f"  {label}: {why}" for label, _, why in forbidden]
    lines.append("  (ray-nodeless plan CLUSTER_YAML --demand '{\"GPU\": 2}' shows one demand's fit, labels and "
                 "alternatives)")
    return lines
