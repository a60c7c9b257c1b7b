"""Real Ray worker nodes as `ray start --block` process groups on this machine.

One `LocalNodeProcesses` manages the nodes of one *state dir* (records.py: what is persisted there; slots.py: each
node's IP and ports; ray_start.py: its command line and environment; starter.py: the pre-warmed starter).

Each node is a process group: `ray start --block` is started with `start_new_session=True`, so its pid is the
group id and every Ray process it spawns (raylet, agents, log monitor, task workers) joins that group. Stopping a
node = SIGTERM to the group (the raylet exits gracefully, Ray 2.60 also drains it), then SIGKILL after a bound.
Killing the group from outside is how a test or demo emulates a spot preemption: `list()` simply stops returning it.

Concurrent `ray start`s on one host race on raylet socket and log names, so starts are serialised machine-wide.
"""
from __future__ import annotations

import builtins
import json

import logging
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from filelock import FileLock

from ray_nodeless.errors import BackendError, CapacityError
from ray_nodeless.providers.local import pids
from ray_nodeless.providers.local.ray_start import (
    MARKER_ENV, READY_MARKER, check_resources, node_env, ray_start_command,
)
from ray_nodeless.providers.local.records import NodeRecord, RecordStore, log_tail
from ray_nodeless.providers.local.settings import (
    DEFAULT_MIN_FREE_MEMORY_MB, DEFAULT_OBJECT_STORE_MEMORY, DEFAULT_START_TIMEOUT_S, NodeProcessSettings, STATE_ROOT,
)
from ray_nodeless.providers.local.slots import DEFAULT_PORT_BASE, allocate_slot, slot_ip, slot_ports
from ray_nodeless.providers.local.starter import PrewarmedStarter

logger = logging.getLogger(__name__)

# How long `stop` waits for SIGTERMed nodes before SIGKILL: a raylet shuts down in a few seconds (Ray 2.60 drains
# it first), and `ray down` should not hang on a stuck one.
STOP_TIMEOUT_S = 15.0
# After SIGKILL, how long `stop` waits for the kernel to take the processes away before dropping the records.
KILL_WAIT_S = 5.0
# How often a start checks the log for READY_MARKER, and a stop checks whether the groups are gone.
POLL_S = 0.2

# One start lock per machine, shared by every state dir: ports are a machine-wide resource (the bind probe is only
# race-free if nobody else is between probe and bind), and two `ray start`s in one Ray session race on file names.
_START_LOCK = FileLock(Path(tempfile.gettempdir()) / STATE_ROOT / "start.lock")


