"""`provider.price_overrides` (core/prices.py): parsed once with errors naming the key, first match wins, applied
before the documented total order (both planner evaluations), in the cost preview and the cost cap, in the
launcher's reservations and machine tags, and shown beside the list price."""
from __future__ import annotations

import pytest

from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.cluster_plan import plan_cluster
from ray_nodeless.core.planner import Planner
from ray_nodeless.core.prices import PricedCatalog, parse_price_overrides, priced
from ray_nodeless.core.requirements import Request, Requirements, Shape
from ray_nodeless.core.settings import parse_provider
from ray_nodeless.errors import ConfigError

CAT = catalog_mod.embedded()
GPU = Shape.from_resources({"CPU": 4, "GPU": 1}, "t")
PROVIDER = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "local", "simulate_cloud": "aws",
            "region": "us-west-2", "exclude": {"gpus": ["M60", "K80"]}}


def cluster(overrides=None, **provider) -> dict:
    prov = dict(PROVIDER, **provider)
    if overrides is not None:
        prov["price_overrides"] = overrides
    return {"cluster_name": "c", "max_workers": 4, "head_node_type": "head", "provider": prov,
            "available_node_types": {
                "head": {"resources": {"CPU": 8, "memory": 32 * 1024 ** 3}, "node_config": {}},
                "gpu_worker": {"resources": {"CPU": 4, "GPU": 1}, "node_config": {}, "min_workers": 1,
                               "max_workers": 4}}}


def plan_of(overrides, name="gpu_worker", **provider):
    return plan_cluster(cluster(overrides, **provider)).plans[name]


def test_no_overrides_is_the_catalog_itself():
    assert priced(CAT, parse_price_overrides(None)) is CAT
    assert plan_cluster(cluster()).catalog_id == CAT.catalog_id


@pytest.mark.parametrize("value, key, words", [
    ("cheap", "provider.price_overrides", "must be a list"),
    ([{"discount": 0.1}, {"families": ["g4dn"], "discount": 28}], "provider.price_overrides[1].discount", "< 1"),
    ([{"discount": -0.1}], "provider.price_overrides[0].discount", ">= 0"),
    ([{"discount": "10%"}], "provider.price_overrides[0].discount", "finite number"),
    ([{"hourly_price": 0}], "provider.price_overrides[0].hourly_price", "> 0"),
    ([{"families": ["g4dn"]}], "provider.price_overrides[0]", "exactly one of"),
    ([{"discount": 0.1, "hourly_price": 0.2}], "provider.price_overrides[0]", "exactly one of"),
    ([{"familes": ["g4dn"], "discount": 0.1}], "provider.price_overrides[0].familes", "did you mean 'families'?"),
    ([{"capacity": ["reserved"], "discount": 0.1}], "provider.price_overrides[0].capacity", "'reserved'"),
    ([{"instance_types": [], "discount": 0.1}], "provider.price_overrides[0].instance_types", "non-empty"),
    (["g4dn"], "provider.price_overrides[0]", "must be a mapping"),
])
def test_bad_overrides_name_the_key(value, key, words):
    with pytest.raises(ConfigError) as e:
        parse_provider(dict(PROVIDER, price_overrides=value))
    assert e.value.key == key and words in str(e.value)


def test_a_broken_override_does_not_stop_a_teardown(caplog):
    s = parse_provider(dict(PROVIDER, price_overrides=[{"discount": 2}]), planning=False)
    assert not s.price_overrides and "price_overrides" in caplog.text


def test_a_discount_applies_to_what_it_matches_only():
    base = plan_of(None)
    assert base.chosen.instance_type.name == "g4dn.xlarge" and base.chosen.capacity == "on-demand"
    cut = plan_of([{"families": ["g4dn"], "capacity": ["on-demand"], "discount": 0.25}])
    o = cut.chosen
    assert o.instance_type.name == "g4dn.xlarge"
    assert o.list_price == pytest.approx(base.chosen.hourly_price)
    assert o.hourly_price == pytest.approx(round(base.chosen.hourly_price * 0.75, 6))
    # A type of another family keeps its list price.
    other = next(x for x in cut.candidates() if x.instance_type.family != "g4dn")
    assert other.hourly_price == other.list_price


