"""The provider's recent decisions in `ray status` (ray_nodeless/metrics/ray_status.py): the block, how it shares Ray's
slot with a real error, its bounds, its setting, and the three injected decisions through NodelessProvider on the
in-memory backend. The slot is Ray's internal-KV key; here a dict-backed stand-in for that key (`KvSlot`), since
the GCS is Ray's, not ours: tests/e2e/test_prometheus.py reads the real `ray status`."""
from __future__ import annotations

import time

import pytest
from ray.autoscaler.node_launch_exception import NodeLaunchException

from ray_nodeless.core.settings import CoreSettings
from ray_nodeless.errors import ConfigError
from ray_nodeless.metrics.events import Event, EventLog
from ray_nodeless.metrics.ray_status import HEADER, MAX_BYTES, MAX_LINE, RayStatusBlock, merged, render
from ray_nodeless.metrics.wiring import ProviderInstruments
from ray_nodeless.operate.config import load_provider
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from tests.ray_adapter.test_provider import PROVIDER, WORKER_TAGS

GPU = {"CPU": 4, "GPU": 1}
RAY_ERROR = "The autoscaler failed with the following error:\nTraceback (most recent call last): ..."


RUN_STARTED = 1796160000.0 - 1      # the run's start (StatusSlot.run_started): just before the events `ev` makes


class KvSlot:
    """Ray's DEBUG_AUTOSCALING_ERROR key, as a value (what StatusSlot reads and writes over the GCS), and the start
    of the cluster's run (what StatusSlot.run_started reads from the session name)."""

    def __init__(self, text: str | None = None, started: float | None = RUN_STARTED):
        self.text = text
        self.started = started
        self.writes = 0
        self.reads = 0

    def read(self) -> str | None:
        self.reads += 1
        return self.text

    def run_started(self) -> float | None:
        self.reads += 1
        return self.started

    def write(self, text: str) -> None:
        self.text = text
        self.writes += 1


class DownSlot:
    def read(self):
        raise ConnectionError("GCS unreachable")

    def run_started(self):
        raise ConnectionError("GCS unreachable")

    def write(self, text):
        raise AssertionError("never written when unreadable")


def ev(i: int, kind: str = "launch", message: str | None = None) -> Event:
    return Event(ts=1796160000.0 + i, kind=kind, message=message or f"decision {i}")


def test_the_block_replaces_only_its_own_text():
    block = render([ev(1)])
    assert merged(None, block) == merged("", block) == block
    assert merged(render([ev(0)]), block) == block                     # ours: replaced
    kept = merged(RAY_ERROR, block)                                    # Ray's error: kept, ours after it
    assert kept == RAY_ERROR + "\n\n" + block
    assert merged(kept, render([ev(2)])) == RAY_ERROR + "\n\n" + render([ev(2)])
    assert block.splitlines()[0] == HEADER and "not an error" in HEADER
    assert block.splitlines()[1] == "  2026-12-01T21:20:01Z launch             decision 1"


def test_the_block_is_bounded():
    events = [ev(i, message="x" * 1000 + f" {i}") for i in range(200)]
    text = render(events)
    assert len(text.encode()) <= MAX_BYTES
    lines = text.splitlines()
    assert lines[0] == HEADER and all(len(line) <= MAX_LINE for line in lines)
    assert lines[-1].endswith("...") and len(lines) > 5
    # Newlines in a message stay on its one line.
    assert render([ev(1, message="a\nb")]).splitlines()[1].endswith(" a b")


def test_the_last_n_events_and_a_slot_that_is_down():
    slot = KvSlot()
    block = RayStatusBlock(slot, max_events=3, background=False)
    for i in range(5):
        block.add(ev(i))
    assert [line.split()[-1] for line in slot.text.splitlines()[1:]] == ["2", "3", "4"]
    down = RayStatusBlock(DownSlot(), max_events=3, background=False)
    down.add(Event(ts=time.time() + 1, kind="launch", message="decision 1"))   # logged, not raised: the launch
    assert "decision 1" in down.text()                                          # that recorded it goes on


def test_the_writer_thread_writes_a_burst():
    slot = KvSlot(RAY_ERROR)
    block = RayStatusBlock(slot, max_events=10)
    for i in range(20):
        block.add(ev(i))
    assert block.flush(60)
    assert slot.text.startswith(RAY_ERROR + "\n\n" + HEADER)
    assert slot.text.splitlines()[-1].endswith("decision 19") and slot.writes <= 20


@pytest.fixture
def cloud():
    return fake_backend.reset()


def _provider(tmp_path, **extra):
    p = NodelessProvider(dict(PROVIDER, ray_status_events=10, **extra), "c1")
    slot = KvSlot()
    p.instruments.recorder.events = EventLog(tmp_path / "events.jsonl")
    p.instruments.recorder.status_block = RayStatusBlock(slot, 10, background=False)
    return p, slot


