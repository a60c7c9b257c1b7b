"""Teardown needs no rules (issue 15): `rules:` / `exclude:` edited since `ray up` into something that does not
parse is refused by `ray up` naming the key, but `ray down` (Ray's own teardown_cluster: our bootstrap_config,
then provider objects that list and terminate) and `ray-nodeless sweep` end every machine of the cluster, with a
warning naming the key. Only the planning keys get this leniency: a broken key the backend needs still stops
teardown, naming it. On the in-memory backend (ray_nodeless.testing.fake_backend)."""
from __future__ import annotations

import logging
from typing import Any

import pytest

from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.sweep import Sweep
from ray_nodeless.providers.base import TAG_CLUSTER
from ray_nodeless.ray_adapter.provider import NodelessProvider
from tests.helpers import cluster_config, write_cluster_yaml
from tests.launch.test_reliability import GPU, tags
from tests.ray_adapter.test_provider import PROVIDER

# provider-block edits that no longer parse, and the key each error names
BROKEN: list[tuple[dict[str, Any], str]] = [
    ({"rules": "gpu-spot-first"}, "provider.rules"),
    ({"rules": [{"name": "gpu", "match": {"GPU": ">=one"}, "capacity": ["spot"]}]}, "provider.rules[0].match.GPU"),
    ({"exclude": {"gpuz": ["K80"]}}, "provider.exclude.gpuz"),
]


@pytest.fixture
def launched(cloud):  # noqa: F811
    """Three GPU workers of cluster c1, launched under rules that parsed."""
    up = NodelessProvider(dict(PROVIDER), "c1")
    up.create_node_with_resources_and_labels({}, tags(), 3, GPU, {})
    assert len(up.non_terminated_nodes({})) == 3
    return cloud


def ours(cloud) -> list[Any]:  # noqa: F811
    return [m for m in cloud.machines.values() if m.tags.get(TAG_CLUSTER) == "c1"]


def broken_config(edit: dict[str, Any], tmp_path) -> dict[str, Any]:
    return cluster_config(dict(PROVIDER, **edit), max_workers=4, ray_keys=True,
                          workers={"gpu_worker": {"resources": dict(GPU), "node_config": {}, "max_workers": 4}},
                          # Ray caches a bootstrapped config by its hash in /tmp: make this one new, or our
                          # bootstrap is skipped.
                          initialization_commands=[f"echo {tmp_path.name}"])


@pytest.mark.parametrize("edit,key", BROKEN, ids=[k for _, k in BROKEN])
def test_ray_down_ends_every_machine_when_the_rules_no_longer_parse(launched, tmp_path, caplog, edit, key):
    from ray.autoscaler._private.commands import teardown_cluster

    config = broken_config(edit, tmp_path)
    with pytest.raises(ConfigError) as e:               # `ray up` refuses it, naming the key
        NodelessProvider.bootstrap_config(config)
    assert e.value.key == key
    path = write_cluster_yaml(tmp_path / "cluster.yaml", config)
    with caplog.at_level(logging.WARNING, logger="ray_nodeless"):
        teardown_cluster(path, yes=True, workers_only=False, override_cluster_name=None, keep_min_workers=False)
    assert ours(launched) == [] and launched.calls.get("terminate", 0) >= 1
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and key in r.getMessage()]
    assert warned and all("not needed to end the cluster's machines" in w for w in warned), caplog.text


@pytest.mark.parametrize("edit,key", BROKEN[1:2], ids=[k for _, k in BROKEN[1:2]])
def test_sweep_ends_every_machine_when_the_rules_no_longer_parse(launched, tmp_path, caplog, edit, key):
    sweep = Sweep(broken_config(edit, tmp_path), verify_s=0)
    try:
        result = sweep.run()
    finally:
        sweep.close()
    assert result.ok and len(result.ended) == 3 and ours(launched) == []
    assert key in caplog.text


def test_teardown_still_refuses_a_key_the_backend_needs(launched, tmp_path):
    """Only planning is skipped: a provider block whose region does not parse names it under `ray down` too (the
    backend must be built from it), and nothing is ended."""
    from ray.autoscaler._private.commands import teardown_cluster

    path = write_cluster_yaml(tmp_path / "cluster.yaml", broken_config({"region": ""}, tmp_path))
    with pytest.raises(ConfigError) as e:
        teardown_cluster(path, yes=True, workers_only=False, override_cluster_name=None, keep_min_workers=False)
    assert e.value.key == "provider.region"
    assert len(ours(launched)) == 3


def test_outside_teardown_the_loader_refuses_broken_rules():
    """The leniency is teardown's alone: a provider object Ray's monitor builds (or `plan`) refuses the block."""
    for edit, key in BROKEN:
        with pytest.raises(ConfigError) as e:
            NodelessProvider(dict(PROVIDER, **edit), "c1")
        assert e.value.key == key
