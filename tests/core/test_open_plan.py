"""Shape-open provisioning, the pure part: one demand's cheapest fit under the rules and its labels, and the packing
of many demands (first-fit-decreasing, grouping when a bigger machine is cheaper, gangs in one zone)."""
from __future__ import annotations

import pytest
import yaml

from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.catalog import embedded
from ray_nodeless.core.family_names import AWS_PREVIOUS_GENERATION
from ray_nodeless.core.demand import (
    Demand, NodeCapacity, canonical_resources, fits, offering_labels, parse_demand, parse_selector,
)
from ray_nodeless.core.node_resources import instance_resources
from ray_nodeless.core.open_pack import Packer
from ray_nodeless.core.open_plan import OpenFitter, type_name
from ray_nodeless.core.planner import Planner
from ray_nodeless.core.settings import Resolver
from ray_nodeless.errors import ConfigError, NoFeasibleOffering
from ray_nodeless.operate.config import catalog_for, load_provider
from tests import REPO_ROOT

GIB = 1024 ** 3


def _fitter(**provider) -> OpenFitter:
    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "local-nodeless.yaml").read_text())
    cfg["provider"].update(provider)
    bundle = load_provider(cfg["provider"])
    return OpenFitter(Resolver(bundle.core, bundle.requirement_overrides), Planner(catalog_for(bundle.core)),
                      UnavailableOfferings(180), bundle.core.open_node_config)


@pytest.fixture(scope="module")
def fitter() -> OpenFitter:
    return _fitter()


def _cheapest(resources: dict, selector: dict | None = None, capacity=("spot", "on-demand")) -> float:
    """Brute force over the catalog rows: the lowest price of an allowed offering whose machine holds the demand."""
    return min((o.hourly_price for o in _allowed_rows(resources, selector, capacity)), default=float("inf"))


