"""The monitor's learned idle release (launch/idle_release.py) through NodelessProvider on the in-memory cloud:
the provider, its launcher, view and terminate path are real, and so is the cluster config file it reads
(ray_adapter/idle_driver.ConfigIdlePlan). Ray's side is `RayIdle`: a stand-in for the GCS's node states (each
node's idle time) and its drain call with the idle reason, which Ray refuses for a node that runs work.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import yaml
import pytest

from ray_nodeless.core.idle_gaps import GapLearner
from ray_nodeless.interruptions.drain import RayNode
from ray_nodeless.launch.idle_release import LearnedRelease
from ray_nodeless.providers.base import TAG_CLUSTER
from ray_nodeless.ray_adapter.idle_driver import ConfigIdlePlan
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from tests.helpers import FakeClock
from tests.launch.test_reversion import RayNodes
from tests.ray_adapter.test_provider import PROVIDER, WORKER_TAGS

GPU = {"CPU": 4, "GPU": 1}
LAUNCH_S = 180.0


@dataclass
class RayIdle(RayNodes):
    """Ray's node states and idle drain (the reversion tests' RayNodes, whose idle drain refuses a `busy` node):
    `members` = the machines that are Ray nodes, `since[id]` = when one last ran work; a drained node is DRAINING
    and no longer reported."""

    clock: FakeClock = field(default_factory=FakeClock)
    since: dict[str, float] = field(default_factory=dict)
    members: set[str] = field(default_factory=set)

    def idle_seconds(self):
        out = {}
        for mid in self.members - set(self.drained):
            out[mid] = None if mid in self.busy else self.clock() - self.since[mid]
        return out

    def find(self, instance_id=None, ip=None):
        if instance_id not in self.members:
            return None
        state = "DRAINING" if instance_id in self.drained else "ALIVE"
        return RayNode(node_id=instance_id, ip="10.0.0.1", instance_id=instance_id, state=state, is_head=False)

    # -- what the workload does ------------------------------------------------------------------------------
    def works(self, mid: str) -> None:
        self.members.add(mid)
        self.busy.add(mid)

    def idles(self, mid: str) -> None:
        self.busy.discard(mid)
        self.since[mid] = self.clock()


@pytest.fixture
def cloud():
    return fake_backend.reset()


def cluster_file(tmp_path, **gpu_type) -> str:
    path = tmp_path / "ray_bootstrapped_config.yaml"
    nt = {"resources": GPU, "node_config": {}, "min_workers": 0, "max_workers": 10, "idle_timeout_s": LAUNCH_S}
    nt.update(gpu_type)
    path.write_text(yaml.safe_dump({
        "cluster_name": "c1", "idle_timeout_minutes": 5, "head_node_type": "head",
        "available_node_types": {"head": {"resources": {"CPU": 2}, "node_config": {}}, "gpu_worker": nt}}))
    return str(path)


def attach(p: NodelessProvider, ray: RayIdle, clock: FakeClock, path: str,
           learnable: list[str] | None = ("gpu_worker",)) -> LearnedRelease:
    """The idle release the provider builds in Ray's monitor, with Ray's GCS replaced by `ray`."""
    p.view.clock = p.launcher._clock = clock
    p.idle_release = LearnedRelease(GapLearner(LAUNCH_S, 5, 5.0), ray, ConfigIdlePlan(path, "head", learnable),
                                    ray, p.terminate_nodes, clock=clock)
    return p.idle_release


def started(tmp_path, learnable: list[str] | None = ("gpu_worker",), **gpu_type):
    """A provider with its idle release attached, Ray's stand-in and the test's clock, on `cluster_file`."""
    clock = FakeClock()
    p = NodelessProvider(dict(PROVIDER), "c1")
    ray = RayIdle(p, clock=clock)
    return clock, p, ray, attach(p, ray, clock, cluster_file(tmp_path, **gpu_type), learnable)


def workers(cloud: fake_backend.Cloud) -> set[str]:
    with cloud.lock:
        return {mid for mid, m in cloud.machines.items() if m.tags.get(TAG_CLUSTER) == "c1"}


def launch(p: NodelessProvider, ray: RayIdle) -> str:
    [mid] = p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {})
    ray.works(mid)
    return mid


def tick(p: NodelessProvider):
    return p.idle_release.tick(p.view.refresh(force=True))


def one_long_gap(p: NodelessProvider, ray: RayIdle, clock: FakeClock) -> str:
    """A worker runs work, then idles past a launch; Ray's own timeout ends it then (not ours)."""
    m = launch(p, ray)
    tick(p)
    ray.idles(m)
    for _ in range(4):
        clock.advance(LAUNCH_S / 4)
        tick(p)
    p.terminate_nodes([m])                   # Ray's idle termination at its 180 s
    ray.members.discard(m)
    tick(p)
    return m


