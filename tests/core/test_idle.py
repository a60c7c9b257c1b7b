"""Cost-aware idle release (core/idle.py): the break-even rule, its precedence (the node type's own
`idle_timeout_s`, the break-even, Ray's `idle_timeout_minutes`), its settings and their errors, and where it takes
effect (the cluster plan, `bootstrap_config`'s per-type `idle_timeout_s` for Ray v2, `ray-nodeless plan`)."""
from __future__ import annotations

import pytest

from ray_nodeless.core.cluster_plan import plan_cluster
from ray_nodeless.core.idle import (
    DEFAULT_LAUNCH_LATENCY_S, SOURCE_BREAK_EVEN, SOURCE_CLUSTER, SOURCE_NODE_TYPE, break_even_s,
)
from ray_nodeless.errors import ConfigError
from tests.core.test_prices import PROVIDER


def cluster(idle_minutes=5, worker_extra=None, **provider) -> dict:
    doc = {"cluster_name": "c", "max_workers": 4, "head_node_type": "head", "provider": dict(PROVIDER, **provider),
           "available_node_types": {
               "head": {"resources": {"CPU": 8}, "node_config": {}},
               "gpu_od": {"resources": {"CPU": 4, "GPU": 1}, "node_config": {"capacity": ["on-demand"]},
                          "max_workers": 2, **(worker_extra or {})},
               "gpu_spot": {"resources": {"CPU": 4, "GPU": 1}, "node_config": {"capacity": ["spot"]},
                            "max_workers": 2}}}
    doc["provider"]["rules"] = [{"name": "all", "match": {}, "capacity": ["spot", "on-demand"]}]
    if idle_minutes is not None:
        doc["idle_timeout_minutes"] = idle_minutes
    return doc


def test_the_break_even_rule():
    # No fixed relaunch cost: keeping idle for one launch latency costs what one relaunch costs, whatever the price.
    assert break_even_s(0.526, 180, 0.0) == break_even_s(32.77, 180, 0.0) == 180
    # With one: the fixed cost buys more idle time of a cheap machine than of an expensive one.
    assert break_even_s(0.50, 180, 0.05) == pytest.approx(180 + 3600 * 0.05 / 0.50)
    assert break_even_s(0.10, 180, 0.05) > break_even_s(0.50, 180, 0.05)
    assert break_even_s(None, 180, 0.05) is None and break_even_s(0.0, 180, 0.05) is None


def test_the_plan_derives_per_type_timeouts_by_default():
    cp = plan_cluster(cluster())
    assert set(cp.idle) == {"gpu_od", "gpu_spot"}           # the head is never released
    for name in cp.idle:
        assert (cp.idle[name].seconds, cp.idle[name].source) == (DEFAULT_LAUNCH_LATENCY_S, SOURCE_BREAK_EVEN)
    assert cp.to_dict()["node_types"]["gpu_od"]["idle_timeout_s"] == DEFAULT_LAUNCH_LATENCY_S
    assert "idle_timeout_s" not in cp.to_dict()["node_types"]["head"]


def test_a_fixed_relaunch_cost_keeps_spot_workers_longer():
    cp = plan_cluster(cluster(idle_minutes=60, relaunch_overhead_usd=0.02, expected_launch_s=120))
    od, spot = cp.plans["gpu_od"].chosen, cp.plans["gpu_spot"].chosen
    assert spot.hourly_price < od.hourly_price
    assert cp.idle["gpu_od"].seconds == pytest.approx(120 + 3600 * 0.02 / od.hourly_price)
    assert cp.idle["gpu_spot"].seconds == pytest.approx(120 + 3600 * 0.02 / spot.hourly_price)
    assert cp.idle["gpu_spot"].seconds > cp.idle["gpu_od"].seconds


