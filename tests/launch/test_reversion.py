"""On-demand -> spot reversion (launch/reversion.py) through NodelessProvider, on the in-memory cloud and on AWS
(moto), with spot capacity that disappears and comes back.

Ray's side is `RayNodes`: a stand-in for Ray's GCS node table and its drain call with the idle reason (Ray refuses
it for a node that runs work; here `busy` says which do). Everything of ours is real: the provider, its launcher,
cost cap, capacity memory, listing and terminate path. What each test checks at every step: no machine doubled
(one replacement per fallback, however often the tick runs or the provider restarts), none leaked, no busy node
drained, the worker count never below where it was, the cluster's cost never over max_hourly_cost.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from ray_nodeless.core.reversion import InterruptionHistory, ReversionSettings
from ray_nodeless.core.settings import parse_provider
from ray_nodeless.errors import ConfigError
from ray_nodeless.interruptions.drain import RayNode
from ray_nodeless.launch.launcher import TAG_FALLBACK
from ray_nodeless.launch.reversion import TAG_REPLACES, Reverter
from ray_nodeless.providers.base import TAG_CAPACITY, TAG_CLUSTER, TAG_PRICE
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from ray_nodeless.testing.moto_server import MotoServer, ec2_error, query_params
from tests.helpers import FakeClock
from tests.ray_adapter.test_provider import PROVIDER, WORKER_TAGS

GPU = {"CPU": 4, "GPU": 1}
FAST = {"min_age_s": 0, "interval_s": 0}


@dataclass
class RayNodes:
    """Ray's node table and drain call, as the reverter sees them: every listed machine is an ALIVE node (named by
    its instance id), a drained one DRAINING; `busy` nodes refuse an idle drain, as the raylet does."""

    provider: NodelessProvider
    busy: set[str] = field(default_factory=set)
    drained: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    joined: bool = True

    def find(self, instance_id=None, ip=None):
        m = self.provider.view.current(instance_id)
        if m is None or not self.joined:
            return None
        state = "DRAINING" if instance_id in self.drained else "ALIVE"
        return RayNode(node_id=instance_id, ip="10.0.0.1", instance_id=instance_id, state=state, is_head=False)

    def drain_idle(self, node, why):
        if node.instance_id in self.busy:
            self.refused.append(node.instance_id)
            return False, "the node is running tasks"
        self.drained.append(node.instance_id)
        return True, ""


def attach(p: NodelessProvider, ray: RayNodes, clock: FakeClock, **settings) -> Reverter:
    """The reverter the provider builds in Ray's monitor, with Ray's GCS replaced by `ray`, on the test's clock."""
    s = ReversionSettings(**{**FAST, **settings})
    p.unavailable.clock = p.view.clock = p.launcher._clock = clock
    p.reverter = Reverter(s, p.launcher, p.view, p.unavailable, ray, p.terminate_nodes,
                          resources_of=lambda t: dict(GPU), node_config_of=p._node_configs.get, clock=clock)
    return p.reverter


@pytest.fixture
def cloud():
    return fake_backend.reset()


def workers(cloud: fake_backend.Cloud) -> dict[str, dict]:
    with cloud.lock:
        return {mid: dict(m.tags) for mid, m in cloud.machines.items() if m.tags.get(TAG_CLUSTER) == "c1"}


def cost(cloud: fake_backend.Cloud) -> float:
    return sum(float(t[TAG_PRICE]) for t in workers(cloud).values())


def launch_during_a_spot_drought(p: NodelessProvider, cloud: fake_backend.Cloud, n: int) -> list[str]:
    """`n` workers while no spot offering has capacity (they fall back to on-demand); then spot comes back."""
    cloud.capacity_faults[("*", "*", "spot")] = "InsufficientInstanceCapacity"
    ids = sorted(p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), n, GPU, {}))
    del cloud.capacity_faults[("*", "*", "spot")]
    return ids


def skip_every_spot_offering(p: NodelessProvider) -> None:
    """The capacity memory holds every spot candidate (as after a drought the walk went all the way through)."""
    plan = p.launcher.plan("gpu_worker", dict(GPU), {}, False)
    for o in plan.candidates():
        if o.capacity == "spot":
            p.unavailable.mark(o, "InsufficientInstanceCapacity")


