"""Machines ended by someone else (issue 28), on the in-memory cloud: young machines a spot reclaim or another
object's terminate ended before the listing showed them, Ray's retry of a request whose machines were ended from
outside, and the `ray.io/` labels a machine starts Ray with (always its facts). The same on EC2 (moto) is in
test_outside_ends_aws.py; the fault matrix runs these among its steps."""
from __future__ import annotations

import logging
import time

import pytest

from ray_nodeless.core.demand import ACCELERATOR_TYPE, MARKET_TYPE, ZONE
from ray_nodeless.launch.launcher import retry_round_s
from ray_nodeless.providers.base import TAG_CLUSTER, TAG_PRICE
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from tests.helpers import FakeClock, wait_for
from tests.launch.test_retry_idempotency import adapter_for
from tests.ray_adapter.test_provider import PROVIDER, WORKER_TAGS

GPU = {"CPU": 4, "GPU": 1}
CPU = {"CPU": 8}


@pytest.fixture
def cloud() -> fake_backend.Cloud:
    return fake_backend.reset()


def tags(request: str, node_type: str = "gpu_worker") -> dict[str, str]:
    return dict(WORKER_TAGS, **{"ray-user-node-type": node_type, "ray-launch-request": request})


def live(cloud: fake_backend.Cloud) -> dict[str, float]:
    with cloud.lock:
        return {mid: float(m.tags[TAG_PRICE]) for mid, m in cloud.machines.items() if m.tags.get(TAG_CLUSTER) == "c1"}


def end_outside(ids: list[str]) -> None:
    """Another object of the cluster (a laptop's `ray down --workers-only`, a sweep) ends them."""
    fake_backend.FakeBackend.from_provider(dict(PROVIDER), "c1").terminate(list(ids))


def on_one_clock(p: NodelessProvider) -> FakeClock:
    clock = FakeClock()
    p.launcher._clock = p.view.clock = p.unavailable.clock = clock
    return clock


# ----------------------------------------------------------------------------- young machines ended outside


@pytest.mark.parametrize("how", ["terminated", "reclaimed"])
def test_a_young_machine_ended_outside_is_gone_at_once_and_frees_the_cap(cloud, how):
    """Before: the 5 machines stayed listed, is_terminated False, and the cap refused a replacement of 2 for
    ttls.LAUNCH_GRACE_S (120 s) although nothing ran. Measured in issue 28 on EC2 ($1/h cap)."""
    one = NodelessProvider(dict(PROVIDER), "c1").launcher.plan("gpu_worker", GPU, {}, False).chosen.hourly_price
    cap = one * 5.5
    p = NodelessProvider(dict(PROVIDER, max_hourly_cost=cap, launch_retry_backoff_s=0), "c1")
    p.view.clock = FakeClock()                        # no time passes: well within the launch grace
    cloud.hide = lambda m: True                       # the listing lags: none of the 5 is listed yet
    ids = sorted(p.create_node_with_resources_and_labels({}, tags("req-1"), 5, GPU, {}))
    assert sorted(p.non_terminated_nodes({})) == ids  # shown while the listing lags
    if how == "terminated":
        end_outside(ids)
    else:
        for mid in ids:
            fake_backend.FakeBackend.from_provider(dict(PROVIDER), "c1").reclaim(mid)
    assert live(cloud) == {}
    assert p.non_terminated_nodes({}) == []
    assert all(p.is_terminated(i) for i in ids)
    assert p.launcher.budget.hourly_cost() == 0
    more = p.create_node_with_resources_and_labels({}, tags("req-2"), 2, GPU, {})
    assert len(more) == 2 and set(more) <= set(live(cloud))
    # A terminate call (by anyone) is not an interruption; a reclaim of a spot machine is.
    marked = {k for k, why in p.unavailable.snapshot().items() if why == "interrupted"}
    assert bool(marked) == (how == "reclaimed")


def test_a_young_machine_the_cloud_shows_nothing_of_is_kept_for_the_launch_grace(cloud):
    """The lookup by id lags too (EC2 right after RunInstances): the machine stays, as before."""
    p = NodelessProvider(dict(PROVIDER), "c1")
    p.view.clock = FakeClock()
    cloud.hide = cloud.hide_from_lookup = lambda m: True
    ids = sorted(p.create_node_with_resources_and_labels({}, tags("req-1"), 2, GPU, {}))
    assert sorted(p.non_terminated_nodes({})) == ids and not any(p.is_terminated(i) for i in ids)


# ------------------------------------------------------------------------------ empty listings, many in a row


