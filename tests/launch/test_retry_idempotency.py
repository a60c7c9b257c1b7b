"""Idempotency keyed to what Ray retries (issue 16 #7). Ray v2 re-queues a REQUESTED instance that no machine
appeared for within its request_status_timeout_s and launches it again under the same request id; the request's
batches (5 per node type, and a remainder) then come again with the same counts. Such a retry must get the
machines the first round made, not new ones: the same tokens (the cloud returns the same machines, as EC2's
ClientToken and GCE's requestId do, and as the in-memory cloud does) for the batches Ray has not seen, the first
round's offering first, and, for a provider that does not know the request (restarted), the listed machines of
the slot without a cloud call (moto, like any endpoint without ClientToken, would launch again)."""
from __future__ import annotations

import pytest

from ray_nodeless.core import ttls
from ray_nodeless.launch.budget import TAG_REQUEST
from ray_nodeless.launch.decisions import launch_slot
from ray_nodeless.launch.launcher import TAG_LAUNCH_SLOT, retry_round_s
from ray_nodeless.providers.base import TAG_CLUSTER
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from ray_nodeless.testing.moto_server import MotoServer
from tests.helpers import FakeClock, cluster_config, wait_for, write_cluster_yaml
from tests.ray_adapter.test_provider import PROVIDER, WORKER_TAGS

GPU = {"CPU": 4, "GPU": 1}


@pytest.fixture
def cloud():
    return fake_backend.reset()


def tags(request: str) -> dict[str, str]:
    return dict(WORKER_TAGS, **{"ray-launch-request": request})


def on_one_clock(p: NodelessProvider) -> FakeClock:
    """The launcher's rounds, the view's launch grace and the capacity memory on one clock the test moves."""
    clock = FakeClock()
    p.launcher._clock = p.view.clock = p.unavailable.clock = clock
    return clock


def adapter_for(provider: NodelessProvider, tmp_path):
    from ray.autoscaler.v2.instance_manager.config import FileConfigReader
    from ray.autoscaler.v2.instance_manager.node_provider import NodeProviderAdapter

    config = cluster_config(PROVIDER, max_workers=12, ray_keys=True,
                            workers={"gpu_worker": {"resources": dict(GPU), "node_config": {}, "max_workers": 12}})
    return NodeProviderAdapter(provider, FileConfigReader(write_cluster_yaml(tmp_path / "c.yaml", config)))


def test_ray_v2_retry_of_a_request_whose_machines_were_never_listed_gets_the_same_machines(cloud, tmp_path):
    """Through Ray's own NodeProviderAdapter: 12 machines (batches 5, 5, 2) that the cloud's listing never shows
    (Ray times the request out), then Ray's retry of the same request id: the same 3 tokens, 12 machines, not 24."""
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = on_one_clock(p)
    adapter = adapter_for(p, tmp_path)
    cloud.hide = lambda m: True                               # launched, but the listing never shows them
    cloud.hide_from_lookup = cloud.hide              # nor do its lookups by id
    adapter.launch({"gpu_worker": 12}, request_id="req-1")
    wait_for(lambda: len(cloud.launches) == 3, 30, "the first round's 3 batches")
    first = sorted(s.request_token for s in cloud.launches)
    clock.advance(retry_round_s() + 1)                        # past the launch grace too: the view drops them
    assert p.non_terminated_nodes({}) == []
    adapter.launch({"gpu_worker": 12}, request_id="req-1")    # Ray v2's retry: same request id, same counts
    wait_for(lambda: len(cloud.launches) == 6, 30, "the retry's 3 batches")
    assert adapter.poll_errors() == []
    assert sorted(s.request_token for s in cloud.launches[3:]) == first
    assert len([m for m in cloud.machines.values() if m.tags.get(TAG_CLUSTER) == "c1"]) == 12
    cloud.hide = None
    cloud.hide_from_lookup = cloud.hide              # nor do its lookups by id
    assert len(p.non_terminated_nodes({})) == 12


