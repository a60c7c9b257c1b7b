"""AwsBackend against moto's server, through real boto3/botocore (retries, pagination, parsing included).

moto does not enforce ClientToken idempotency, MaxCount semantics, nor any capacity error; those are injected with
botocore `before-send` hooks on the backend's own clients and the backend's behaviour is asserted directly.
"""
from __future__ import annotations

import logging
from typing import Any

import botocore.exceptions
import pytest

from ray_nodeless.core.catalog import InstanceType, Offering
from ray_nodeless.errors import BackendError, CapacityError, ConfigError, TransientBackendError
from ray_nodeless.providers.aws.backend import TAG_REQUEST, AwsBackend, client_token
from ray_nodeless.providers.base import MACHINE_PENDING, MACHINE_RUNNING, TAG_CLUSTER, LaunchSpec

from ray_nodeless.testing.moto_server import (REGION, MotoServer, counter, ec2_error, forward, install, query_params, unique)

CLUSTER = "c1"
M5 = InstanceType(cloud="aws", name="m5.large", family="m5", vcpus=2, memory_gib=8, machine_type="m5.large")
G4 = InstanceType(cloud="aws", name="g4dn.xlarge", family="g4dn", vcpus=4, memory_gib=16, gpu_model="T4",
                  gpu_count=1, gpu_memory_gib=16, machine_type="g4dn.xlarge")


def offering(t: InstanceType = M5, zone: str = "us-east-1a", capacity: str = "on-demand") -> Offering:
    return Offering(instance_type=t, region=REGION, zone=zone, capacity=capacity, hourly_price=0.096)


def make_backend(moto: MotoServer, cluster: str = CLUSTER, **extra: Any) -> AwsBackend:
    cfg: dict[str, Any] = {
        "region": REGION, "endpoint_url": moto.url, "image_id": moto.ami(),
        "aws_credentials": {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"},
        "aws_retry_base_delay_s": 0.0, "aws_max_attempts": 5,
    }
    cfg.update(extra)
    return AwsBackend(cfg, cluster)


def make_spec(off: Offering | None = None, count: int = 1, cluster: str = CLUSTER, node_config: dict | None = None,
              token: str | None = None) -> LaunchSpec:
    off = off or offering()
    tags = {
        TAG_CLUSTER: cluster, "ray-node-type": "worker", "ray-user-node-type": "cpu",
        "ray-node-name": f"ray-{cluster}-worker", "ray-node-status": "uninitialized",
        "nodeless-instance-type": off.instance_type.name, "nodeless-zone": off.zone,
        "nodeless-capacity": off.capacity, "nodeless-hourly-price": str(off.hourly_price),
    }
    return LaunchSpec(cluster_name=cluster, node_type="cpu", offering=off, count=count, tags=tags,
                      node_config=dict(node_config or {}), request_token=token or unique("tok"))


def all_instances(moto: MotoServer, tag: tuple[str, str] | None = None, **filters: list[str]) -> list[dict]:
    ec2 = moto.client()
    f = [{"Name": k.replace("_", "-"), "Values": v} for k, v in filters.items()]
    if tag:
        f.append({"Name": f"tag:{tag[0]}", "Values": [tag[1]]})
    out = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=f):
        for r in page["Reservations"]:
            out.extend(r["Instances"])
    return out


def live(moto: MotoServer) -> list[dict]:
    return all_instances(moto, instance_state_name=["pending", "running"])


def tags_of(inst: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


def capture_params(backend: AwsBackend) -> list[dict]:
    """RunInstances parameters as the backend built them (before serialisation)."""
    seen: list[dict] = []
    backend.ec2_launch.meta.events.register(
        "provide-client-params.ec2.RunInstances", lambda params, **_: seen.append(dict(params)))
    return seen


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
        "Placement": {"Tenancy": "default", "AvailabilityZone": "us-west-2a"},
        "TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": "team", "Value": "ml"},
                                                                    {"Key": TAG_CLUSTER, "Value": "spoof"}]}],
        "min_vcpus": 2,                       # a requirement key that leaked through: stripped, not sent
    }
    assert b.requirement_overrides(b.provider_config, node_config) == {"instance_types": ["m5.xlarge"]}
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


