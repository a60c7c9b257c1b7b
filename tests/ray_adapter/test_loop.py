"""The provider's own loop in the monitor (ray_adapter/loop.py, provider.py): Ray's listing call reads a snapshot
while the cloud is slow, a reverter's launch stuck in the cloud holds back none of Ray's launches, a failing step
never ends the loop, and outside the monitor there is no loop at all.

The cloud is the in-memory backend; a call is held in it by a gate (fake_backend `gates`) on an event. The loop's
clock is a FakeClock: a lane runs its first pass when it starts and then only what a test asks for (`wake`)."""
from __future__ import annotations

import threading
import time

import pytest

from ray_nodeless.errors import ListingError
from ray_nodeless.launch.reversion import TAG_REPLACES
from ray_nodeless.ray_adapter import provider as provider_module
from ray_nodeless.ray_adapter.context import OUTSIDE, MonitorContext
from ray_nodeless.ray_adapter.loop import Lane, ProviderLoop
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from ray_nodeless.testing.clock import FakeClock
from tests.launch.test_reversion import GPU, RayNodes, attach, launch_during_a_spot_drought
from tests.ray_adapter.test_provider import PROVIDER, WORKER_TAGS

MONITOR = MonitorContext(gcs_address="127.0.0.1:1", acts_on_cluster=True)
# In the monitor, without the endpoint and the `ray status` block (no GCS here), the reverter attached by the test.
SETTINGS = dict(PROVIDER, metrics_port=None, ray_status_events=0, reversion={"enabled": False})
QUICK_S = 2.0     # far below a 30 s cloud call; generous for a loaded 2-core machine


@pytest.fixture
def cloud():
    c = fake_backend.reset()
    yield c
    c.wake.set()


@pytest.fixture
def monitor(cloud, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_NODELESS_EVENTS_DIR", str(tmp_path))
    made: list[NodelessProvider] = []
    clock = FakeClock()

    def make(**extra) -> NodelessProvider:
        p = NodelessProvider(dict(SETTINGS, **extra), "c1", context=MONITOR, clock=clock)
        made.append(p)
        return p

    yield make, clock
    for p in made:
        p.stop()


class Gate:
    """Holds the calls `which` selects in the cloud until `release`."""

    def __init__(self, which=lambda arg: True):
        self.which = which
        self.entered = threading.Event()
        self.released = threading.Event()

    def __call__(self, arg) -> None:
        if self.which(arg):
            self.entered.set()
            assert self.released.wait(60), "the gate was never released"

    def release(self) -> None:
        self.released.set()


def timed(f, *args):
    start = time.monotonic()
    out = f(*args)
    return out, time.monotonic() - start


def test_the_listing_call_answers_while_a_refresh_is_held_in_the_cloud(monitor, cloud):
    make, _ = monitor
    p = make()
    [mid] = p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {})
    assert p.non_terminated_nodes({}) == [mid]           # the loop's first listing
    passes = p.loop.lanes["listing"].passes
    gate = Gate()
    cloud.gates["list"] = gate
    p.loop.wake("listing")
    assert gate.entered.wait(10), "the listing lane never reached the cloud"
    try:
        # The cloud holds the loop's listing; Ray's calls answer from the snapshot, at once.
        nodes, took = timed(p.non_terminated_nodes, {})
        assert nodes == [mid] and took < QUICK_S
        assert p.is_running(mid) and p.node_tags(mid)["ray-user-node-type"] == "gpu_worker"
        # What this object launches meanwhile is in the snapshot at once (the view shows its launches).
        del cloud.gates["list"]
        [other], took = timed(p.create_node_with_resources_and_labels, {}, dict(WORKER_TAGS), 1, GPU, {})
        assert took < QUICK_S and p.non_terminated_nodes({}) == sorted([mid, other])
        assert p.loop.lanes["listing"].passes == passes          # still held
    finally:
        gate.release()
    assert p.loop.wait_for_pass("listing", passes + 1, 10)


