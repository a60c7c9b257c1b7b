"""On-demand -> spot reversion through a whole episode of spot capacity that disappears and comes back, on the
in-memory cloud, on AWS (moto) and on the fake Compute Engine, with every safety clause checked after every step.

Everything of ours is real (the provider, its launcher, cost cap, capacity memory, listing, tags and terminate
path); Ray's node table and idle drain are `RayNodes` (tests/launch/test_reversion.py: a node running a task refuses
the idle drain, as the raylet does; the drain call itself against a real Ray is tests/e2e/test_reversion_drain.py).
The cloud's own listing (EC2 DescribeInstances on moto, the fake GCE's instance table) is the ground truth for
"no machine doubled or leaked" and for the cost, not the provider's view.

The clauses (issue 19), each an `Episode.check` line run after every provider call:
- nothing leaked: every machine the cloud lists is one the provider shows (and nothing it shows is gone);
- nothing doubled: at most one spot machine per on-demand machine it replaces, at most `max_in_flight` at once;
- never below min_workers: the worker count never drops under the count the episode started with;
- within max_hourly_cost: the listed machines' prices never sum over the cap;
- no busy node drained, the replaced machine's work never lost: a machine that runs a task is never terminated,
  and only a machine Ray accepted an idle drain for (or one the test reclaimed) ever leaves the listing.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import pytest

from ray_nodeless.launch.launcher import TAG_FALLBACK
from ray_nodeless.launch.reversion import TAG_REPLACES
from ray_nodeless.providers.base import TAG_CAPACITY, TAG_CLUSTER, TAG_PRICE
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from ray_nodeless.testing.moto_server import MotoServer, ec2_error, install, query_params
from tests.helpers import FakeClock
from tests.launch.test_reversion import GPU, RayNodes, attach
from tests.ray_adapter.test_provider import PROVIDER, WORKER_TAGS


# ----- the three clouds, each with a spot drought that can be switched on and off --------------------------------

class InMemoryCloud:
    name = "memory"
    tags = WORKER_TAGS

    def __init__(self) -> None:
        self.cloud = fake_backend.reset()

    def provider(self, **extra: Any) -> NodelessProvider:
        return NodelessProvider(dict(PROVIDER, **extra), "c1")

    def drought(self, on: bool) -> None:
        if on:
            self.cloud.capacity_faults[("*", "*", "spot")] = "InsufficientInstanceCapacity"
        else:
            self.cloud.capacity_faults.pop(("*", "*", "spot"), None)

    def listing(self) -> set[str]:
        with self.cloud.lock:
            return {mid for mid, m in self.cloud.machines.items() if m.tags.get(TAG_CLUSTER) == "c1"}

    def reclaim(self, mid: str) -> None:
        with self.cloud.lock:
            del self.cloud.machines[mid]
            self.cloud.gone[mid] = "interrupted"


class MotoCloud:
    name = "aws-moto"

    def __init__(self, moto: MotoServer) -> None:
        from tests.providers.aws.test_aws_provider import GPU_TAGS
        self.moto, self.tags, self.dry = moto, GPU_TAGS, False

    def provider(self, **extra: Any) -> NodelessProvider:
        from tests.providers.aws.test_aws_provider import _provider
        p = _provider(self.moto, **extra)

        def no_spot(request, n):      # EC2's answer to a spot RunInstances while the drought lasts
            if self.dry and query_params(request).get("InstanceMarketOptions.MarketType") == "spot":
                return ec2_error(request, "InsufficientInstanceCapacity", "no spot capacity", 500)
            return None

        install(p.backend.ec2_launch, "RunInstances", no_spot)
        return p

    def drought(self, on: bool) -> None:
        self.dry = on

    def listing(self) -> set[str]:
        from tests.providers.aws.helpers import live
        return {i["InstanceId"] for i in live(self.moto)}

    def reclaim(self, mid: str) -> None:
        self.moto.client().terminate_instances(InstanceIds=[mid])


class GceCloud:
    name = "gcp-fake-gce"

    def __init__(self, fake: Any) -> None:
        from tests.providers.gcp.test_gcp_backend import _GPU_TAGS
        self.fake, self.tags, self.fault = fake, _GPU_TAGS, None

    def provider(self, **extra: Any) -> NodelessProvider:
        from tests.providers.gcp.test_gcp_backend import _provider
        return _provider(self.fake, **extra)

    def drought(self, on: bool) -> None:
        if on and self.fault is None:
            self.fault = self.fake.fail_insert(spot=True, times=None)
        elif not on and self.fault is not None:
            self.fake.faults.remove(self.fault)
            self.fault = None

    def listing(self) -> set[str]:
        with self.fake.lock:
            return {n for n, i in self.fake.instances.items() if i.get("status") not in ("TERMINATED", "STOPPING")}

    def reclaim(self, mid: str) -> None:
        self.fake.preempt(mid)


@contextmanager
def a_cloud(kind: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    if kind == "memory":
        yield InMemoryCloud()
    elif kind == "moto":
        yield MotoCloud(request.getfixturevalue("moto"))
    else:
        from ray_nodeless.testing.fake_gce import FakeGce
        from tests.providers.gcp.test_gcp_backend import PROJECT
        with FakeGce(project=PROJECT) as fake:
            yield GceCloud(fake)


CLOUDS = ["memory", "moto", "gce"]


# ----- an episode: the provider as Ray's monitor drives it, checked after every call -------------------------------

class Episode:
    def __init__(self, cloud: Any, cap: float | None = None, **reversion: Any):
        self.cloud = cloud
        extra = {} if cap is None else {"max_hourly_cost": cap}
        self.p = cloud.provider(**extra)
        self.cap = cap
        self.clock = FakeClock()
        self.ray = RayNodes(self.p)
        self.rev = attach(self.p, self.ray, self.clock, **reversion)
        self.reclaimed: set[str] = set()     # ended by someone else: the cloud (spot reclaimed), Ray's scale-down
        self.ever: set[str] = set()          # every machine the cloud ever listed
        self.floor = 0                       # the worker count the episode must never drop under
        self.spot_launches: dict[str, set[str]] = {}    # on-demand machine -> the spot machines launched for it
        self.steps = 0

    def prices(self) -> tuple[float, float]:
        """(the cheapest on-demand, the cheapest spot) price of the node type, as the launcher ranks them."""
        plan = self.p.launcher.plan("gpu_worker", dict(GPU), {}, False)
        od = min(o.hourly_price for o in plan.candidates() if o.capacity == "on-demand")
        spot = min(o.hourly_price for o in plan.candidates() if o.capacity == "spot")
        return od, spot

    def launch_in_a_drought(self, n: int) -> list[str]:
        self.cloud.drought(True)
        ids = sorted(self.p.create_node_with_resources_and_labels({}, dict(self.cloud.tags), n, GPU, {}))
        for mid in ids:
            tags = self.p.node_tags(mid)
            assert tags[TAG_CAPACITY] == "on-demand" and tags[TAG_FALLBACK] == "spot"
        self.floor = n
        self.check()
        return ids

    def tick(self, times: int = 1, advance: float = 1.0) -> None:
        for _ in range(times):
            self.p.non_terminated_nodes({})
            self.check()
            self.clock.advance(advance)

    def after_the_capacity_memory(self) -> None:
        """Until every offering's backoff in force has ended (each capacity error in a row doubles it)."""
        states = self.p.unavailable.states().values()
        assert states, "nothing in the capacity memory"
        self.clock.advance(max(st.remaining_s for st in states) + 1)

    def check(self) -> None:
        self.steps += 1
        listed = self.cloud.listing()
        shown = set(self.p.view.cost_view()[1])
        gone = self.ever - listed
        self.ever |= listed
        # Nothing leaked: the cloud lists exactly what the provider shows.
        assert listed == shown, f"step {self.steps}: cloud {sorted(listed)} != provider {sorted(shown)}"
        tags = {mid: self.p.node_tags(mid) for mid in sorted(listed)}
        # Nothing doubled.
        replacing: dict[str, list[str]] = {}
        for mid, t in tags.items():
            if t.get(TAG_REPLACES):
                replacing.setdefault(t[TAG_REPLACES], []).append(mid)
                self.spot_launches.setdefault(t[TAG_REPLACES], set()).add(mid)
                assert t[TAG_CAPACITY] == "spot"
        assert all(len(v) == 1 for v in replacing.values()), f"step {self.steps}: {replacing}"
        assert len(self.rev.flights) <= self.rev.settings.max_in_flight
        # Never below min_workers (the count the episode started with).
        assert len(listed) >= self.floor, f"step {self.steps}: {len(listed)} workers < {self.floor}"
        # Within max_hourly_cost, summed from the cloud's own listing.
        if self.cap is not None:
            cost = sum(float(t[TAG_PRICE]) for t in tags.values())
            assert cost <= self.cap + 1e-9, f"step {self.steps}: ${cost:.4f}/h over the cap ${self.cap:.4f}/h"
        # No busy node drained, no work lost: what runs a task is listed; only what Ray let go (drained idle) or
        # the cloud took back (reclaimed) ever left.
        assert not (self.ray.busy - listed), f"step {self.steps}: busy {sorted(self.ray.busy - listed)} ended"
        assert not (set(self.ray.drained) & self.ray.busy)
        assert gone <= set(self.ray.drained) | self.reclaimed, f"step {self.steps}: {sorted(gone)} ended unasked"

    def reclaim(self, mid: str) -> None:
        self.reclaimed.add(mid)
        self.cloud.reclaim(mid)

    def spot_machines(self) -> dict[str, str]:
        """spot machine -> the on-demand machine it replaces (listed now)."""
        return {mid: self.p.node_tags(mid)[TAG_REPLACES] for mid in sorted(self.cloud.listing())
                if self.p.node_tags(mid).get(TAG_REPLACES)}