def test_a_fixed_price_reorders_the_candidates():
    # g5.xlarge lists at more than g4dn.xlarge; at a fixed (reserved) price below it, it is the cheapest fit.
    p = plan_of([{"instance_types": ["g5.xlarge"], "capacity": ["on-demand"], "regions": ["us-west-2"],
                  "hourly_price": 0.30}])
    assert (p.chosen.instance_type.name, p.chosen.hourly_price) == ("g5.xlarge", 0.30)
    assert p.chosen.list_price > plan_of(None).chosen.hourly_price
    prices = [o.hourly_price for o in p.candidates()]
    assert prices == sorted(prices)            # the documented order, on effective prices
    rec = p.explain()
    assert rec["hourly_price"] == 0.30 and rec["list_price"] == p.chosen.list_price
    # The override names another region: nothing changes here.
    q = plan_of([{"instance_types": ["g5.xlarge"], "regions": ["us-east-1"], "hourly_price": 0.30}])
    assert q.chosen.instance_type.name == "g4dn.xlarge"


def test_first_match_wins_and_discounts_do_not_stack():
    specific = {"instance_types": ["g4dn.xlarge"], "capacity": ["on-demand"], "hourly_price": 0.20}
    general = {"families": ["g4dn"], "discount": 0.5}
    a = plan_of([specific, general]).chosen
    b = plan_of([general, specific]).chosen
    assert (a.instance_type.name, a.hourly_price) == ("g4dn.xlarge", 0.20)
    assert (b.instance_type.name, b.hourly_price) == ("g4dn.xlarge", round(a.list_price * 0.5, 6))
    book = parse_price_overrides([specific, general])
    t = CAT.instance_type("aws", "g4dn.2xlarge")
    assert book.which(t, "us-west-2", "on-demand") == 1 and book.which(t, "us-west-2", "spot") == 1
    assert book.which(CAT.instance_type("aws", "m5.large"), "us-west-2", "on-demand") is None


def test_both_planner_evaluations_agree_on_effective_prices():
    book = parse_price_overrides([{"families": ["g5", "g6"], "discount": 0.6}, {"capacity": ["spot"],
                                                                                "hourly_price": 5.0}])
    cat = priced(CAT, book)
    assert isinstance(cat, PricedCatalog) and cat.catalog_id.startswith(CAT.catalog_id + "+prices@")
    assert priced(cat, book) is cat and priced(cat, parse_price_overrides(None)) is CAT
    for capacity in (("on-demand",), ("spot", "on-demand")):
        req = Request(cloud="aws", region="us-west-2", shape=GPU, requirements=Requirements(capacity=capacity),
                      rule="t")
        fast, slow = Planner(cat, vectorized=True).plan(req), Planner(cat, vectorized=False).plan(req)
        assert [o.to_dict() for o in fast.top(20)] == [o.to_dict() for o in slow.top(20)]
        assert fast.rejected == slow.rejected
        assert fast.chosen.instance_type.family in ("g5", "g6")


