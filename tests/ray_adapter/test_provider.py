"""NodelessProvider against an in-memory backend: fallback, capacity memory, listing cache, tags, vanished nodes."""
from __future__ import annotations

import threading

import pytest
from ray.autoscaler.node_launch_exception import NodeLaunchException

from ray_nodeless.testing import fake_backend
from ray_nodeless.testing.clock import FakeClock
from ray_nodeless.core.node_resources import instance_resources
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.providers.base import (TAG_CAPACITY, TAG_CATALOG, TAG_CLUSTER, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_RULE,
                                         TAG_ZONE)

WORKER_TAGS = {"ray-node-type": "worker", "ray-user-node-type": "gpu_worker", "ray-node-status": "uninitialized",
               "ray-node-name": "ray-c1-worker", "ray-launch-config": "abc"}
PROVIDER = {
    "type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "fake", "simulate_cloud": "aws",
    "region": "us-west-2", "list_cache_s": 0,
    "exclude": {"gpus": ["M60", "K80"]},
    "rules": [
        {"name": "gpu-spot-first", "match": {"GPU": ">=1"}, "capacity": ["spot", "on-demand"]},
        {"name": "cpu", "match": {}, "capacity": ["on-demand"]},
    ],
}


@pytest.fixture
def cloud():
    return fake_backend.reset()


@pytest.fixture
def provider(cloud):
    return NodelessProvider(dict(PROVIDER), "c1")


def test_launch_picks_cheapest_fit_and_tags_the_decision(provider, cloud):
    provider.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    [mid] = provider.non_terminated_nodes({})
    tags = provider.node_tags(mid)
    plan_first = cloud.launches[0].offering
    assert tags[TAG_INSTANCE_TYPE] == plan_first.instance_type.name == "g6.xlarge"
    assert (tags[TAG_ZONE], tags[TAG_CAPACITY], tags[TAG_RULE]) == ("us-west-2a", "spot", "gpu-spot-first")
    assert float(tags[TAG_PRICE]) == pytest.approx(plan_first.hourly_price)
    assert tags[TAG_CATALOG] == provider.catalog.catalog_id and tags[TAG_CLUSTER] == "c1"
    assert tags["ray-user-node-type"] == "gpu_worker"
    assert provider.is_running(mid) and not provider.is_terminated(mid)
    # The machine advertises the chosen instance type's resources.
    assert cloud.launches[0].resources["GPU"] == 1 and cloud.launches[0].resources["CPU"] == 4


def test_capacity_error_falls_back_in_the_same_call_and_is_remembered(provider, cloud):
    cloud.capacity_faults[("g6.xlarge", "us-west-2a", "spot")] = "InsufficientInstanceCapacity"
    provider.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    assert [(s.offering.zone, s.offering.capacity) for s in cloud.launches] == [
        ("us-west-2a", "spot"), ("us-west-2b", "spot")]
    assert provider.unavailable.reason(cloud.launches[0].offering) == "InsufficientInstanceCapacity"
    # The next launch skips the failed offering without calling the cloud for it.
    del cloud.capacity_faults[("g6.xlarge", "us-west-2a", "spot")]
    cloud.launches.clear()
    provider.create_node_with_resources_and_labels({}, dict(WORKER_TAGS, **{"ray-launch-request": "r2"}), 1,
                                                   {"CPU": 4, "GPU": 1}, {})
    assert [(s.offering.zone) for s in cloud.launches] == ["us-west-2b"]


def test_regional_quota_error_skips_the_type_in_every_zone(provider, cloud):
    cloud.capacity_faults[("g6.xlarge", "*", "spot")] = ("VcpuLimitExceeded", "region")
    provider.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    tried = [(s.offering.instance_type.name, s.offering.zone) for s in cloud.launches]
    # One attempt on g6.xlarge (its quota is regional), then straight to the next type: no walk over its zones.
    assert tried[0] == ("g6.xlarge", "us-west-2a") and tried[1][0] != "g6.xlarge" and len(tried) == 2
    assert all(provider.unavailable.reason(o) == "VcpuLimitExceeded"
               for o in provider.planner.plan(provider.resolver.request("gpu_worker", {"CPU": 4, "GPU": 1}, {}, False))
               .candidates() if (o.instance_type.name, o.capacity) == ("g6.xlarge", "spot"))


def test_ttl_expiry_makes_the_offering_eligible_again(cloud):
    p = NodelessProvider(dict(PROVIDER, unavailable_ttl_s=180), "c1")
    p.unavailable.clock = clock = FakeClock()
    cloud.capacity_faults[("g6.xlarge", "us-west-2a", "spot")] = "InsufficientInstanceCapacity"
    p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    failed = cloud.launches[0].offering
    assert p.unavailable.blocked(failed)
    clock.advance(179)
    assert p.unavailable.blocked(failed)
    clock.advance(2)
    assert not p.unavailable.blocked(failed)


