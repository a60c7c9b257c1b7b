"""Which Ray process is calling: Ray's monitor of a cluster (its command line) or `ray down` (the call stack).
Ray passes the provider neither fact; these are the two documented detections, each checked against the installed
Ray by tests/ray_compat/test_compat.py.

- `monitor_args(argv)`: Ray 2.60 starts its monitor as `python -u <ray>/autoscaler/_private/monitor.py` (autoscaler
  v1) or `<ray>/autoscaler/v2/monitor.py` (v2) with `--logs-dir=...`, `--gcs-address=...` and, on a cluster `ray up`
  made, `--autoscaling-config=~/ray_bootstrap_config.yaml` (ray/_private/services.py start_monitor; both scripts'
  argparse declare the same three flags). Read once by `ray_adapter/context.py`, which builds the provider's
  MonitorContext from it; the KubeRay bridge builds its context itself and never comes here.
- `in_teardown()`: `ray down` runs commands.teardown_cluster, which calls our bootstrap_config and then builds the
  provider through Ray's provider cache: no argument, flag or provider call tells it apart from `ray up`. Found on
  the call stack; this is the only stack detection in ray_nodeless.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from types import FrameType
from typing import Sequence

# Ray's `ray down` path: commands.teardown_cluster calls _bootstrap_config (our bootstrap_config) before it lists and
# terminates the machines. Ray passes no flag that says so.
_TEARDOWN_FUNCTIONS = frozenset({"teardown_cluster"})
_TEARDOWN_MODULE = "ray.autoscaler._private.commands"

# The monitor scripts Ray starts (services.start_monitor: AUTOSCALER_PRIVATE_DIR or AUTOSCALER_V2_DIR + monitor.py),
# as (module, the module's file name), and the flags of theirs we read.
MONITOR_MODULES = ("ray.autoscaler._private.monitor", "ray.autoscaler.v2.monitor")
MONITOR_SCRIPT_DIRS = (("autoscaler", "_private"), ("autoscaler", "v2"))
GCS_FLAG, CONFIG_FLAG, LOGS_FLAG = "--gcs-address", "--autoscaling-config", "--logs-dir"
MONITOR_FLAGS = (GCS_FLAG, CONFIG_FLAG, LOGS_FLAG)

RAY_NAMES = tuple((_TEARDOWN_MODULE, f) for f in sorted(_TEARDOWN_FUNCTIONS)) + (
    ("ray.autoscaler._private.monitor", "Monitor"), ("ray.autoscaler.v2.monitor", "AutoscalerMonitor"),
    ("ray._private.services", "start_monitor"))


@dataclass(frozen=True)
class MonitorArgs:
    """What Ray's monitor command line says: its GCS, the config file it re-reads every loop, its logs dir."""

    gcs_address: str
    config_path: str | None
    logs_dir: str | None


def in_teardown() -> bool:
    """Is this call part of `ray down` (Ray's teardown_cluster)? Teardown must never depend on planning: a rule
    tightened since `ray up` must not leave the workers running."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in _TEARDOWN_FUNCTIONS and frame.f_globals.get("__name__") == _TEARDOWN_MODULE:
            return True
        frame = frame.f_back
    return False


def _flag(argv: Sequence[str], flag: str) -> str | None:
    """The value of `flag` (`--flag=value` or `--flag value`, as argparse takes both), else None."""
    for i, arg in enumerate(argv):
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1] or None
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1] or None
    return None


def is_monitor_script(path: str) -> bool:
    """Is `path` (argv[0]) one of Ray's monitor scripts: .../ray/autoscaler/_private/monitor.py or .../v2/...?"""
    parts = os.path.normpath(path).split(os.sep)
    return len(parts) >= 3 and parts[-1] == "monitor.py" and tuple(parts[-3:-1]) in MONITOR_SCRIPT_DIRS


def monitor_args(argv: Sequence[str] | None = None) -> MonitorArgs | None:
    """This process as Ray's monitor (its script and `--gcs-address`), else None: `ray up`, `ray down`, `sweep`,
    `plan`, a driver, a test. Ray hands a NodeProvider no GCS address; only the monitor on the head acts on the
    cluster's nodes (`ray up` / `ray down` build provider objects too, on a laptop that may not reach GCS at all)."""
    argv = list(sys.argv if argv is None else argv)
    if not argv or not is_monitor_script(argv[0]):
        return None
    gcs = _flag(argv, GCS_FLAG)
    if not gcs:
        return None
    return MonitorArgs(gcs_address=gcs, config_path=_flag(argv, CONFIG_FLAG), logs_dir=_flag(argv, LOGS_FLAG))
