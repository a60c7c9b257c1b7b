"""Each autoscaler event reaches a driver once on the local backend (providers/local/ray_start.py): local worker
nodes share the head's session logs directory, and each log monitor publishes that directory's autoscaler log from
its first line. Run on Ray's own pieces without a cluster: our `ray start` command line parsed by Ray's `ray start`
command (whether that node starts a log monitor), and Ray's `LogMonitor` over one shared logs directory for the
head and each node that starts one, publishing to a recording stand-in for the GCS; the event is written by our
autoscaler event sink into the monitor log, as Ray's v1 monitor has it (tests/e2e: the whole cluster)."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ray_nodeless.providers.local.ray_start import ray_start_command
from ray_nodeless.ray_compat.demand import autoscaler_event_sink

PORTS = {k: 20000 + i for i, k in enumerate(("node_manager", "object_manager", "dashboard_agent_listen",
                                             "dashboard_agent_grpc", "runtime_env_agent", "metrics_export",
                                             "min_worker", "max_worker"))}


def _command(extra: list[str]) -> list[str]:
    return ray_start_command(gcs_address="127.0.0.1:6379", ip="127.0.0.2", ports=PORTS, resources={"CPU": 1},
                             object_store_memory=80 * 2**20, labels_file=None, extra_args=extra)


def starts_log_monitor(cmd: list[str]) -> bool:
    """Whether `ray start` with this command line starts a log monitor: Ray's own option parsing, and its default
    (node.py: `include_log_monitor` unset means True)."""
    from ray.scripts.scripts import start

    assert cmd[1] == "start"
    ctx = start.make_context("start", cmd[2:])
    return ctx.params["include_log_monitor"] is not False


class Published:
    """Ray's GCS client as the log monitor uses it: what it publishes to the drivers."""

    def __init__(self):
        self.lines: list[str] = []

    def publish_logs(self, data: dict) -> None:
        self.lines.extend(data["lines"])


def _log_monitor(logs_dir: Path, gcs: Published):
    from ray._private.log_monitor import LogMonitor

    return LogMonitor("127.0.0.1", str(logs_dir), gcs, is_proc_alive_fn=lambda pid: True)


def _poll(monitors) -> None:
    for m in monitors:
        m.update_log_filenames()
        m.open_closed_files()
        m.check_log_files_and_publish_updates()


@pytest.fixture
def monitor_log(tmp_path):
    """The session's monitor.log, where Ray's v1 monitor logs (its logger's file handler) and our sink writes."""
    logs = tmp_path / "session_x" / "logs"
    logs.mkdir(parents=True)
    handler = logging.FileHandler(logs / "monitor.log")
    target = logging.getLogger("ray.autoscaler._private.monitor")
    # As in Ray's monitor process (its logging level, INFO by default), the logger logs warnings. Its own level,
    # not an inherited one: an earlier test in the same worker may have left it disabled or a parent quieter
    # (tests/swapin's quiet_ray sets `ray.autoscaler` to ERROR), which has nothing to do with this test.
    saved = (target.disabled, target.level)
    target.disabled, target.level = False, logging.INFO
    target.addHandler(handler)
    try:
        yield logs
    finally:
        target.removeHandler(handler)
        handler.close()
        target.disabled, target.level = saved


def test_local_workers_leave_the_shared_logs_to_the_heads_log_monitor():
    assert not starts_log_monitor(_command([]))
    # A node with a temp dir of its own has logs of its own: it keeps its log monitor (Ray's default).
    assert starts_log_monitor(_command(["--temp-dir=/tmp/elsewhere"]))
    assert starts_log_monitor(_command(["--include-log-monitor=True"]))


def test_each_event_reaches_the_drivers_once_however_many_local_nodes(monitor_log):
    sink = autoscaler_event_sink(None)
    gcs = Published()
    head = _log_monitor(monitor_log, gcs)                      # `ray start --head` always runs one
    workers = [_command([]) for _ in range(3)]
    sink("ray_nodeless: first decision")
    monitors = [head]
    for cmd in workers:                                        # the nodes join one after another
        if starts_log_monitor(cmd):
            monitors.append(_log_monitor(monitor_log, gcs))
        _poll(monitors)
    sink("ray_nodeless: second decision")
    _poll(monitors)
    ours = [line for line in gcs.lines if "ray_nodeless:" in line]
    assert [line.split("ray_nodeless: ")[1] for line in ours] == ["first decision", "second decision"]


def test_what_a_log_monitor_per_local_node_did(monitor_log):
    # Guards the test above: with a log monitor per node (the old command line), each node replays the whole log.
    sink = autoscaler_event_sink(None)
    gcs = Published()
    monitors = [_log_monitor(monitor_log, gcs)]
    sink("ray_nodeless: first decision")
    for _ in range(3):
        monitors.append(_log_monitor(monitor_log, gcs))
        _poll(monitors)
    sink("ray_nodeless: second decision")
    _poll(monitors)
    ours = [line for line in gcs.lines if "ray_nodeless:" in line]
    assert sum("first decision" in line for line in ours) == 4 and sum("second decision" in line for line in ours) == 4