def test_fallback_is_tagged_and_replaced_by_spot_once_spot_is_back(cloud):
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = FakeClock()
    ray = RayNodes(p)
    rev = attach(p, ray, clock)
    [od] = launch_during_a_spot_drought(p, cloud, 1)
    assert workers(cloud)[od][TAG_CAPACITY] == "on-demand" and workers(cloud)[od][TAG_FALLBACK] == "spot"
    od_price = float(workers(cloud)[od][TAG_PRICE])
    # The spot offerings are in the capacity memory: nothing is replaced while they are.
    skip_every_spot_offering(p)
    for _ in range(3):
        p.non_terminated_nodes({})
    assert list(workers(cloud)) == [od] and not rev.flights
    clock.advance(p.settings.unavailable_ttl_s + 1)          # out of the capacity memory
    p.non_terminated_nodes({})                               # tick 1: the spot machine first
    spot = [m for m, t in workers(cloud).items() if t[TAG_CAPACITY] == "spot"]
    assert len(spot) == 1 and workers(cloud)[spot[0]][TAG_REPLACES] == od and od in workers(cloud)
    assert workers(cloud)[spot[0]]["ray-user-node-type"] == "gpu_worker"
    for _ in range(3):                                       # however often it ticks: one replacement
        p.non_terminated_nodes({})
    assert set(workers(cloud)) == {spot[0]}                  # then the on-demand one, drained idle, terminated
    assert ray.drained == [od] and rev.replaced == 1
    assert float(workers(cloud)[spot[0]][TAG_PRICE]) < od_price


def test_a_busy_fallback_is_never_drained_and_is_replaced_when_it_is_idle(cloud):
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = FakeClock()
    ray = RayNodes(p)
    rev = attach(p, ray, clock)
    [od] = launch_during_a_spot_drought(p, cloud, 1)
    ray.busy.add(od)
    clock.advance(p.settings.unavailable_ttl_s + 1)
    for _ in range(5):
        p.non_terminated_nodes({})
        clock.advance(1)
        assert od in workers(cloud) and od not in ray.drained     # its work goes on
    assert len(workers(cloud)) == 2 and len(ray.refused) >= 3      # asked again each tick, one spot machine
    ray.busy.clear()                                               # its tasks finished
    p.non_terminated_nodes({})
    assert od not in workers(cloud) and rev.replaced == 1 and len(workers(cloud)) == 1


def test_max_in_flight_and_the_worker_count_never_drops(cloud):
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = FakeClock()
    ray = RayNodes(p)
    attach(p, ray, clock, max_in_flight=2)
    ods = launch_during_a_spot_drought(p, cloud, 5)
    ray.busy.update(ods)
    clock.advance(p.settings.unavailable_ttl_s + 1)
    p.non_terminated_nodes({})
    assert sum(1 for t in workers(cloud).values() if t[TAG_CAPACITY] == "spot") == 2    # the bound
    ray.busy.clear()
    seen = []
    for _ in range(12):
        p.non_terminated_nodes({})
        seen.append(len(workers(cloud)))
    assert min(seen) >= 5                                     # never fewer workers than before (min_workers)
    assert sorted(t[TAG_CAPACITY] for t in workers(cloud).values()) == ["spot"] * 5
    assert sorted(ray.drained) == ods


def test_a_restarted_provider_continues_the_replacement_without_a_second_spot_machine(cloud):
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = FakeClock()
    ray = RayNodes(p, busy=set())
    attach(p, ray, clock)
    [od] = launch_during_a_spot_drought(p, cloud, 1)
    ray.busy.add(od)
    clock.advance(p.settings.unavailable_ttl_s + 1)
    p.non_terminated_nodes({})
    assert len(workers(cloud)) == 2
    restarted = NodelessProvider(dict(PROVIDER), "c1")          # the monitor restarted
    restarted._node_configs["gpu_worker"] = {}
    ray2 = RayNodes(restarted, busy={od})
    attach(restarted, ray2, FakeClock())
    for _ in range(3):
        restarted.non_terminated_nodes({})
    assert len(workers(cloud)) == 2                             # the listed replacement, not a second one
    ray2.busy.clear()
    restarted.non_terminated_nodes({})
    assert len(workers(cloud)) == 1 and od not in workers(cloud)