def test_max_hourly_price_and_the_cost_cap_read_effective_prices():
    list_head = plan_of(None, "head").chosen.hourly_price
    overrides = [{"families": [plan_of(None, "head").chosen.instance_type.family], "discount": 0.5}]
    # A cap below the head's list price but above its effective price is a cap that can be kept.
    with pytest.raises(ConfigError, match="head's own price"):
        plan_cluster(cluster(max_hourly_cost=list_head * 0.6))
    cp = plan_cluster(cluster(overrides, max_hourly_cost=list_head * 0.6 + 1.0))
    assert cp.cost.idle_cost_per_hour == pytest.approx(
        cp.plans["head"].chosen.hourly_price + cp.plans["gpu_worker"].chosen.hourly_price)
    # The preview at list prices beside it; without overrides there is only the one.
    assert cp.cost.list_idle_cost_per_hour == pytest.approx(
        cp.plans["head"].chosen.list_price + cp.plans["gpu_worker"].chosen.listed)
    assert cp.to_dict()["summary"]["list_ceiling_cost_per_hour"] > cp.to_dict()["summary"]["ceiling_cost_per_hour"]
    assert "list_idle_cost_per_hour" not in plan_cluster(cluster()).to_dict()["summary"]
    assert cp.plans["head"].chosen.hourly_price == pytest.approx(round(list_head * 0.5, 6))
    # A rule's max_hourly_price is compared with what the user pays.
    cfg = cluster([{"instance_types": ["g5.xlarge"], "hourly_price": 0.30}])
    cfg["available_node_types"]["gpu_worker"]["node_config"] = {"max_hourly_price": 0.35,
                                                                "instance_types": ["g5.*"]}
    assert plan_cluster(cfg).plans["gpu_worker"].chosen.instance_type.name == "g5.xlarge"


def test_the_index_finds_the_first_match_the_plain_scan_finds():
    """The PriceBook's index (by family, by literal name, globs, open overrides) against trying every override on
    every offering in order, on a mixed list of 2,000 overrides over a whole region."""
    import random

    rc = catalog_mod.embedded().region("aws", "us-west-2")
    rng = random.Random(7)
    names = sorted({t.name for t in rc.types})
    families = sorted({t.family for t in rc.types})
    entries: list[dict] = []
    for _ in range(2000):
        kind = rng.random()
        e: dict = {"discount": round(rng.random() * 0.9, 2)}
        if kind < 0.35:
            e["families"] = rng.sample(families, 2)
        elif kind < 0.7:
            e["instance_types"] = [rng.choice(names)]
        elif kind < 0.9:
            e["instance_types"] = [rng.choice(families) + ".*large"]
        if rng.random() < 0.3:
            e["capacity"] = [rng.choice(["spot", "on-demand"])]
        if rng.random() < 0.3:
            e["regions"] = [rng.choice(["us-west-2", "us-east-1"])]
        entries.append(e)
    book = parse_price_overrides(entries)
    for t, c in zip(rc.type_ids, rc.cap_ids):
        it, cap = rc.types[t], catalog_mod.CAPACITY_TYPES[c]
        plain = next((i for i, o in enumerate(book.overrides) if o.matches(it, "us-west-2", cap)), None)
        assert book.which(it, "us-west-2", cap) == plain, (it.name, cap)


def test_ten_thousand_overrides_plan_and_the_unused_ones_are_one_note(caplog):
    """10,000 overrides (each for one instance type of another region) plan, and the ones that price nothing
    here are named in one note, not 10,000."""
    entries = [{"instance_types": [f"c5.{s}"], "regions": ["us-east-1"], "discount": 0.1}
               for _ in range(2500) for s in ("large", "xlarge", "2xlarge", "4xlarge")]
    entries.append({"families": ["g6"], "discount": 0.2})
    cp = plan_cluster(cluster(entries))
    [note] = [w for w in cp.warnings if "price no offering" in w]
    assert "provider.price_overrides[0]" in note and "and 9995 more" in note and "[10000]" not in note
    assert cp.plans["gpu_worker"].chosen.instance_type.family in {"g6", "g4dn"}


@pytest.mark.parametrize("entry, key, words", [
    ({"families": ["g4dm"], "discount": 0.2}, "provider.price_overrides[0].families[0]", "did you mean 'g4dn'"),
    ({"instance_types": ["g4dn.xlarg"], "discount": 0.2}, "provider.price_overrides[0].instance_types[0]",
     "not an aws instance type"),
    ({"regions": ["us-west-9"], "discount": 0.2}, "provider.price_overrides[0].regions[0]", "not an aws region"),
])
def test_an_override_that_could_match_nothing_is_named(entry, key, words):
    with pytest.raises(ConfigError) as e:
        plan_cluster(cluster([entry]))
    assert e.value.key == key and words in str(e.value)
