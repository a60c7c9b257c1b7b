"""State files never stop the monitor (ray_nodeless/metrics/state_files.py, events.py, cost_store.py): a decision log
with bytes that are not UTF-8, a directory where the log belongs, a file where the events dir belongs, a log whose
lock another process holds, and a cost state that cannot be true. Each is logged and set aside (renamed
`<name>.aside-<time>`, its content kept), the monitor's instruments come up (with the `ray status` block on, which
reads the log at the start), and launches go on and are logged afresh."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ray_nodeless.metrics.events import EVENTS_DIR_ENV, EventLog, cost_path, events_path, read_log
from ray_nodeless.metrics.state_files import ASIDE
from ray_nodeless.metrics.wiring import ProviderInstruments
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from tests.metrics.test_ray_status import KvSlot, _settings
from tests.ray_adapter.test_provider import PROVIDER, WORKER_TAGS

GPU = {"CPU": 4, "GPU": 1}
GOOD = json.dumps({"ts": time.time(), "kind": "launch", "message": "kept", "fields": {}}) + "\n"


def _instruments(where: Path) -> ProviderInstruments:
    """The monitor's instruments with the `ray status` block on (it reads the head's log when it starts)."""
    return ProviderInstruments("c1", _settings(ray_status_events=5), gcs_address="127.0.0.1:1",
                               status_slot=KvSlot(), events_dir=str(where))


def _aside(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ASIDE + "*"))


def test_a_log_with_bytes_that_are_not_utf8_is_set_aside(tmp_path, caplog):
    log = events_path("c1", str(tmp_path))
    log.write_bytes(GOOD.encode() + b'{"ts": 1, "kind": "launch", "message": "\xff\xfe"}\n')
    with caplog.at_level(logging.WARNING):
        inst = _instruments(tmp_path)
    [aside] = _aside(log)
    assert aside.read_bytes().startswith(GOOD.encode())          # kept as it was, for a look
    assert "not UTF-8" in caplog.text and aside.name in caplog.text
    inst.recorder.event("launch", "after the restart")
    assert [e.message for e in read_log(log)] == ["after the restart"]


def test_a_log_not_utf8_past_its_cut_never_raises_into_a_launch(tmp_path):
    # A foreign writer's bad byte after the monitor's start: the cut (every max_events) keeps bytes as they are.
    log = EventLog(tmp_path / "c1.jsonl", max_events=2)
    log.append("launch", "first")
    with open(log.path, "ab") as f:
        f.write(b"\xff garbage\n")
    for i in range(5):
        log.append("launch", f"next {i}")
    assert [e.message for e in read_log(log.path)] == ["next 2", "next 3", "next 4"]     # cut, then one more


def test_a_directory_where_the_log_belongs_is_set_aside(tmp_path):
    log = events_path("c1", str(tmp_path))
    (log / "inside").mkdir(parents=True)
    inst = _instruments(tmp_path)
    [aside] = _aside(log)
    assert (aside / "inside").is_dir()
    inst.recorder.event("launch", "logged")
    assert [e.message for e in read_log(log)] == ["logged"]


def test_a_file_where_the_events_dir_belongs_is_set_aside(tmp_path):
    where = tmp_path / "events"
    where.write_text("not a directory")
    inst = _instruments(where)
    [aside] = _aside(where)
    assert aside.read_text() == "not a directory"
    inst.recorder.event("launch", "logged")
    assert [e.message for e in read_log(events_path("c1", str(where)))] == ["logged"]


@pytest.fixture
def monitor(monkeypatch, tmp_path):
    """NodelessProvider built as Ray's monitor (its --gcs-address on the command line) on the in-memory backend."""
    monkeypatch.setenv(EVENTS_DIR_ENV, str(tmp_path / "events"))
    fake_backend.reset()
    from ray_nodeless.ray_adapter.context import MonitorContext
    return lambda: NodelessProvider(dict(PROVIDER, metrics_port=None), "c1",
                                    context=MonitorContext(gcs_address="127.0.0.1:1", acts_on_cluster=True))


def test_a_lock_held_by_another_process_never_holds_a_launch(monitor, caplog):
    p = monitor()
    lock = str(events_path("c1")) + ".lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from filelock import FileLock; l = FileLock(sys.argv[1]); l.acquire(); "
         "print('held', flush=True); sys.stdin.read()", lock],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        done: list = []
        with caplog.at_level(logging.WARNING):
            t = threading.Thread(target=lambda: done.append(
                p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {})), daemon=True)
            started = time.monotonic()
            t.start()
            t.join(30)
            took = time.monotonic() - started
        assert not t.is_alive(), "create_node blocked on the log's lock"
        assert done and len(done[0]) == 1 and took < 10
        assert len(fake_backend.CLOUD.machines) == 1
        assert "locked by another process" in caplog.text
    finally:
        holder.stdin.close()
        holder.wait(10)
    # The lock free again: the next event is logged.
    p.instruments.recorder.event("launch", "after the lock")
    assert "after the lock" in [e.message for e in read_log(events_path("c1"))]


@pytest.mark.parametrize("content", [b'{"total": NaN, "at": 1796160000.0, "hourly": 0.5}',
                                     b'{"total": Infinity, "at": 1796160000.0, "hourly": 0.5}',
                                     b'{"total": -3.5, "at": 1796160000.0, "hourly": 0.5}',
                                     b'{"total": 1.0, "at": 1796160000.0, "hourly": -1}',
                                     b'{"total": 1.0, "at": 1e999, "hourly": 0.5}',
                                     b'[1, 2, 3]', b'{"total": "12"}', b"\x00\xff garbage"])
def test_a_cost_state_that_cannot_be_true_is_set_aside(monitor, content, caplog):
    path = cost_path("c1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING):
        p = monitor()
    assert p.instruments.recorder.cost_total() == 0.0
    [aside] = _aside(path)
    assert aside.read_bytes() == content and not path.exists()
    assert "set aside" in caplog.text
    p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS), 1, GPU, {})
    p.non_terminated_nodes({})
    saved = json.loads(path.read_text())          # a fresh state, written at the first listing
    assert saved["total"] == 0.0 and saved["hourly"] > 0


def test_a_directory_where_the_cost_state_belongs_is_set_aside(monitor):
    path = cost_path("c1")
    path.mkdir(parents=True)
    p = monitor()
    assert p.instruments.recorder.cost_total() == 0.0 and _aside(path)
    p.non_terminated_nodes({})
    assert json.loads(path.read_text())["total"] == 0.0
