"""The capacity reservations the moto server learned (ray_nodeless/testing/moto_reservations.py), checked against
botocore's own EC2 service model: every field produced is a member of the model's shape with the model's type,
and the HTTP round trip through moto's model-driven serializer and boto3's parser keeps every one of them."""
from __future__ import annotations

import time
from datetime import datetime

import botocore.session
import pytest
from botocore.exceptions import ClientError

from ray_nodeless.testing import moto_reservations
from ray_nodeless.testing.moto_server import REGION, MotoServer

EC2 = botocore.session.get_session().get_service_model("ec2")
PY = {"string": str, "integer": int, "boolean": bool, "timestamp": datetime}


def off_model(value, shape, path: str) -> list[str]:
    """Where `value` is not what `shape` (a botocore shape) says: unknown members, wrong types."""
    if shape.type_name == "structure":
        out = [f"{path}.{k}: not a member of {shape.name}" for k in value if k not in shape.members]
        for k, v in value.items():
            if k in shape.members:
                out += off_model(v, shape.members[k], f"{path}.{k}")
        return out
    if shape.type_name == "list":
        return [p for i, v in enumerate(value) for p in off_model(v, shape.member, f"{path}[{i}]")]
    want = PY.get(shape.type_name)
    if want is not None and not isinstance(value, want):
        return [f"{path}: {type(value).__name__}, the model says {shape.type_name}"]
    if getattr(shape, "enum", None) and value not in shape.enum:
        return [f"{path}: {value!r} not in {shape.name}'s enum"]
    return []


def create(moto: MotoServer, count: int = 2, **kw) -> dict:
    args = dict(InstanceType="g6.xlarge", InstancePlatform="Linux/UNIX", AvailabilityZone=f"{REGION}a",
                InstanceCount=count, InstanceMatchCriteria="targeted",
                TagSpecifications=[{"ResourceType": "capacity-reservation", "Tags": [{"Key": "team", "Value": "ml"}]}])
    args.update(kw)
    return moto.client().create_capacity_reservation(**args)["CapacityReservation"]


def run(moto: MotoServer, rid: str, n: int = 1, itype: str = "g6.xlarge", zone: str = f"{REGION}a"):
    return moto.client().run_instances(
        ImageId=moto.ami(), MinCount=n, MaxCount=n, InstanceType=itype, Placement={"AvailabilityZone": zone},
        CapacityReservationSpecification={"CapacityReservationTarget": {"CapacityReservationId": rid}})


def test_every_field_is_the_models_and_the_round_trip_keeps_them(moto: MotoServer):
    shape = EC2.shape_for("CapacityReservation")
    rec = moto_reservations._Reservation("cr-0123456789abcdef0", "123456789012", REGION, "g6.xlarge",
                                         f"{REGION}a", 2, end=time.time() + 3600, tags={"a": "b"}).record()
    assert off_model(rec, shape, "CapacityReservation") == []
    created = create(moto)
    [listed] = moto.client().describe_capacity_reservations()["CapacityReservations"]
    produced = set(moto_reservations._book("123456789012", REGION)[created["CapacityReservationId"]].record())
    assert set(created) == set(listed) == produced            # nothing dropped by the serializer
    assert off_model(listed, shape, "CapacityReservation") == []
    out = EC2.operation_model("CreateCapacityReservation").output_shape
    assert off_model({"CapacityReservation": created}, out, "CreateCapacityReservationResult") == []


def test_the_count_is_enforced_as_ec2_does(moto: MotoServer):
    rid = create(moto)["CapacityReservationId"]
    ids = [i["InstanceId"] for i in run(moto, rid, 2)["Instances"]]
    with pytest.raises(ClientError) as e:
        run(moto, rid)
    assert e.value.response["Error"]["Code"] == "ReservationCapacityExceeded"
    moto.client().terminate_instances(InstanceIds=ids[:1])
    [cr] = moto.client().describe_capacity_reservations(CapacityReservationIds=[rid])["CapacityReservations"]
    assert cr["AvailableInstanceCount"] == 1
    run(moto, rid)


@pytest.mark.parametrize("kw, code", [
    ({"itype": "g6.2xlarge"}, "InvalidParameterCombination"),
    ({"zone": f"{REGION}b"}, "InvalidParameterCombination"),
])
def test_a_launch_that_does_not_match_its_reservation_is_refused(moto: MotoServer, kw, code):
    rid = create(moto)["CapacityReservationId"]
    with pytest.raises(ClientError) as e:
        run(moto, rid, **kw)
    assert e.value.response["Error"]["Code"] == code


def test_unknown_cancelled_and_ended_reservations_take_nothing(moto: MotoServer):
    with pytest.raises(ClientError) as e:
        run(moto, "cr-00000000000000000")
    assert e.value.response["Error"]["Code"] == "InvalidCapacityReservationId.NotFound"
    rid = create(moto)["CapacityReservationId"]
    moto.client().cancel_capacity_reservation(CapacityReservationId=rid)
    [cr] = moto.client().describe_capacity_reservations(CapacityReservationIds=[rid])["CapacityReservations"]
    assert (cr["State"], cr["AvailableInstanceCount"]) == ("cancelled", 0)
    with pytest.raises(ClientError):
        run(moto, rid)
    now = time.time()
    block = moto_reservations.add_capacity_block("123456789012", REGION, "g6.xlarge", f"{REGION}a", 1,
                                                 start=now - 7200, end=now - 60)
    active = moto.client().describe_capacity_reservations(
        Filters=[{"Name": "state", "Values": ["active"]}])["CapacityReservations"]
    assert block not in {r["CapacityReservationId"] for r in active}


def test_filters_by_tag_type_and_zone(moto: MotoServer):
    rid = create(moto)["CapacityReservationId"]
    create(moto, InstanceType="c7i.large", TagSpecifications=[])
    c = moto.client()
    assert [r["CapacityReservationId"] for r in c.describe_capacity_reservations(
        Filters=[{"Name": "tag:team", "Values": ["ml"]}])["CapacityReservations"]] == [rid]
    assert len(c.describe_capacity_reservations(
        Filters=[{"Name": "instance-type", "Values": ["c7i.large"]}])["CapacityReservations"]) == 1
    assert c.describe_capacity_reservations(
        Filters=[{"Name": "availability-zone", "Values": [f"{REGION}c"]}])["CapacityReservations"] == []