def test_a_spot_machine_that_never_joins_ray_is_terminated_and_the_fallback_kept(cloud):
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = FakeClock()
    ray = RayNodes(p, joined=False)
    attach(p, ray, clock, ready_timeout_s=60)
    [od] = launch_during_a_spot_drought(p, cloud, 1)
    clock.advance(p.settings.unavailable_ttl_s + 1)
    p.non_terminated_nodes({})
    assert len(workers(cloud)) == 2
    clock.advance(61)
    p.non_terminated_nodes({})
    assert list(workers(cloud)) == [od] and ray.drained == []    # no leak, no drain
    clock.advance(30)
    p.non_terminated_nodes({})
    assert list(workers(cloud)) == [od]                          # backs off for ready_timeout_s


def test_the_cost_cap_holds_during_a_replacement(cloud):
    """The on-demand machine and its spot replacement run together for a while: a cap with no room for both
    means no replacement, never a cluster over the cap."""
    p = NodelessProvider(dict(PROVIDER), "c1")
    [od] = launch_during_a_spot_drought(p, cloud, 1)
    od_price = float(workers(cloud)[od][TAG_PRICE])
    capped = NodelessProvider(dict(PROVIDER, max_hourly_cost=od_price + 0.01), "c1")
    capped._node_configs["gpu_worker"] = {}
    clock = FakeClock()
    ray = RayNodes(capped)
    attach(capped, ray, clock)
    clock.advance(capped.settings.unavailable_ttl_s + 1)
    for _ in range(3):
        capped.non_terminated_nodes({})
        assert cost(cloud) <= od_price + 0.01 + 1e-9
    assert list(workers(cloud)) == [od]


def test_repeated_interruptions_make_a_node_type_prefer_on_demand(cloud):
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = FakeClock()
    rev = attach(p, RayNodes(p), clock, interruption_limit=2, interruption_window_s=600, prefer_on_demand_s=900)
    for _ in range(2):
        [m] = sorted(p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {}))
        assert workers(cloud)[m][TAG_CAPACITY] == "spot"
        p.non_terminated_nodes({})
        with cloud.lock:
            del cloud.machines[m]                  # reclaimed by the cloud
        p.non_terminated_nodes({})                 # the listing sees it vanish: an interruption
        clock.advance(p.settings.unavailable_ttl_s + 1)
    assert rev.prefers_on_demand("gpu_worker")
    [m] = sorted(p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {}))
    assert workers(cloud)[m][TAG_CAPACITY] == "on-demand" and TAG_FALLBACK not in workers(cloud)[m]
    clock.advance(901)
    assert not rev.prefers_on_demand("gpu_worker")


def test_interruption_history_window():
    h = InterruptionHistory(ReversionSettings(interruption_limit=3, interruption_window_s=100, prefer_on_demand_s=50))
    assert not h.record("t", 0) and not h.record("t", 10)
    assert not h.record("t", 200)                  # the first two fell out of the window
    assert not h.record("t", 250) and h.record("t", 260)
    assert h.prefers_on_demand("t", 300) and not h.prefers_on_demand("t", 311) and not h.prefers_on_demand("u", 300)


@pytest.mark.parametrize("block,key", [({"min_age_s": -1}, "provider.reversion.min_age_s"),
                                       ({"max_in_flight": 0}, "provider.reversion.max_in_flight"),
                                       ({"enabled": "yes"}, "provider.reversion.enabled"),
                                       ({"max_inflight": 2}, "provider.reversion.max_inflight")])
def test_bad_reversion_settings_name_the_key(block, key):
    with pytest.raises(ConfigError) as e:
        parse_provider({"region": "us-west-2", "reversion": block})
    assert e.value.key == key


