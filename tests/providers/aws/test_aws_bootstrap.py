"""`bootstrap_config` for `cloud: aws` against moto: the same IAM instance profile, key pair, security group,
subnets and default AMI that Ray's own `bootstrap_aws` gives a plain `type: aws` YAML (compared on the same moto),
subnets narrowed to the zones the rules allow, a missing AMI refused before anything exists, and the filled keys
honoured by the backend's RunInstances."""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.aws.backend import AwsBackend
from ray_nodeless.providers.aws.bootstrap import default_ami
from ray_nodeless.ray_adapter.bootstrap import bootstrap_config
from ray_nodeless.ray_adapter.ray_defaults import POST_LAUNCH_KEYS
from ray_nodeless.testing.moto_server import REGION, MotoServer
from tests.providers.aws.helpers import G4, all_instances, make_spec, offering

CREDS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
CLUSTER = "bs"


@pytest.fixture
def fresh(moto: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MotoServer:
    """An account where Ray's IAM step creates the profile and role. Key files go to ~/.ssh (Ray's naming): a home
    of the test's own. Ray's role attaches AWS managed policies, which moto 5 only knows with this switch (read
    when the reset IAM backend is rebuilt: about 4 s of moto's time per test)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
    return moto


@pytest.fixture
def aws(moto: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MotoServer:
    """An account that already has Ray's instance profile with its role (Ray's IAM step then only reads it)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    iam = moto.client("iam")
    iam.create_role(RoleName="ray-autoscaler-v1", AssumeRolePolicyDocument="{}")
    iam.create_instance_profile(InstanceProfileName="ray-autoscaler-v1")
    iam.add_role_to_instance_profile(InstanceProfileName="ray-autoscaler-v1", RoleName="ray-autoscaler-v1")
    return moto


def ours(moto: MotoServer, region: str = REGION, **provider: Any) -> dict[str, Any]:
    p = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws", "region": region,
         "endpoint_url": moto.url, "aws_credentials": dict(CREDS)}
    p.update(provider)
    return {
        "cluster_name": CLUSTER, "max_workers": 2, "provider": p, "auth": {"ssh_user": "ubuntu"},
        "head_node_type": "head", "head_node": {},
        "available_node_types": {
            "head": {"resources": {"CPU": 4}, "node_config": {}, "max_workers": 0},
            "gpu": {"resources": {"CPU": 4, "GPU": 1}, "node_config": {}, "max_workers": 2},
        },
        # what Ray's prepare_config leaves for `type: external` (it raises KeyError without these three)
        "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
    }


def rays(moto: MotoServer) -> dict[str, Any]:
    """The same cluster as a plain `type: aws` YAML, as Ray's own bootstrap_aws gets it."""
    return {
        "cluster_name": CLUSTER, "auth": {"ssh_user": "ubuntu"}, "head_node_type": "head",
        "provider": {"type": "aws", "region": REGION, "aws_credentials": dict(CREDS, endpoint_url=moto.url)},
        "available_node_types": {"head": {"node_config": {}}, "gpu": {"node_config": {}}},
    }


