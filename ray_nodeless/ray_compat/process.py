"""Which Ray process is calling: `ray down` (found on the call stack) or the monitor of a cluster (its argv).
Ray passes the provider neither fact."""
from __future__ import annotations

import sys
from types import FrameType

# Ray's `ray down` path: commands.teardown_cluster calls _bootstrap_config (our bootstrap_config) before it lists and
# terminates the machines. Ray passes no flag that says so.
_TEARDOWN_FUNCTIONS = frozenset({"teardown_cluster"})
_TEARDOWN_MODULE = "ray.autoscaler._private.commands"

RAY_NAMES = tuple((_TEARDOWN_MODULE, f) for f in sorted(_TEARDOWN_FUNCTIONS))


def in_teardown() -> bool:
    """Is this call part of `ray down` (Ray's teardown_cluster)? Teardown must never depend on planning: a rule
    tightened since `ray up` must not leave the workers running."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in _TEARDOWN_FUNCTIONS and frame.f_globals.get("__name__") == _TEARDOWN_MODULE:
            return True
        frame = frame.f_back
    return False


def _monitor_flag(flag: str) -> str | None:
    """The value of `flag` (`--flag=value` or `--flag value`) on this process's command line, else None."""
    argv = sys.argv
    for i, arg in enumerate(argv):
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1] or None
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1] or None
    return None


def monitor_gcs_address() -> str | None:
    """The GCS address of the Ray monitor this process is (`--gcs-address` on monitor.py's command line, v1 and v2
    alike), else None. Ray hands a NodeProvider no GCS address; and only the monitor on the head should act on the
    cluster's nodes: `ray up` / `ray down` build provider objects too, on a laptop that may not reach GCS at all."""
    return _monitor_flag("--gcs-address")


def monitor_config_path() -> str | None:
    """The cluster config file this Ray monitor re-reads every loop (`--autoscaling-config` on monitor.py's command
    line, v1 and v2 alike; `ray up` writes it as ~/ray_bootstrap_config.yaml), else None."""
    return _monitor_flag("--autoscaling-config")


def monitor_logs_dir() -> str | None:
    """The session's logs directory of this Ray monitor (`--logs-dir`), where v2 writes its autoscaler events."""
    return _monitor_flag("--logs-dir")