@pytest.mark.parametrize("kind", CLOUDS)
def test_spot_goes_away_and_comes_back_twice_with_a_busy_fallback_and_a_binding_cost_cap(kind, request):
    """Two fallbacks (one runs a task); spot is still short once the capacity memory lets go; spot returns and a
    replacement starts (the cap has room for one spot machine beside the two on-demand ones, although max_in_flight
    allows two); spot goes away again and the replacement is reclaimed before it takes over; spot returns: the idle
    fallback is replaced, the busy one only after its task finished there."""
    with a_cloud(kind, request) as cloud:
        probe = Episode(cloud)
        od_price, spot_price = probe.prices()
        assert spot_price < od_price and od_price >= spot_price / 2
        cap = 2 * od_price + 1.5 * spot_price      # two on-demand + one spot fit; two on-demand + two spot do not
        ep = Episode(cloud, cap=cap, max_in_flight=2)
        a, b = ep.launch_in_a_drought(2)
        ep.ray.busy.add(a)                          # a task runs on `a`

        # The capacity memory forgot spot, but spot is still short: a replacement is tried and fails, no machine.
        ep.after_the_capacity_memory()
        ep.tick(2)
        assert ep.cloud.listing() == {a, b} and not ep.rev.flights

        # Spot is back: one replacement (the cap's room), never two.
        cloud.drought(False)
        ep.after_the_capacity_memory()
        ep.tick()
        [(s1, target)] = ep.spot_machines().items()
        assert target == a and len(ep.rev.flights) == 1      # the same price: the first by id, the busy one

        # Spot goes away again, and the cloud takes the replacement back before it took over.
        cloud.drought(True)
        ep.reclaim(s1)
        ep.tick(3)
        assert ep.cloud.listing() == {a, b} and not ep.spot_machines()

        # Spot is back for good. The replacement is for a again; Ray refuses a's drain while its task runs, so b
        # (idle) is retired in its place; a gets a spot machine of its own, and waits for its task.
        cloud.drought(False)
        ep.after_the_capacity_memory()
        ep.tick(8)
        assert a in ep.cloud.listing() and b not in ep.cloud.listing() and b in ep.ray.drained
        assert a in ep.ray.refused and a not in ep.ray.drained

        # The task on a finished, on a: its work is done; now a drains idle and goes.
        ep.ray.busy.discard(a)
        ep.tick(3)
        assert sorted(ep.ray.drained) == sorted([a, b]) and ep.rev.replaced == 2
        final = ep.cloud.listing()
        assert len(final) == 2 and {ep.p.node_tags(m)[TAG_CAPACITY] for m in final} == {"spot"}
        # One spot machine per fallback that stayed, plus the one the cloud took back.
        assert sum(len(v) for v in ep.spot_launches.values()) == 3
        assert len(ep.ever) == 5