def test_the_break_even_never_outlasts_idle_timeout_minutes():
    # A 15-s cluster-wide timeout (the demo's) stays 15 s; an expensive relaunch does not keep a cheap machine past
    # the longest idle the YAML allows.
    short = plan_cluster(cluster(idle_minutes=0.25))
    assert {(i.seconds, i.source) for i in short.idle.values()} == {(15.0, SOURCE_CLUSTER)}
    capped = plan_cluster(cluster(idle_minutes=5, relaunch_overhead_usd=1.0))
    assert {(i.seconds, i.source) for i in capped.idle.values()} == {(300.0, SOURCE_CLUSTER)}
    # No idle_timeout_minutes (never, under v2): the break-even alone.
    free = plan_cluster(cluster(idle_minutes=None))
    assert {(i.seconds, i.source) for i in free.idle.values()} == {(DEFAULT_LAUNCH_LATENCY_S, SOURCE_BREAK_EVEN)}


def test_the_node_types_own_value_wins_and_the_switch_turns_it_off():
    cp = plan_cluster(cluster(worker_extra={"idle_timeout_s": 900}))
    assert (cp.idle["gpu_od"].seconds, cp.idle["gpu_od"].source) == (900, SOURCE_NODE_TYPE)
    assert cp.idle["gpu_spot"].source == SOURCE_BREAK_EVEN
    off = plan_cluster(cluster(idle_minutes=2, cost_aware_idle=False))
    assert {(i.seconds, i.source) for i in off.idle.values()} == {(120.0, SOURCE_CLUSTER)}
    never = plan_cluster(cluster(idle_minutes=None, cost_aware_idle=False))
    assert {i.seconds for i in never.idle.values()} == {None}


@pytest.mark.parametrize("provider, extra, key", [
    ({"expected_launch_s": -1}, None, "provider.expected_launch_s"),
    ({"relaunch_overhead_usd": "5 cents"}, None, "provider.relaunch_overhead_usd"),
    ({"cost_aware_idle": "yes"}, None, "provider.cost_aware_idle"),
    ({}, {"idle_timeout_s": -5}, "available_node_types.gpu_od.idle_timeout_s"),
    ({}, {"idle_timeout_s": "10m"}, "available_node_types.gpu_od.idle_timeout_s"),
])
def test_bad_settings_name_the_key(provider, extra, key):
    with pytest.raises(ConfigError) as e:
        plan_cluster(cluster(worker_extra=extra, **provider))
    assert e.value.key == key


def test_bootstrap_writes_the_break_even_for_ray_v2_and_keeps_the_users():
    from ray_nodeless.ray_adapter.bootstrap import bootstrap_config
    from ray_nodeless.testing import fake_backend

    fake_backend.reset()
    out = bootstrap_config(cluster(worker_extra={"idle_timeout_s": 900}, cloud="fake"))
    types = out["available_node_types"]
    assert types["gpu_od"]["idle_timeout_s"] == 900
    assert types["gpu_spot"]["idle_timeout_s"] == DEFAULT_LAUNCH_LATENCY_S
    assert "idle_timeout_s" not in types["head"]
    off = bootstrap_config(cluster(cost_aware_idle=False, cloud="fake"))
    assert all("idle_timeout_s" not in t for t in off["available_node_types"].values())
    # The demo's 15-s idle_timeout_minutes is shorter than the break-even: Ray v2 keeps using it.
    short = bootstrap_config(cluster(idle_minutes=0.25, cloud="fake"))
    assert all("idle_timeout_s" not in t for t in short["available_node_types"].values())


@pytest.mark.parametrize("cost_aware", [True, False])
def test_shape_open_generated_types_get_their_offerings_break_even(cost_aware):
    from tests.launch.test_open_types import _config, _open_types
    from ray_nodeless.core.demand import parse_demand
    from ray_nodeless.launch.open_types import Snapshot, is_open_type

    cfg = _config(cost_aware_idle=cost_aware, relaunch_overhead_usd=0.01)
    cfg["idle_timeout_minutes"] = 60
    ot, store, _, _ = _open_types(cfg)
    result = ot.step(Snapshot([parse_demand('{"GPU": 1}'), parse_demand('{"CPU": 2}')], []), {})
    generated = {n: t for n, t in store.config["available_node_types"].items() if is_open_type(t)}
    assert generated
    for name, t in generated.items():
        o = result.packing.types[name].offering
        if cost_aware:
            assert t["idle_timeout_s"] == pytest.approx(DEFAULT_LAUNCH_LATENCY_S + 3600 * 0.01 / o.hourly_price,
                                                        abs=1e-3)
        else:
            assert "idle_timeout_s" not in t
