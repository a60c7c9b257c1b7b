"""EC2 eventual consistency right after RunInstances: `InvalidInstanceID.NotFound` from TerminateInstances /
CreateTags, and listings that do not show the instance yet, must not read as "already gone" for an instance
launched within the launch grace. Injected on the wire (botocore before-send) in front of moto."""
from __future__ import annotations

import time

import pytest

from ray_nodeless.core import ttls
from ray_nodeless.errors import BackendError, TransientBackendError
from ray_nodeless.providers.base import TAG_CLUSTER
from ray_nodeless.testing.clock import FakeClock
from ray_nodeless.testing.moto_server import MotoServer, ec2_empty_describe, ec2_not_found, install, query_params
from tests.providers.aws.helpers import all_instances, live, make_backend, make_spec, tags_of


def _ids_in(request) -> list[str]:
    return [v for k, v in query_params(request).items() if k.startswith("InstanceId.") or k.startswith("ResourceId.")]


def not_found_for(client, operation: str, times: int):
    """The first `times` calls of `operation` answer NotFound naming the ids they were given."""
    return install(client, operation, lambda r, n: ec2_not_found(r, _ids_in(r)) if n <= times else None)


def state(moto: MotoServer, iid: str) -> str:
    [inst] = all_instances(moto, instance_id=[iid])
    return inst["State"]["Name"]


def test_terminate_of_a_just_launched_instance_is_retried_not_skipped(moto: MotoServer) -> None:
    b = make_backend(moto)
    [iid] = b.launch(make_spec())
    hook = not_found_for(b.ec2, "TerminateInstances", times=2)
    b.terminate([iid])
    assert hook.calls == 3                                  # two NotFound answers, then the terminate that worked
    assert state(moto, iid) in ("shutting-down", "terminated")


def test_terminate_still_not_found_after_the_retries_raises_instead_of_skipping(moto: MotoServer) -> None:
    b = make_backend(moto)
    [iid] = b.launch(make_spec())
    hook = not_found_for(b.ec2, "TerminateInstances", times=ttls.NOT_FOUND_RETRIES + 1)
    with pytest.raises(TransientBackendError) as e:
        b.terminate([iid])
    assert e.value.category == "NotYetVisible" and iid in str(e.value)
    assert hook.calls == ttls.NOT_FOUND_RETRIES + 1
    assert [i["InstanceId"] for i in live(moto)] == [iid]   # not terminated, and not forgotten:
    b.terminate([iid])                                      # the next attempt goes through
    assert live(moto) == []


def test_other_ids_of_the_call_are_terminated_while_a_young_one_waits(moto: MotoServer) -> None:
    b = make_backend(moto)
    young, other = b.launch(make_spec(count=2))

    def lagging(request, n):
        return ec2_not_found(request, [young]) if young in _ids_in(request) else None
    install(b.ec2, "TerminateInstances", lagging)
    with pytest.raises(TransientBackendError):
        b.terminate([young, other])
    assert [i["InstanceId"] for i in live(moto)] == [young]


def test_a_listing_that_does_not_show_a_young_instance_yet_does_not_make_it_foreign(moto: MotoServer) -> None:
    b = make_backend(moto)
    [iid] = b.launch(make_spec())
    hidden = install(b.ec2, "DescribeInstances", lambda r, n: ec2_empty_describe(r))   # EC2 lags: nothing listed
    assert b.list_machines() == []
    b.terminate([iid])                     # still known as ours: terminated, not "skipped: gone or not tagged"
    assert live(moto) == [] and hidden.calls >= 1


def test_set_tags_on_a_just_launched_instance_is_retried(moto: MotoServer) -> None:
    b = make_backend(moto)
    [iid] = b.launch(make_spec())
    hook = not_found_for(b.ec2, "CreateTags", times=2)
    b.set_tags(iid, {"ray-node-status": "up-to-date"})
    assert hook.calls == 3
    [inst] = live(moto)
    assert tags_of(inst)["ray-node-status"] == "up-to-date"
    not_found_for(b.ec2, "CreateTags", times=ttls.NOT_FOUND_RETRIES + 1)
    with pytest.raises(TransientBackendError):          # not silently dropped: the caller writes them again
        b.set_tags(iid, {"ray-node-status": "setting-up"})


def test_not_found_for_an_instance_past_the_launch_grace_means_gone(moto: MotoServer) -> None:
    b = make_backend(moto)
    b.clock = clock = FakeClock(time.time())
    [iid] = b.launch(make_spec())
    clock.advance(ttls.LAUNCH_GRACE_S - 1)
    young = not_found_for(b.ec2, "CreateTags", times=1)
    assert b.set_tags(iid, {"a": "b"}) is True              # still young: the NotFound is retried
    assert young.calls == 2
    clock.advance(60)                   # well past the grace (a describe reads moto's real LaunchTime)
    hook = not_found_for(b.ec2, "TerminateInstances", times=1)
    b.terminate([iid])                                      # gone: no error, no retry
    assert hook.calls == 1
    tags = not_found_for(b.ec2, "CreateTags", times=1)
    assert b.set_tags(iid, {"a": "b"}) is False             # gone: nothing to tag, and said so
    assert tags.calls <= 1


def test_provider_keeps_a_just_launched_machine_and_retries_its_terminate(moto: MotoServer) -> None:
    """Through NodelessProvider: the listing does not show the new machine and EC2 answers NotFound to its
    terminate. Ray keeps seeing it, the terminate raises (not skipped), and once EC2 lists it, the next refresh
    terminates it."""
    from tests.providers.aws.test_aws_provider import GPU_TAGS, _provider

    p = _provider(moto)
    p.create_node_with_resources_and_labels({}, dict(GPU_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    [iid] = [i["InstanceId"] for i in live(moto)]
    lag = {"on": True}
    install(p.backend.ec2, "DescribeInstances", lambda r, n: ec2_empty_describe(r) if lag["on"] else None)
    install(p.backend.ec2, "TerminateInstances",
            lambda r, n: ec2_not_found(r, _ids_in(r)) if lag["on"] else None)
    assert p.non_terminated_nodes({}) == [iid]            # not dropped while the listing lags
    with pytest.raises(BackendError):
        p.terminate_nodes([iid])                           # not skipped as "already gone"
    assert p.non_terminated_nodes({}) == [iid] and state(moto, iid) == "running"
    lag["on"] = False                                      # EC2 catches up
    assert p.non_terminated_nodes({}) == [iid]             # listed: this refresh retried the terminate
    assert state(moto, iid) in ("shutting-down", "terminated")
    assert p.non_terminated_nodes({}) == []
    assert not p.unavailable.snapshot()                    # ended by us, not an interruption
    assert all(tags_of(i).get(TAG_CLUSTER) for i in all_instances(moto))
