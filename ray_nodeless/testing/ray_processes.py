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
import time
from pathlib import Path
from typing import Iterator

import psutil

from ray_nodeless.providers.local.processes import READY_MARKER, LocalNodeProcesses, ray_executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _group_alive(pgid: int) -> bool:
    """Is any live (non-zombie) process still in process group `pgid`?"""
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the group, then SIGKILL it; reap the leader. Never touches anything outside the group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and _group_alive(proc.pid):
        proc.poll()
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    end = time.monotonic() + 10
    while time.monotonic() < end and _group_alive(proc.pid):
        time.sleep(0.2)


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
        deadline = time.monotonic() + 90
        while READY_MARKER not in log_path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("test head failed to start:\n" + log_path.read_text(errors="replace")[-3000:])
            time.sleep(0.2)
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
    from ray._raylet import GcsClient
    return list(GcsClient(address=gcs_address).get_all_node_info(timeout=10).values())


def alive_nodes_by_instance(gcs_address: str) -> dict[str, object]:
    return {n.instance_id: n for n in gcs_nodes(gcs_address) if n.state == 0 and n.instance_id}


def wait_for(pred, timeout: float, what: str):
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.3)


def stop_everything(nodes: LocalNodeProcesses) -> None:
    ids = [r.id for r in nodes._all_records()]
    if ids:
        nodes.stop(ids, timeout=10)
