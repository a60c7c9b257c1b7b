"""Why a GCE instance went, from its zone's operations (providers/gcp/vanished.py; issue 16 #8 on GCP): a delete by
any provider object of the cluster (an overlapping monitor, a laptop's `ray down --workers-only`, the console) is
not an interruption, a preemption is. Through the real google-cloud-compute client against the fake Compute server,
which records both as GCE does."""
from __future__ import annotations

from typing import Iterator

import pytest
from google.cloud import compute_v1

from ray_nodeless.providers.base import TAG_CAPACITY, TAG_INSTANCE_TYPE, TAG_ZONE
from ray_nodeless.providers.gcp.vanished import target_filter
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing.fake_gce import FakeGce, client_kwargs
from ray_nodeless.testing.fault_matrix.core import WORKER_TAGS
from ray_nodeless.testing.fault_matrix.gcp import PROJECT, SHAPES, provider_config
from ray_nodeless.testing.fault_matrix.world import CLUSTER


@pytest.fixture
def fake() -> Iterator[FakeGce]:
    with FakeGce(project=PROJECT) as f:
        yield f


def launch(p: NodelessProvider, count: int, request: str) -> list[str]:
    tags = dict(WORKER_TAGS, **{"ray-user-node-type": "gpu", "ray-launch-request": request})
    p.create_node_with_resources_and_labels({}, tags, count, SHAPES["gpu"], {})
    return sorted(p.non_terminated_nodes({}))


def interrupted(p: NodelessProvider) -> set[tuple[str, str, str]]:
    return {k for k, why in p.unavailable.snapshot().items() if why == "interrupted"}


def offering(p: NodelessProvider, node_id: str) -> tuple[str, str, str]:
    t = p.node_tags(node_id)
    return t[TAG_INSTANCE_TYPE], t[TAG_ZONE], t[TAG_CAPACITY]


def test_another_objects_delete_is_not_an_interruption_and_a_preemption_is(fake: FakeGce) -> None:
    monitor = NodelessProvider(provider_config(fake), CLUSTER)
    ids = launch(monitor, 4, "r1")
    laptop = NodelessProvider(provider_config(fake), CLUSTER)        # `ray down --workers-only` from a laptop
    laptop.non_terminated_nodes({})
    laptop.terminate_nodes(ids[:2])
    # and one deleted by hand in the console: no nodeless-terminating tag at all
    zone = fake.instances[ids[2]]["zone"].rsplit("/", 1)[-1]
    compute_v1.InstancesClient(**client_kwargs(fake)).delete_unary(project=PROJECT, zone=zone, instance=ids[2])
    assert monitor.non_terminated_nodes({}) == [ids[3]]
    assert interrupted(monitor) == set()
    fake.preempt(ids[3])
    assert monitor.non_terminated_nodes({}) == []
    assert interrupted(monitor) == {offering(monitor, ids[3])}


def test_vanished_reasons_reads_the_zones_operations(fake: FakeGce) -> None:
    p = NodelessProvider(provider_config(fake), CLUSTER)
    ids = launch(p, 3, "r1")
    backend = p.backend
    backend.terminate([ids[0]])
    fake.preempt(ids[1])
    before = fake.count("zoneOperations.list")
    assert backend.vanished_reasons(ids + ["never-seen"]) == {ids[0]: "terminated", ids[1]: "interrupted"}
    zones = {fake.instances.get(i, {}).get("zone") for i in ids}
    assert fake.count("zoneOperations.list") - before <= len(zones)      # one call per zone, not per instance
    assert all(r.query["filter"] == target_filter(sorted(ids)) or "instances/(" in r.query["filter"]
               for r in fake.calls("zoneOperations.list"))