@pytest.mark.parametrize("kind", CLOUDS)
def test_a_fallback_busy_past_drain_patience_is_kept_and_never_replaced_again(kind, request):
    """Ray refuses the drain for drain_patience_s: the fallback stays (its work goes on), its spot machine becomes
    an ordinary worker, and the tags written to the cloud say so: neither this provider nor a restarted one
    launches another replacement for it."""
    with a_cloud(kind, request) as cloud:
        ep = Episode(cloud, drain_patience_s=30)
        [od] = ep.launch_in_a_drought(1)
        ep.ray.busy.add(od)
        cloud.drought(False)
        ep.after_the_capacity_memory()
        ep.tick(8, advance=5)
        [spot] = ep.cloud.listing() - {od}
        assert od in ep.ray.refused and not ep.ray.drained and not ep.rev.flights and ep.rev.replaced == 0
        restarted = cloud.provider()
        ep2_ray = RayNodes(restarted, busy=set())           # idle now: a replacement would drain it
        restarted._node_configs["gpu_worker"] = {}
        rev2 = attach(restarted, ep2_ray, FakeClock())
        for _ in range(3):
            ep.tick()
            restarted.non_terminated_nodes({})
        assert ep.cloud.listing() == {od, spot} and not rev2.flights and not ep2_ray.drained
        tags = restarted.node_tags(spot)
        assert tags[TAG_CAPACITY] == "spot" and not tags.get(TAG_REPLACES)
        assert not restarted.node_tags(od).get(TAG_FALLBACK)


