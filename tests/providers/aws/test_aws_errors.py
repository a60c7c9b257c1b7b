"""AwsBackend's error mapping, retries and idempotency, with EC2 failures injected through botocore `before-send`
hooks on the backend's own clients (moto raises no capacity error and ignores ClientToken)."""
from __future__ import annotations

import botocore.exceptions
import pytest

from ray_nodeless.errors import BackendError, CapacityError, TransientBackendError
from ray_nodeless.providers.aws.launch_params import TAG_REQUEST
from ray_nodeless.providers.base import TAG_CLUSTER
from ray_nodeless.testing.moto_server import MotoServer, counter, ec2_error, forward, install, query_params
from tests.providers.aws.helpers import (
    CLUSTER, G4, M5, all_instances, live, make_backend, make_spec, offering,
)


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