def test_reversion_on_moto_with_spot_capacity_that_comes_back(moto: MotoServer):
    """The AWS backend against moto: RunInstances for spot fails (InsufficientInstanceCapacity) and then works."""
    from tests.providers.aws.helpers import live, tags_of
    from tests.providers.aws.test_aws_provider import GPU_TAGS, _provider, install

    p = _provider(moto)
    clock = FakeClock()
    ray = RayNodes(p)
    rev = attach(p, ray, clock)
    drought = {"on": True}

    def no_spot(request, n):
        if drought["on"] and query_params(request).get("InstanceMarketOptions.MarketType") == "spot":
            return ec2_error(request, "InsufficientInstanceCapacity", "no spot capacity", 500)
        return None

    install(p.backend.ec2_launch, "RunInstances", no_spot)
    [od] = sorted(p.create_node_with_resources_and_labels({}, dict(GPU_TAGS), 1, GPU, {}))
    assert {tags_of(i)[TAG_FALLBACK] for i in live(moto)} == {"spot"}
    clock.advance(p.settings.unavailable_ttl_s + 1)
    p.non_terminated_nodes({})                      # spot still short: the replacement fails, nothing leaks
    assert [i["InstanceId"] for i in live(moto)] == [od] and not rev.flights
    drought["on"] = False
    clock.advance(p.settings.unavailable_ttl_s + 1)
    for _ in range(3):
        p.non_terminated_nodes({})
    left = live(moto)
    assert len(left) == 1 and left[0]["InstanceId"] != od
    assert tags_of(left[0])[TAG_CAPACITY] == "spot" and tags_of(left[0])[TAG_REPLACES] == od
    assert ray.drained == [od] and rev.replaced == 1


def test_reversion_on_the_fake_gce_with_spot_capacity_that_comes_back():
    """The GCP backend against the fake Compute Engine: every spot insert ends ZONE_RESOURCE_POOL_EXHAUSTED (the
    fallback runs standard), then spot capacity returns; a busy fallback is kept until Ray lets it drain."""
    from ray_nodeless.testing.fake_gce import FakeGce
    from tests.providers.gcp.test_gcp_backend import _GPU_TAGS, PROJECT, _provider

    with FakeGce(project=PROJECT) as fake:
        p = _provider(fake)
        clock = FakeClock()
        ray = RayNodes(p)
        rev = attach(p, ray, clock)
        drought = fake.fail_insert(spot=True, times=None)
        [od] = sorted(p.create_node_with_resources_and_labels({}, dict(_GPU_TAGS), 1, GPU, {}))
        assert p.node_tags(od)[TAG_FALLBACK] == "spot" and p.node_tags(od)[TAG_CAPACITY] == "on-demand"
        clock.advance(p.settings.unavailable_ttl_s + 1)
        p.non_terminated_nodes({})                  # still exhausted: no replacement stays, nothing leaks
        assert sorted(fake.instances) == [od] and not rev.flights
        fake.faults.remove(drought)
        ray.busy.add(od)
        # The second capacity error in a row doubled the offering's backoff (core/availability.py): the cap bounds it.
        clock.advance(p.settings.unavailable_backoff_cap_s + 1)
        for _ in range(3):
            p.non_terminated_nodes({})
        assert len(fake.instances) == 2 and od in fake.instances and ray.drained == []   # busy: kept, not drained
        ray.busy.clear()
        p.non_terminated_nodes({})
        [spot] = sorted(fake.instances)
        assert spot != od and p.node_tags(spot)[TAG_CAPACITY] == "spot" and p.node_tags(spot)[TAG_REPLACES] == od
        assert ray.drained == [od] and rev.replaced == 1
        p.backend.close()


def test_plan_shows_every_reversion_setting_with_its_default_or_the_value_set(tmp_path):
    """`ray-nodeless plan` (text and --json) names each provider.reversion key with the value in force."""
    import json

    import yaml
    from click.testing import CliRunner

    from ray_nodeless.cli.main import main as cli
    from tests.helpers import cluster_config

    aws = {k: v for k, v in PROVIDER.items() if k not in ("simulate_cloud", "type", "module")} | {"cloud": "aws"}
    defaults = ReversionSettings().model_dump()
    for block, expect in [({}, defaults), ({"max_in_flight": 3, "drain_patience_s": 120},
                                           dict(defaults, max_in_flight=3, drain_patience_s=120.0))]:
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(cluster_config(dict(aws, reversion=block))))
        text = CliRunner().invoke(cli, ["plan", str(path)])
        assert text.exit_code == 0, text.output
        [line] = [ln for ln in text.output.splitlines() if ln.startswith("reversion:")]
        for key, value in expect.items():
            if key != "enabled":
                assert f"{key}={value:g}" in line, (key, line)
        js = CliRunner().invoke(cli, ["plan", "--json", str(path)])
        assert js.exit_code == 0, js.output
        assert json.loads(js.output)["reversion"] == expect
    path.write_text(yaml.safe_dump(cluster_config(dict(aws, reversion={"enabled": False}))))
    assert "reversion: off" in CliRunner().invoke(cli, ["plan", str(path)]).output