def test_ray_ending_the_fallback_during_its_replacement_keeps_the_spot_machine_as_a_worker():
    """Ray's own scale-down ends the on-demand machine while its replacement starts: the spot machine stays a
    worker, and no second spot machine is launched for a machine that is gone."""
    ep = Episode(InMemoryCloud())
    ray_joined = ep.ray
    ray_joined.joined = False                                # the spot machine has not joined Ray yet
    [od] = ep.launch_in_a_drought(1)
    ep.cloud.drought(False)
    ep.after_the_capacity_memory()
    ep.tick()
    [spot] = ep.cloud.listing() - {od}
    ep.floor = 0
    ep.reclaimed.add(od)                                     # Ray's own scale-down (idle timeout) ends it
    ep.p.terminate_nodes([od])                               # through the provider's terminate path
    ray_joined.joined = True
    ep.tick(5)
    assert ep.cloud.listing() == {spot} and not ep.rev.flights and ep.rev.replaced == 0
    assert ep.spot_launches == {od: {spot}}


def test_no_replacement_when_spot_is_not_cheaper_at_the_effective_price():
    """A reserved on-demand price below spot (price_overrides): the fallback is already the cheaper machine."""
    cloud = InMemoryCloud()
    probe = Episode(cloud)
    od_price, spot_price = probe.prices()
    ep = Episode(cloud)
    ep.p = cloud.provider(price_overrides=[{"capacity": ["on-demand"], "hourly_price": round(spot_price / 2, 4)}])
    ep.ray = RayNodes(ep.p)
    ep.rev = attach(ep.p, ep.ray, ep.clock)
    [od] = ep.launch_in_a_drought(1)
    assert float(ep.p.node_tags(od)[TAG_PRICE]) < spot_price
    ep.cloud.drought(False)
    ep.after_the_capacity_memory()
    ep.tick(5)
    assert ep.cloud.listing() == {od} and not ep.rev.flights


def test_a_node_type_that_prefers_on_demand_is_not_reverted():
    """After interruption_limit spot interruptions of the type, its fallbacks stay on-demand until the preference
    ends; then they are replaced."""
    ep = Episode(InMemoryCloud(), interruption_limit=2, prefer_on_demand_s=600)
    [od] = ep.launch_in_a_drought(1)
    for _ in range(2):        # two spot machines of the type reclaimed by the cloud (what the listing reports)
        ep.rev.on_interrupted({TAG_CAPACITY: "spot", "ray-user-node-type": "gpu_worker"})
    ep.cloud.drought(False)
    ep.after_the_capacity_memory()
    ep.tick(5)
    assert ep.cloud.listing() == {od} and not ep.rev.flights
    ep.clock.advance(600)
    ep.tick(3)
    assert od not in ep.cloud.listing() and ep.rev.replaced == 1