def test_provider_subnets_map(moto: MotoServer) -> None:
    ec2 = moto.client()
    sub = {s["AvailabilityZone"]: s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]}
    b = make_backend(moto, subnets={"us-east-1d": sub["us-east-1d"]})
    assert b.requirement_overrides(b.provider_config, {}) == {"zones": ["us-east-1d"]}
    [i] = b.launch(make_spec(offering(M5, "us-east-1d")))
    assert all_instances(moto, instance_id=[i])[0]["SubnetId"] == sub["us-east-1d"]
    with pytest.raises(CapacityError):
        b.launch(make_spec(offering(M5, "us-east-1a")))


def test_validate_node_config(moto: MotoServer) -> None:
    b = make_backend(moto)
    key = "available_node_types.cpu.node_config"
    b.check_node_config(b.provider_config, "cpu", {"ImageId": "ami-1", "SubnetIds": ["s-1"], "IamInstanceProfile": {"Arn": "x"},
                                   "MetadataOptions": {}, "EbsOptimized": True, "NetworkInterfaces": [],
                                   "InstanceType": "m5.large", "gpus": ["T4"], "max_hourly_price": 1}, key)
    with pytest.raises(ConfigError) as e:
        b.check_node_config(b.provider_config, "cpu", {"ImageId": "ami-1", "SecurityGroupIDs": ["sg"]}, key)
    assert e.value.key == f"{key}.SecurityGroupIDs" and "SecurityGroupIds" in str(e.value)
    with pytest.raises(ConfigError) as e:
        b.check_node_config(b.provider_config, "cpu", {"ImageId": "ami-1", "MaxCount": 3}, key)
    assert e.value.key == f"{key}.MaxCount"
    with pytest.raises(ConfigError) as e:
        b.check_node_config(b.provider_config, "cpu", {"ImageId": "ami-1", "SubnetIds": "subnet-1"}, key)
    assert e.value.key == f"{key}.SubnetIds"

    no_image = make_backend(moto, image_id=None)
    with pytest.raises(ConfigError) as e:
        no_image.check_node_config(no_image.provider_config, "cpu", {}, key)
    assert e.value.key == f"{key}.ImageId"
    with pytest.raises(ConfigError) as e:
        no_image.launch(make_spec())
    assert e.value.key == "available_node_types.cpu.node_config.ImageId"
    assert live(moto) == []

    with pytest.raises(ConfigError) as e:
        AwsBackend({}, CLUSTER)
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
    b.set_tags(untagged, {"ray-node-status": "hijacked"})
    b.set_tags(other, {"ray-node-status": "hijacked"})
    with pytest.raises(BackendError):
        b.set_tags(mine, {TAG_CLUSTER: "c2"})        # would move our instance into another cluster

    fresh = make_backend(moto)        # nothing cached: terminate must verify the tags itself
    terminates = counter(fresh.ec2, "TerminateInstances")
    fresh.terminate([untagged, other, mine])
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
    fresh.terminate(ids + ["i-0123456789abcdef0"])                # terminated + never existed
    assert terminates.calls == 0                                  # nothing of ours left to terminate


def test_terminate_retries_without_ids_ec2_says_are_gone(moto: MotoServer) -> None:
    b = make_backend(moto)
    ids = b.launch(make_spec(count=3))
    b.list_machines()

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


# ---------------------------------------------------------------------------------------------- capacity errors


def test_injected_capacity_error_for_one_type_and_zone(moto: MotoServer) -> None:
    b = make_backend(moto)

    def ice(request, n):
        q = query_params(request)
        if q.get("InstanceType") == "g4dn.xlarge" and q.get("Placement.AvailabilityZone") == "us-east-1a":
            return ec2_error(request, "InsufficientInstanceCapacity",
                             "We currently do not have sufficient g4dn.xlarge capacity in us-east-1a.", 500)
        return None

    hook = install(b.ec2_launch, "RunInstances", ice)
    with pytest.raises(CapacityError) as e:
        b.launch(make_spec(offering(G4, "us-east-1a"), count=2))
    assert e.value.category == "InsufficientInstanceCapacity"
    assert "g4dn.xlarge" in str(e.value)
    assert hook.calls == 1                     # a capacity error is an answer: never retried (AWS sends it as 5xx)
    assert all_instances(moto) == []           # nothing leaked
    # The same type in another zone, and another type in that zone, still launch.
    assert len(b.launch(make_spec(offering(G4, "us-east-1b")))) == 1
    assert len(b.launch(make_spec(offering(M5, "us-east-1a")))) == 1


