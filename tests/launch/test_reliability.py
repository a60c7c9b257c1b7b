"""The launch layer under Ray v2's real call pattern and cloud faults, through NodelessProvider and the in-memory
backend (ray_nodeless.testing.fake_backend): batching, listing truth, teardown, bounds, two provider objects."""
from __future__ import annotations

import pytest
from ray.autoscaler.node_launch_exception import NodeLaunchException

from ray_nodeless.errors import BackendError, ListingError
from ray_nodeless.providers.base import TAG_CLUSTER, TAG_TERMINATING
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from tests.helpers import FakeClock, cluster_config, wait_for, write_cluster_yaml
from tests.ray_adapter.test_provider import PROVIDER, WORKER_TAGS

GPU = {"CPU": 4, "GPU": 1}


def tags(node_type: str = "gpu_worker", request: str = "req-1") -> dict[str, str]:
    return dict(WORKER_TAGS, **{"ray-user-node-type": node_type, "ray-launch-request": request})


def test_ray_v2_batches_under_one_request_id_each_get_their_machines(provider, cloud):
    """v2 submits 10 machines of one type as 2 batches of 5 under one request id: 10 machines, not 5."""
    provider.create_node_with_resources_and_labels({}, tags(), 5, GPU, {})
    provider.create_node_with_resources_and_labels({}, tags(), 5, GPU, {})
    assert len(provider.non_terminated_nodes({})) == 10
    assert len({s.request_token for s in cloud.launches}) == 2


def test_two_node_types_of_one_shape_in_one_request_get_a_machine_each(provider, cloud):
    provider.create_node_with_resources_and_labels({}, tags("gpu_a"), 1, GPU, {})
    provider.create_node_with_resources_and_labels({}, tags("gpu_b"), 1, GPU, {})
    nodes = provider.non_terminated_nodes({})
    assert sorted(provider.node_tags(n)["ray-user-node-type"] for n in nodes) == ["gpu_a", "gpu_b"]


def test_a_retried_batch_gets_the_same_machines(provider, cloud):
    """Within one create_node call a retry reuses the token, and the cloud (like EC2/GCE) returns the same ids."""
    provider.create_node_with_resources_and_labels({}, tags(), 2, GPU, {})
    first = cloud.launches[0]
    again = fake_backend.FakeBackend.from_provider(dict(PROVIDER), "c1").launch(first)
    assert sorted(again) == provider.non_terminated_nodes({})


def test_a_fresh_provider_whose_listing_fails_raises_instead_of_answering_empty(provider, cloud):
    provider.create_node_with_resources_and_labels({}, tags(), 2, GPU, {})
    restarted = NodelessProvider(dict(PROVIDER), "c1")
    cloud.list_failures = 1
    with pytest.raises(ListingError):
        restarted.non_terminated_nodes({})           # `ray down` must fail loudly, not report success
    assert len(restarted.non_terminated_nodes({})) == 2
    cloud.next_errors["list"] = [RuntimeError("NoCredentialsError")]   # any exception, after a good listing
    assert len(restarted.non_terminated_nodes({})) == 2


def test_an_empty_page_by_glitch_marks_nothing_terminated(provider, cloud):
    provider.create_node_with_resources_and_labels({}, tags(), 2, GPU, {})
    ids = provider.non_terminated_nodes({})
    calls = {"n": 0}
    glitch_at = cloud.calls["list"] + 1               # the next listing comes back empty, once

    def count():
        calls["n"] = cloud.calls["list"] + 1
    cloud.hooks["list"] = count
    cloud.hide = lambda m: calls["n"] == glitch_at
    assert provider.non_terminated_nodes({}) == ids
    assert not provider.unavailable.snapshot()       # no spot offering blocked as "interrupted"


def test_new_machines_show_at_once_while_the_listing_lags(provider, cloud):
    cloud.hide = lambda m: True                       # the cloud's listing does not show anything new yet
    provider.create_node_with_resources_and_labels({}, tags(), 3, GPU, {})
    assert len(provider.non_terminated_nodes({})) == 3
    assert not provider.unavailable.snapshot()
    cloud.hide = None
    assert len(provider.non_terminated_nodes({})) == 3