def _allowed_rows(resources: dict, selector: dict | None = None, capacity=("spot", "on-demand")) -> list:
    """Brute force over the catalog rows: the allowed offerings whose machine holds the demand."""
    sel = parse_selector(selector) if selector else None
    rc = embedded().region("aws", "us-west-2")
    want = {k: v for k, v in resources.items() if not k.startswith("accelerator_type:")}
    accel = [k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")]
    out = []
    for i in range(len(rc.type_ids)):
        o = rc.offering(i)
        t = o.instance_type
        if (o.hourly_price is None or o.capacity not in capacity or t.arch != "x86_64" or t.burstable
                or t.accelerator or (t.gpu_count and t.gpu_model in ("M60", "K80"))
                or t.family in AWS_PREVIOUS_GENERATION):     # left out by default (allow_previous_generation)
            continue
        if t.gpu_count and not (want.get("GPU") or accel):
            continue
        if accel and t.gpu_model != accel[0]:
            continue
        if fits(instance_resources(t, {}), want) and (sel is None or sel.matches(offering_labels(o))):
            out.append(o)
    return out


@pytest.mark.parametrize("text", ['{"CPU": 1}', '{"CPU": 16}', '{"CPU": 1, "GPU": 2}', '{"GPU": 1}',
                                  '{"GPU": 1, "accelerator_type:L4": 0.001}', '{"memory": "64GiB", "CPU": 1}',
                                  '{"GPU": 1, "accelerator_type:A100": 0.001}'])
def test_fit_is_the_catalog_cheapest_that_holds_the_demand(fitter, text):
    d = parse_demand(text)
    t = fitter.fit(d)
    assert t.price == pytest.approx(_cheapest(d.res))
    node = dict(t.resources)
    assert fits(node, {k: v for k, v in d.res.items() if not k.startswith("accelerator_type:")})
    assert t.name == type_name(t.offering) and len(t.name) <= 63
    if d.accelerator:
        assert node[f"accelerator_type:{d.accelerator}"] == 1
        assert dict(t.labels)["ray.io/accelerator-type"] == d.accelerator


@pytest.mark.parametrize("text, selector", [('{"CPU": 1}', None), ('{"CPU": 1, "GPU": 2}', None),
                                            ('{"GPU": 1, "accelerator_type:L4": 0.001}', None),
                                            ('{"memory": "64GiB", "CPU": 1}', None),
                                            ('{"CPU": 2}', {"ray.io/availability-zone": "!in(us-west-2a)"})])
def test_allowed_is_every_offering_the_fit_chooses_from(fitter, text, selector):
    # benches/lp_bound.py bounds the packing over these: exactly the brute force's set, the fit first.
    d = parse_demand(text, [selector] if selector else [])
    sel = d.selectors[0] if d.selectors else None
    allowed = fitter.allowed(d, sel)
    assert allowed[0] == fitter.fit(d, sel)
    assert {t.offering for t in allowed} == set(_allowed_rows(d.res, selector))
    assert len({t.offering for t in allowed}) == len(allowed)


def test_memory_demand_counts_rays_share_of_the_ram(fitter):
    # Ray's `memory` resource is 70 % of the RAM: 64 GiB of task memory needs more than a 64 GiB machine.
    t = fitter.fit(parse_demand('{"CPU": 1, "memory": "64GiB"}'))
    assert dict(t.resources)["memory"] >= 64 * GIB
    assert t.offering.instance_type.memory_gib > 64


@pytest.mark.parametrize("selector", [{"ray.io/market-type": "on-demand"}, {"ray.io/availability-zone": "us-west-2b"},
                                      {"ray.io/availability-zone": "!in(us-west-2a,us-west-2b)"},
                                      {"ray.io/market-type": "!spot"}])
def test_label_selectors_pick_the_cheapest_offering_with_those_labels(fitter, selector):
    d = parse_demand('{"CPU": 1}', [selector])
    t = fitter.fit(d, d.selectors[0])
    labels = dict(t.labels)
    assert d.selectors[0].matches(labels)
    assert labels == offering_labels(t.offering)     # the type promises exactly what the machine is
    assert t.price == pytest.approx(_cheapest(d.res, selector))


def test_excluded_gpu_model_is_reported_with_the_reason(fitter):
    with pytest.raises(NoFeasibleOffering) as e:
        fitter.fit(parse_demand('{"GPU": 1, "accelerator_type:K80": 0.001}'))
    assert "K80" in str(e.value)


def test_custom_resource_is_not_served_by_a_generated_type(fitter):
    with pytest.raises(NoFeasibleOffering, match="custom_thing"):
        fitter.fit(parse_demand('{"CPU": 1, "custom_thing": 1}'))


def test_a_label_no_offering_has_names_the_selector(fitter):
    d = parse_demand('{"CPU": 1}', [{"ray.io/availability-zone": "eu-west-1a"}])
    with pytest.raises(NoFeasibleOffering, match="eu-west-1a"):
        fitter.fit(d, d.selectors[0])


def test_unavailable_offering_is_skipped_for_the_next():
    f = _fitter()
    d = parse_demand('{"GPU": 1}')
    first = f.fit(d)
    f.unavailable.mark(first.offering, "InsufficientInstanceCapacity")
    second = f.fit(d)
    assert second.offering.key != first.offering.key and second.price >= first.price


def test_a_fallback_is_served_once_capacity_errors_took_every_offering_of_the_primary():
    """Ray's fallback_strategy after capacity errors: while any offering of the primary selector may have capacity
    it is served (the next one after each failure); once every fitting offering of the primary's zone failed (as
    the launcher marks them, UnavailableOfferings), the first fallback is; when their backoff ends, the primary
    again."""
    from ray_nodeless.testing.clock import FakeClock
    clock = FakeClock()
    f = _fitter()
    f.unavailable = UnavailableOfferings(180, clock)
    d = parse_demand('{"CPU": 2, "GPU": 1}', [{"ray.io/availability-zone": "us-west-2a"},
                                              {"ray.io/availability-zone": "us-west-2b"}])

    def served():
        packing = Packer(f).pack([d], [])
        [name] = packing.new
        return packing.types[name]
    first = served()
    assert first.offering.zone == "us-west-2a" and dict(first.labels)["ray.io/availability-zone"] == "us-west-2a"
    f.unavailable.mark(first.offering, "InsufficientInstanceCapacity")
    assert served().offering.zone == "us-west-2a"          # the primary's next offering
    for o in f.planner.plan(f.resolver.request("x", {"CPU": 2, "GPU": 1}, {}, False)).candidates():
        if o.zone == "us-west-2a":
            f.unavailable.mark(o, "InsufficientInstanceCapacity")
    fallback = served()
    assert fallback.offering.zone == "us-west-2b" and dict(fallback.labels)["ray.io/availability-zone"] == \
        "us-west-2b"
    assert fallback.price == pytest.approx(_cheapest({"CPU": 2, "GPU": 1}, {"ray.io/availability-zone": "us-west-2b"}))
    clock.advance(181)                                      # the backoff ended: the primary is probed again
    assert served().offering.zone == "us-west-2a"


def test_parse_demand_errors_name_the_key():
    with pytest.raises(ConfigError, match="--demand.CPU"):
        parse_demand('{"CPU": -1}')
    with pytest.raises(ConfigError, match="--demand"):
        parse_demand("[1]")
    with pytest.raises(ConfigError, match="--label-selector.ray.io/market-type"):
        parse_selector({"ray.io/market-type": ""})
    sel = parse_selector({"ray.io/availability-zone": "in(a, b)", "ray.io/market-type": "!spot"})
    assert sel.matches({"ray.io/availability-zone": "b", "ray.io/market-type": "on-demand"})
    assert not sel.matches({"ray.io/availability-zone": "b", "ray.io/market-type": "spot"})


# ----- packing ------------------------------------------------------------------------------------------------------

def test_demands_share_open_machines_first_fit_decreasing(fitter):
    packing = Packer(fitter).pack([parse_demand('{"CPU": 1, "GPU": 1}'), Demand(canonical_resources({"CPU": 1}),
                                                                                count=3)], [])
    # The GPU machine opened for the GPU task (g6.xlarge, 4 CPUs) has room for the three 1-CPU tasks: as Ray's
    # scheduler, they go there rather than on machines of their own.
    [(name, count)] = packing.new.items()
    assert count == 1 and packing.types[name].offering.instance_type.gpu_count == 1
    assert packing.hourly <= 3 * _cheapest({"CPU": 1}) + _cheapest({"CPU": 1, "GPU": 1}) + 1e-9
    # Non-GPU capacity is preferred when there is some.
    cpu_node = NodeCapacity("ray:i-cpu", {"CPU": 2.0}, {})
    gpu_node = NodeCapacity("ray:a-gpu", {"CPU": 4.0, "GPU": 1.0}, {}, has_gpu=True)
    packed = Packer(fitter).pack([Demand(canonical_resources({"CPU": 1}), count=2)], [gpu_node, cpu_node])
    assert not packed.new


def test_the_dearest_fit_opens_first_and_the_rest_fill_its_room(fitter):
    """One A100 task (its cheapest fit a p4d.24xlarge: 8 GPUs) and three 2-GPU tasks: packed by GPU count first, the
    2-GPU tasks opened machines of their own before the p4d; the dearest fit first, they go on the p4d's seven
    spare GPUs (benches/bench_packing_bound.py: the LP bound's cover)."""
    a100 = parse_demand('{"GPU": 1, "accelerator_type:A100": 0.001}')
    two = Demand(canonical_resources({"GPU": 2}), count=3)
    packing = Packer(fitter).pack([two, a100], [])
    [(name, count)] = packing.new.items()
    assert count == 1 and packing.types[name].offering.instance_type.gpu_model == "A100"
    assert packing.hourly == pytest.approx(_cheapest(a100.res))
    assert packing.hourly < _cheapest(a100.res) + 3 * _cheapest({"GPU": 2})


def test_selector_demands_are_placed_before_free_ones(fitter):
    # The selector-free task must not take the only on-demand machine's room from the task that needs on-demand.
    od = NodeCapacity("machine:a-od", {"CPU": 1.0}, {"ray.io/market-type": "on-demand"})
    packing = Packer(fitter).pack([parse_demand('{"CPU": 1}'),
                                   parse_demand('{"CPU": 1}', [{"ray.io/market-type": "on-demand"}])], [od])
    [name] = packing.new
    assert dict(packing.types[name].labels)["ray.io/market-type"] == "spot"


def test_free_capacity_of_existing_and_launching_nodes_is_used_first(fitter):
    node = NodeCapacity("ray:i-1", {"CPU": 4.0}, {"ray.io/market-type": "spot"})
    packing = Packer(fitter).pack([Demand(canonical_resources({"CPU": 1}), count=4)], [node])
    assert not packing.new
    packing = Packer(fitter).pack([Demand(canonical_resources({"CPU": 1}), count=5)], [node])
    assert sum(packing.new.values()) == 1


def test_selector_keeps_demand_off_nodes_without_the_label(fitter):
    node = NodeCapacity("ray:i-1", {"CPU": 4.0}, {"ray.io/market-type": "spot"})
    d = parse_demand('{"CPU": 1}', [{"ray.io/market-type": "on-demand"}])
    packing = Packer(fitter).pack([d], [node])
    [name] = packing.new
    assert dict(packing.types[name].labels)["ray.io/market-type"] == "on-demand"


def test_grouping_opens_one_bigger_machine_when_it_costs_less_per_demand(fitter):
    d = Demand(canonical_resources({"CPU": 2}), count=8)
    packing = Packer(fitter).pack([d], [])
    assert packing.hourly <= 8 * fitter.fit(Demand(canonical_resources({"CPU": 2}))).price + 1e-9
    capacity = sum(dict(packing.types[n].resources)["CPU"] * c for n, c in packing.new.items())
    assert capacity >= 16


def test_strict_spread_gang_gets_distinct_machines_in_one_zone(fitter):
    gang = [Demand(canonical_resources({"CPU": 1, "GPU": 1}), gang="pg1", spread=True) for _ in range(3)]
    packing = Packer(fitter).pack(gang, [])
    assert sum(packing.new.values()) == 3
    assert len({packing.types[n].offering.zone for n in packing.new}) == 1


def test_gang_zone_follows_the_zone_that_cannot_fail():
    f = _fitter()
    gang = [Demand(canonical_resources({"CPU": 1, "GPU": 1}), gang="pg1", spread=True) for _ in range(2)]
    first = Packer(f).pack(gang, [])
    [zone] = {first.types[n].offering.zone for n in first.new}
    # Every offering of the first zone for that shape fails: the whole gang moves to one other zone.
    for o in f.planner.plan(f.resolver.request("x", {"CPU": 1, "GPU": 1}, {}, False)).candidates():
        if o.zone == zone:
            f.unavailable.mark(o, "InsufficientInstanceCapacity")
    moved = Packer(f).pack(gang, [])
    zones = {moved.types[n].offering.zone for n in moved.new}
    assert len(zones) == 1 and zones != {zone}


def test_single_zone_gangs_off_takes_each_bundles_cheapest(fitter):
    gang = [Demand(canonical_resources({"CPU": 1, "GPU": 1}), gang="pg1", spread=True) for _ in range(2)]
    packing = Packer(fitter, single_zone_gangs=False).pack(gang, [])
    assert sum(packing.new.values()) == 2


def test_strict_pack_gang_gets_one_machine_for_the_sum(fitter):
    gang = [Demand(canonical_resources({"CPU": 8}), gang="pg2", packed=True) for _ in range(2)]
    packing = Packer(fitter).pack(gang, [])
    [(name, count)] = packing.new.items()
    assert count == 1 and dict(packing.types[name].resources)["CPU"] >= 16


def test_infeasible_demand_is_reported_and_the_rest_packed(fitter):
    packing = Packer(fitter).pack([parse_demand('{"GPU": 1, "accelerator_type:K80": 0.001}'),
                                   parse_demand('{"CPU": 2}')], [])
    [(d, why)] = packing.infeasible.items()
    assert "K80" in why and d.accelerator == "K80"
    assert sum(packing.new.values()) == 1


def test_packing_is_deterministic(fitter):
    demands = [parse_demand('{"CPU": 1}'), parse_demand('{"GPU": 1}'), Demand(canonical_resources({"CPU": 4}), count=3),
               parse_demand('{"CPU": 1}', [{"ray.io/availability-zone": "us-west-2c"}])]
    a = Packer(fitter).pack(demands, [])
    b = Packer(fitter).pack(list(reversed(demands)), [])
    assert a.new == b.new


def test_a_demand_the_exclusion_forbids_names_the_exclusion_and_the_nearest_offering():
    f = _fitter(exclude={"gpus": ["M60", "K80", "V100"]})
    with pytest.raises(NoFeasibleOffering) as e:
        f.fit(parse_demand('{"GPU": 1, "accelerator_type:V100": 0.001}'))
    text = str(e.value)
    assert "provider.exclude.gpus" in text and "nearest offering is p3" in text, text


def _cover_prices(fitter, shape: dict, k: int) -> dict[int, float]:
    """Brute force: the cheapest fit of m x `shape` (m = 1..k) in the zone of the shape's own cheapest fit."""
    zone = fitter.fit(Demand(canonical_resources(shape))).offering.zone
    out = {}
    for m in range(1, k + 1):
        try:
            out[m] = fitter.fit(Demand(canonical_resources({key: v * m for key, v in shape.items()})), None, zone,
                                quiet=True).price
        except NoFeasibleOffering:
            continue
    return out


def _best_composition(prices: dict[int, float], k: int) -> float:
    """Every way of covering k equal bundles with machines of the sizes priced (the last may hold fewer)."""
    best = [0.0] + [float("inf")] * k
    for n in range(1, k + 1):
        best[n] = min(best[max(0, n - m)] + p for m, p in prices.items())
    return best[k]


@pytest.mark.parametrize("shape, k", [({"CPU": 3}, 6), ({"CPU": 6}, 3), ({"CPU": 3}, 8), ({"CPU": 10}, 4),
                                      ({"CPU": 1, "GPU": 1}, 4), ({"CPU": 2, "memory": 20 * 2**30}, 5)])
def test_a_gangs_equal_bundles_get_the_cheapest_mix_of_machine_sizes(fitter, shape, k):
    """A placement group that is not STRICT_SPREAD or STRICT_PACK: its bundles may share machines, so the packer
    takes the cheapest mix of a bigger and smaller machines (issue 29: before, all on one or one each)."""
    gang = [Demand(canonical_resources(shape), gang="pg") for _ in range(k)]
    packing = Packer(fitter).pack(gang, [])
    prices = _cover_prices(fitter, shape, k)
    assert packing.hourly <= _best_composition(prices, k) + 1e-9     # a machine may hold more than it was fit for
    assert packing.hourly <= min(k * prices[1], prices.get(k, float("inf"))) + 1e-9
    held = sum(dict(packing.types[n].resources).get("CPU", 0) * c for n, c in packing.new.items())
    assert held >= shape["CPU"] * k


def test_the_mix_is_cheaper_than_either_pure_split(fitter):
    """6 x {CPU: 3} in us-west-2: an r7i.4xlarge for four and an r7i.xlarge for two cost less than six machines
    or one that holds all six (the catalog's spot prices; the brute force above says it is the cheapest mix)."""
    prices = _cover_prices(fitter, {"CPU": 3}, 6)
    packing = Packer(fitter).pack([Demand(canonical_resources({"CPU": 3}), gang="pg") for _ in range(6)], [])
    assert packing.hourly < min(6 * prices[1], prices[6]) - 0.01
    assert len(packing.new) == 2


def test_a_strict_spread_gang_still_gets_a_machine_per_bundle(fitter):
    gang = [Demand(canonical_resources({"CPU": 3}), gang="pg", spread=True) for _ in range(6)]
    packing = Packer(fitter).pack(gang, [])
    assert sum(packing.new.values()) == 6