def test_all_spot_failing_falls_back_to_on_demand(provider, cloud):
    cloud.capacity_faults[("*", "*", "spot")] = "InsufficientInstanceCapacity"
    provider.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    last = cloud.launches[-1].offering
    assert last.capacity == "on-demand"
    assert all(s.offering.capacity == "spot" for s in cloud.launches[:-1])
    # rule order: every spot candidate was tried (other zones, then other types) before any on-demand one
    prices = [s.offering.hourly_price for s in cloud.launches[:-1]]
    assert prices == sorted(prices)


def test_every_candidate_failing_raises_nodelaunchexception_with_the_cloud_category(provider, cloud):
    cloud.capacity_faults[("*", "*", "*")] = "InsufficientInstanceCapacity"
    with pytest.raises(NodeLaunchException) as e:
        provider.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    assert e.value.category == "InsufficientInstanceCapacity"
    assert provider.non_terminated_nodes({}) == []


def test_infeasible_shape_raises_before_any_launch(provider, cloud):
    with pytest.raises(NodeLaunchException) as e:
        provider.create_node_with_resources_and_labels({"gpus": ["K80"]}, dict(WORKER_TAGS), 1, {"CPU": 4, "GPU": 1},
                                                       {})
    assert e.value.category == "NoFeasibleOffering"
    assert cloud.launches == []


def test_excluded_family_is_never_launched_even_when_cheapest(cloud):
    p = NodelessProvider(dict(PROVIDER, exclude={"families": ["g6"]}), "c1")
    p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    assert cloud.launches[0].offering.instance_type.family != "g6"


def test_cpu_shape_never_lands_on_a_gpu_instance(provider, cloud):
    provider.create_node_with_resources_and_labels({}, dict(WORKER_TAGS, **{"ray-user-node-type": "cpu"}), 1,
                                                   {"CPU": 2}, {})
    assert cloud.launches[0].offering.instance_type.gpu_count == 0


def test_one_listing_per_update_shared_by_per_node_queries(cloud):
    p = NodelessProvider(dict(PROVIDER, list_cache_s=60), "c1")
    p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 3, {"CPU": 4, "GPU": 1}, {})
    before, rechecks = cloud.calls.get("list", 0), cloud.calls.get("recheck", 0)
    ids = p.non_terminated_nodes({})
    for mid in ids:
        p.node_tags(mid), p.is_running(mid), p.internal_ip(mid), p.is_terminated(mid)
    p.non_terminated_nodes({"ray-node-type": "worker"})
    # A fresh object's first listing is checked by a second query (the in-memory cloud's by-id lookup, `recheck`).
    assert len(ids) == 3 and cloud.calls["list"] - before == 1 and cloud.calls["recheck"] - rechecks == 1
    before = cloud.calls["list"]
    p.view.refresh(force=True)          # any later update: one listing
    for mid in ids:
        p.node_tags(mid), p.is_running(mid), p.internal_ip(mid), p.is_terminated(mid)
    assert cloud.calls["list"] - before == 1


def test_transient_listing_error_answers_from_last_listing(provider, cloud):
    provider.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    ids = provider.non_terminated_nodes({})
    cloud.list_failures = 3
    assert provider.non_terminated_nodes({}) == ids
    assert provider.node_tags(ids[0])["ray-user-node-type"] == "gpu_worker"


def test_vanished_node_never_raises_and_spot_loss_is_remembered(provider, cloud):
    provider.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    [mid] = provider.non_terminated_nodes({})
    ip = provider.internal_ip(mid)
    del cloud.machines[mid]                     # reclaimed by the cloud
    assert provider.non_terminated_nodes({}) == []
    assert provider.is_terminated(mid) and not provider.is_running(mid)
    assert provider.node_tags(mid)["ray-user-node-type"] == "gpu_worker"   # last known, no KeyError
    assert provider.internal_ip(mid) == ip
    assert provider.unavailable.reason(cloud.launches[0].offering) == "interrupted"
    assert provider.node_tags("never-existed") == {} and provider.internal_ip("never-existed") is None


def test_terminated_by_us_is_not_an_interruption(provider, cloud):
    provider.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 2, {"CPU": 4, "GPU": 1}, {})
    ids = provider.non_terminated_nodes({})
    provider.terminate_nodes(ids)
    assert cloud.calls["terminate"] == 1     # one batched call
    assert provider.non_terminated_nodes({}) == []
    assert not provider.unavailable.snapshot()


def test_other_clusters_machines_are_invisible_and_untouchable(cloud):
    a = NodelessProvider(dict(PROVIDER), "a")
    b = NodelessProvider(dict(PROVIDER), "b")
    a.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    [mid] = a.non_terminated_nodes({})
    assert b.non_terminated_nodes({}) == []
    b.terminate_nodes([mid])
    assert a.non_terminated_nodes({}) == [mid]


