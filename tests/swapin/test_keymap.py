"""The key table names real code, and a Ray YAML swapped in by hand (only its provider block changed) means what
it meant to Ray: list-form scheduling, guestAccelerators and InstanceMarketOptions included."""
from __future__ import annotations

from pathlib import Path

import yaml

import ray_nodeless
from ray_nodeless.operate.config import check_cluster
from ray_nodeless.swapin import keymap
from ray_nodeless.swapin.convert import convert
from tests.swapin.helpers import PROJECT, example, quiet_ray


def test_every_mapping_names_a_file_of_the_package() -> None:
    from ray_nodeless.providers import backend_names

    root = Path(ray_nodeless.__file__).parent
    table = keymap.table()
    for m in table:
        assert (root / m.where.split()[0]).is_file(), m
        assert m.cloud in (*backend_names(), "both")
    # Each convertible backend contributes its own rows, through its SwapIn (providers/<cloud>/swapin.py).
    assert keymap.convertible() == ["aws", "gcp"]
    assert {m.cloud for m in table} == {"aws", "gcp", "both"}
    assert ("aws", "node_config.InstanceType") in {(m.cloud, m.ray_key) for m in table}
    assert ("gcp", "node_config.machineType") in {(m.cloud, m.ray_key) for m in table}


def test_a_ray_provider_type_without_a_swapin_is_refused_naming_the_key() -> None:
    """`type: local` is one of Ray's providers and a ray_nodeless backend, but the local backend has no SwapIn
    (BackendConfig's default): convert refuses it as it refuses a type no backend has."""
    import pytest

    from ray_nodeless.errors import ConfigError

    for ray_type in ("local", "azure", ["aws"]):
        with pytest.raises(ConfigError, match=r"provider.type: .*convert reads Ray YAMLs for `type: aws` or "
                                              r"`type: gcp`"):
            convert({"provider": {"type": ray_type}, "cluster_name": "c"})


def test_hand_swapped_gcp_yaml_with_rays_list_scheduling_and_accelerators() -> None:
    cfg = yaml.safe_load(example("gcp-example-gpu-docker.yaml").read_text())
    cfg["provider"] = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "gcp",
                       "region": "us-west1", "project_id": PROJECT, "availability_zone": "us-west1-b"}
    for nt in cfg["available_node_types"].values():       # the two things the catalog cannot give: K80, custom
        nt["node_config"]["guestAccelerators"][0]["acceleratorType"] = "nvidia-tesla-t4"
    cfg["available_node_types"]["ray_head_gpu"]["node_config"]["machineType"] = "n1-standard-8"
    cp = check_cluster(cfg)
    worker, head = cp.plans["ray_worker_gpu"], cp.plans["ray_head_gpu"]
    assert {(o.instance_type.name, o.capacity) for o in worker.candidates()} == {("n1-standard-2+1xT4", "spot")}
    assert {(o.instance_type.name, o.capacity) for o in head.candidates()} == {("n1-standard-8+1xT4", "on-demand")}
    launch = keymap.ray_launch("gcp", cfg["provider"], cfg["available_node_types"]["ray_worker_gpu"]["node_config"])
    assert launch == keymap.RayLaunch("n1-standard-2+1xT4", "spot", ("us-west1-b",))


def test_what_ray_itself_refuses_is_refused_with_rays_reason() -> None:
    """Ray 2.60 rejects a legacy head_node / worker_nodes config in its own schema: so does convert."""
    import pytest

    from ray_nodeless.errors import ConfigError

    quiet_ray()
    legacy = {"cluster_name": "old", "max_workers": 2,
              "provider": {"type": "aws", "region": "us-west-2", "availability_zone": "us-west-2a"},
              "head_node": {"InstanceType": "m5.xlarge"}, "worker_nodes": {"InstanceType": "m5.large"}}
    with pytest.raises(ConfigError, match=r"Ray's cluster schema refused it: .*'head_node', 'worker_nodes'"):
        convert(legacy)


def test_an_aws_node_type_without_resources_converts_as_ray_accepts_it() -> None:
    """Ray's AWS provider fills `resources` before its schema requires them; the converted YAML states `{}` and
    gets them filled from the pinned type at `ray up`."""
    from ray_nodeless.ray_adapter.provider import NodelessProvider
    from tests.swapin.helpers import prepared

    quiet_ray()
    cfg = yaml.safe_load(example("aws-example-minimal.yaml").read_text())
    cfg["available_node_types"] = {"head": {"node_config": {"InstanceType": "m5.xlarge"}},
                                   "w": {"node_config": {"InstanceType": "c5.large"}, "max_workers": 1}}
    cfg["head_node_type"] = "head"
    conv = convert(cfg)
    assert conv.config["available_node_types"]["w"]["resources"] == {}
    filled = NodelessProvider.fillout_available_node_types_resources(prepared(conv.config))
    assert filled["available_node_types"]["w"]["resources"] == {"CPU": 2, "memory": int(4096 * 2 ** 20 * 0.7)}
    assert filled["available_node_types"]["head"]["resources"] == {"CPU": 4}
