"""Capacity `reserved` (launch/reservations.py) through NodelessProvider and the real AWS backend on moto, whose
EC2 learned capacity reservations here (testing/moto_reservations.py: the count is enforced as EC2 does).

A rule `capacity: [reserved, spot, on-demand]` uses a matching reservation first, never over its count, then spot,
then on-demand; the machine's tags say `reserved`, the reservation's id and the real (on-demand) price."""
from __future__ import annotations

import time

import pytest

from ray_nodeless.core.settings import parse_provider
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.base import TAG_CAPACITY, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_RESERVATION, TAG_ZONE
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import moto_reservations
from ray_nodeless.testing.moto_server import REGION, MotoServer
from tests.providers.aws.helpers import live, tags_of
from tests.providers.aws.test_aws_provider import GPU_TAGS, _provider

GPU = {"CPU": 4, "GPU": 1}
RESERVED_FIRST = [{"name": "gpu", "match": {"GPU": ">=1"}, "capacity": ["reserved", "spot", "on-demand"]}]


def provider(moto: MotoServer, rules=RESERVED_FIRST, **kw) -> NodelessProvider:
    return _provider(moto, rules=rules, reservations={"refresh_s": 0, **kw.pop("reservations", {})}, **kw)


def cheapest_on_demand(p: NodelessProvider):
    """The plan's cheapest on-demand fit of a GPU worker: what a reservation for it would hold."""
    plan = p.planner.plan(p.resolver.request("gpu_worker", GPU, {}, False))
    od = [o for o in plan.candidates() if o.capacity == "on-demand"] or None
    if od is None:
        region = plan.region
        od = [region.find(o.instance_type.name, o.zone, "on-demand") for o in plan.candidates()]
        od = [o for o in od if o is not None]
    return od[0]