@pytest.mark.parametrize("empties", [2, 3, 6])
def test_runs_of_empty_pages_change_nothing(cloud, empties):
    """The listing comes back empty several times in a row while 4 machines run; a fresh object (`ray down`)
    among them: every one is still listed, none is terminated for Ray, no offering is marked interrupted."""
    p = NodelessProvider(dict(PROVIDER), "c1")
    ids = sorted(p.create_node_with_resources_and_labels({}, tags("req-1"), 4, GPU, {}))
    assert sorted(p.non_terminated_nodes({})) == ids
    cloud.hide = lambda m: True
    fresh = NodelessProvider(dict(PROVIDER), "c1")
    for _ in range(empties):
        assert sorted(p.non_terminated_nodes({})) == ids
        assert not any(p.is_terminated(i) for i in ids)
    assert sorted(fresh.non_terminated_nodes({})) == ids
    assert not p.unavailable.snapshot()


# ------------------------------------------------------------------------- a retry after outside terminations


def test_rays_retry_after_outside_terminations_launches_anew(cloud):
    """A batch's machines were listed, then ended from outside before Ray saw them; Ray's retry of the request
    (same id, same count, after request_status_timeout_s) must get new machines under a new token generation.
    Before: the in-memory cloud (like EC2's ClientToken) answered the old token with the ended ids, returned to
    Ray as new nodes; on an endpoint without ClientToken the AWS backend failed PartialLookup after 45 s."""
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = on_one_clock(p)
    first = sorted(p.create_node_with_resources_and_labels({}, tags("req-1"), 3, GPU, {}))
    assert sorted(p.non_terminated_nodes({})) == first
    end_outside(first)
    clock.advance(retry_round_s() + 1)
    assert p.non_terminated_nodes({}) == []
    again = sorted(p.create_node_with_resources_and_labels({}, tags("req-1"), 3, GPU, {}))
    assert len(again) == 3 and not set(again) & set(first)
    assert set(again) == set(live(cloud))
    assert cloud.launches[-1].request_token != cloud.launches[0].request_token
    # and the next retry of the new generation, its machines alive, gets those same machines back
    clock.advance(retry_round_s() + 1)
    cloud.hide = cloud.hide_from_lookup = lambda m: True      # Ray never saw them: it retries once more
    clock.advance(1)
    p.non_terminated_nodes({})
    once_more = sorted(p.create_node_with_resources_and_labels({}, tags("req-1"), 3, GPU, {}))
    assert once_more == again and cloud.launches[-1].request_token == cloud.launches[-2].request_token


def test_a_retry_whose_machines_still_run_keeps_its_token(cloud):
    """Nothing was ended: the lookup shows the machines live, so the retry's token is the first round's."""
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = on_one_clock(p)
    cloud.hide = cloud.hide_from_lookup = lambda m: True
    first = sorted(p.create_node_with_resources_and_labels({}, tags("req-1"), 2, GPU, {}))
    clock.advance(retry_round_s() + 1)
    p.non_terminated_nodes({})
    again = sorted(p.create_node_with_resources_and_labels({}, tags("req-1"), 2, GPU, {}))
    assert again == first and len(live(cloud)) == 2


def test_ray_v2_retry_after_outside_terminations_launches_anew(cloud, tmp_path):
    """Through Ray's own NodeProviderAdapter: 7 machines (batches 5 and 2), listed, ended from outside; Ray's
    retry of the same request id launches 7 new machines with no error."""
    p = NodelessProvider(dict(PROVIDER), "c1")
    clock = on_one_clock(p)
    adapter = adapter_for(p, tmp_path)
    adapter.launch({"gpu_worker": 7}, request_id="req-1")
    wait_for(lambda: len(cloud.launches) == 2, 30, "the first round's 2 batches")
    wait_for(lambda: len(p.non_terminated_nodes({})) == 7, 30, "the first round's machines listed")
    first = set(live(cloud))
    end_outside(sorted(first))
    clock.advance(retry_round_s() + 1)
    assert p.non_terminated_nodes({}) == []
    adapter.launch({"gpu_worker": 7}, request_id="req-1")
    wait_for(lambda: len(cloud.launches) == 4, 30, "the retry's 2 batches")
    wait_for(lambda: len(live(cloud)) == 7, 30, "7 new machines")
    assert adapter.poll_errors() == []
    assert not set(live(cloud)) & first
    assert {s.request_token for s in cloud.launches[2:]}.isdisjoint({s.request_token for s in cloud.launches[:2]})


