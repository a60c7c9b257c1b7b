"""Listing truth (issue 16, items 3 and 4) on the real AWS backend against moto, with DescribeInstances pages
faulted on the wire (ray_nodeless/testing/fault_matrix/aws.py's `Wire`): an empty or short page while the cloud
holds machines is confirmed by a second query before it is believed, for a fresh provider object's first listing
too (`ray down` and `ray-nodeless sweep` build a fresh one), and "nothing left" after a teardown or a sweep is
the cloud's answer by id, not a page's silence."""
from __future__ import annotations

from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from ray_nodeless.core import ttls
from ray_nodeless.operate.sweep import Sweep
from ray_nodeless.providers.base import TAG_CLUSTER
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing.clock import FakeClock
from ray_nodeless.testing.fault_matrix.aws import SHAPES, Wire, provider_config
from ray_nodeless.testing.fault_matrix.core import WORKER_TAGS
from ray_nodeless.testing.fault_matrix.world import CLUSTER
from ray_nodeless.testing.moto_server import MotoServer, _Raw


def provider(moto: MotoServer, wire: Wire) -> NodelessProvider:
    return wire.install(NodelessProvider(provider_config(moto), CLUSTER))


def launch(p: NodelessProvider, count: int, shape: str = "gpu") -> list[str]:
    tags = dict(WORKER_TAGS, **{"ray-user-node-type": shape, "ray-launch-request": f"r-{shape}-{count}"})
    return sorted(p.create_node_with_resources_and_labels({}, tags, count, SHAPES[shape], {}))


def live_ours(moto: MotoServer) -> set[str]:
    out = set()
    for page in moto.client().get_paginator("describe_instances").paginate(Filters=[
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [CLUSTER]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]}]):
        out |= {i["InstanceId"] for r in page["Reservations"] for i in r["Instances"]}
    return out


def ray_down(p: NodelessProvider) -> None:
    """What Ray's teardown_cluster does with its provider object: list, terminate, list again until empty."""
    ids = p.non_terminated_nodes({})
    while ids:
        p.terminate_nodes(ids)
        ids = p.non_terminated_nodes({})


def interrupted(p: NodelessProvider) -> dict:
    return {k: v for k, v in p.unavailable.snapshot().items() if v == "interrupted"}


@pytest.fixture
def four(moto: MotoServer) -> list[str]:
    moto.reset()
    return launch(provider(moto, Wire()), 4)


def test_ray_down_with_an_empty_first_page_ends_every_machine(moto: MotoServer, four: list[str]) -> None:
    """Before: one successful empty page and `ray down` printed "No nodes remaining" over 3 running workers."""
    wire = Wire()
    wire.next_describe.append("empty")              # the fresh object's first DescribeInstances page
    down = provider(moto, wire)
    assert down.non_terminated_nodes({}) == four
    ray_down(down)
    assert live_ours(moto) == set()


def test_a_fresh_objects_short_first_page_is_completed(moto: MotoServer, four: list[str]) -> None:
    wire = Wire()
    wire.next_describe.append(("hide", frozenset(four[:3])))
    assert provider(moto, wire).non_terminated_nodes({}) == four


@pytest.mark.parametrize("fault", ["empty", "partial"])
def test_sweep_with_a_glitched_first_page_ends_every_machine(moto: MotoServer, four: list[str], fault: str) -> None:
    """Before: `ray-nodeless sweep -y` printed "nothing to end" and exited 0 with 4 machines running."""
    config = {"cluster_name": CLUSTER, "provider": provider_config(moto)}
    sweep = Sweep(config, verify_s=5.0)
    wire = Wire()
    for c in sweep.backend.clients:
        c.meta.events.register("before-send.ec2", wire)
    wire.next_describe.append("empty" if fault == "empty" else ("hide", frozenset(four[1:])))
    try:
        result = sweep.run()
    finally:
        sweep.close()
    assert result.ok, result.failures
    assert sorted(t.id for t in result.targets) == four
    assert live_ours(moto) == set()


def test_sweep_does_not_confirm_over_machines_a_terminate_left_running(moto: MotoServer, four: list[str]) -> None:
    """An endpoint answers TerminateInstances with success and ends nothing, and the listings after it come back
    empty: the check by id still sees the machines running, so the sweep fails naming them."""
    config = {"cluster_name": CLUSTER, "provider": provider_config(moto)}
    sweep = Sweep(config, verify_s=0.5)
    wire = Wire()

    def swallow(request: Any, **kw: Any) -> AWSResponse | None:
        if kw.get("event_name", "").endswith(".TerminateInstances"):
            wire.next_describe += ["empty"] * 20
            body = (b'<TerminateInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
                    b'<requestId>swallowed</requestId><instancesSet/></TerminateInstancesResponse>')
            return AWSResponse(request.url, 200, {"Content-Type": "text/xml"}, _Raw(body))
        return wire(request, **kw)

    for c in sweep.backend.clients:
        c.meta.events.register("before-send.ec2", swallow)
    try:
        result = sweep.run()
    finally:
        sweep.close()
    assert not result.ok
    assert sorted(f["id"] for f in result.failures if f["kind"] == "machine") == four
    assert all(f["error"] in ("still listed after terminate", "not confirmed ended (the cloud does not show it)")
               for f in result.failures)
    assert live_ours(moto) == set(four)


def test_a_page_missing_2_of_4_live_machines_changes_nothing(moto: MotoServer) -> None:
    """Before: is_terminated() became True for both and their spot offering was marked interrupted."""
    moto.reset()
    wire = Wire()
    p = provider(moto, wire)
    ids = launch(p, 4)
    assert p.non_terminated_nodes({}) == ids
    wire.next_describe.append(("hide", frozenset(ids[:2])))
    assert p.non_terminated_nodes({}) == ids
    assert not any(p.is_terminated(i) for i in ids)
    assert interrupted(p) == {}


def test_two_empty_pages_in_a_row_change_nothing(moto: MotoServer) -> None:
    """The listing and the second look by id both empty: nothing the cloud shows nothing about is believed gone
    for ttls.UNSEEN_GONE_S (EC2 keeps a terminated instance listed for about an hour)."""
    moto.reset()
    wire = Wire()
    p = provider(moto, wire)
    ids = launch(p, 4)
    p.view.clock = clock = FakeClock()
    assert p.non_terminated_nodes({}) == ids            # listed: from now on the listing's answer counts
    wire.next_describe += ["empty", "empty"]
    assert p.non_terminated_nodes({}) == ids and interrupted(p) == {}
    assert not any(p.is_terminated(i) for i in ids)
    # A machine the cloud keeps showing nothing of, past the bound, is gone (reason unknown).
    wire.next_describe += [("hide", frozenset(ids[:1]))] * 4
    clock.advance(ttls.UNSEEN_GONE_S / 2)
    assert p.non_terminated_nodes({}) == ids
    clock.advance(ttls.UNSEEN_GONE_S)
    assert p.non_terminated_nodes({}) == ids[1:] and p.is_terminated(ids[0])