def test_a_reverter_launch_held_in_the_cloud_does_not_hold_rays_launches(monitor, cloud):
    make, clock = monitor
    p = make()
    rev = attach(p, RayNodes(p), clock)
    [od] = launch_during_a_spot_drought(p, cloud, 1)
    clock.advance(p.settings.unavailable_ttl_s + 1)          # spot is back, out of the capacity memory
    gate = Gate(lambda spec: bool(spec.tags.get(TAG_REPLACES)))    # only the reverter's replacement launch
    cloud.gates["launch"] = gate
    assert p.non_terminated_nodes({}) == [od]                # starts the loop; its first listing
    clock.advance(5)
    p.loop.wake("reversion")
    assert gate.entered.wait(10), "the reverter never launched its spot replacement"
    try:
        # Ray launches while the reverter's launch is in the cloud: on Ray's thread, through the launcher, at once.
        ids, took = timed(p.create_node_with_resources_and_labels, {}, dict(WORKER_TAGS), 1, GPU, {})
        assert took < QUICK_S and len(ids) == 1
        nodes, took = timed(p.non_terminated_nodes, {})
        assert took < QUICK_S and set(nodes) == {od, *ids}
        # The listing lane goes on beside the held reversion lane.
        n = p.loop.lanes["listing"].passes
        p.loop.wake("listing")
        assert p.loop.wait_for_pass("listing", n + 1, 10)
        assert not rev.flights                               # the replacement has not come back yet
    finally:
        gate.release()
    assert p.loop.wait_for_pass("reversion", 2, 10)
    assert list(rev.flights) == [od]                         # it came back: the replacement is under way


def test_the_first_listing_call_waits_bounded_for_the_first_listing(monitor, cloud, monkeypatch):
    make, _ = monitor
    monkeypatch.setattr(provider_module, "FIRST_SNAPSHOT_TIMEOUT_S", 0.3)
    gate = Gate()
    cloud.gates["list"] = gate
    p = make()
    try:
        with pytest.raises(ListingError, match="no listing of cluster 'c1' within"):
            p.non_terminated_nodes({})
    finally:
        gate.release()
    assert p.non_terminated_nodes({}) == []


def test_a_failed_first_listing_is_retried_by_the_loop(cloud, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_NODELESS_EVENTS_DIR", str(tmp_path))
    cloud.list_failures = 1           # the first listing fails: no good listing to answer from yet
    p = NodelessProvider(dict(SETTINGS), "c1", context=MONITOR)     # the real clock: the lane retries in 1 s
    try:
        assert p.non_terminated_nodes({}) == []
        assert p.loop.lanes["listing"].errors == 1 and "ListingError" in p.loop.lanes["listing"].last_error
    finally:
        p.stop()


def test_a_new_provider_object_of_the_cluster_takes_over_the_loop(monitor, cloud):
    make, _ = monitor
    old = make()
    old.non_terminated_nodes({})
    assert old.loop.running
    new = make()
    new.non_terminated_nodes({})
    assert new.loop.running and not old.loop.running


def test_outside_the_monitor_there_is_no_loop_and_each_listing_asks_the_cloud(cloud):
    before = threading.active_count()
    p = NodelessProvider(dict(SETTINGS), "c1", context=OUTSIDE)
    assert p.loop is None
    [mid] = p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {})
    calls = cloud.calls.get("list", 0)
    assert p.non_terminated_nodes({}) == [mid]
    assert cloud.calls["list"] > calls                     # ray down terminates what really runs
    del cloud.machines[mid]
    assert p.non_terminated_nodes({}) == []                 # gone at the next call, no loop needed
    assert threading.active_count() == before


def test_a_step_that_raises_never_ends_its_lane():
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) <= 3:
            raise RuntimeError("the cloud said no")

    loop = ProviderLoop("t", [Lane("flaky", flaky, 0.01)])
    loop.start()
    try:
        assert loop.wait_for_pass("flaky", 6, 10)
        lane = loop.lanes["flaky"]
        assert lane.errors == 3 and lane.last_error == "RuntimeError: the cloud said no"
    finally:
        assert loop.stop(timeout_s=5)
    assert not loop.running and not lane._thread.is_alive()


def test_lanes_wait_on_the_injected_clock():
    clock = FakeClock()
    passes: list[float] = []
    loop = ProviderLoop("t", [Lane("tick", lambda: passes.append(clock()), 0.05)], clock)
    loop.start()
    try:
        assert loop.wait_for_pass("tick", 1, 5)
        time.sleep(0.3)                       # real time passes, the clock does not: no pass is due
        assert len(passes) == 1
        clock.advance(0.05)
        assert loop.wait_for_pass("tick", 2, 5)
        loop.run_once("tick")                 # a caller's own pass, never overlapping the thread's
        assert len(passes) >= 3
    finally:
        loop.stop()
