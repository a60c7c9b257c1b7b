"""AwsBackend against moto's server, through real boto3/botocore (retries, pagination, parsing included).

moto does not enforce ClientToken idempotency, MaxCount semantics, nor any capacity error; those are injected with
botocore `before-send` hooks on the backend's own clients and the backend's behaviour is asserted directly.
"""
from __future__ import annotations

import logging
import time

import pytest

from ray_nodeless.core.schema import parse_section
from ray_nodeless.errors import BackendError, CapacityError, ConfigError, ForeignMachineError, TransientBackendError
from ray_nodeless.testing.clock import FakeClock
from ray_nodeless.providers.aws.backend import AwsBackend
from ray_nodeless.providers.aws.launch_params import TAG_REQUEST, client_token
from ray_nodeless.providers.aws.settings import AwsSettings
from ray_nodeless.providers.base import MACHINE_PENDING, MACHINE_RUNNING, TAG_CLUSTER
from ray_nodeless.testing.moto_server import REGION, MotoServer, counter, ec2_error, install, query_params
from tests.providers.aws.helpers import (
    CLUSTER, G4, M5, all_instances, capture_params, live, make_backend, make_spec, offering, tags_of,
)


# ----------------------------------------------------------------------------------------------------- round trip


def test_on_demand_round_trip(moto: MotoServer) -> None:
    b = make_backend(moto)
    spec = make_spec(count=2)
    ids = b.launch(spec)
    assert len(ids) == 2

    insts = {i["InstanceId"]: i for i in live(moto)}
    assert set(insts) == set(ids)
    for i in insts.values():
        assert i["InstanceType"] == "m5.large"
        assert i["Placement"]["AvailabilityZone"] == "us-east-1a"
        assert "InstanceLifecycle" not in i
        tags = tags_of(i)
        assert spec.tags.items() <= tags.items()
        assert tags[TAG_CLUSTER] == CLUSTER and tags[TAG_REQUEST] == spec.request_token
        assert i["ClientToken"] == spec.request_token
    # Volumes are tagged at creation too (no untagged resource ever exists).
    vols = moto.client().describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": ids}])["Volumes"]
    assert len(vols) == 2 and all(tags_of(v)[TAG_CLUSTER] == CLUSTER for v in vols)

    machines = {m.id: m for m in b.list_machines()}
    assert set(machines) == set(ids)
    for m in machines.values():
        assert m.state in (MACHINE_PENDING, MACHINE_RUNNING)
        assert m.internal_ip == insts[m.id]["PrivateIpAddress"]
        assert m.external_ip == insts[m.id].get("PublicIpAddress")
        assert m.launched_at == pytest.approx(insts[m.id]["LaunchTime"].timestamp())
        assert m.tags["ray-user-node-type"] == "cpu"

    b.set_tags(ids[0], {"ray-node-status": "up-to-date"})
    assert tags_of(all_instances(moto, instance_id=[ids[0]])[0])["ray-node-status"] == "up-to-date"
    assert {m.id: m.tags["ray-node-status"] for m in b.list_machines()}[ids[0]] == "up-to-date"

    b.terminate(ids)
    assert b.list_machines() == []
    states = {i["State"]["Name"] for i in all_instances(moto, instance_id=ids)}
    assert states <= {"shutting-down", "terminated"}


def test_spot_launch(moto: MotoServer) -> None:
    b = make_backend(moto)
    params = capture_params(b)
    spec = make_spec(offering(G4, "us-east-1b", "spot"), count=1,
                     node_config={"InstanceMarketOptions": {"MarketType": "spot",
                                                            "SpotOptions": {"MaxPrice": "0.5"}}})
    ids = b.launch(spec)
    [inst] = live(moto)
    assert inst["InstanceId"] == ids[0]
    assert inst["InstanceLifecycle"] == "spot"
    assert inst["InstanceType"] == "g4dn.xlarge" and inst["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert params[0]["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate",
                        "MaxPrice": "0.5"}}
    assert spec.tags.items() <= tags_of(inst).items()


