"""`ray_nodeless_cost_dollars_total` continues across a monitor restart (ray_nodeless/metrics/cost_store.py): two
NodelessProvider objects built as the monitor (its `--gcs-address` on the command line, as Ray runs it) on the
in-memory backend, the second after the first is gone, with one clock moved by hand."""
from __future__ import annotations

import sys
import time

import pytest

from ray_nodeless.metrics.events import EVENTS_DIR_ENV, cost_path
from ray_nodeless.providers.base import TAG_PRICE
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from ray_nodeless.testing.clock import FakeClock
from tests.ray_adapter.test_provider import PROVIDER, WORKER_TAGS

GPU = {"CPU": 4, "GPU": 1}
# In the monitor, without the endpoint and the `ray status` block (no GCS here).
MONITOR = dict(PROVIDER, metrics_port=None, ray_status_events=0)


@pytest.fixture
def monitor(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", [sys.argv[0], "--gcs-address=127.0.0.1:1"])
    monkeypatch.setenv(EVENTS_DIR_ENV, str(tmp_path / "events"))
    clock = FakeClock(time.time())

    def start() -> NodelessProvider:
        p = NodelessProvider(dict(MONITOR), "c1")
        p.instruments.recorder.clock = clock
        return p

    fake_backend.reset()
    return start, clock


def test_a_restarted_monitor_continues_the_cost(monitor, tmp_path):
    start, clock = monitor
    first = start()
    first.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {})
    [mid] = first.non_terminated_nodes({})
    price = float(fake_backend.CLOUD.machines[mid].tags[TAG_PRICE])
    clock.advance(1800)
    first.non_terminated_nodes({})
    before = first.instruments.recorder.cost_total()
    assert before == pytest.approx(price / 2, rel=1e-6)
    assert cost_path("c1").is_file() and str(tmp_path) in str(cost_path("c1"))

    # The monitor dies; 10 minutes pass with the machine running (billed); a new monitor starts.
    del first
    clock.advance(600)
    second = start()
    assert second.instruments.recorder.cost_total() == pytest.approx(before)     # before its first listing
    second.non_terminated_nodes({})
    assert second.instruments.recorder.cost_total() == pytest.approx(before + price * 600 / 3600, rel=1e-6)
    clock.advance(1200)
    second.non_terminated_nodes({})
    assert second.instruments.recorder.cost_total() == pytest.approx(price, rel=1e-6)    # one hour in all


def test_a_machine_gone_while_no_monitor_ran_is_not_counted_for_the_gap(monitor):
    start, clock = monitor
    first = start()
    first.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {})
    [mid] = first.non_terminated_nodes({})
    price = float(fake_backend.CLOUD.machines[mid].tags[TAG_PRICE])
    clock.advance(3600)
    first.non_terminated_nodes({})
    del fake_backend.CLOUD.machines[mid]      # ended while no monitor ran: its end time is unknown
    clock.advance(600)
    second = start()
    assert second.non_terminated_nodes({}) == []
    assert second.instruments.recorder.cost_total() == pytest.approx(price, rel=1e-6)    # short, never over


def test_an_unreadable_cost_state_starts_from_zero(monitor):
    start, _ = monitor
    path = cost_path("c1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    assert start().instruments.recorder.cost_total() == 0.0
