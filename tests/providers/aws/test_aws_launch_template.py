"""A node_config with a `LaunchTemplate` (issue 10): what the template pins about the instance (InstanceType, a
spot InstanceMarketOptions) is what is planned and launched, against moto's launch templates. Before, Ray's
template step read the template but only ImageId/KeyName/subnets/security groups were kept: the planner picked its
own cheapest type and RunInstances overrode the template's type with it."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli import main
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import check_cluster
from ray_nodeless.providers.aws.backend import AwsBackend
from ray_nodeless.ray_adapter.bootstrap import bootstrap_config
from ray_nodeless.testing.moto_server import REGION, MotoServer
from tests.providers.aws.helpers import all_instances, make_spec
from tests.providers.aws.test_aws_bootstrap import CLUSTER, nc, ours

TEMPLATE = "ray-gpu"


def template(moto: MotoServer, **data: Any) -> str:
    r = moto.client().create_launch_template(
        LaunchTemplateName=TEMPLATE, LaunchTemplateData={"ImageId": moto.ami(), **data})
    return r["LaunchTemplate"]["LaunchTemplateId"]


def with_template(moto: MotoServer, ref: dict[str, Any], **gpu_node_config: Any) -> dict[str, Any]:
    cfg = ours(moto)
    nc(cfg, "gpu").update({"LaunchTemplate": ref, **gpu_node_config})
    nc(cfg, "head")["ImageId"] = moto.ami()
    return cfg


def test_unpinned_the_planner_would_pick_another_type(aws: MotoServer) -> None:
    """The premise: for {CPU: 4, GPU: 1} the cheapest fit in us-east-1 is not g4dn.2xlarge."""
    cfg = ours(aws)
    nc(cfg, "gpu")["ImageId"] = nc(cfg, "head")["ImageId"] = aws.ami()
    assert check_cluster(cfg).plans["gpu"].chosen.instance_type.name != "g4dn.2xlarge"


@pytest.mark.parametrize("ref", [{"LaunchTemplateName": TEMPLATE, "Version": "$Latest"},
                                 {"LaunchTemplateName": TEMPLATE}, "by-id"])
def test_the_templates_instance_type_is_planned_and_launched(aws: MotoServer, ref: Any) -> None:
    tid = template(aws, InstanceType="g4dn.2xlarge")
    if ref == "by-id":
        ref = {"LaunchTemplateId": tid, "Version": "1"}
    got = bootstrap_config(with_template(aws, ref))
    assert nc(got, "gpu")["InstanceType"] == "g4dn.2xlarge"
    plan = check_cluster(got).plans["gpu"]
    assert {o.instance_type.name for o in plan.candidates()} == {"g4dn.2xlarge"}
    backend = AwsBackend.from_provider(copy.deepcopy(got["provider"]), CLUSTER)
    try:
        [iid] = backend.launch(make_spec(plan.chosen, cluster=CLUSTER, node_config=nc(got, "gpu")))
        [inst] = [i for i in all_instances(aws) if i["InstanceId"] == iid]
        assert inst["InstanceType"] == "g4dn.2xlarge"
        backend.terminate([iid])
    finally:
        backend.close()


def test_the_node_configs_own_instance_type_overrides_the_template_as_in_ray(aws: MotoServer) -> None:
    template(aws, InstanceType="g4dn.2xlarge")
    got = bootstrap_config(with_template(aws, {"LaunchTemplateName": TEMPLATE}, InstanceType="g5.xlarge"))
    assert nc(got, "gpu")["InstanceType"] == "g5.xlarge"
    assert check_cluster(got).plans["gpu"].chosen.instance_type.name == "g5.xlarge"


def test_a_spot_template_pins_spot_capacity(aws: MotoServer) -> None:
    template(aws, InstanceType="g4dn.xlarge", InstanceMarketOptions={"MarketType": "spot"})
    got = bootstrap_config(with_template(aws, {"LaunchTemplateName": TEMPLATE}))
    assert {(o.instance_type.name, o.capacity) for o in check_cluster(got).plans["gpu"].candidates()} == {
        ("g4dn.xlarge", "spot")}


def test_a_template_without_instance_type_leaves_the_choice_to_the_planner(aws: MotoServer) -> None:
    template(aws)
    got = bootstrap_config(with_template(aws, {"LaunchTemplateName": TEMPLATE}))
    assert "InstanceType" not in nc(got, "gpu")
    assert check_cluster(got).plans["gpu"].chosen.instance_type.gpu_count == 1


@pytest.mark.parametrize("data,words", [
    ({"InstanceRequirements": {"VCpuCount": {"Min": 4}, "MemoryMiB": {"Min": 16384}}}, "InstanceRequirements"),
    ({"InstanceType": "g4dn.xlarge", "InstanceMarketOptions": {"MarketType": "capacity-block"}}, "MarketType"),
])
def test_what_a_template_pins_and_cannot_be_honoured_is_refused_naming_it(aws: MotoServer, data, words) -> None:
    template(aws, **data)
    with pytest.raises(ConfigError) as e:
        bootstrap_config(with_template(aws, {"LaunchTemplateName": TEMPLATE}))
    assert e.value.key == "available_node_types.gpu.node_config.LaunchTemplate" and words in str(e.value)
    assert all_instances(aws) == []


def test_a_missing_template_is_an_error_naming_the_key(aws: MotoServer) -> None:
    with pytest.raises(ConfigError) as e:
        bootstrap_config(with_template(aws, {"LaunchTemplateName": "nope"}))
    assert "LaunchTemplate" in e.value.key


def test_plan_says_the_template_is_read_at_ray_up(aws: MotoServer, tmp_path: Path) -> None:
    """`plan` makes no API call: it cannot read the template, and says so under the node type."""
    cfg = with_template(aws, {"LaunchTemplateName": TEMPLATE})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = CliRunner().invoke(main, ["plan", str(path)])
    assert r.exit_code == 0, r.output
    assert f"LaunchTemplate {TEMPLATE}" in r.output and "ray up" in r.output
    assert REGION in r.output
