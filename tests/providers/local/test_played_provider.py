"""`registration: local-player` through the Ray adapter: the provider's backend is the decorated one, so a launch
plays its machine, a terminate or a vanished machine stops its player, and a machine that cannot be played is
terminated before the launch fails. The cloud is the in-memory one (`cloud: fake`); players are real Ray nodes."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from ray.autoscaler.node_launch_exception import NodeLaunchException

from ray_nodeless.providers.local.played import PlayedBackend
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from ray_nodeless.testing.ray_processes import alive_nodes_by_instance, ray_head, stop_everything, wait_for

WORKER_TAGS = {"ray-node-type": "worker", "ray-user-node-type": "cpu_worker", "ray-node-status": "uninitialized",
               "ray-node-name": "ray-c1-worker", "ray-launch-config": "abc"}
CLUSTER = "t-played"


def provider_block(tmp_path: Path, gcs_address: str, **extra) -> dict:
    return {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "fake", "simulate_cloud": "aws",
            "region": "us-west-2", "list_cache_s": 0, "registration": "local-player", "gcs_address": gcs_address,
            "player_state_dir": str(tmp_path / "player"), "local_prewarm": False,
            "rules": [{"name": "cpu", "match": {}, "capacity": ["on-demand"]}], **extra}


@pytest.fixture(scope="module")
def gcs_address() -> Iterator[str]:
    with ray_head() as address:
        yield address


def test_a_machine_the_player_cannot_start_is_terminated_and_ray_sees_a_launch_error(tmp_path: Path) -> None:
    cloud = fake_backend.reset()
    p = NodelessProvider(provider_block(tmp_path, "127.0.0.1:1", local_min_free_memory_mb=10**9), CLUSTER)
    assert isinstance(p.backend, PlayedBackend)
    with pytest.raises(NodeLaunchException) as ei:
        p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 1}, {})
    assert ei.value.category == "LocalPlayerStartFailed"
    assert len(cloud.launches) == 1 and cloud.machines == {} and list(cloud.gone.values()) == ["terminated"]
    assert p.non_terminated_nodes({}) == []


@pytest.mark.e2e
def test_played_workers_follow_their_machines(tmp_path: Path, gcs_address: str) -> None:
    cloud = fake_backend.reset()
    p = NodelessProvider(provider_block(tmp_path, gcs_address), CLUSTER)
    nodes = p.backend.player.nodes
    try:
        p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, {"CPU": 1}, {})
        [mid] = p.non_terminated_nodes({})
        node = wait_for(lambda: alive_nodes_by_instance(gcs_address).get(mid), 30, "the played Ray node")
        assert p.internal_ip(mid) == node.node_manager_address != cloud.machines[mid].internal_ip
        # Reclaimed by the cloud: the listing no longer shows it, and its player goes with it.
        p.backend.inner.reclaim(mid)
        assert p.non_terminated_nodes({}) == []
        assert nodes.get(mid) is None
        wait_for(lambda: mid not in alive_nodes_by_instance(gcs_address), 20, "the reclaimed machine's Ray node")
    finally:
        stop_everything(nodes)
