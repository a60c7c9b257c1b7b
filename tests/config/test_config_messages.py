"""The messages of the value checks, word for word where a user reads them: did-you-mean from the catalog, the key
that left a node type with no offering and what it would get without it, the cost cap's two figures, names, and
a launch that never went through `bootstrap_config` still refused with the key (issue 16.13)."""
from __future__ import annotations

import copy

import pytest
import yaml

from ray_nodeless.core.catalog import embedded
from ray_nodeless.errors import ConfigError, NoFeasibleOffering
from ray_nodeless.operate.config import check_cluster, prepare_like_ray_up
from ray_nodeless.providers.base import LaunchSpec
from tests import REPO_ROOT


def aws(region: str = "us-west-2") -> dict:
    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "aws-gpu-head.yaml").read_text())
    cfg["provider"]["region"] = region
    return cfg


def check(cfg: dict):
    return check_cluster(prepare_like_ray_up(copy.deepcopy(cfg)))


def test_an_instance_type_typo_gets_the_catalogs_nearest_name():
    cfg = aws("us-east-1")
    cfg["provider"]["rules"][0]["instance_types"] = ["g4dn.xlarg"]
    with pytest.raises(ConfigError) as e:
        check(cfg)
    assert str(e.value) == ("provider.rules[0].instance_types[0]: 'g4dn.xlarg' is not an aws instance type in "
                            "us-east-1; did you mean 'g4dn.xlarge'?")


def test_an_allow_list_of_types_the_region_lacks_is_refused_but_one_offered_type_is_enough():
    rc = embedded().region("aws", "us-west-2")
    offered = {rc.types[i].name for i in set(rc.type_ids)}
    missing = sorted(t.name for t in rc.types if t.name not in offered)
    assert missing, "the catalog has a type that us-west-2 does not offer"
    cfg = aws()
    cfg["provider"]["rules"][2]["instance_types"] = [missing[0]]
    with pytest.raises(ConfigError) as e:
        check(cfg)
    assert e.value.key == "provider.rules[2].instance_types" and "offered in aws us-west-2" in str(e.value)
    cfg["provider"]["rules"][2]["instance_types"] = [missing[0], "m5.*"]
    check(cfg)


def test_a_pin_the_exclusions_forbid_names_both_keys_and_the_nearest_offering():
    cfg = aws()
    cfg["available_node_types"]["gpu_worker"]["node_config"]["InstanceType"] = "g4dn.xlarge"
    cfg["provider"]["exclude"]["families"] = ["g4dn"]
    with pytest.raises(NoFeasibleOffering) as e:
        check(cfg)
    first = str(e.value).splitlines()[0]
    assert first.startswith("available_node_types.gpu_worker.node_config.InstanceType / provider.exclude.families: "
                            "leaves node type 'gpu_worker' {CPU: 4, GPU: 1} with no offering in aws us-west-2")
    assert "the nearest offering is " in first
    assert "no offering in aws us-west-2 fits node type 'gpu_worker'" in str(e.value)   # the planner's own, after


def test_a_gpu_count_no_instance_has_names_the_resource_and_the_largest():
    cfg = aws()
    cfg["available_node_types"]["gpu_worker"]["resources"]["GPU"] = 9
    with pytest.raises(NoFeasibleOffering) as e:
        check(cfg)
    assert str(e.value).startswith("available_node_types.gpu_worker.resources.GPU: 9 is more than any instance "
                                   "type in aws us-west-2 has (the most is 8 GPUs, ")


def test_a_cap_below_the_idle_cost_names_both_figures():
    cfg = aws()
    cp = check(cfg)
    head = cp.plans["head"].chosen.hourly_price
    cfg["available_node_types"]["gpu_worker"]["min_workers"] = 4
    idle = check(cfg).cost.idle_cost_per_hour
    cfg["provider"]["max_hourly_cost"] = round((head + idle) / 2, 4)
    with pytest.raises(ConfigError) as e:
        check(cfg)
    assert e.value.key == "provider.max_hourly_cost"
    assert f"${cfg['provider']['max_hourly_cost']:.4f}/h" in str(e.value) and f"${idle:.4f}/h" in str(e.value)
    cfg["provider"]["max_hourly_cost"] = round(head / 2, 4)
    with pytest.raises(ConfigError, match=r"below the head's own price: node type 'head' gets g4dn\.4xlarge"):
        check(cfg)
    cfg["provider"]["max_hourly_cost"] = idle + 0.01
    check(cfg)


@pytest.mark.parametrize("name,why", [("", "must not be empty"), ("x" * 64, "64 characters; at most 63"),
                                      (7, "must be a string")])
def test_cluster_names_ray_and_the_clouds_can_tag_with(name, why):
    cfg = aws()
    cfg["cluster_name"] = name
    with pytest.raises(ConfigError, match=why) as e:
        check(cfg)
    assert e.value.key == "cluster_name"


def test_a_launch_that_skipped_bootstrap_is_refused_with_the_key_not_a_raw_type_error():
    from ray_nodeless.providers.aws.launch_params import run_instances_params

    o = embedded().region("aws", "us-west-2").find("g4dn.xlarge", "us-west-2a", "on-demand")
    spec = LaunchSpec(cluster_name="c", node_type="gpu_worker", offering=o, count=1, tags={},
                      node_config={"ImageId": "ami-1", "UserData": 5}, request_token="t")
    with pytest.raises(ConfigError) as e:
        run_instances_params(spec, {"ray-cluster-name": "c"}, None, lambda zone, subnets: None)
    assert e.value.key == "available_node_types.gpu_worker.node_config.UserData"
