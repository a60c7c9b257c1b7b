"""Interruption judged from the cloud's state reason and this cluster's tags (issue 16, item 8), with two provider
objects on moto: one object's (or a laptop's `ray down --workers-only`, or a console user's) terminations are not
spot interruptions for the other; a spot reclaim (EC2's `Server.SpotInstanceTermination`) is."""
from __future__ import annotations

import pytest

from ray_nodeless.providers.aws.listing import reason_of
from ray_nodeless.providers.base import TAG_CAPACITY, TAG_INSTANCE_TYPE, TAG_TERMINATING, TAG_ZONE
from ray_nodeless.testing.fault_matrix.aws import AwsWorld, Wire
from ray_nodeless.testing.moto_server import MotoServer, ec2_error
from tests.launch.test_listing_truth import interrupted, launch, provider


def offering_of(p, machine_id: str) -> tuple[str, str, str]:
    t = p.view.known(machine_id).tags
    return (t[TAG_INSTANCE_TYPE], t[TAG_ZONE], t[TAG_CAPACITY])


@pytest.fixture
def monitor(moto: MotoServer):
    """The head's provider object with 4 spot GPU workers, listed once."""
    moto.reset()
    p = provider(moto, Wire())
    ids = launch(p, 4)
    assert p.non_terminated_nodes({}) == ids
    assert {offering_of(p, i)[2] for i in ids} == {"spot"}
    return p, ids


def test_another_objects_terminate_is_not_an_interruption_even_without_its_tag(moto: MotoServer, monitor) -> None:
    """A laptop's `ray down --workers-only` (a second provider object) whose tag write is refused: the machines
    carry no `nodeless-terminating` tag, and EC2's StateReason (Client.UserInitiatedShutdown) still tells."""
    p, ids = monitor
    wire = Wire()
    laptop = provider(moto, wire)
    laptop.backend.ec2.meta.events.register(
        "before-send.ec2.CreateTags",
        lambda request, **_: ec2_error(request, "UnauthorizedOperation", "no CreateTags for you", 403))
    assert laptop.non_terminated_nodes({}) == ids
    laptop.terminate_nodes(ids[:2])
    assert p.non_terminated_nodes({}) == ids[2:]
    assert interrupted(p) == {}
    assert p.is_terminated(ids[0]) and p.is_terminated(ids[1])


def test_overlapping_monitors_terminations_are_not_interruptions(moto: MotoServer, monitor) -> None:
    p, ids = monitor
    old = provider(moto, Wire())                    # the old monitor, still running
    old.non_terminated_nodes({})
    old.terminate_nodes(ids[:3])
    assert p.non_terminated_nodes({}) == ids[3:] and interrupted(p) == {}


def test_a_console_terminate_is_not_an_interruption(moto: MotoServer, monitor) -> None:
    p, ids = monitor
    moto.client().terminate_instances(InstanceIds=ids[:1])
    assert p.non_terminated_nodes({}) == ids[1:] and interrupted(p) == {}


def test_a_spot_reclaim_is_an_interruption(moto: MotoServer, monitor) -> None:
    p, ids = monitor
    AwsWorld(moto).reclaim(ids[0])                  # terminated with Server.SpotInstanceTermination
    assert p.non_terminated_nodes({}) == ids[1:]
    assert interrupted(p) == {offering_of(p, ids[0]): "interrupted"}


@pytest.mark.parametrize("code, tags, reason", [
    ("Server.SpotInstanceTermination", {}, "interrupted"),
    ("Server.SpotInstanceShutdown", {}, "interrupted"),
    ("Server.InsufficientInstanceCapacity", {}, "interrupted"),
    ("Server.SpotInstanceTermination", {TAG_TERMINATING: "1"}, "terminated"),   # ours to end, whatever EC2 did
    ("Client.UserInitiatedShutdown", {}, "terminated"),
    ("Client.InstanceInitiatedShutdown", {}, "terminated"),
    ("", {}, ""),
])
def test_state_reason_codes(code: str, tags: dict, reason: str) -> None:
    inst = {"InstanceId": "i-0", "State": {"Name": "terminated"},
            "StateReason": {"Code": code, "Message": code} if code else None,
            "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
    assert reason_of(inst) == reason
