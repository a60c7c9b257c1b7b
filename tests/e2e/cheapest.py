"""The cheapest fit of one demand by brute force over the catalog region, independent of the planner: what the
shape-open e2e tests (`ray up` and KubeRay) hold each served demand's machine against."""
from __future__ import annotations

from ray_nodeless.core.catalog import embedded
from ray_nodeless.core.demand import fits, offering_labels, parse_selector
from ray_nodeless.core.family_names import AWS_PREVIOUS_GENERATION
from ray_nodeless.core.node_resources import instance_resources
from ray_nodeless.operate.config import load_provider


def cheapest_fit(cfg: dict, resources: dict, selector: dict | None) -> tuple[float, set[str]]:
    """The cheapest price, and every instance type at that price, over the whole catalog region: offerings the
    cluster's first matching rule allows (capacity, exclusions) whose machine holds the demand and has its labels.
    Independent of the planner: it reads the catalog rows and the settings directly."""
    core = load_provider(cfg["provider"]).core
    rule = core.rules.first_match("x", {k: v for k, v in resources.items() if k in ("CPU", "GPU")} |
                                  ({"GPU": 1} if any(k.startswith("accelerator_type:") for k in resources) else {}),
                                  False)
    capacity = rule.requirements.capacity
    excluded_gpus = core.rules.exclude.exclude_gpus
    sel = parse_selector(selector) if selector else None
    rc = embedded().region("aws", "us-west-2")
    best, names = float("inf"), set()
    for i in range(len(rc.type_ids)):
        o = rc.offering(i)
        t = o.instance_type
        if o.hourly_price is None or o.capacity not in capacity or t.arch != "x86_64":
            continue
        if t.burstable or t.accelerator:
            continue      # only when named (docs/rules.md: the planner's documented defaults)
        if t.family in AWS_PREVIOUS_GENERATION and not core.allow_previous_generation:
            continue      # previous generation: left out by default (docs/rules.md)
        if t.gpu_count and t.gpu_model in excluded_gpus:
            continue
        if t.gpu_count and not (resources.get("GPU") or any(k.startswith("accelerator_type:") for k in resources)):
            continue      # GPU instances only for GPU work (docs/rules.md: the planner's documented default)
        node = instance_resources(t, {})
        want = {k: v for k, v in resources.items() if not k.startswith("accelerator_type:")}
        accel = [k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")]
        if accel and t.gpu_model != accel[0]:
            continue
        if not fits(node, want) or (sel is not None and not sel.matches(offering_labels(o))):
            continue
        if o.hourly_price < best - 1e-12:
            best, names = o.hourly_price, {t.name}
        elif abs(o.hourly_price - best) <= 1e-12:
            names.add(t.name)
    return best, names