# --------------------------------------------------------------------------------------- a label that lies


def test_a_cpu_machine_never_starts_ray_with_a_declared_accelerator_label(cloud, caplog):
    """Before: a node type declaring ray.io/accelerator-type: H100 started its CPU machines with that label."""
    p = NodelessProvider(dict(PROVIDER), "c1")
    declared = {ACCELERATOR_TYPE: "H100", MARKET_TYPE: "spot", "team": "ml"}
    with caplog.at_level(logging.WARNING, logger="ray_nodeless.launch.launcher"):
        p.create_node_with_resources_and_labels({}, tags("req-1", "cpu"), 1, CPU, declared)
    labels = cloud.launches[-1].labels
    o = cloud.launches[-1].offering
    assert o.instance_type.gpu_count == 0
    assert ACCELERATOR_TYPE not in labels
    assert labels[MARKET_TYPE] == o.capacity == "on-demand" and labels[ZONE] == o.zone
    assert labels["team"] == "ml"                     # a label of the user's own is kept
    assert ACCELERATOR_TYPE in caplog.text and "H100" in caplog.text and MARKET_TYPE in caplog.text


def test_a_gpu_machine_carries_its_own_accelerator_not_the_declared_one(cloud):
    p = NodelessProvider(dict(PROVIDER), "c1")
    p.create_node_with_resources_and_labels({}, tags("req-1"), 1, GPU, {ACCELERATOR_TYPE: "H100"})
    spec = cloud.launches[-1]
    assert spec.offering.instance_type.gpu_model != "H100"
    assert spec.labels[ACCELERATOR_TYPE] == spec.offering.instance_type.gpu_model


# ------------------------------------------------------------------- teardown: launched but not listed yet


def launched_late(cloud: fake_backend.Cloud, lag_s: float) -> tuple[list[str], list[str]]:
    """A cluster (a head and 2 workers) whose monitor launched one more worker just before the teardown: the
    cloud shows nothing of it (listing and lookups alike) for `lag_s`. (all ids, the late one)"""
    monitor = NodelessProvider(dict(PROVIDER), "c1")
    head = monitor.create_node_with_resources_and_labels(
        {}, dict(tags("req-h", "cpu"), **{"ray-node-type": "head"}), 1, CPU, {})
    workers = monitor.create_node_with_resources_and_labels({}, tags("req-w", "cpu"), 2, CPU, {})
    late = list(monitor.create_node_with_resources_and_labels({}, tags("req-late", "cpu"), 1, CPU, {}))
    until = time.monotonic() + lag_s
    cloud.hide = cloud.hide_from_lookup = lambda m: m.id in late and time.monotonic() < until
    return sorted([*head, *workers, *late]), late


def test_ray_down_ends_a_worker_launched_just_before_and_not_listed_yet(cloud):
    """Before: Ray's teardown loop stopped at the first empty listing and the late worker kept running (Ray's
    own AWS provider does the same). Now, once the head is ended, "empty" needs a listing teardown_watch_s later."""
    every, late = launched_late(cloud, lag_s=1.5)
    down = NodelessProvider(dict(PROVIDER), "c1")         # `ray down`'s own object
    down.view.teardown_watch_s = 3.0
    ids = down.non_terminated_nodes({})
    assert late[0] not in ids
    while ids:                                          # Ray's teardown_cluster loop (less its 5 s sleeps)
        down.terminate_nodes(ids)
        ids = down.non_terminated_nodes({})
    assert live(cloud) == {}


def test_sweep_ends_a_worker_launched_just_before_and_not_listed_yet(cloud):
    from ray_nodeless.operate.sweep import Sweep

    every, late = launched_late(cloud, lag_s=1.5)
    sweep = Sweep({"cluster_name": "c1", "provider": dict(PROVIDER)}, verify_s=3.0)
    try:
        result = sweep.run()
    finally:
        sweep.close()
    assert result.ok, result.failures
    assert sorted(t.id for t in result.targets if t.kind == "machine") == every
    assert live(cloud) == {}


def test_a_monitor_ending_workers_never_waits(cloud):
    """Only a terminate that includes the head starts the watch: the monitor's scale-downs answer at once."""
    p = NodelessProvider(dict(PROVIDER), "c1")
    ids = p.create_node_with_resources_and_labels({}, tags("req-1", "cpu"), 2, CPU, {})
    p.terminate_nodes(list(ids))
    t0 = time.monotonic()
    assert p.non_terminated_nodes({}) == [] and time.monotonic() - t0 < 0.5
