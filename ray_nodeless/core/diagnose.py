"""Which key left a node type with no offering, and what it would get without it.

The planner's NoFeasibleOffering counts rejections by reason ("instance_type_not_allowed=12778"): true, but it
names neither the key nor the value at fault. A node type's requirements are composed from up to four places
(the matching rule, its node_config's constraint keys, what its backend keys imply such as AWS `InstanceType`,
and `provider.exclude`), combined as `Resolver.request` combines them (core/settings.py). Here each constraint of
each place is lifted in turn and the node type planned again: the keys whose removal alone gives an offering
emptied it, and the offering it would then get is the nearest. When no single key does it, the shape is checked
alone (a GPU count or a memory size no instance of the region has names `resources.<name>`); else the message
names every place that constrains the node type (their combination leaves nothing).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

from ray_nodeless.core.documents import Document, DocumentView
from ray_nodeless.core.catalog import CAPACITY_TYPES, InstanceType, Offering, RegionCatalog
from ray_nodeless.core.catalog_checks import provider_key_holding
from ray_nodeless.core.requirements import (
    ARCHES, Request, Requirements, Shape, parse_requirements, split_node_config,
)
from ray_nodeless.errors import ConfigError, NoFeasibleOffering
from ray_nodeless.core.plan import Plan

if TYPE_CHECKING:
    from ray_nodeless.core.settings import CoreSettings   # settings imports nothing of this module's callers

# provider.exclude spells its exclusions without the `exclude_` prefix.
_EXCLUDE_SPELLING = {"exclude_families": "families", "exclude_gpus": "gpus",
                     "exclude_instance_types": "instance_types"}
_DEFAULTS = Requirements()
_MOST_CULPRITS = 3


def _set_fields(req: Requirements) -> list[str]:
    return [f.name for f in dataclasses.fields(Requirements) if getattr(req, f.name) != getattr(_DEFAULTS, f.name)]


def _describe(o: Offering) -> str:
    t = o.instance_type
    gpu = f", {t.gpu_count}x{t.gpu_model}" if t.gpu_count else ""
    price = "unknown" if o.hourly_price is None else f"${o.hourly_price:.4f}/h"
    return f"{t.name} ({t.vcpus:g} vCPU, {t.memory_gib:g} GiB{gpu}) {o.zone} {o.capacity} {price}"


def explain_no_offering(error: NoFeasibleOffering, plan: Callable[[Request], Plan], rc: RegionCatalog,
                        settings: CoreSettings, name: str,
                        node_type: DocumentView, is_head: bool,
                        backend_overrides: Callable[[Document], Document] | None,
                        settings_provider: DocumentView | None = None) -> NoFeasibleOffering:
    """`error` (the planner's, for node type `name`) with the key that emptied it first. `plan` is the planner's
    `plan` (cached: the re-plans cost a few ms each, and only a failing config pays them); `rc` the region."""
    key = f"available_node_types.{name}"
    resources = node_type.get("resources") or {}
    shape = Shape.from_resources(resources, f"{key}.resources")
    nc = node_type.get("node_config") or {}
    ours, theirs = split_node_config(nc)
    rule = settings.rules.first_match(name, resources, is_head)
    implied = backend_overrides(dict(theirs)) if backend_overrides else {}
    pins: dict[str, str] = {}
    if backend_overrides:
        # What the provider block alone implies (AWS availability_zone, subnets) is the provider's, not a key's.
        from_provider = backend_overrides({})
        for field, value in from_provider.items():
            shown = value[0] if isinstance(value, list) and value else value
            pins[field] = provider_key_holding(settings_provider, str(shown)) if settings_provider else "provider"
        for k in sorted(theirs, key=str):
            for field, value in backend_overrides({k: theirs[k]}).items():
                if from_provider.get(field) != value:
                    pins.setdefault(field, f"{key}.node_config.{k}")
    # (place, requirements, field -> the key it is spelled as), in Resolver's order of composition.
    parts: list[tuple[Requirements, Callable[[str], str]]] = [
        (rule.requirements if rule else Requirements(),
         lambda f: f"provider.rules[{rule.index if rule else '?'}].{f}"),     # no rule: no rule field is set
        (parse_requirements(ours, f"{key}.node_config"), lambda f: f"{key}.node_config.{f}"),
        (parse_requirements(implied, f"{key}.node_config"), lambda f: pins.get(f, f"{key}.node_config")),
        (settings.rules.exclude, lambda f: f"provider.exclude.{_EXCLUDE_SPELLING.get(f, f)}"),
    ]
    rule_name = rule.name if rule else "default"

    def attempt(reqs: list[Requirements]) -> Offering | None:
        try:
            req = reqs[0].narrowed_by(reqs[1], f"{key}.node_config").narrowed_by(
                reqs[2], f"{key}.node_config").narrowed_by(reqs[3], "provider.exclude")
            return plan(Request(cloud=settings.price_cloud, region=settings.region, shape=shape,
                                requirements=req, rule=rule_name, node_type=name)).chosen
        except (NoFeasibleOffering, ConfigError):
            return None

    where = f"in {settings.price_cloud} {settings.region}"
    head = f"leaves node type {name!r} {shape.describe()} with no offering {where} (rule {rule_name!r})"
    culprits: list[tuple[str, Offering]] = []
    for i, (req, spelled) in enumerate(parts):
        for field in _set_fields(req):
            reqs = [r for r, _ in parts]
            reqs[i] = dataclasses.replace(req, **{field: getattr(_DEFAULTS, field)})
            got = attempt(reqs)
            if got is not None and all(spelled(field) != k for k, _ in culprits):
                culprits.append((spelled(field), got))
    if culprits:
        keys = [k for k, _ in culprits[:_MOST_CULPRITS]]
        first, got = culprits[0]
        more = f" (as does {' or '.join(keys[1:])})" if len(keys) > 1 else ""
        text = f"{' / '.join(keys)}: {head}; without {first} the nearest offering is {_describe(got)}{more}"
    else:
        text = _shape_text(plan, rc, settings, name, shape, resources, key, where) or (
            f"{key}: {head}: no single key is at fault; the combination of "
            + ", ".join(sorted({spelled(f) for req, spelled in parts for f in _set_fields(req)}) or ["the defaults"])
            + " leaves nothing")
    return NoFeasibleOffering(f"{text}\n{error}", explanation=error.explanation, key=text.split(":", 1)[0])


def _shape_text(plan: Callable[[Request], Plan], rc: RegionCatalog, settings: CoreSettings, name: str, shape: Shape,
                resources: DocumentView, key: str, where: str) -> str | None:
    """The shape's own misfit (no constraint at all gives an offering), naming the resource; None if it fits."""
    open_req = Requirements(arch=ARCHES, capacity=CAPACITY_TYPES, allow_gpu_instances=True)
    try:
        plan(Request(cloud=settings.price_cloud, region=settings.region, shape=shape, requirements=open_req,
                     rule="default", node_type=name))
        return None
    except NoFeasibleOffering:
        pass
    rc_types = [rc.types[i] for i in sorted(set(rc.type_ids))]
    if shape.accelerator_type:
        with_model = [t for t in rc_types if t.gpu_model == shape.accelerator_type]
        if not with_model:
            return (f"{key}.resources.accelerator_type:{shape.accelerator_type}: no instance type {where} has a "
                    f"{shape.accelerator_type} GPU")
        rc_types = with_model
    checks: tuple[tuple[str, float, Callable[[InstanceType], float], str], ...] = (
        ("GPU", shape.gpu, lambda t: t.gpu_count, "GPUs"), ("CPU", shape.cpu, lambda t: t.vcpus, "vCPUs"),
        ("memory", shape.memory_gib, lambda t: t.memory_gib, "GiB of memory"))
    for res, wanted, have, unit in checks:
        best = max(rc_types, key=lambda t: (have(t), t.name), default=None)
        if best is not None and wanted > have(best):
            shown = f"{wanted:g}" if res != "memory" else f"{wanted:g} GiB"
            return (f"{key}.resources.{res}: {shown} is more than any instance type {where} has (the most is "
                    f"{have(best):g} {unit}, {best.name})")
    return (f"{key}.resources: no instance type {where} has {shape.describe()} at once "
            f"(resources {dict(resources)})")