def reserve(moto: MotoServer, o, count: int, match: str = "targeted", **tags: str) -> str:
    spec = [{"ResourceType": "capacity-reservation", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    cr = moto.client().create_capacity_reservation(
        InstanceType=o.instance_type.name, InstancePlatform="Linux/UNIX", AvailabilityZone=o.zone,
        InstanceCount=count, InstanceMatchCriteria=match, TagSpecifications=spec if tags else [])
    return cr["CapacityReservation"]["CapacityReservationId"]


def launch(p: NodelessProvider, count: int = 1) -> list[dict]:
    ids = sorted(p.create_node_with_resources_and_labels({}, dict(GPU_TAGS), count, GPU, {}))
    return [p.node_tags(i) for i in ids]


def available(moto: MotoServer, rid: str) -> int:
    [cr] = moto.client().describe_capacity_reservations(CapacityReservationIds=[rid])["CapacityReservations"]
    return cr["AvailableInstanceCount"]


def test_a_reservation_is_used_first_never_over_its_count_then_spot_then_on_demand(moto: MotoServer):
    p = provider(moto)
    o = cheapest_on_demand(p)
    rid = reserve(moto, o, 2)
    first = launch(p, 2)
    assert {t[TAG_CAPACITY] for t in first} == {"reserved"} and {t[TAG_RESERVATION] for t in first} == {rid}
    assert {(t[TAG_INSTANCE_TYPE], t[TAG_ZONE]) for t in first} == {(o.instance_type.name, o.zone)}
    assert [float(t[TAG_PRICE]) for t in first] == pytest.approx([o.hourly_price] * 2)     # the real price
    assert available(moto, rid) == 0
    [third] = launch(p)                      # the reservation is full: spot, the rule's next capacity type
    assert third[TAG_CAPACITY] == "spot" and TAG_RESERVATION not in third
    # Spot has no capacity anywhere: on demand.
    p2 = provider(moto)
    from ray_nodeless.testing.moto_server import ec2_error, install, query_params

    def no_spot(request, n):
        if query_params(request).get("InstanceMarketOptions.MarketType") == "spot":
            return ec2_error(request, "InsufficientInstanceCapacity", "no spot capacity", 500)
        return None

    install(p2.backend.ec2_launch, "RunInstances", no_spot)
    [fourth] = launch(p2)
    assert fourth[TAG_CAPACITY] == "on-demand"
    # Ended reserved machines free their places: the next launch is reserved again.
    p.terminate_nodes([i["InstanceId"] for i in live(moto) if tags_of(i).get(TAG_RESERVATION) == rid][:1])
    [again] = launch(p)
    assert again[TAG_CAPACITY] == "reserved" and again[TAG_RESERVATION] == rid


def test_two_provider_objects_never_put_more_into_a_reservation_than_it_holds(moto: MotoServer):
    """Each object saw one free place (listed before either launched): EC2 refuses the second, which walks on."""
    a, b = provider(moto, reservations={"refresh_s": 3600}), provider(moto, reservations={"refresh_s": 3600})
    rid = reserve(moto, cheapest_on_demand(a), 1)
    plan = a.planner.plan(a.resolver.request("gpu_worker", GPU, {}, False))
    assert a.launcher.reservations.candidates(plan, 1) and b.launcher.reservations.candidates(plan, 1)
    [ta], [tb] = launch(a), launch(b)
    assert sorted([ta[TAG_CAPACITY], tb[TAG_CAPACITY]]) == ["reserved", "spot"]
    assert sum(1 for i in live(moto) if tags_of(i).get(TAG_RESERVATION) == rid) == 1
    assert available(moto, rid) == 0


def test_a_batch_larger_than_the_room_left_goes_to_the_next_capacity_type(moto: MotoServer):
    p = provider(moto)
    rid = reserve(moto, cheapest_on_demand(p), 2)
    got = launch(p, 3)
    assert {t[TAG_CAPACITY] for t in got} == {"spot"} and available(moto, rid) == 2


def test_a_reserved_only_rule_launches_only_into_reservations(moto: MotoServer):
    from ray.autoscaler.node_launch_exception import NodeLaunchException     # what Ray gets of a LaunchError

    only = [{"name": "gpu", "match": {"GPU": ">=1"}, "capacity": ["reserved"]}]
    p = provider(moto, rules=only)
    with pytest.raises(NodeLaunchException):
        launch(p)                            # no reservation: nothing is launched at all
    assert live(moto) == []
    rid = reserve(moto, cheapest_on_demand(p), 1)
    [t] = launch(p)
    assert t[TAG_CAPACITY] == "reserved" and t[TAG_RESERVATION] == rid
    with pytest.raises(NodeLaunchException):
        launch(p)                            # full: never on demand or spot
    assert len(live(moto)) == 1


def test_the_rules_exclusions_and_the_reservation_filters_hold(moto: MotoServer):
    p = provider(moto)
    o = cheapest_on_demand(p)
    excluded = provider(moto, exclude={"families": [o.instance_type.family]})
    rid = reserve(moto, o, 4, team="ml")
    # A reservation of an excluded family is never used: the rule's plan has no such candidate.
    assert all(t[TAG_CAPACITY] != "reserved" for t in launch(excluded))
    by_tag = provider(moto, reservations={"tags": {"team": "web"}})
    assert launch(by_tag)[0][TAG_CAPACITY] == "spot"
    by_id = provider(moto, reservations={"ids": [rid], "tags": {"team": "ml"}})
    assert launch(by_id)[0][TAG_RESERVATION] == rid


def test_a_capacity_block_is_used_only_while_it_runs_and_not_close_to_its_end(moto: MotoServer):
    p = provider(moto)
    o = cheapest_on_demand(p)
    now = time.time()
    args = ("123456789012", REGION, o.instance_type.name, o.zone)
    # The most room wins among reservations of one type and zone: the two that must not be used have more.
    later = moto_reservations.add_capacity_block(*args, 3, start=now + 3600, end=now + 7200)
    ending = moto_reservations.add_capacity_block(*args, 3, start=now - 3600, end=now + 600)   # < block_drain_s
    running = moto_reservations.add_capacity_block(*args, 1, start=now - 3600, end=now + 6 * 3600)
    states = {r["CapacityReservationId"]: r["State"] for r in
              moto.client().describe_capacity_reservations()["CapacityReservations"]}
    assert (states[later], states[ending], states[running]) == ("scheduled", "active", "active")
    [t] = launch(p)
    assert t[TAG_RESERVATION] == running


def test_the_walk_puts_reserved_where_the_rule_says(moto: MotoServer):
    from ray_nodeless.launch.reservations import merged

    p = provider(moto, rules=[{"name": "gpu", "match": {"GPU": ">=1"}, "capacity": ["spot", "reserved",
                                                                                   "on-demand"]}])
    reserve(moto, cheapest_on_demand(p), 1)
    plan = p.planner.plan(p.resolver.request("gpu_worker", GPU, {}, False))
    reserved = p.launcher.reservations.candidates(plan, 1)
    order = [o.capacity for o in merged(plan, reserved)]
    first_od = order.index("on-demand")
    assert order.index("reserved") > max(i for i, c in enumerate(order) if c == "spot")
    assert order.index("reserved") < first_od and order.count("reserved") == 1


def test_reserved_is_a_capacity_type_of_the_rules_and_a_bad_one_is_named():
    assert parse_provider({"region": "us-west-2", "rules": RESERVED_FIRST}).rules
    with pytest.raises(ConfigError) as e:
        parse_provider({"region": "us-west-2", "rules": [{"name": "x", "match": {}, "capacity": ["reservd"]}]})
    assert "reserved" in str(e.value) and e.value.key.endswith("capacity")
