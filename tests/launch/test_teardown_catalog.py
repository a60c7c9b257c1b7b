"""Teardown needs no catalog (issue 16, item 9): `provider.catalog` names a file that is gone (moved, or only on the
laptop that ran `ray up`), and `ray down` through Ray's own teardown path still ends every machine; the provider
object loads its catalog only at its first launch. On the in-memory backend (ray_nodeless.testing.fake_backend)."""
from __future__ import annotations

from pathlib import Path

import pytest
from ray.autoscaler.node_launch_exception import NodeLaunchException

from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.base import TAG_CATALOG, TAG_CLUSTER
from ray_nodeless.ray_adapter.provider import NodelessProvider
from tests.helpers import cluster_config, write_cluster_yaml
from tests.launch.test_reliability import GPU, tags
from tests.ray_adapter.test_provider import PROVIDER


def region_copy(path: Path, cloud_name: str = "aws", region: str = "us-west-2") -> Path:
    """A single-file catalog of one embedded region (what `provider.catalog: <path>` names)."""
    emb = catalog_mod.embedded()
    rc = emb.region(cloud_name, region)
    rows = [(o.instance_type.name, o.zone, o.capacity, o.hourly_price) for o in rc.offerings()]
    types = list(emb.types(cloud_name))
    doc = {"format": 1, "name": "copied", "clouds": {cloud_name: {
        "types": [catalog_mod.type_row(t) for t in types], "regions": {region: catalog_mod.region_entry(types, rows)}}}}
    path.write_bytes(catalog_mod.dump_bytes(doc))
    return path


@pytest.fixture
def gone_catalog(cloud, tmp_path):  # noqa: F811
    """Three GPU workers launched under a catalog file that is then deleted; the provider block naming it."""
    provider = dict(PROVIDER, catalog=str(region_copy(tmp_path / "catalog.json.gz")))
    up = NodelessProvider(dict(provider), "c1")
    up.create_node_with_resources_and_labels({}, tags(), 3, GPU, {})
    assert {m.tags[TAG_CATALOG] for m in cloud.machines.values()} == {up.catalog.catalog_id}
    assert up.catalog.catalog_id.startswith("copied@")
    Path(provider["catalog"]).unlink()
    return provider


def test_ray_down_ends_every_machine_when_the_catalog_file_is_gone(gone_catalog, cloud, tmp_path):  # noqa: F811
    """Ray's own `ray down` (commands.teardown_cluster: fillout + bootstrap_config, then a provider object that
    lists and terminates); `ray up` with the same YAML is refused naming the key."""
    from ray.autoscaler._private.commands import teardown_cluster

    config = cluster_config(gone_catalog, max_workers=4, ray_keys=True,
                            workers={"gpu_worker": {"resources": dict(GPU), "node_config": {}, "max_workers": 4}},
                            # Ray caches a bootstrapped config by its hash in /tmp: make this one new, or our
                            # bootstrap is skipped.
                            initialization_commands=[f"echo {tmp_path.name}"])
    with pytest.raises(ConfigError, match=r"^provider.catalog: cannot read catalog"):
        NodelessProvider.bootstrap_config(config)
    path = write_cluster_yaml(tmp_path / "cluster.yaml", config)
    teardown_cluster(path, yes=True, workers_only=False, override_cluster_name=None, keep_min_workers=False)
    assert [m for m in cloud.machines.values() if m.tags.get(TAG_CLUSTER) == "c1"] == []
    assert cloud.calls.get("terminate", 0) >= 1


def test_a_provider_without_its_catalog_lists_and_terminates_and_refuses_only_to_launch(gone_catalog,
                                                                                        cloud):  # noqa: F811
    p = NodelessProvider(dict(gone_catalog), "c1")        # constructing it reads no catalog
    nodes = p.non_terminated_nodes({})
    assert len(nodes) == 3 and p.node_tags(nodes[0])["ray-user-node-type"] == "gpu_worker"
    with pytest.raises(NodeLaunchException) as e:         # a launch needs the catalog: the error names the key
        p.create_node_with_resources_and_labels({}, tags(request="req-2"), 1, GPU, {})
    assert e.value.category == "ConfigError" and "provider.catalog: cannot read catalog" in e.value.description
    p.terminate_nodes(nodes)
    assert p.non_terminated_nodes({}) == [] and cloud.machines == {}
