"""Private Ray heads and process-group helpers shared by the tests, the benchmarks and the demo.

Safety: other engineers may run Ray on this machine, so nothing here runs `ray stop` (which kills every Ray process
of the user). A head is our own `ray start --head --block` in a new session, on free ports and a private
--temp-dir (worker nodes inherit the head's temp dir through GCS), and is stopped by signalling its process group
only.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from ray_nodeless.providers.local.pids import live_processes
from ray_nodeless.testing.clock import wait_for  # noqa: F401 - the one polling loop, long imported from here
from ray_nodeless.providers.local.processes import LocalNodeProcesses
from ray_nodeless.providers.local.ray_start import READY_MARKER, ray_executable
from ray_nodeless.ray_compat.gcs import node_infos

T = TypeVar("T")

# How often wait_for and poll_until look at their condition: fast next to the seconds a Ray process takes to start
# or stop, slow enough not to load a 2-core machine.
POLL_S = 0.2
# A SIGTERMed test head exits within a few seconds (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0 skips the drain).
KILL_GRACE_S = 5.0
# After SIGKILL the kernel takes the group away at once; this only bounds a stuck reap.
KILL_WAIT_S = 10.0
# A head's `ray start` takes a few seconds here; 90 s covers a host loaded by concurrent Ray test runs.
HEAD_START_TIMEOUT_S = 90.0
# How long a test waits for its nodes' stop in stop_everything (SIGKILL after).
STOP_TIMEOUT_S = 10.0
# Bytes of a failed head's log shown in the error.
LOG_TAIL_CHARS = 3000


def poll_until(pred: Callable[[], T], timeout: float) -> T | None:
    """`pred()`'s first truthy value, polled until `timeout` passes; None if it never was."""
    try:
        return wait_for(pred, timeout, interval=POLL_S)
    except AssertionError:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def group_alive(pgid: int) -> bool:
    """Is any live (non-zombie) process still in process group `pgid`?"""
    return any(info.pgid == pgid for info in live_processes())


def kill_group(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the group, then SIGKILL it; reap the leader. Never touches anything outside the group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    poll_until(lambda: proc.poll() is not None and not group_alive(proc.pid), grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_WAIT_S)
    poll_until(lambda: not group_alive(proc.pid), KILL_WAIT_S)


@contextlib.contextmanager
def head_process(env: dict[str, str], port: int, temp_dir: str,
                 extra_args: tuple[str, ...] = ()) -> Iterator[subprocess.Popen]:
    """`ray start --head --block` (0 CPUs, no dashboard, its own ports and temp dir) in its own session; waits
    for it to be up; kills its whole process group afterwards. Shared by the tests that need a private head."""
    log_path = Path(temp_dir) / "head.log"
    cmd = [ray_executable(), "start", "--head", "--block", "--disable-usage-stats", f"--port={port}",
           "--node-ip-address=127.0.0.1", "--num-cpus=0", "--include-dashboard=false",
           f"--dashboard-port={free_port()}", f"--ray-client-server-port={free_port()}",
           f"--temp-dir={temp_dir}", "--object-store-memory=83886080", *extra_args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    try:
        poll_until(lambda: READY_MARKER in log_path.read_text(errors="replace") or proc.poll() is not None,
                   HEAD_START_TIMEOUT_S)
        text = log_path.read_text(errors="replace")
        if READY_MARKER not in text:
            raise RuntimeError("test head failed to start:\n" + text[-LOG_TAIL_CHARS:])
        yield proc
    finally:
        kill_group(proc)


@contextlib.contextmanager
def ray_head() -> Iterator[str]:
    """A private Ray head (GCS + raylet with 0 CPUs). Yields its GCS address."""
    temp_dir = tempfile.mkdtemp(prefix="rnl-", dir="/tmp")   # short: raylet socket paths are limited to ~107 chars
    port = free_port()
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"   # a SIGTERMed head would otherwise drain for up to 30 s
    # Ray 2.60 turns token auth on for a *head* whose RAY_AUTH_MODE is unset when ~/.ray/auth_token exists (any
    # Ray user on the machine may have created it), but not for `ray start --address` workers, which are then
    # rejected with InvalidAuthToken. Be explicit.
    env["RAY_AUTH_MODE"] = "disabled"
    try:
        with head_process(env, port, temp_dir):
            yield f"127.0.0.1:{port}"
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def gcs_nodes(gcs_address: str) -> list:
    """Node table straight from GCS: GcsNodeInfo protos, with instance_id (= RAY_CLOUD_INSTANCE_ID)."""
    return node_infos(gcs_address, timeout_s=10)


def alive_nodes_by_instance(gcs_address: str) -> dict[str, object]:
    return {n.instance_id: n for n in gcs_nodes(gcs_address) if n.state == 0 and n.instance_id}


def stop_everything(nodes: LocalNodeProcesses) -> None:
    """Stop every node that has a record in `nodes`' state dir, alive or not."""
    ids = [r.id for r in nodes.records.all()]
    if ids:
        nodes.stop(ids, timeout=STOP_TIMEOUT_S)