def test_a_failed_terminate_leaves_the_machines_visible_and_is_retried(provider, cloud):
    provider.create_node_with_resources_and_labels({}, tags(), 2, GPU, {})
    ids = provider.non_terminated_nodes({})
    cloud.next_errors["terminate"] = [BackendError("throttled", "RequestLimitExceeded")]
    with pytest.raises(BackendError):
        provider.terminate_nodes(ids)
    assert provider.non_terminated_nodes({}) == ids and not provider.is_terminated(ids[0])
    assert provider.non_terminated_nodes({}) == []    # the refresh after that retried the terminate
    assert not cloud.machines and not provider.unavailable.snapshot()


def test_a_failed_tag_write_is_kept_and_written_again(provider, cloud):
    provider.create_node_with_resources_and_labels({}, tags(), 1, GPU, {})
    [mid] = provider.non_terminated_nodes({})
    cloud.next_errors["set_tags"] = [BackendError("throttled", "RequestLimitExceeded")]
    provider.set_node_tags(mid, {"ray-node-status": "up-to-date"})
    assert cloud.machines[mid].tags["ray-node-status"] == "uninitialized"
    assert provider.node_tags(mid)["ray-node-status"] == "up-to-date"     # Ray sees its status all along
    provider.non_terminated_nodes({})
    assert cloud.machines[mid].tags["ray-node-status"] == "up-to-date"


def test_another_provider_objects_terminate_is_not_an_interruption(provider, cloud):
    provider.create_node_with_resources_and_labels({}, tags(), 2, GPU, {})
    ids = provider.non_terminated_nodes({})
    lingering = NodelessProvider(dict(PROVIDER), "c1")    # a monitor restarting while the old one lingers
    assert lingering.non_terminated_nodes({}) == ids
    provider.non_terminated_nodes({})
    lingering.terminate_nodes(ids)
    assert provider.non_terminated_nodes({}) == [] and lingering.non_terminated_nodes({}) == []
    assert not provider.unavailable.snapshot() and not lingering.unavailable.snapshot()


def test_the_candidate_walk_is_bounded_in_a_drought(cloud):
    cloud.capacity_faults[("*", "*", "spot")] = "InsufficientInstanceCapacity"
    p = NodelessProvider(dict(PROVIDER, max_candidates_per_launch=3), "c1")
    p.create_node_with_resources_and_labels({}, tags(), 1, GPU, {})
    assert cloud.calls["launch"] == 4                  # 3 spot candidates, then the first on-demand one
    [mid] = p.non_terminated_nodes({})
    assert p.node_tags(mid)["nodeless-capacity"] == "on-demand"
    cloud.capacity_faults[("*", "*", "*")] = "InsufficientInstanceCapacity"
    with pytest.raises(NodeLaunchException):
        p.create_node_with_resources_and_labels({}, tags(request="req-2"), 1, GPU, {})
    assert cloud.calls["launch"] <= 4 + 2 * 3


def test_max_hourly_cost_refuses_launches_that_would_exceed_it(cloud):
    p = NodelessProvider(dict(PROVIDER, max_hourly_cost=0.5), "c1")
    p.create_node_with_resources_and_labels({}, tags(), 1, GPU, {})      # one spot g6.xlarge fits
    price = float(p.node_tags(p.non_terminated_nodes({})[0])["nodeless-hourly-price"])
    with pytest.raises(NodeLaunchException) as e:
        p.create_node_with_resources_and_labels({}, tags(request="req-2"), 5, GPU, {})
    assert "max_hourly_cost" in str(e.value.description) and "MaxHourlyCostExceeded" == e.value.category
    assert len(p.non_terminated_nodes({})) == 1 and price * 6 > 0.5


def test_terminating_tag_never_touches_another_clusters_machine(cloud):
    a = NodelessProvider(dict(PROVIDER), "a")
    b = NodelessProvider(dict(PROVIDER), "b")
    a.create_node_with_resources_and_labels({}, tags(), 1, GPU, {})
    [mid] = a.non_terminated_nodes({})
    b.non_terminated_nodes({})
    b.terminate_nodes([mid])
    assert TAG_TERMINATING not in cloud.machines[mid].tags and cloud.machines[mid].tags[TAG_CLUSTER] == "a"