def test_on_demand_drops_user_spot_options(moto: MotoServer) -> None:
    b = make_backend(moto)
    params = capture_params(b)
    b.launch(make_spec(node_config={"InstanceMarketOptions": {"MarketType": "spot"}}))
    assert "InstanceMarketOptions" not in params[0]
    assert "InstanceLifecycle" not in live(moto)[0]


# ----------------------------------------------------------------------------------------- node_config handling


def test_node_config_pass_through_and_subnet_ids(moto: MotoServer) -> None:
    ec2 = moto.client()
    subnets = {s["AvailabilityZone"]: s["SubnetId"] for s in ec2.describe_subnets(
        Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]}
    sg = ec2.create_security_group(GroupName="ray", Description="ray")["GroupId"]
    ec2.create_key_pair(KeyName="ray-key")
    b = make_backend(moto)
    params = capture_params(b)
    node_config = {
        "InstanceType": "m5.xlarge",          # an allow-list for the planner; the offering decides
        "KeyName": "ray-key",
        "SecurityGroupIds": [sg],
        "SubnetIds": [subnets["us-east-1a"], subnets["us-east-1c"]],
        "UserData": "#!/bin/sh\necho SECRET-USER-DATA\n",
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 100}}],
        "Placement": {"Tenancy": "default", "AvailabilityZone": "us-east-1c"},
        "TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": "team", "Value": "ml"},
                                                                    {"Key": TAG_CLUSTER, "Value": "spoof"}]}],
        "min_vcpus": 2,                       # a requirement key that leaked through: stripped, not sent
    }
    assert b.requirement_overrides(b.settings, node_config) == {"instance_types": ["m5.xlarge"],
                                                                       "zones": ["us-east-1c"]}
    ids = b.launch(make_spec(offering(M5, "us-east-1c"), node_config=node_config))

    p = params[0]
    assert p["InstanceType"] == "m5.large"
    assert p["SubnetId"] == subnets["us-east-1c"] and "SubnetIds" not in p
    assert p["Placement"] == {"Tenancy": "default", "AvailabilityZone": "us-east-1c"}
    assert p["KeyName"] == "ray-key" and p["SecurityGroupIds"] == [sg]
    assert "min_vcpus" not in p
    assert p["MinCount"] == p["MaxCount"] == 1 and p["ClientToken"]
    [inst] = all_instances(moto, instance_id=ids)
    assert inst["SubnetId"] == subnets["us-east-1c"] and inst["KeyName"] == "ray-key"
    tags = tags_of(inst)
    assert tags["team"] == "ml" and tags[TAG_CLUSTER] == CLUSTER   # user tags kept, ours win
    assert node_config["InstanceType"] == "m5.xlarge"              # the caller's dict is not mutated


def test_subnet_ids_without_the_zone_is_a_capacity_error(moto: MotoServer) -> None:
    ec2 = moto.client()
    sub_a = ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]},
                                          {"Name": "availability-zone", "Values": ["us-east-1a"]}])["Subnets"][0]
    b = make_backend(moto)
    with pytest.raises(CapacityError) as e:
        b.launch(make_spec(offering(M5, "us-east-1b"), node_config={"SubnetIds": [sub_a["SubnetId"]]}))
    assert e.value.category == "NoSubnetInZone"
    assert live(moto) == []


def test_subnet_discovery_by_tag_and_default(moto: MotoServer) -> None:
    ec2 = moto.client()
    vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    own = ec2.create_subnet(VpcId=vpc, CidrBlock="172.31.200.0/24", AvailabilityZone="us-east-1b",
                            TagSpecifications=[{"ResourceType": "subnet",
                                                "Tags": [{"Key": "ray-nodeless-subnet", "Value": "1"}]}])
    own_id = own["Subnet"]["SubnetId"]
    b = make_backend(moto)
    [i] = b.launch(make_spec(offering(M5, "us-east-1b")))
    assert all_instances(moto, instance_id=[i])[0]["SubnetId"] == own_id
    with pytest.raises(CapacityError, match="us-east-1c"):
        b.launch(make_spec(offering(M5, "us-east-1c")))

    # Without tagged subnets: the default subnet of the AZ.
    ec2.delete_tags(Resources=[own_id], Tags=[{"Key": "ray-nodeless-subnet"}])
    b2 = make_backend(moto)
    [j] = b2.launch(make_spec(offering(M5, "us-east-1c")))
    inst = all_instances(moto, instance_id=[j])[0]
    default_c = ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]},
                                              {"Name": "availability-zone", "Values": ["us-east-1c"]}])["Subnets"]
    assert inst["SubnetId"] == default_c[0]["SubnetId"]