@pytest.mark.parametrize("code", ["SpotMaxPriceTooLow", "VcpuLimitExceeded", "InsufficientFreeAddressesInSubnet",
                                  "MaxSpotInstanceCountExceeded", "Unsupported"])
def test_capacity_codes(moto: MotoServer, code: str) -> None:
    b = make_backend(moto)
    install(b.ec2_launch, "RunInstances", lambda r, n: ec2_error(r, code, "no", 400))
    with pytest.raises(CapacityError) as e:
        b.launch(make_spec(offering(M5, "us-east-1a", "spot")))
    assert e.value.category == code


def test_other_errors_are_backend_errors_naming_the_action(moto: MotoServer) -> None:
    b = make_backend(moto)
    install(b.ec2_launch, "RunInstances", lambda r, n: ec2_error(r, "InvalidParameterValue", "bad", 400))
    with pytest.raises(BackendError) as e:
        b.launch(make_spec())
    assert not isinstance(e.value, (CapacityError, TransientBackendError))
    assert e.value.category == "InvalidParameterValue"
    ids = b2_ids = make_backend(moto).launch(make_spec())
    install(b.ec2, "TerminateInstances", lambda r, n: ec2_error(
        r, "UnauthorizedOperation", "You are not authorized to perform this operation. Encoded ...", 403))
    with pytest.raises(BackendError) as e:
        b.terminate(ids)
    assert e.value.category == "UnauthorizedOperation" and "ec2:TerminateInstances" in str(e.value)
    assert [i["InstanceId"] for i in live(moto)] == b2_ids


# ------------------------------------------------------------------------------------ throttling and idempotency


def test_throttling_storm_launches_exactly_count(moto: MotoServer) -> None:
    b = make_backend(moto)
    run = install(b.ec2_launch, "RunInstances",
                  lambda r, n: ec2_error(r, "RequestLimitExceeded", "Request limit exceeded.", 503) if n <= 3 else None)
    describes = counter(b.ec2, "DescribeInstances")
    spec = make_spec(count=3)
    ids = b.launch(spec)
    assert len(ids) == 3 and run.calls == 4
    assert describes.calls == 3                       # one token lookup before each re-issue
    assert sorted(i["InstanceId"] for i in live(moto)) == sorted(ids)


def test_throttling_that_outlasts_retries_is_transient(moto: MotoServer) -> None:
    b = make_backend(moto, aws_max_attempts=3)
    run = install(b.ec2_launch, "RunInstances", lambda r, n: ec2_error(r, "RequestLimitExceeded", "slow down", 503))
    with pytest.raises(TransientBackendError) as e:
        b.launch(make_spec())
    assert e.value.category == "RequestLimitExceeded" and run.calls == 3
    assert all_instances(moto) == []


def test_ambiguous_5xx_after_launch_returns_the_launched_instances(moto: MotoServer) -> None:
    """The request reaches moto and creates the instances, but the caller sees a 500."""
    b = make_backend(moto)
    created: list[str] = []

    def lose_response(request, n):
        if n == 1:
            forward(request).raise_for_status()
            created.extend(i["InstanceId"] for i in live(moto))
            return ec2_error(request, "InternalError", "An internal error has occurred", 500)
        return None

    run = install(b.ec2_launch, "RunInstances", lose_response)
    spec = make_spec(count=2)
    ids = b.launch(spec)
    assert len(created) == 2 and sorted(ids) == sorted(created)
    assert run.calls == 1                                    # found by token, never re-issued
    assert len(all_instances(moto, tag=(TAG_REQUEST, spec.request_token))) == 2
    assert len(live(moto)) == 2


def test_ambiguous_timeout_after_launch_returns_the_launched_instances(moto: MotoServer) -> None:
    b = make_backend(moto)

    def timeout(request, n):
        if n == 1:
            forward(request).raise_for_status()
            raise botocore.exceptions.ReadTimeoutError(endpoint_url=request.url)
        return None

    install(b.ec2_launch, "RunInstances", timeout)
    spec = make_spec(count=1)
    ids = b.launch(spec)
    assert [i["InstanceId"] for i in live(moto)] == ids