def test_ray_down_ends_every_machine_after_a_rule_was_tightened(cloud, tmp_path):
    """Ray's own teardown path (commands.teardown_cluster, which bootstraps the YAML first): the rules now admit no
    instance for the workers, and `ray down` still terminates them; `ray up` with the same YAML is refused."""
    from ray.autoscaler._private.commands import teardown_cluster

    from ray_nodeless.errors import NoFeasibleOffering

    config = cluster_config(PROVIDER, max_workers=4, ray_keys=True,
                            workers={"gpu_worker": {"resources": dict(GPU), "node_config": {}, "max_workers": 4}},
                            # Ray caches a bootstrapped config by its hash in /tmp: make this one new, or our
                            # bootstrap is skipped.
                            initialization_commands=[f"echo {tmp_path.name}"])
    p = NodelessProvider(dict(PROVIDER), "c1")
    p.create_node_with_resources_and_labels({}, tags(), 3, GPU, {})
    assert len(p.non_terminated_nodes({})) == 3
    rules = [dict(PROVIDER["rules"][0], max_hourly_price=0.001), PROVIDER["rules"][1]]   # no GPU costs that little
    tightened = dict(config, provider=dict(PROVIDER, rules=rules))
    with pytest.raises(NoFeasibleOffering):
        NodelessProvider.bootstrap_config(tightened)
    path = write_cluster_yaml(tmp_path / "cluster.yaml", tightened)
    teardown_cluster(path, yes=True, workers_only=True, override_cluster_name=None, keep_min_workers=False)
    assert [m for m in cloud.machines.values() if m.tags.get(TAG_CLUSTER) == "c1"] == []


def test_ray_v2_adapter_launching_10_of_two_types_in_one_request_gets_10_each(cloud, tmp_path):
    """Ray v2's own NodeProviderAdapter (the code `ray up` runs under autoscaler v2) splits one request id into
    batches of 5 per node type on a thread pool: 10 + 10 requested machines are 20 machines."""
    from ray.autoscaler.v2.instance_manager.config import FileConfigReader
    from ray.autoscaler.v2.instance_manager.node_provider import NodeProviderAdapter

    config = cluster_config(PROVIDER, max_workers=20, ray_keys=True, workers={
        "gpu_a": {"resources": dict(GPU), "node_config": {}, "max_workers": 10},
        "gpu_b": {"resources": dict(GPU), "node_config": {}, "max_workers": 10}})
    path = write_cluster_yaml(tmp_path / "cluster.yaml", config)
    provider = NodelessProvider(dict(PROVIDER), "c1")
    adapter = NodeProviderAdapter(provider, FileConfigReader(path))
    adapter.launch({"gpu_a": 10, "gpu_b": 10}, request_id="one-request")
    wait_for(lambda: len(provider.non_terminated_nodes({})) >= 20, 30, "20 machines listed")
    assert adapter.poll_errors() == []
    nodes = provider.non_terminated_nodes({})
    assert len(nodes) == 20 and len(cloud.launches) == 4           # 4 batches of 5
    kinds = sorted(provider.node_tags(n)["ray-user-node-type"] for n in nodes)
    assert kinds == ["gpu_a"] * 10 + ["gpu_b"] * 10
    assert {provider.node_tags(n)["ray-launch-request"] for n in nodes} == {"one-request"}


def test_a_launched_machine_the_listing_lags_on_stays_visible_for_the_launch_grace_only(cloud):
    """The cloud's listing does not show a new machine (eventual consistency): Ray keeps seeing it for
    `ttls.LAUNCH_GRACE_S` of the view's clock, then the cloud's answer wins. A FakeClock instead of a 2-minute sleep."""
    from ray_nodeless.core import ttls

    p = NodelessProvider(dict(PROVIDER), "c1")
    p.view.clock = clock = FakeClock()
    cloud.hide = lambda m: True
    cloud.hide_from_lookup = cloud.hide              # nor do its lookups by id
    p.create_node_with_resources_and_labels({}, tags(), 1, GPU, {})
    [mid] = p.non_terminated_nodes({})
    clock.advance(ttls.LAUNCH_GRACE_S - 1)
    assert p.non_terminated_nodes({}) == [mid]
    clock.advance(2)
    assert p.non_terminated_nodes({}) == []
    cloud.hide = None
    cloud.hide_from_lookup = cloud.hide              # nor do its lookups by id
    assert p.non_terminated_nodes({}) == [mid]          # listed again once the cloud shows it