def test_a_capacity_error_a_fallback_and_a_cost_cap_refusal_show_in_the_block(cloud, tmp_path):
    p, slot = _provider(tmp_path)
    first = p.launcher.plan("gpu_worker", GPU, {}, False).chosen
    cloud.capacity_faults[(first.instance_type.name, first.zone, first.capacity)] = "InsufficientInstanceCapacity"
    p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {})
    [mid] = p.non_terminated_nodes({})
    price = float(cloud.machines[mid].tags["nodeless-hourly-price"])
    # A cap that leaves no room for a second worker.
    capped, capped_slot = _provider(tmp_path, max_hourly_cost=round(1.5 * price, 4))
    with pytest.raises(NodeLaunchException):
        capped.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {})
    lines = slot.text.splitlines()
    assert lines[0] == HEADER
    assert [line.split()[1] for line in lines[1:]] == ["capacity_error", "fallback", "launch"]
    assert f"capacity error InsufficientInstanceCapacity on {first.instance_type.name}/{first.zone}" in lines[1]
    [refusal] = capped_slot.text.splitlines()[1:]
    assert refusal.split()[1] == "cost_cap_refusal" and "max_hourly_cost" in refusal


def test_the_capacity_error_event_states_the_backoff_it_starts(cloud, tmp_path):
    """The decision log says how long the offering is skipped, as the capacity memory will skip it: 180 s on the
    first error in a row, doubled on the next error after that backoff ended (core/availability.py)."""
    from ray_nodeless.metrics.events import read_log
    from ray_nodeless.testing.clock import FakeClock

    p, _ = _provider(tmp_path)
    clock = FakeClock()
    p.unavailable.clock = clock
    first = p.launcher.plan("gpu_worker", GPU, {}, False).chosen
    cloud.capacity_faults[(first.instance_type.name, first.zone, first.capacity)] = "InsufficientInstanceCapacity"
    p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS, **{"ray-launch-request": "a"}), 1, GPU, {})
    clock.advance(181)
    p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS, **{"ray-launch-request": "b"}), 1, GPU, {})
    errors = [e for e in read_log(tmp_path / "events.jsonl") if e.kind == "capacity_error"]
    assert [(e.fields["skip_s"], e.fields["in_a_row"]) for e in errors] == [(180.0, 1), (360.0, 2)]
    assert "skipped for 360 s (capacity error 2 in a row on it" in errors[1].message
    assert p.unavailable.states()[first.key].remaining_s == 360


def _settings(**extra) -> CoreSettings:
    return load_provider(dict(PROVIDER, metrics_port=None, **extra)).core


def test_off_by_default_the_slot_is_never_touched(tmp_path):
    slot = KvSlot()
    off = ProviderInstruments("c1", _settings(), gcs_address="127.0.0.1:1", status_slot=slot, events_dir=str(tmp_path))
    assert off.recorder.status_block is None
    off.recorder.event("launch", "a decision")
    assert (slot.text, slot.reads, slot.writes) == (None, 0, 0)
    assert "a decision" in (tmp_path / "c1.jsonl").read_text()          # the log and Ray's channel still have it


def test_opted_in_the_block_shows_only_the_current_runs_decisions(tmp_path):
    log = EventLog(tmp_path / "c1.jsonl", clock=lambda: 1796000000.0)     # an earlier cluster of the same name
    log.append("launch", "of the cluster before")
    run = 1796100000.0
    log.clock = lambda: run + 60                                           # this run's monitor, before a restart
    log.append("fallback", "of this run before the restart")
    slot = KvSlot(started=run)
    on = ProviderInstruments("c1", _settings(ray_status_events=5), gcs_address="127.0.0.1:1", status_slot=slot,
                             events_dir=str(tmp_path))
    on.recorder.event("launch", "of this monitor")
    assert on.recorder.status_block.flush(60)
    shown = slot.text.splitlines()
    assert shown[0] == HEADER
    assert [line.split(None, 2)[2].strip() for line in shown[1:]] == [
        "of this run before the restart", "of this monitor"]
    # A slot that cannot say when the run began: only this monitor's own decisions.
    time.sleep(0.01)
    unknown = KvSlot(started=None)
    again = ProviderInstruments("c1", _settings(ray_status_events=5), gcs_address="127.0.0.1:1",
                                status_slot=unknown, events_dir=str(tmp_path))
    again.recorder.event("drain", "of the next monitor")
    assert again.recorder.status_block.flush(60)
    assert [line.split()[1] for line in unknown.text.splitlines()[1:]] == ["drain"]


def test_the_setting_turns_it_off_and_a_restart_shows_the_last_decisions(tmp_path):
    slot = KvSlot()
    off = ProviderInstruments("c1", _settings(ray_status_events=0), gcs_address="127.0.0.1:1", status_slot=slot,
                              events_dir=str(tmp_path))
    assert off.recorder.status_block is None
    off.recorder.event("launch", "before the restart")
    assert slot.text is None
    # A restarted monitor (the slot cleared by Ray v1): the block comes back from the head's log.
    again = ProviderInstruments("c1", _settings(ray_status_events=3), gcs_address="127.0.0.1:1", status_slot=slot,
                                events_dir=str(tmp_path))
    assert again.recorder.status_block.flush(60)
    assert slot.text.splitlines()[1:][0].endswith("before the restart")
    # Not in the monitor (`ray up`, `ray down`): no block, no log.
    away = ProviderInstruments("c1", _settings(), gcs_address=None, status_slot=slot, events_dir=str(tmp_path))
    assert away.recorder.status_block is None and away.recorder.events is None


@pytest.mark.parametrize("value", [-1, 51, "ten"])
def test_a_bad_ray_status_events_names_the_key(value):
    with pytest.raises(ConfigError, match="ray_status_events"):
        load_provider(dict(PROVIDER, ray_status_events=value))