def test_state_is_rebuilt_from_the_backend_after_a_restart(provider, cloud):
    provider.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    restarted = NodelessProvider(dict(PROVIDER), "c1")
    [mid] = restarted.non_terminated_nodes({})
    assert restarted.node_tags(mid)[TAG_INSTANCE_TYPE] == "g6.xlarge"


def test_concurrent_queries_are_thread_safe(cloud):
    p = NodelessProvider(dict(PROVIDER, list_cache_s=0), "c1")
    errors = []
    # Force the interleaving instead of hoping for it: all 8 launches and the first listing meet inside the
    # backend, so every launch is in flight while a listing is, and queries run against that listing's cache.
    meet = threading.Barrier(9, timeout=20)
    met = {"launch": 0, "list": 0}
    met_lock = threading.Lock()

    def rendezvous(name, limit):
        def hook():
            with met_lock:
                first = met[name] < limit
                met[name] += 1
            if first:
                meet.wait()
        return hook

    cloud.hooks["launch"] = rendezvous("launch", 8)
    cloud.hooks["list"] = rendezvous("list", 1)

    def launch(i):
        try:
            p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def query():
        try:
            for _ in range(50):
                for mid in p.non_terminated_nodes({}):
                    p.node_tags(mid), p.internal_ip(mid), p.is_running(mid)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = ([threading.Thread(target=launch, args=(i,)) for i in range(8)]
               + [threading.Thread(target=query) for _ in range(4)])
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert not meet.broken and met["launch"] == 8    # the interleaving really happened
    assert len(p.non_terminated_nodes({})) == 8


def test_head_is_planned_on_its_recorded_shape(cloud):
    config = {"cluster_name": "c1", "max_workers": 2, "head_node_type": "head", "provider": dict(PROVIDER),
              "available_node_types": {
                  "head": {"resources": {"CPU": 8, "memory": 32 * 1024 ** 3}, "node_config": {}},
                  "gpu_worker": {"resources": {"CPU": 4, "GPU": 1}, "node_config": {}, "max_workers": 2}}}
    boot = NodelessProvider.bootstrap_config(config)
    p = NodelessProvider(boot["provider"], "c1")
    p.create_node({}, {"ray-node-type": "head", "ray-user-node-type": "head"}, 1)
    t = cloud.launches[-1].offering.instance_type
    assert t.vcpus >= 8 and t.memory_gib >= 32 and t.gpu_count == 0
    assert cloud.launches[-1].is_head


def test_bootstrap_config_fails_on_bad_keys_naming_them():
    from ray_nodeless.errors import ConfigError
    base = {"cluster_name": "c1", "max_workers": 1, "head_node_type": "head",
            "available_node_types": {"head": {"resources": {"CPU": 2}, "node_config": {}}}}
    cases = [
        (dict(PROVIDER, rules=[{"name": "r", "match": {"GPU": ">= one"}}]), "provider.rules[0].match.GPU"),
        (dict(PROVIDER, rules=[{"name": "r", "capacity": ["preemptible"]}]), "provider.rules[0].capacity"),
        (dict(PROVIDER, rule=[]), "provider.rule"),
        (dict(PROVIDER, exclude={"family": ["t3"]}), "provider.exclude.family"),
        (dict(PROVIDER, region=None), "provider.region"),
    ]
    for provider, key in cases:
        with pytest.raises(ConfigError) as e:
            NodelessProvider.bootstrap_config(dict(base, provider=provider))
        assert e.value.key == key, (key, str(e.value))
    bad_nc = dict(base, provider=dict(PROVIDER))
    bad_nc["available_node_types"] = {"head": {"resources": {"CPU": 2}, "node_config": {"families": "m5", "zones": 3}}}
    with pytest.raises(ConfigError, match=r"available_node_types.head.node_config.zones"):
        NodelessProvider.bootstrap_config(bad_nc)


def test_fillout_resources_from_the_chosen_instance():
    config = {"cluster_name": "c1", "max_workers": 1, "head_node_type": "head", "provider": dict(PROVIDER),
              "available_node_types": {"head": {"resources": {}, "node_config": {"instance_types": ["g4dn.2xlarge"],
                                                                              "allow_gpu_instances": True}}}}
    out = NodelessProvider.fillout_available_node_types_resources(config)
    # Ray's AWS fill-in: no memory for the head node type, and an accelerator_type resource
    assert out["available_node_types"]["head"]["resources"] == {"CPU": 8, "GPU": 1, "accelerator_type:T4": 1}


def test_instance_resources_keep_declared_custom_resources():
    from ray_nodeless.core.catalog import embedded
    t = embedded().instance_type("aws", "g4dn.xlarge")
    r = instance_resources(t, {"CPU": 2, "GPU": 1, "trial_slot": 1})
    assert r["CPU"] == 4 and r["GPU"] == 1 and r["trial_slot"] == 1 and r["accelerator_type:T4"] == 1