def _wait(pred, timeout: float) -> bool:
    """Poll `pred` until it holds (True) or `timeout` passes (False)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


class LocalNodeProcesses:
    """Starts, stops and lists `ray start --block` worker nodes of one state dir. Thread-safe and multi-process-safe."""

    def __init__(self, state_dir: Path | str, gcs_address: str, *,
                 object_store_memory: int = DEFAULT_OBJECT_STORE_MEMORY,
                 port_base: int = DEFAULT_PORT_BASE,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 min_free_memory_mb: int = DEFAULT_MIN_FREE_MEMORY_MB,
                 extra_ray_start_args: list[str] | None = None, prewarm: bool = True):
        self.state_dir = Path(state_dir)
        self.gcs_address = gcs_address
        self.object_store_memory = object_store_memory
        self.port_base = port_base
        self.start_timeout_s = start_timeout_s
        self.min_free_memory_mb = min_free_memory_mb
        self.extra_ray_start_args = list(extra_ray_start_args or [])
        self.records = RecordStore(self.state_dir)
        self.starter = PrewarmedStarter(self.state_dir) if prewarm else None
        # Popen objects of the nodes *this* process started: polling them reaps zombies (a zombie leader would
        # otherwise keep its group "alive" to kill(0) until we exit).
        self._children: dict[str, subprocess.Popen] = {}
        self._children_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: NodeProcessSettings, state_dir: Path | str) -> "LocalNodeProcesses":
        return cls(state_dir, settings.local_gcs_address(), object_store_memory=settings.local_object_store_memory,
                   port_base=settings.local_port_base, start_timeout_s=settings.local_start_timeout_s,
                   min_free_memory_mb=settings.local_min_free_memory_mb,
                   extra_ray_start_args=settings.local_ray_start_args, prewarm=settings.local_prewarm)

    # ---------------------------------------------------------------- records

    def get(self, machine_id: str) -> NodeRecord | None:
        """The stored record (alive or not); cheap: one small file read."""
        return self.records.get(machine_id)

    def _all_records(self) -> list[NodeRecord]:
        """Every stored record, alive or not (for cleanup: `list()` drops the dead)."""
        return self.records.all()

    def update_tags(self, machine_id: str, tags: dict[str, str]) -> bool:
        """Merge tags into a record; False if there is no such record."""
        return self.records.update_tags(machine_id, tags)

    def add_placeholder(self, machine_id: str, node_type: str, ip: str, tags: dict[str, str],
                        resources: dict[str, float] | None = None, request_token: str = "") -> NodeRecord:
        """A record with no process (the head machine: Ray is started on it through the command runner)."""
        rec = NodeRecord(id=machine_id, node_type=node_type, ip=ip, started_at=time.time(), ready=True,
                         resources=dict(resources or {}), tags=dict(tags), request_token=request_token)
        with self.records.lock:
            self.records.write(rec)
        return rec

    # ---------------------------------------------------------------- liveness

    def _marker(self, machine_id: str) -> str:
        """The MARKER_ENV value of this node's processes."""
        return f"{machine_id}@{self.state_dir}"

    def _reap(self, machine_id: str) -> None:
        with self._children_lock:
            p = self._children.get(machine_id)
            if p is not None and p.poll() is not None:
                del self._children[machine_id]

    def alive(self, rec: NodeRecord) -> bool:
        """True while the node's `ray start --block` leader runs. Zombies and reused pids count as dead."""
        if rec.pid is None:
            return True
        self._reap(rec.id)
        info = pids.proc_info(rec.pid)
        if info is None:
            return False
        # Same pid but a different start time: the pid was recycled for an unrelated process.
        if rec.started_s is not None and not pids.same_start(info.started_s, rec.started_s):
            return False
        return info.pgid == rec.pid

    def _group_members(self, rec: NodeRecord, *, leader_ok: bool) -> list[int]:
        """Live (non-zombie) pids of the node's process group.

        When the leader is gone, its pgid could only have been reused by a *new* process whose pid equals it (a
        group id is always created by its leader). So: members must have started no earlier than our leader, and if
        an unrelated process now holds the leader's pid, they must also carry this node's marker variable. (The
        marker alone is not enough: Ray's agents and workers set their process title, which clobbers the
        environment the kernel shows.)"""
        if rec.pid is None:
            return []
        members = [info for info in pids.live_processes() if info.pgid == rec.pid]
        if leader_ok:
            return [info.pid for info in members]
        if rec.started_s is not None:
            members = [info for info in members
                       if info.started_s > rec.started_s - pids.SAME_START_TOLERANCE_S]
        holder = pids.start_of(rec.pid)
        if holder is not None and not pids.same_start(holder, rec.started_s):   # an impostor holds the pid
            marker = self._marker(rec.id)
            members = [info for info in members if pids.has_env(info.pid, MARKER_ENV, marker)]
        return [info.pid for info in members]

    def rss_bytes(self, rec: NodeRecord) -> int:
        """Resident memory of all processes of the node (for reports and demos)."""
        return sum(pids.rss_bytes(pid) for pid in self._group_members(rec, leader_ok=self.alive(rec)))

    @staticmethod
    def _log_has_ready(rec: NodeRecord) -> bool:
        try:
            with open(rec.log_path, "rb") as fh:
                return READY_MARKER.encode() in fh.read()
        except OSError:
            return False

    # ---------------------------------------------------------------- listing

    def list(self) -> list[NodeRecord]:
        """Records of live nodes. Dead ones (killed from outside: a "preemption") are dropped silently, after any
        straggler of their group is killed."""
        live: list[NodeRecord] = []
        for rec in self.records.all():
            if self.alive(rec):
                if not rec.ready and self._log_has_ready(rec):
                    # The starter died between "Ray runtime started" and writing ready=True: fix the record.
                    rec.ready = True
                    with self.records.lock:
                        if self.records.get(rec.id) is not None:
                            self.records.write(rec)
                live.append(rec)
                continue
            logger.info("local node %s (pid %s, %s) is gone; dropping its record", rec.id, rec.pid, rec.ip)
            for pid in self._group_members(rec, leader_ok=False):
                pids.signal_pid(pid, signal.SIGKILL)
            with self.records.lock:
                current = self.records.get(rec.id)
                # Only drop what we judged: a concurrent start may have rewritten the record meanwhile.
                if current is not None and current.pid == rec.pid and current.started_s == rec.started_s:
                    self.records.remove(rec.id)
        return live

    # ---------------------------------------------------------------- start

    def _allocate_slot(self) -> int:
        """Next free slot (see slots.py), skipping the slots of live records. Caller holds the start lock."""
        with self.records.lock:
            used = {r.slot for r in self.records.all() if r.slot is not None and self.alive(r)}
            return allocate_slot(self.records.counter_path, used, self.port_base)

    def start(self, machine_id: str, node_type: str, resources: dict[str, float], labels: dict[str, str],
              extra_env: dict[str, str] | None = None, tags: dict[str, str] | None = None,
              request_token: str = "", on_record: Callable[[NodeRecord], None] | None = None) -> NodeRecord:
        """Start one node and wait (bounded) until Ray reports it started. Raises BackendError (with the log tail)
        on failure, after killing what was started; CapacityError if the host has no room for another node.
        `on_record`: called with the node's record once it is persisted (listed, pending), before the wait."""
        check_resources(machine_id, resources)
        if self.min_free_memory_mb > 0:
            avail = pids.mem_available_bytes()
            if avail < self.min_free_memory_mb * 1024 * 1024:
                raise CapacityError(
                    f"host has {avail // 2**20} MB available, below local min_free_memory_mb="
                    f"{self.min_free_memory_mb}; not starting {machine_id}", category="InsufficientHostMemory")
        with _START_LOCK:
            return self._start_locked(machine_id, node_type, resources, labels, extra_env or {}, tags or {},
                                      request_token, on_record)

    def _start_locked(self, machine_id: str, node_type: str, resources: dict[str, float], labels: dict[str, str],
                      extra_env: dict[str, str], tags: dict[str, str], request_token: str,
                      on_record: Callable[[NodeRecord], None] | None) -> NodeRecord:
        if self.records.get(machine_id) is not None:
            raise BackendError(f"local node {machine_id} already has a record in {self.state_dir}")
        slot = self._allocate_slot()
        rec = NodeRecord(
            id=machine_id, node_type=node_type, ip=slot_ip(slot), slot=slot, ports=slot_ports(self.port_base, slot),
            started_at=time.time(), resources={k: float(v) for k, v in resources.items()},
            labels=dict(labels), tags=dict(tags), log_path=str(self.records.log_path(machine_id)),
            request_token=request_token,
        )
        # Ray refuses `ray.io/` keys from --labels (reserved for its default labels); the autoscaler's way to set
        # them is RAY_OVERRIDE_LABELS, as for a real machine (registrations/vm_boot.py).
        ray_labels = {k: v for k, v in labels.items() if k.startswith("ray.io/")}
        user_labels = {k: v for k, v in labels.items() if k not in ray_labels}
        labels_file = self.records.write_labels(machine_id, user_labels) if user_labels else None
        env = node_env(machine_id, node_type, self._marker(machine_id), extra_env)
        if ray_labels:
            env["RAY_OVERRIDE_LABELS"] = json.dumps(ray_labels, sort_keys=True)
        cmd = ray_start_command(gcs_address=self.gcs_address, ip=rec.ip, ports=rec.ports, resources=rec.resources,
                                object_store_memory=self.object_store_memory, labels_file=labels_file,
                                extra_args=self.extra_ray_start_args)
        logger.info("starting local node %s (%s) at %s: %s", machine_id, node_type, rec.ip, " ".join(cmd))
        proc = self.starter.start(cmd, env, rec.log_path) if self.starter is not None else None
        if proc is None:
            proc = self._start_cold(machine_id, cmd, env, rec.log_path)
        if self.starter is not None:
            self.starter.spawn()   # warm for the next launch: this process is the one that launches
        with self._children_lock:
            self._children[machine_id] = proc
        rec.pid = proc.pid
        rec.started_s = pids.start_of(proc.pid)
        # Persist before waiting: if this process dies mid-start, the node is still found (and can be stopped).
        with self.records.lock:
            self.records.write(rec)
        if on_record is not None:
            on_record(rec)

        _wait(lambda: self._log_has_ready(rec) or proc.poll() is not None, self.start_timeout_s)
        if not self._log_has_ready(rec):
            rc = proc.poll()
            reason = (f"`ray start` exited with code {rc}" if rc is not None
                      else f"no '{READY_MARKER}' within {self.start_timeout_s:.0f} s")
            self._kill_group_now(rec, proc)
            with self.records.lock:
                self.records.remove(machine_id)
            raise BackendError(f"local node {machine_id} failed to start ({reason}); log {rec.log_path}:\n"
                               + log_tail(rec.log_path))
        rec.ready = True
        with self.records.lock:
            self.records.write(rec)
        logger.info("local node %s ready at %s (pid %d) after %.1f s", machine_id, rec.ip, rec.pid,
                    time.time() - rec.started_at)
        return rec

    # builtins.list: `list` in this class's body is its method
    def _start_cold(self, machine_id: str, cmd: builtins.list[str], env: dict[str, str],
                    log_path: str) -> subprocess.Popen:
        try:
            with open(log_path, "ab") as log:
                return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=env, cwd=str(self.state_dir), start_new_session=True, close_fds=True)
        except OSError as e:
            raise BackendError(f"cannot run `ray start` for {machine_id}: {e}") from e

    def _kill_group_now(self, rec: NodeRecord, proc: subprocess.Popen) -> None:
        if rec.pid is not None:
            pids.signal_group(rec.pid, signal.SIGKILL)
        try:
            proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        self._reap(rec.id)

    def close(self) -> None:
        """Let an idle pre-warmed starter exit. Running nodes are not touched."""
        if self.starter is not None:
            self.starter.close()

    # ---------------------------------------------------------------- stop

    def stop(self, machine_ids: builtins.list[str], timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop these nodes: SIGTERM every group first (they shut down in parallel), wait for all (bounded), SIGKILL
        leftovers, drop the records. Unknown ids are ignored. Placeholders just lose their record."""
        recs = [r for r in (self.records.get(i) for i in dict.fromkeys(machine_ids)) if r is not None]
        live: list[tuple[NodeRecord, bool]] = []
        for rec in recs:
            if rec.pid is None:
                continue
            leader_ok = self.alive(rec)
            if leader_ok:
                logger.info("stopping local node %s (pid %d, %s)", rec.id, rec.pid, rec.ip)
                pids.signal_group(rec.pid, signal.SIGTERM)
            live.append((rec, leader_ok))

        pending = live

        def all_gone() -> bool:
            # Narrowing: a group once seen empty is not looked at again (its pgid may be reused meanwhile).
            nonlocal pending
            for r, _ in pending:
                self._reap(r.id)
            pending = [(r, ok) for r, ok in pending if self._group_members(r, leader_ok=ok)]
            return not pending

        if not _wait(all_gone, timeout):
            for rec, ok in pending:
                members = self._group_members(rec, leader_ok=ok)
                logger.warning("local node %s did not stop within %.0f s; SIGKILL to %d processes", rec.id, timeout,
                               len(members))
                for pid in members:
                    pids.signal_pid(pid, signal.SIGKILL)
            _wait(all_gone, KILL_WAIT_S)
        with self.records.lock:
            for rec in recs:
                self.records.remove(rec.id)