def nc(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    return cfg["available_node_types"][name]["node_config"]


def zone_of(moto: MotoServer) -> dict[str, str]:
    return {s["SubnetId"]: s["AvailabilityZone"] for s in moto.client().describe_subnets()["Subnets"]}


def test_fills_what_rays_own_bootstrap_fills(fresh: MotoServer) -> None:
    from ray.autoscaler._private.aws.config import bootstrap_aws

    aws = fresh
    role = lambda: aws.client("iam").list_instance_profiles()["InstanceProfiles"]  # noqa: E731
    assert role() == []

    got = bootstrap_config(ours(aws))
    ray = bootstrap_aws(rays(aws))            # after ours: the profile has its role, so Ray does not sleep
    assert got["head_node"]["IamInstanceProfile"] == ray["head_node"]["IamInstanceProfile"]
    assert got["head_node"]["IamInstanceProfile"]["Arn"].endswith(":instance-profile/ray-autoscaler-v1")
    assert got["auth"]["ssh_private_key"] == ray["auth"]["ssh_private_key"]
    assert os.path.exists(got["auth"]["ssh_private_key"])
    for name in ("head", "gpu"):
        mine, theirs = nc(got, name), nc(ray, name)
        for key in ("KeyName", "SecurityGroupIds", "SubnetIds", "ImageId"):
            assert mine[key] == theirs[key], key
        assert "IamInstanceProfile" not in mine       # the head instance only, through head_node, like Ray
        assert mine["ImageId"] == default_ami(REGION)
        assert mine["zones"] == sorted({zone_of(aws)[s] for s in mine["SubnetIds"]})
    sg = aws.client().describe_security_groups(GroupIds=nc(got, "head")["SecurityGroupIds"])["SecurityGroups"][0]
    assert sg["GroupName"] == f"ray-autoscaler-{CLUSTER}"
    assert aws.client().describe_key_pairs()["KeyPairs"][0]["KeyName"] == nc(got, "head")["KeyName"]
    assert all_instances(aws) == []          # bootstrap creates no machine
    [profile] = role()
    assert [r["RoleName"] for r in profile["Roles"]] == ["ray-autoscaler-v1"]
    policies = aws.client("iam").list_attached_role_policies(RoleName="ray-autoscaler-v1")["AttachedPolicies"]
    assert {p["PolicyName"] for p in policies} == {"AmazonEC2FullAccess", "AmazonS3FullAccess"}


def test_top_level_keys_ray_reads_after_the_head_launches_get_rays_defaults(aws: MotoServer, tmp_path) -> None:
    from ray.autoscaler._private.providers import _get_default_config

    got = bootstrap_config(ours(aws))
    defaults = _get_default_config({"type": "aws"})
    for key in POST_LAUNCH_KEYS:
        if key not in ("setup_commands", "head_setup_commands", "worker_setup_commands"):
            assert got[key] == defaults[key], key
    kept = ours(aws)
    # A mount whose source exists (bootstrap_config refuses a missing one before anything launches).
    kept.update(file_mounts={"/a": str(tmp_path)}, head_start_ray_commands=["echo mine"])
    got = bootstrap_config(kept)
    assert got["file_mounts"] == {"/a": str(tmp_path)} and got["head_start_ray_commands"] == ["echo mine"]


def test_subnets_are_limited_to_the_zones_the_rules_allow(aws: MotoServer) -> None:
    cfg = ours(aws, rules=[{"name": "two-zones", "match": {}, "zones": ["us-east-1b", "us-east-1c"]}])
    got = bootstrap_config(cfg)
    zones = zone_of(aws)
    for name in ("head", "gpu"):
        subnets = nc(got, name)["SubnetIds"]
        assert subnets and {zones[s] for s in subnets} == {"us-east-1b", "us-east-1c"}
        assert nc(got, name)["zones"] == ["us-east-1b", "us-east-1c"]


def test_node_config_zones_narrow_that_node_type_only(aws: MotoServer) -> None:
    cfg = ours(aws)
    nc(cfg, "gpu")["zones"] = ["us-east-1d"]
    got = bootstrap_config(cfg)
    zones = zone_of(aws)
    assert {zones[s] for s in nc(got, "gpu")["SubnetIds"]} == {"us-east-1d"}
    assert len({zones[s] for s in nc(got, "head")["SubnetIds"]}) == 6


def test_users_own_keys_are_kept(aws: MotoServer) -> None:
    ec2 = aws.client()
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    sg = ec2.create_security_group(GroupName="mine", Description="d", VpcId=vpc)["GroupId"]
    cfg = ours(aws, image_id=aws.ami())
    nc(cfg, "gpu").update(SecurityGroupIds=[sg], ImageId="ami-12345678")
    got = bootstrap_config(cfg)
    assert nc(got, "gpu")["SecurityGroupIds"] == [sg]
    assert nc(got, "gpu")["ImageId"] == "ami-12345678"
    assert "ImageId" not in nc(got, "head")               # provider.image_id: the backend's default, not Ray's
    assert nc(got, "head")["SecurityGroupIds"] != [sg]    # Ray's group for the head, in the same VPC


def test_latest_dlami_means_rays_default_ami(aws: MotoServer) -> None:
    cfg = ours(aws)
    nc(cfg, "gpu")["ImageId"] = "latest_dlami"
    assert nc(bootstrap_config(cfg), "gpu")["ImageId"] == default_ami(REGION)


def test_missing_ami_in_a_region_without_a_default_fails_before_anything_exists(fresh: MotoServer) -> None:
    aws = fresh
    region = "eu-north-1"
    assert default_ami(region) is None
    with pytest.raises(ConfigError) as e:
        bootstrap_config(ours(aws, region=region))
    assert e.value.key == "available_node_types.gpu.node_config.ImageId" or \
        e.value.key == "available_node_types.head.node_config.ImageId"
    assert "no default AMI" in str(e.value)
    for r in (region, REGION):
        assert all_instances(aws) == [] and aws.client(region=r).describe_key_pairs()["KeyPairs"] == []
    assert aws.client("iam").list_instance_profiles()["InstanceProfiles"] == []


def test_aws_endpoint_url_environment_is_honoured(aws: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws.url)
    cfg = ours(aws)
    del cfg["provider"]["endpoint_url"]
    got = bootstrap_config(cfg)
    assert nc(got, "head")["SecurityGroupIds"] and got["head_node"]["IamInstanceProfile"]


def test_local_player_gets_network_keys_only(moto: MotoServer, tmp_path: Path) -> None:
    cfg = ours(moto, registration="local-player", player_state_dir=str(tmp_path / "p"))
    got = bootstrap_config(cfg)
    assert "KeyName" not in nc(got, "head") and "ssh_private_key" not in got["auth"]
    assert "IamInstanceProfile" not in got["head_node"]
    assert moto.client("iam").list_instance_profiles()["InstanceProfiles"] == []
    assert nc(got, "head")["SecurityGroupIds"] and nc(got, "head")["SubnetIds"]


def test_a_step_the_account_refuses_is_a_config_error_naming_the_key(aws: MotoServer) -> None:
    cfg = ours(aws)
    nc(cfg, "head")["SubnetIds"] = ["subnet-00000000"]
    with pytest.raises(ConfigError) as e:
        bootstrap_config(cfg)
    assert "SubnetIds" in e.value.key


def test_the_backend_launches_with_the_filled_keys(aws: MotoServer) -> None:
    got = bootstrap_config(ours(aws))
    node_config = dict(nc(got, "gpu"), **got["head_node"])   # what `ray up` hands create_node for the head
    backend = AwsBackend.from_provider(copy.deepcopy(got["provider"]), CLUSTER)
    [iid] = backend.launch(make_spec(offering(G4, zone="us-east-1b"), cluster=CLUSTER, node_config=node_config))
    [inst] = [i for i in all_instances(aws) if i["InstanceId"] == iid]
    assert inst["KeyName"] == node_config["KeyName"]
    assert [g["GroupId"] for g in inst["SecurityGroups"]] == node_config["SecurityGroupIds"]
    assert inst["SubnetId"] in node_config["SubnetIds"] and zone_of(aws)[inst["SubnetId"]] == "us-east-1b"
    assert inst["ImageId"] == default_ami(REGION)
    assert inst["IamInstanceProfile"]["Arn"] == got["head_node"]["IamInstanceProfile"]["Arn"]
    backend.terminate([iid])
    backend.close()
