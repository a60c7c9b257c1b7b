"""The cheapest fit of one demand by brute force over the catalog region, independent of the planner: what the
shape-open e2e tests (`ray up` and KubeRay) hold each served demand's machine against."""
from __future__ import annotations

from ray_nodeless.core.catalog import embedded
from ray_nodeless.core.demand import fits, offering_labels, parse_selector
from ray_nodeless.core.family_names import AWS_PREVIOUS_GENERATION
from ray_nodeless.core.node_resources import instance_resources
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers.base import TAG_CAPACITY, TAG_INSTANCE_TYPE, TAG_ZONE


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


def check_served(cfg: dict, name: str, want: dict, selector: dict | None, tags: dict, labels: dict, *,
                 unique: bool, hosts: object = None) -> tuple[float, set[str]]:
    """One served demand of a shape-open e2e test, held against the brute force: its machine (`tags`, the
    backend's) holds it; a demand only its own cheapest fit can serve (`unique`: a GPU model, a zone, a market)
    runs there; the Ray node's `labels` tell the truth (market, zone, region, accelerator) and match its selector.
    Returns (its own cheapest price, every instance type at that price)."""
    itype = tags[TAG_INSTANCE_TYPE]
    price, cheapest = cheapest_fit(cfg, want, selector)
    t = embedded().instance_type("aws", itype)
    assert fits(instance_resources(t, {}), {k: v for k, v in want.items()
                                            if not k.startswith("accelerator_type:")}), (name, itype)
    if unique:
        assert itype in cheapest, (f"{name}: got {itype}, the catalog's cheapest fit is {sorted(cheapest)}; "
                                   f"hosts {hosts}")
    assert labels["ray.io/market-type"] == tags[TAG_CAPACITY], (name, labels)
    assert labels["ray.io/availability-zone"] == tags[TAG_ZONE], (name, labels)
    assert labels["ray.io/availability-region"] == "us-west-2", (name, labels)
    if t.gpu_count:
        assert labels["ray.io/accelerator-type"] == t.gpu_model, (name, labels)
    if selector:
        assert parse_selector(selector).matches(labels), (name, labels)
    return price, cheapest