def test_a_retry_of_part_of_a_request_gets_the_batch_ray_has_not_seen(cloud):
    """12 machines in batches 5, 5, 2; the second batch's machines are never listed, so Ray allocates 7 and
    retries 5 under the same request id: the retry passes over the batch Ray has (all listed) and gets the
    unseen batch's token, and the cloud answers it with that batch's machines: 12 machines, not 17."""
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = on_one_clock(p)
    unseen = launch_slot("c1", "req-1", "gpu_worker", 5, 1)
    cloud.hide = lambda m: m.tags.get(TAG_LAUNCH_SLOT) == unseen
    cloud.hide_from_lookup = cloud.hide              # nor do its lookups by id
    batches = [sorted(p.create_node_with_resources_and_labels({}, tags("req-1"), n, GPU, {})) for n in (5, 5, 2)]
    clock.advance(retry_round_s() + 1)                     # past the launch grace too: the view drops the unseen
    assert len(p.non_terminated_nodes({})) == 7
    again = sorted(p.create_node_with_resources_and_labels({}, tags("req-1"), 5, GPU, {}))
    assert again == batches[1] and len(cloud.machines) == 12
    assert cloud.launches[-1].request_token == cloud.launches[1].request_token


def test_a_retry_when_every_batch_is_listed_launches_anew(cloud):
    """Ray retries only instances no machine appeared for; if every batch of the request is listed (another
    request's instances took its machines), what it asks for is new machines."""
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = on_one_clock(p)
    first = p.create_node_with_resources_and_labels({}, tags("req-1"), 5, GPU, {})
    clock.advance(retry_round_s() + 1)
    again = p.create_node_with_resources_and_labels({}, tags("req-1"), 5, GPU, {})
    assert not set(first) & set(again) and len(p.non_terminated_nodes({})) == 10


def test_batches_of_one_round_still_get_their_own_machines(cloud):
    """Within a round, a call of the same count is the next batch, not a retry (Ray's pool may start it after
    the first batch returned)."""
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = on_one_clock(p)
    a = p.create_node_with_resources_and_labels({}, tags("req-1"), 5, GPU, {})
    clock.advance(retry_round_s() - 1)
    b = p.create_node_with_resources_and_labels({}, tags("req-1"), 5, GPU, {})
    assert not set(a) & set(b) and len(p.non_terminated_nodes({})) == 10


def test_a_retry_goes_to_the_offering_its_first_round_launched_on(cloud):
    """The first round fell back past an offering without capacity; by Ray's retry that offering has capacity
    again (its unavailable_ttl_s ran out): the retry still goes to the first round's offering and token."""
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = on_one_clock(p)
    cloud.capacity_faults[("g6.xlarge", "us-west-2a", "spot")] = "InsufficientInstanceCapacity"
    cloud.hide = lambda m: True
    cloud.hide_from_lookup = cloud.hide              # nor do its lookups by id
    first = p.create_node_with_resources_and_labels({}, tags("req-1"), 5, GPU, {})
    assert {v["zone"] for v in first.values()} == {"us-west-2b"}
    del cloud.capacity_faults[("g6.xlarge", "us-west-2a", "spot")]
    clock.advance(max(retry_round_s(), ttls.UNAVAILABLE_TTL_S, ttls.LAUNCH_GRACE_S) + 1)
    p.non_terminated_nodes({})
    again = p.create_node_with_resources_and_labels({}, tags("req-1"), 5, GPU, {})
    assert sorted(again) == sorted(first) and cloud.launches[-1].offering.zone == "us-west-2b"
    assert len(cloud.machines) == 5


def test_a_restarted_provider_answers_rays_retry_from_the_listing_on_moto(moto: MotoServer):
    """moto does not honour ClientToken (a repeated token launches again, like some EC2-compatible endpoints):
    the monitor restarted, Ray retries the request, and the listed machines are the answer."""
    from tests.providers.aws.helpers import live
    from tests.providers.aws.test_aws_provider import GPU_TAGS, _provider

    p = _provider(moto)
    tags_ = dict(GPU_TAGS, **{"ray-launch-request": "req-1"})
    first = sorted(p.create_node_with_resources_and_labels({}, tags_, 5, GPU, {}))
    assert len(live(moto)) == 5
    restarted = _provider(moto)
    restarted.non_terminated_nodes({})
    again = sorted(restarted.create_node_with_resources_and_labels({}, tags_, 5, GPU, {}))
    assert again == first and len(live(moto)) == 5
    assert {restarted.node_tags(i)[TAG_REQUEST] for i in again} == {p.node_tags(first[0])[TAG_REQUEST]}
