"""Planning memory is bounded by the shapes of a cluster, not its node types (issue 16 #12): node types of one shape
and requirements share one evaluation, and a YAML with more than MAX_NODE_TYPES node types is refused naming
`available_node_types` (benches/bench_plan_memory.py measures both paths; figures in BENCHMARKS.md)."""
from __future__ import annotations

import tracemalloc

import pytest

from ray_nodeless.core.cluster_plan import MAX_NODE_TYPES, planner_for
from ray_nodeless.core.planner import Planner
from ray_nodeless.errors import ConfigError, NoFeasibleOffering
from ray_nodeless.operate.config import catalog_for, check_cluster, load_provider
from ray_nodeless.ray_adapter.provider import NodelessProvider
from tests.helpers import cluster_config
from tests.ray_adapter.test_provider import PROVIDER

SHAPES = [{"CPU": 4}, {"CPU": 8}, {"CPU": 4, "GPU": 1}]


def config(workers: int, shapes=SHAPES) -> dict:
    types = {f"w{i}": {"resources": dict(shapes[i % len(shapes)]), "node_config": {}, "max_workers": 1}
             for i in range(workers)}
    return cluster_config(PROVIDER, workers=types, max_workers=workers, ray_keys=True)


def test_node_types_of_one_shape_share_one_plan():
    cp = check_cluster(config(300))
    by_shape: dict[int, set[str]] = {}
    for name, plan in cp.plans.items():
        by_shape.setdefault(id(plan.candidate_index), set()).add(name)
        assert plan.request.node_type == name and plan.explain()["node_type"] == name
    assert len(by_shape) == len(SHAPES) + 1                      # one evaluation per shape, and the head's
    assert by_shape[id(cp.plans["w0"].candidate_index)] == {f"w{i}" for i in range(0, 300, 3)}
    # The shared plan is the one a fresh planner computes for that node type alone, rejection counts included.
    fresh = Planner(catalog_for(cp.settings)).plan(cp.plans["w4"].request)
    assert cp.plans["w4"].explain() == fresh.explain() and cp.plans["w4"].rejected == cp.plans["w1"].rejected
    assert [o.key for o in cp.plans["w7"].top(20)] == [o.key for o in fresh.top(20)]


def test_planning_memory_grows_with_shapes_not_node_types():
    check_cluster(config(3))                                    # catalog and region index loaded once, first

    def peak(workers: int) -> int:
        planner_for(catalog_for_provider())._plans.clear()       # a cold plan cache, as in a fresh `ray up`
        tracemalloc.start()
        try:
            cp = check_cluster(config(workers))
            for plan in cp.plans.values():
                plan.explain()                                  # what `ray-nodeless plan` prints for each
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, big = peak(9), peak(MAX_NODE_TYPES - 1)
    # Before the shapes were shared this grew by 40 KB (numpy) to 0.45 MB (plain Python) per node type: 40 MB to
    # 450 MB here. Now a node type of a known shape costs its view and its entry of the YAML.
    assert big - small < 8 * 2 ** 20, (small, big)


def catalog_for_provider():
    return catalog_for(load_provider(cluster_config(PROVIDER)["provider"]).core)


def test_more_node_types_than_the_limit_are_refused_naming_the_key():
    too_many = config(MAX_NODE_TYPES)          # plus the head: one more than the limit
    with pytest.raises(ConfigError) as e:
        check_cluster(too_many)
    assert e.value.key == "available_node_types" and f"at most {MAX_NODE_TYPES}" in str(e.value)
    with pytest.raises(ConfigError) as e:      # `ray up` stops in bootstrap_config the same way
        NodelessProvider.bootstrap_config(too_many)
    assert e.value.key == "available_node_types"
    check_cluster(config(MAX_NODE_TYPES - 1))  # the limit itself is allowed


def test_a_failure_names_each_node_type_of_a_shared_shape():
    cp = check_cluster(config(2))
    planner = planner_for(catalog_for_provider())
    req = cp.plans["w0"].request
    impossible = req.shape.__class__.from_resources({"CPU": 4, "GPU": 9}, "resources")
    for name in ("gpu_a", "gpu_b"):
        with pytest.raises(NoFeasibleOffering) as e:
            planner.plan(type(req)(cloud=req.cloud, region=req.region, shape=impossible,
                                   requirements=req.requirements, rule=req.rule, node_type=name))
        assert f"node type {name!r}" in str(e.value)
