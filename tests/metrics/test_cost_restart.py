"""`ray_nodeless_cost_dollars_total` continues across a monitor restart (ray_nodeless/metrics/cost_store.py): two
NodelessProvider objects built as the monitor (a MonitorContext that acts on the cluster) on the in-memory backend,
the second after the first is gone, with one clock moved by hand. The cost is integrated at each listing of the
provider's loop: `listing` runs one pass of it, then asks as Ray does."""
from __future__ import annotations

import time

import pytest

from ray_nodeless.metrics.events import EVENTS_DIR_ENV, cost_path
from ray_nodeless.providers.base import TAG_PRICE
from ray_nodeless.ray_adapter.context import MonitorContext
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from ray_nodeless.testing.clock import FakeClock
from tests.ray_adapter.test_provider import PROVIDER, WORKER_TAGS

GPU = {"CPU": 4, "GPU": 1}
# In the monitor, without the endpoint and the `ray status` block (no GCS here).
MONITOR = dict(PROVIDER, metrics_port=None, ray_status_events=0)


@pytest.fixture
def monitor(monkeypatch, tmp_path):
    monkeypatch.setenv(EVENTS_DIR_ENV, str(tmp_path / "events"))
    clock = FakeClock(time.time())

    started: list[NodelessProvider] = []

    def start() -> NodelessProvider:
        p = NodelessProvider(dict(MONITOR), "c1", context=MonitorContext(gcs_address="127.0.0.1:1",
                                                                         acts_on_cluster=True), clock=clock)
        p.instruments.recorder.clock = clock
        started.append(p)
        return p

    fake_backend.reset()
    yield start, clock
    for p in started:
        p.stop()


def listing(p: NodelessProvider) -> list[str]:
    """One pass of the provider's listing lane (it integrates the cost), then Ray's listing call."""
    p.loop.run_once("listing")
    return p.non_terminated_nodes({})


def test_a_restarted_monitor_continues_the_cost(monitor, tmp_path):
    start, clock = monitor
    first = start()
    first.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {})
    [mid] = listing(first)
    price = float(fake_backend.CLOUD.machines[mid].tags[TAG_PRICE])
    clock.advance(1800)
    listing(first)
    before = first.instruments.recorder.cost_total()
    assert before == pytest.approx(price / 2, rel=1e-6)
    assert cost_path("c1").is_file() and str(tmp_path) in str(cost_path("c1"))

    # The monitor dies; 10 minutes pass with the machine running (billed); a new monitor starts.
    first.stop()
    del first
    clock.advance(600)
    second = start()
    assert second.instruments.recorder.cost_total() == pytest.approx(before)     # before its first listing
    listing(second)
    assert second.instruments.recorder.cost_total() == pytest.approx(before + price * 600 / 3600, rel=1e-6)
    clock.advance(1200)
    listing(second)
    assert second.instruments.recorder.cost_total() == pytest.approx(price, rel=1e-6)    # one hour in all


def test_a_machine_gone_while_no_monitor_ran_is_not_counted_for_the_gap(monitor):
    start, clock = monitor
    first = start()
    first.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {})
    [mid] = listing(first)
    price = float(fake_backend.CLOUD.machines[mid].tags[TAG_PRICE])
    clock.advance(3600)
    listing(first)
    del fake_backend.CLOUD.machines[mid]      # ended while no monitor ran: its end time is unknown
    clock.advance(600)
    second = start()
    assert listing(second) == []
    assert second.instruments.recorder.cost_total() == pytest.approx(price, rel=1e-6)    # short, never over


def test_an_unreadable_cost_state_starts_from_zero(monitor):
    start, _ = monitor
    path = cost_path("c1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    assert start().instruments.recorder.cost_total() == 0.0