def test_subnet_discovery_is_cached_across_launches(moto: MotoServer) -> None:
    b = make_backend(moto)
    describes = counter(b.ec2, "DescribeSubnets")
    b.launch(make_spec(offering(M5, "us-east-1a")))
    first = describes.calls
    b.launch(make_spec(offering(M5, "us-east-1b")))
    assert first == 2 and describes.calls == first      # tagged (none), then default-for-az; then the cache


def test_provider_subnets_map(moto: MotoServer) -> None:
    ec2 = moto.client()
    sub = {s["AvailabilityZone"]: s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]}
    b = make_backend(moto, subnets={"us-east-1d": sub["us-east-1d"]})
    assert b.requirement_overrides(b.settings, {}) == {"zones": ["us-east-1d"]}
    [i] = b.launch(make_spec(offering(M5, "us-east-1d")))
    assert all_instances(moto, instance_id=[i])[0]["SubnetId"] == sub["us-east-1d"]
    with pytest.raises(CapacityError):
        b.launch(make_spec(offering(M5, "us-east-1a")))


def test_validate_node_config(moto: MotoServer) -> None:
    b = make_backend(moto)
    key = "available_node_types.cpu.node_config"
    b.check_node_config(b.settings, "cpu", {
        "ImageId": "ami-1", "SubnetIds": ["s-1"], "IamInstanceProfile": {"Arn": "x"}, "MetadataOptions": {},
        "EbsOptimized": True, "NetworkInterfaces": [], "InstanceType": "m5.large", "gpus": ["T4"],
        "max_hourly_price": 1}, key)
    with pytest.raises(ConfigError) as e:
        b.check_node_config(b.settings, "cpu", {"ImageId": "ami-1", "SecurityGroupIDs": ["sg"]}, key)
    assert e.value.key == f"{key}.SecurityGroupIDs" and "SecurityGroupIds" in str(e.value)
    with pytest.raises(ConfigError) as e:
        b.check_node_config(b.settings, "cpu", {"ImageId": "ami-1", "MaxCount": 3}, key)
    assert e.value.key == f"{key}.MaxCount"
    with pytest.raises(ConfigError) as e:
        b.check_node_config(b.settings, "cpu", {"ImageId": "ami-1", "SubnetIds": "subnet-1"}, key)
    assert e.value.key == f"{key}.SubnetIds"

    no_image = make_backend(moto, image_id=None)
    with pytest.raises(ConfigError) as e:
        no_image.check_node_config(no_image.settings, "cpu", {}, key)
    assert e.value.key == f"{key}.ImageId"
    with pytest.raises(ConfigError) as e:
        no_image.launch(make_spec())
    assert e.value.key == "available_node_types.cpu.node_config.ImageId"
    assert live(moto) == []

    with pytest.raises(ConfigError) as e:
        AwsBackend.from_provider({}, CLUSTER)
    assert e.value.key == "provider.region"


def test_long_request_token_is_hashed_for_client_token(moto: MotoServer) -> None:
    long = "x" * 100
    assert len(client_token(long)) == 64 and client_token("abc") == "abc"
    b = make_backend(moto)
    [i] = b.launch(make_spec(token=long))
    assert tags_of(all_instances(moto, instance_id=[i])[0])[TAG_REQUEST] == long


# ---------------------------------------------------------------------------------------- cluster isolation


