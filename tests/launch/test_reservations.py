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


def test_a_capacity_blocks_machines_are_drained_before_it_ends(moto: MotoServer):
    """interruptions/block_ends.py with the provider's own book of reservations (on moto): a machine in a block is
    drained through Ray's preemption drain once the block ends within block_drain_s, with EC2's termination time
    (30 min before the end) as the deadline; once; machines in no block are left alone."""
    from ray_nodeless.interruptions.block_ends import AWS_TERMINATION_LEAD_S, BlockEnds
    from ray_nodeless.interruptions.drain import RayNode

    class Ray:
        def __init__(self):
            self.drains = []

        def find(self, instance_id=None, ip=None):
            return RayNode(node_id=instance_id, ip=ip or "", instance_id=instance_id, state="ALIVE", is_head=False)

        def drain(self, node, notice):
            self.drains.append((node.instance_id, notice.deadline, notice.source))

    p = provider(moto, reservations={"refresh_s": 0, "block_drain_s": 2400})
    o = cheapest_on_demand(p)
    now = time.time()
    end = now + 3 * 3600
    block = moto_reservations.add_capacity_block("123456789012", REGION, o.instance_type.name, o.zone, 1,
                                                 start=now - 60, end=end)
    [t] = launch(p)
    assert t[TAG_RESERVATION] == block
    [other] = launch(p)
    assert TAG_RESERVATION not in other
    clock = {"t": now}
    ray = Ray()
    ends = BlockEnds(p.launcher.reservations.block_ends, ray, 2400, clock=lambda: clock["t"])
    machines = p.view.refresh(force=True)
    assert ends.tick(machines) == [] and ray.drains == []           # 3 h left
    clock["t"] = end - 2399
    [mid] = ends.tick(machines)
    [(drained, deadline, source)] = ray.drains
    assert (drained, source) == (mid, "capacity-block")
    assert deadline == pytest.approx(end - AWS_TERMINATION_LEAD_S, abs=1.0)     # EC2's dates: whole seconds
    assert p.node_tags(mid)[TAG_RESERVATION] == block
    assert ends.tick(machines) == [] and len(ray.drains) == 1        # once


def test_plan_shows_the_reservation_a_launch_would_use(moto: MotoServer, tmp_path):
    import json

    from click.testing import CliRunner

    from ray_nodeless.cli import main
    from tests.helpers import cluster_config, write_cluster_yaml

    p = provider(moto)
    o = cheapest_on_demand(p)
    rid = reserve(moto, o, 3)
    cfg = cluster_config({"cloud": "aws", "region": REGION, "endpoint_url": moto.url, "image_id": moto.ami(),
                          "aws_credentials": {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"},
                          "rules": RESERVED_FIRST}, ray_keys=True)
    path = write_cluster_yaml(tmp_path / "cluster.yaml", cfg)
    offline = CliRunner().invoke(main, ["plan", str(path)])
    assert offline.exit_code == 0, offline.output
    assert "capacity reserved first: the region's capacity reservations are listed at launch" in offline.output
    live = CliRunner().invoke(main, ["plan", str(path), "--reservations"])
    assert live.exit_code == 0, live.output
    assert (f"capacity reserved: would use {rid} ({o.instance_type.name} in {o.zone}, 3 of 3 free, targeted, "
            f"default) at ${o.hourly_price:.4f}/h") in live.output
    doc = json.loads(CliRunner().invoke(main, ["plan", str(path), "--reservations", "--json"]).output)
    use = doc["node_types"]["gpu_worker"]["reservation"]["would_use"]
    assert (use["id"], use["available"], use["total"]) == (rid, 3, 3)
    bad = CliRunner().invoke(main, ["plan", "--cloud", "aws", "--region", REGION, "--reservations"])
    assert bad.exit_code != 0 and "--reservations" in bad.output


def test_a_restarted_objects_retry_of_a_launch_that_filled_its_reservation_gets_the_same_machines(moto: MotoServer):
    """Ray retries a launch request (the same request id) at a provider object restarted since: the machines the
    first round put into the reservation are listed, but the reservation, full now, is no candidate any more. The
    retry must answer with them (the slot's offering from their tags), not launch again on spot."""
    p = provider(moto)
    rid = reserve(moto, cheapest_on_demand(p), 1)
    tags = dict(GPU_TAGS, **{"ray-launch-request": "req-1"})
    [first] = p.create_node_with_resources_and_labels({}, dict(tags), 1, GPU, {})
    assert p.node_tags(first)[TAG_RESERVATION] == rid and available(moto, rid) == 0
    restarted = provider(moto)
    restarted.non_terminated_nodes({})
    [after] = restarted.create_node_with_resources_and_labels({}, dict(tags), 1, GPU, {})
    assert after == first
    assert [i["InstanceId"] for i in live(moto)] == [first]
