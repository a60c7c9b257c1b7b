"""`ray stop` limited to the processes of one marker.

Every process started through a LocalCommandRunner (e.g. a local head) carries `NODELESS_LOCAL_NODE=<marker>`. A
plain `ray stop` would kill every Ray process of the user on the machine, other clusters included; this stops only
the marked ones. LocalCommandRunner's `ray` shell function runs it as
`python -m ray_nodeless.providers.local.scoped_stop stop-marked <marker> [--force]`.
"""
from __future__ import annotations

import os
import signal
import sys
import time

from ray_nodeless.errors import BackendError
from ray_nodeless.providers.local.pids import (
    ancestors, has_env, live_processes, proc_info, same_start, signal_pid,
)
from ray_nodeless.providers.local.ray_start import MARKER_ENV

# Ray's own `ray stop` waits 16 s before SIGKILL; the head's gcs_server and monitor were seen ignoring SIGTERM
# for longer than that, so waiting much longer buys nothing.
SCOPED_STOP_GRACE_S = 10.0
# How often the stop checks whether the signalled processes are gone.
STOP_POLL_S = 0.2


def _marked_targets(marker: str) -> tuple[dict[int, float], set[int]]:
    """({pid: start}, sessions): live processes started with `NODELESS_LOCAL_NODE=<marker>` in their environment, plus
    every process in their sessions, except this process's ancestry. Sessions count because Ray's agents and task
    workers clobber their environment (as the kernel shows it) when they set their process title; LocalCommandRunner
    gives each command its own session (unless run from a terminal, whose session -- ours -- is never included)."""
    mine = ancestors(os.getpid())
    own_sessions = {info.sid for info in map(proc_info, mine) if info is not None}
    procs = [info for info in live_processes() if info.pid not in mine]
    marked = {info.pid for info in procs if has_env(info.pid, MARKER_ENV, marker)}
    sessions = {info.sid for info in procs if info.pid in marked} - own_sessions - {0, 1}
    return {info.pid: info.started_s for info in procs if info.pid in marked or info.sid in sessions}, sessions


def marked_pids(marker: str) -> list[int]:
    return sorted(_marked_targets(marker)[0])


def stop_marked_processes(marker: str, timeout: float = SCOPED_STOP_GRACE_S, force: bool = False) -> int:
    """SIGTERM (SIGKILL with `force`) the processes of this marker, wait up to `timeout` for them, SIGKILL what is
    left. Returns how many processes were signalled."""
    pids, sessions = _marked_targets(marker)
    mine = ancestors(os.getpid())

    def remaining() -> set[int]:
        # Track the sessions found at the start: once the marked processes are gone, the unmarked ones remain. A
        # target is its pid *and* start time: a pid freed meanwhile may already belong to an unrelated process.
        return {info.pid for info in live_processes() if info.pid not in mine
                and (same_start(info.started_s, pids.get(info.pid)) or info.sid in sessions)}

    for pid in pids:
        signal_pid(pid, signal.SIGKILL if force else signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while not force and time.monotonic() < deadline and remaining():
        time.sleep(STOP_POLL_S)
    for pid in remaining():
        signal_pid(pid, signal.SIGKILL)
    return len(pids)


def end_marked_processes(marker: str, cluster_name: str) -> None:
    """`stop_marked_processes` for a sweep: SIGTERM, then SIGKILL what is left after the grace; a BackendError
    naming the processes that survived even SIGKILL (the sweep reports them as not ended)."""
    stop_marked_processes(marker)
    left = marked_pids(marker)
    if left:
        raise BackendError(f"processes {left} of cluster {cluster_name} survived SIGKILL", category="ProcessesSurvived")


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "stop-marked":
        n = stop_marked_processes(argv[1], force=any(a in ("-f", "--force") for a in argv[2:]))
        print(f"Stopped {n} local Ray processes of {argv[1]} (scoped `ray stop`).")
        return 0
    print("usage: python -m ray_nodeless.providers.local.scoped_stop stop-marked <marker> [--force]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