def test_foreign_instances_are_never_listed_tagged_or_terminated(moto: MotoServer) -> None:
    ec2 = moto.client()
    untagged = ec2.run_instances(ImageId=moto.ami(), MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    other = ec2.run_instances(ImageId=moto.ami(), MinCount=1, MaxCount=1, TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": "c2"}]}])["Instances"][0]["InstanceId"]
    b = make_backend(moto)
    [mine] = b.launch(make_spec())

    assert [m.id for m in b.list_machines()] == [mine]
    for foreign in (untagged, other):
        with pytest.raises(ForeignMachineError):
            b.set_tags(foreign, {"ray-node-status": "hijacked"})
    with pytest.raises(BackendError) as ei:
        b.set_tags(mine, {TAG_CLUSTER: "c2"})        # would move our instance into another cluster
    assert ei.value.category == "WrongCluster"

    fresh = make_backend(moto)        # nothing cached: terminate must verify the tags itself
    terminates = counter(fresh.ec2, "TerminateInstances")
    with pytest.raises(ForeignMachineError) as fe:   # ours ended, the foreign ones refused by name
        fresh.terminate([untagged, other, mine])
    assert fe.value.machine_ids == sorted([untagged, other])
    assert terminates.calls == 1
    state = {i["InstanceId"]: i["State"]["Name"] for i in all_instances(moto)}
    assert state[untagged] == "running" and state[other] == "running"
    assert state[mine] in ("shutting-down", "terminated")
    for iid in (untagged, other):
        assert "ray-node-status" not in tags_of(all_instances(moto, instance_id=[iid])[0])


def test_terminate_ignores_gone_ids(moto: MotoServer) -> None:
    b = make_backend(moto)
    ids = b.launch(make_spec(count=2))
    b.terminate(ids)
    b.terminate(ids)                                              # already terminated: no error
    fresh = make_backend(moto)
    terminates = counter(fresh.ec2, "TerminateInstances")
    fresh.terminate(ids)                                          # terminated: ignored
    assert terminates.calls == 0                                  # nothing of ours left to terminate
    # An id EC2 does not show at all may be an instance launched moments ago (listing lag): not skipped as gone.
    with pytest.raises(TransientBackendError) as ei:
        fresh.terminate(ids + ["i-0123456789abcdef0"])
    assert ei.value.category == "NotYetVisible" and terminates.calls == 0


def test_terminate_retries_without_ids_ec2_says_are_gone(moto: MotoServer) -> None:
    from ray_nodeless.core import ttls

    b = make_backend(moto)
    b.clock = clock = FakeClock(time.time())
    ids = b.launch(make_spec(count=3))
    b.list_machines()
    # Instances past the launch grace: a NotFound means gone (for a younger one it is eventual consistency and is
    # retried: tests/providers/aws/test_aws_not_found.py).
    clock.advance(ttls.LAUNCH_GRACE_S + 60)     # well past it: listings read moto's real LaunchTime

    def vanish(request, n):
        if n == 1:   # as if ids[0] had vanished between our listing and this call (EC2 fails the whole call)
            return ec2_error(request, "InvalidInstanceID.NotFound", f"The instance ID '{ids[0]}' does not exist",
                             400)
        assert ids[0] not in str(query_params(request))
        return None

    hook = install(b.ec2, "TerminateInstances", vanish)
    b.terminate(ids)
    assert hook.calls == 2
    state = {i["InstanceId"]: i["State"]["Name"] for i in all_instances(moto, instance_id=ids)}
    assert state[ids[0]] == "running"     # we were told it is gone, so the retry left it out
    assert {state[ids[1]], state[ids[2]]} <= {"shutting-down", "terminated"}


def test_terminate_chunks_of_1000(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import ray_nodeless.providers.aws.backend as aws

    monkeypatch.setattr(aws, "TERMINATE_CHUNK", 2)
    b = make_backend(moto)
    ids = b.launch(make_spec(count=5))
    terminates = counter(b.ec2, "TerminateInstances")
    b.terminate(ids)
    assert terminates.calls == 3 and live(moto) == []


def test_stopped_instances_are_not_listed_but_warned(moto: MotoServer, caplog: pytest.LogCaptureFixture) -> None:
    b = make_backend(moto)
    a, c = b.launch(make_spec(count=2))
    moto.client().stop_instances(InstanceIds=[c])
    with caplog.at_level(logging.WARNING, logger="ray_nodeless"):
        assert [m.id for m in b.list_machines()] == [a]
        b.list_machines()
    assert sum(c in r.getMessage() and "stopped" in r.getMessage() for r in caplog.records) == 1
    b.terminate([c])                                        # still ours: `ray down` can clean it up
    assert all_instances(moto, instance_id=[c])[0]["State"]["Name"] in ("shutting-down", "terminated")


# --------------------------------------------------------------------------------------------- listing


def test_listing_paginates_as_one_logical_call(moto: MotoServer) -> None:
    b = make_backend(moto, aws_describe_page_size=5)
    ids = [b.launch(make_spec())[0] for _ in range(12)]     # 12 reservations: moto pages by reservation
    describes = counter(b.ec2, "DescribeInstances")
    machines = b.list_machines()
    assert sorted(m.id for m in machines) == sorted(ids)
    assert describes.calls == 3


def test_listing_throttled_is_transient(moto: MotoServer) -> None:
    b = make_backend(moto, aws_max_attempts=2)
    hook = install(b.ec2, "DescribeInstances", lambda r, n: ec2_error(r, "RequestLimitExceeded", "x", 503))
    with pytest.raises(TransientBackendError) as e:
        b.list_machines()
    assert e.value.category == "RequestLimitExceeded" and hook.calls == 2


def test_listing_connection_error_is_transient() -> None:
    b = AwsBackend.from_provider({"region": REGION, "endpoint_url": "http://127.0.0.1:9", "aws_max_attempts": 1,
                    "aws_credentials": {"aws_access_key_id": "x", "aws_secret_access_key": "y"}}, CLUSTER)
    with pytest.raises(TransientBackendError):
        b.list_machines()


def test_user_data_is_never_logged(moto: MotoServer, caplog: pytest.LogCaptureFixture) -> None:
    b = make_backend(moto)
    install(b.ec2_launch, "RunInstances", lambda r, n: ec2_error(r, "RequestLimitExceeded", "x", 503) if n == 1
            else None)
    with caplog.at_level(logging.DEBUG, logger="ray_nodeless"):
        b.launch(make_spec(node_config={"UserData": "export TOKEN=SECRET-USER-DATA"}))
        b.list_machines()
    text = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("ray_nodeless"))
    assert "RunInstances" in text and "SECRET" not in text and "testing" not in text


def test_config_checks_are_class_level() -> None:
    """`bootstrap_config` and `plan` call these on the class: no clients, no backend object."""
    provider = parse_section(AwsSettings, {"region": REGION, "image_id": "ami-1"}, "provider")
    key = "available_node_types.gpu.node_config"
    AwsBackend.check_node_config(provider, "gpu", {"InstanceType": "g5.xlarge"}, key)
    assert AwsBackend.requirement_overrides(provider, {"InstanceType": "g5.xlarge"}) == {
        "instance_types": ["g5.xlarge"]}
    with pytest.raises(ConfigError) as e:
        AwsBackend.check_node_config(provider, "gpu", {"Foo": 1}, key)
    assert e.value.key == f"{key}.Foo"


def test_endpoint_from_aws_endpoint_url_env(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without provider.endpoint_url, botocore's own AWS_ENDPOINT_URL handling applies (how e2e runs reach moto)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    b = AwsBackend.from_provider({"region": REGION, "image_id": moto.ami(), "aws_retry_base_delay_s": 0.0}, CLUSTER)
    ids = b.launch(make_spec())
    assert [i["InstanceId"] for i in live(moto)] == ids


def test_without_disable_node_updaters_no_user_data_is_added(moto: MotoServer) -> None:
    b = make_backend(moto)
    [iid] = b.launch(make_spec())
    import boto3
    ec2 = boto3.client("ec2", endpoint_url=moto.url, region_name=REGION, aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    assert not ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"].get("Value")