def test_moto_itself_does_not_dedupe_client_token(moto: MotoServer) -> None:
    """Control for the two tests above: the same trick through a plain retrying client creates duplicates."""
    ec2 = moto.client()
    install(ec2, "RunInstances", lambda r, n: (forward(r), ec2_error(r, "InternalError", "x", 500))[1]
            if n == 1 else None)
    ec2.run_instances(ImageId=moto.ami(), MinCount=1, MaxCount=1, ClientToken="same")
    assert len(live(moto)) == 2


def test_token_with_more_instances_than_count_keeps_count(moto: MotoServer) -> None:
    spec = make_spec(count=1)
    tags = [{"Key": TAG_CLUSTER, "Value": CLUSTER}, {"Key": TAG_REQUEST, "Value": spec.request_token}]
    for _ in range(2):    # e.g. created by an endpoint that ignored ClientToken on an earlier retry
        moto.client().run_instances(ImageId=moto.ami(), MinCount=1, MaxCount=1,
                                    TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
    b = make_backend(moto)
    install(b.ec2_launch, "RunInstances", lambda r, n: ec2_error(r, "ServiceUnavailable", "x", 503))
    ids = b.launch(spec)
    assert len(ids) == 1 and [i["InstanceId"] for i in live(moto)] == ids


def test_token_lookup_failure_never_launches_again(moto: MotoServer) -> None:
    b = make_backend(moto, aws_max_attempts=1)
    b2 = make_backend(moto)      # a backend whose describe fails after an ambiguous launch
    install(b2.ec2_launch, "RunInstances", lambda r, n: ec2_error(r, "InternalError", "x", 500) if n == 1 else None)
    install(b2.ec2, "DescribeInstances", lambda r, n: ec2_error(r, "UnauthorizedOperation", "no", 403))
    with pytest.raises(TransientBackendError):
        b2.launch(make_spec())
    assert all_instances(moto) == []
    assert b.list_machines() == []


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
    b = AwsBackend({"region": REGION, "endpoint_url": "http://127.0.0.1:9", "aws_max_attempts": 1,
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
    provider = {"region": REGION, "image_id": "ami-1"}
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
    b = AwsBackend({"region": REGION, "image_id": moto.ami(), "aws_retry_base_delay_s": 0.0}, CLUSTER)
    ids = b.launch(make_spec())
    assert [i["InstanceId"] for i in live(moto)] == ids


# ------------------------------------------------------------------ disable_node_updaters: the worker boots itself

def test_provider_gives_workers_a_boot_script_when_node_updaters_are_disabled(moto: MotoServer) -> None:
    import base64

    import boto3

    from ray_nodeless.ray_adapter.provider import NodelessProvider

    cfg = {"cluster_name": CLUSTER, "max_workers": 1, "head_node_type": "head",
           "setup_commands": ["pip install ray-nodeless"], "worker_setup_commands": [],
           "worker_start_ray_commands": ["ray start --address=$RAY_HEAD_IP:6379"],
           "provider": {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws",
                        "region": REGION, "endpoint_url": moto.url, "image_id": moto.ami(), "head_ip": "10.0.0.5",
                        "disable_node_updaters": True,
                        "aws_credentials": {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}},
           "available_node_types": {"head": {"resources": {"CPU": 2}, "node_config": {}},
                                    "gpu_worker": {"resources": {"CPU": 4, "GPU": 1}, "node_config": {}}}}
    boot = NodelessProvider.bootstrap_config(cfg)
    p = NodelessProvider(boot["provider"], CLUSTER)
    p.create_node_with_resources_and_labels({}, {"ray-node-type": "worker", "ray-user-node-type": "gpu_worker"}, 1,
                                           {"CPU": 4, "GPU": 1}, {})
    [iid] = p.non_terminated_nodes({})
    ec2 = boto3.client("ec2", endpoint_url=moto.url, region_name=REGION, aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    raw = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
    script = base64.b64decode(raw).decode()
    assert script.startswith("#!/bin/bash")
    assert "latest/meta-data/instance-id" in script and "export RAY_CLOUD_INSTANCE_ID" in script
    assert "export RAY_NODE_TYPE_NAME=gpu_worker" in script and "export RAY_HEAD_IP=10.0.0.5" in script
    assert script.index("pip install ray-nodeless") < script.index("ray start --address=$RAY_HEAD_IP:6379")
    assert '"GPU": 1.0' in script   # RAY_OVERRIDE_RESOURCES: the chosen instance's resources


def test_without_disable_node_updaters_no_user_data_is_added(moto: MotoServer) -> None:
    b = make_backend(moto)
    [iid] = b.launch(make_spec())
    import boto3
    ec2 = boto3.client("ec2", endpoint_url=moto.url, region_name=REGION, aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    assert not ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"].get("Value")


# ------------------------------------------------------------------ the provider's fallback, through real boto3

def _provider(moto: MotoServer, **provider: Any):
    from ray_nodeless.ray_adapter.provider import NodelessProvider

    cfg = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws", "region": REGION,
           "endpoint_url": moto.url, "image_id": moto.ami(), "list_cache_s": 0, "aws_retry_base_delay_s": 0.0,
           "aws_credentials": {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"},
           "rules": [{"name": "gpu-spot-first", "match": {"GPU": ">=1"}, "capacity": ["spot", "on-demand"]}]}
    cfg.update(provider)
    return NodelessProvider(cfg, CLUSTER)


GPU_TAGS = {"ray-node-type": "worker", "ray-user-node-type": "gpu_worker", "ray-node-status": "uninitialized",
            "ray-node-name": "w", "ray-launch-config": "x"}


def _launched(p) -> list[tuple[str, str, str]]:
    out = []
    for iid in p.non_terminated_nodes({}):
        t = p.node_tags(iid)
        out.append((t["nodeless-instance-type"], t["nodeless-zone"], t["nodeless-capacity"]))
    return sorted(out)


def test_provider_capacity_error_on_the_cheapest_offering_launches_the_next_in_the_same_call(moto: MotoServer) -> None:
    p = _provider(moto)
    plan = p.planner.plan(p.resolver.request("gpu_worker", {"CPU": 4, "GPU": 1}, {}, False))
    first, second = plan.top(2)

    def ice(request, n):
        q = query_params(request)
        if (q.get("InstanceType"), q.get("Placement.AvailabilityZone")) == (first.instance_type.name, first.zone):
            return ec2_error(request, "InsufficientInstanceCapacity", "no capacity", 500)
        return None

    hook = install(p.backend.ec2_launch, "RunInstances", ice)
    p.create_node_with_resources_and_labels({}, dict(GPU_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    assert hook.calls == 2                                    # the failed offering once, then the next one
    assert _launched(p) == [(second.instance_type.name, second.zone, second.capacity)]
    assert p.unavailable.reason(first) == "InsufficientInstanceCapacity"
    assert len(live(moto)) == 1


def test_provider_all_spot_failing_falls_back_to_on_demand(moto: MotoServer) -> None:
    p = _provider(moto)

    def no_spot(request, n):
        if query_params(request).get("InstanceMarketOptions.MarketType") == "spot":
            return ec2_error(request, "InsufficientInstanceCapacity", "no spot capacity", 500)
        return None

    hook = install(p.backend.ec2_launch, "RunInstances", no_spot)
    p.create_node_with_resources_and_labels({}, dict(GPU_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    plan = p.planner.plan(p.resolver.request("gpu_worker", {"CPU": 4, "GPU": 1}, {}, False))
    n_spot = sum(1 for o in plan.candidates() if o.capacity == "spot")
    assert hook.calls == n_spot + 1                           # every spot candidate once, then the first on-demand
    [(itype, zone, cap)] = _launched(p)
    first_od = next(o for o in plan.candidates() if o.capacity == "on-demand")
    assert (itype, zone, cap) == (first_od.instance_type.name, first_od.zone, "on-demand")
    [inst] = live(moto)
    assert inst.get("InstanceLifecycle") != "spot"


def test_provider_throttling_storm_launches_exactly_the_requested_number(moto: MotoServer) -> None:
    p = _provider(moto)
    install(p.backend.ec2_launch, "RunInstances",
            lambda r, n: ec2_error(r, "RequestLimitExceeded", "Request limit exceeded.", 503) if n <= 3 else None)
    p.create_node_with_resources_and_labels({}, dict(GPU_TAGS), 3, {"CPU": 4, "GPU": 1}, {})
    assert len(p.non_terminated_nodes({})) == 3 and len(live(moto)) == 3