def test_after_long_gaps_an_idle_worker_is_drained_and_ended_at_once(cloud, tmp_path):
    clock, p, ray, rel = started(tmp_path)
    first = one_long_gap(p, ray, clock)
    assert ray.drained == [] and first not in workers(cloud)        # the first gap was Ray's to end
    clock.advance(600)
    second = launch(p, ray)                  # work came back 780 s after the first went idle: a long gap
    tick(p)
    ray.idles(second)
    clock.advance(3)
    assert tick(p) == [] and second in workers(cloud)                # not before the min gap
    clock.advance(3)
    [r] = tick(p)
    assert (r.machine_id, r.node_type, r.type_timeout_s) == (second, "gpu_worker", LAUNCH_S)
    assert ray.drained == [second] and second not in workers(cloud)
    assert "its type's recent idle gaps were longer than a launch" in r.describe()
    assert rel.learner.gaps("gpu_worker", clock()) == [pytest.approx(780.0)]


def test_a_busy_node_is_never_ended(cloud, tmp_path):
    clock, p, ray, rel = started(tmp_path)
    one_long_gap(p, ray, clock)
    clock.advance(600)
    m = launch(p, ray)
    tick(p)
    # Ray reported it idle, then it took work before the drain (a race): Ray refuses, the machine stays.
    ray.idles(m)
    clock.advance(10)
    ray.busy.add(m)
    reported = ray.idle_seconds() | {m: 10.0}
    rel.source = type("Stale", (), {"idle_seconds": lambda self: reported})()
    assert tick(p) == [] and ray.refused == [m] and m in workers(cloud)


def test_short_gaps_keep_the_machines(cloud, tmp_path):
    clock, p, ray, rel = started(tmp_path)
    m = launch(p, ray)
    tick(p)
    for _ in range(4):                       # gaps of 40 s, four times
        ray.idles(m)
        for _ in range(8):
            clock.advance(5)
            assert tick(p) == []
        ray.works(m)
        tick(p)
    assert rel.learner.gaps("gpu_worker", clock()) == [40.0] * 4
    assert rel.learner.timeout_s("gpu_worker", LAUNCH_S, clock()) == LAUNCH_S
    ray.idles(m)
    for _ in range(12):
        clock.advance(5)
        assert tick(p) == []
    assert m in workers(cloud) and ray.drained == []         # Ray's own 180 s applies


def test_the_users_own_timeout_and_min_workers_are_kept(cloud, tmp_path):
    clock, p, ray, _ = started(tmp_path, learnable=[])    # the user set gpu_worker's idle_timeout_s
    one_long_gap(p, ray, clock)
    clock.advance(600)
    m = launch(p, ray)
    tick(p)
    ray.idles(m)
    clock.advance(60)
    assert tick(p) == [] and m in workers(cloud)
    # Learnable, but at its min_workers: kept too (the config file is read again when it changes).
    attach(p, ray, clock, cluster_file(tmp_path, min_workers=1))
    p.idle_release.learner = GapLearner(LAUNCH_S, 5, 5.0)
    p.idle_release.learner.idle("gpu_worker", "x", clock() - 1000)    # a long gap known
    p.idle_release._worked.add(m)
    assert tick(p) == [] and m in workers(cloud)


def test_a_machine_that_never_ran_work_is_rays_to_end(cloud, tmp_path):
    clock, p, ray, rel = started(tmp_path)
    rel.learner.idle("gpu_worker", "x", clock() - 1000)              # the type's gaps are long
    [m] = p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {})
    ray.members.add(m)
    ray.since[m] = clock()                   # joined and idle, never busy: launched for work on its way
    clock.advance(60)
    assert tick(p) == [] and m in workers(cloud)


def test_ray_unreachable_or_the_config_gone_ends_nothing(cloud, tmp_path):
    clock, p, ray, rel = started(tmp_path)

    class Down:
        def idle_seconds(self):
            from ray_nodeless.errors import DrainError
            raise DrainError("reading Ray's nodes failed: GCS down")

    rel.source = Down()
    m = launch(p, ray)
    assert tick(p) == [] and m in workers(cloud)
    rel.source = ray
    (tmp_path / "ray_bootstrapped_config.yaml").write_text("idle_timeout_minutes: [5\n")      # half written
    assert tick(p) == [] and m in workers(cloud)
    (tmp_path / "ray_bootstrapped_config.yaml").unlink()
    assert tick(p) == [] and m in workers(cloud)
