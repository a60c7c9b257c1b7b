"""Real Ray worker nodes as `ray start --block` process groups on this machine.

One `LocalNodeProcesses` manages the nodes of one *state dir*. Everything it knows is persisted there, so several
processes can share it (the `ray up` CLI creates the head record, the head's monitor launches and terminates workers,
a restarted monitor rebuilds its view from disk):

    <state_dir>/nodes/<machine_id>.json   one NodeRecord per node (written atomically)
    <state_dir>/logs/<machine_id>.log     stdout+stderr of the node's `ray start --block`
    <state_dir>/labels/<machine_id>.json  the node's labels (passed with --labels-file: no quoting of a k=v,k=v list)
    <state_dir>/counter.json              the slot counter (IP + port block allocation)
    <state_dir>/state.lock                flock for record/counter updates (held for milliseconds)

Each node is a process group: `ray start --block` is started with `start_new_session=True`, so its pid is the
group id and every Ray process it spawns (raylet, agents, log monitor, task workers) joins that group. Stopping a
node = SIGTERM to the group (the raylet exits gracefully, Ray 2.60 also drains it), then SIGKILL after a bound.
Killing the group from outside is how a test or demo emulates a spot preemption: `list()` simply stops returning it.

Pitfalls handled here (see shared notes §4): concurrent `ray start`s on one host race on raylet socket/log names and
on random ports, so starts are serialised machine-wide and each node gets a unique loopback IP (127.0.0.N, so v1's
IP-keyed LoadMetrics works) and an explicit, unique block of ports.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ray_nodeless.errors import BackendError, CapacityError

logger = logging.getLogger(__name__)

READY_MARKER = "Ray runtime started"
# Set in every node's environment (and so inherited by every Ray process of the node): lets a process found in
# /proc be attributed to one node of one state dir, even after its group leader is gone and its pgid is reused.
MARKER_ENV = "NODELESS_LOCAL_NODE"

FIRST_HOST = 2          # 127.0.0.1 is the host itself (Ray resolves it to the routable IP anyway)
LAST_HOST = 254
NUM_SLOTS = LAST_HOST - FIRST_HOST + 1
# Port block of a slot: base + offset. Ray's own defaults are 6379/8265/10001 and workers 10002-19999, and Linux's
# ephemeral range starts at 32768, so blocks from 20000 with a stride of 50 (253 slots -> up to 32650) collide
# with neither.
DEFAULT_PORT_BASE = 20000
PORT_STRIDE = 50
PORT_OFFSETS = {
    "node_manager": 0,
    "object_manager": 1,
    "dashboard_agent_listen": 2,
    "dashboard_agent_grpc": 3,
    "runtime_env_agent": 4,
    "metrics_export": 5,
    "min_worker": 10,
    "max_worker": PORT_STRIDE - 1,   # 40 task-worker ports per node: plenty for an emulated VM
}
# Ray refuses an object store below 75 MiB; 80 MiB keeps each node's /dev/shm footprint small.
DEFAULT_OBJECT_STORE_MEMORY = 80 * 1024 * 1024
DEFAULT_START_TIMEOUT_S = 90.0
DEFAULT_STOP_TIMEOUT_S = 15.0
# Below this much MemAvailable a new node (~400 MB idle) would push the host towards the OOM killer: refuse it as a
# capacity shortage instead, exactly like a cloud without capacity.
DEFAULT_MIN_FREE_MEMORY_MB = 800

# Variables a parent process may carry that would change what the child `ray start` does. The head's monitor, for
# instance, inherits RAY_OVERRIDE_RESOURCES and RAY_CLOUD_INSTANCE_ID of the *head* from `ray up`.
_SCRUBBED_ENV = (
    "RAY_ADDRESS", "RAY_OVERRIDE_RESOURCES", "RAY_OVERRIDE_LABELS", "RAY_CLOUD_INSTANCE_ID", "RAY_NODE_TYPE_NAME",
    "RAY_CLOUD_INSTANCE_TYPE_NAME", "RAY_OVERRIDE_NODE_ID_FOR_TESTING", "RAY_NODE_IP_ADDRESS",
)

# A pre-warmed starter: a Python process that has already imported Ray's CLI (about 0.5 s of a `ray start` on
# this class of machine) and waits for one start request on stdin. The request carries the node's full
# environment, log file, working directory and argv; the starter then *becomes* that `ray start --block`, so the
# node keeps its own session and process group exactly as with a plain Popen. If the owner goes away the starter
# reads EOF and exits.
_STARTER_CODE = r"""
import json, os, sys
import ray.scripts.scripts as scripts
line = sys.stdin.readline()
if not line.strip():
    sys.exit(0)
req = json.loads(line)
fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.dup2(fd, 1)
os.dup2(fd, 2)
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.environ.clear()
os.environ.update(req["env"])
os.chdir(req["cwd"])
sys.argv = req["argv"]
sys.exit(scripts.main())
"""

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class NodeRecord:
    """What is persisted about one local node. `pid is None` marks a process-less placeholder (the head machine)."""

    id: str
    node_type: str
    ip: str
    slot: int | None = None
    ports: dict[str, int] = field(default_factory=dict)
    pid: int | None = None            # == pgid: the node is started in a new session
    start_ticks: int | None = None    # /proc/<pid>/stat starttime: tells our process from a reused pid
    started_at: float = 0.0
    ready: bool = False               # "Ray runtime started" seen
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    log_path: str = ""
    request_token: str = ""           # the launch call that made it (idempotent retries)

    @property
    def pgid(self) -> int | None:
        return self.pid

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "NodeRecord":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class _ProcStat:
    pid: int
    state: str
    pgrp: int
    session: int
    start_ticks: int


def _read_stat(pid: int) -> _ProcStat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the *last* ')'.
    rest = raw[raw.rfind(")") + 2:].split()
    try:
        # rest[0] = field 3 (state), rest[2] = field 5 (pgrp), rest[19] = field 22 (starttime)
        return _ProcStat(pid=pid, state=rest[0], pgrp=int(rest[2]), session=int(rest[3]), start_ticks=int(rest[19]))
    except (IndexError, ValueError):
        return None


def _iter_proc_stats() -> Iterator[_ProcStat]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = _read_stat(int(entry.name))
            if st is not None:
                yield st


def _has_marker(pid: int, marker: str) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER_ENV}={marker}".encode() in env.split(b"\0")


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def mem_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _port_free(port: int) -> bool:
    # Raylets and agents bind *:port, so probe the wildcard address: that also fails if anything holds the port on
    # any single address. SO_REUSEADDR so that a socket in TIME_WAIT does not count as taken (Ray reuses it too).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def ray_executable() -> str:
    """The `ray` script of the running interpreter's environment (the monitor and CLI run in the venv)."""
    candidate = Path(sys.executable).parent / "ray"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("ray")
    if not found:
        raise BackendError("cannot find the `ray` executable next to the interpreter or on PATH")
    return found


def _fmt_number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


class _FileLock:
    """An exclusive flock on `path`, plus a thread lock (flock alone does not order threads sharing one fd)."""

    def __init__(self, path: Path):
        self.path = path
        self._thread_lock = threading.RLock()
        self._depth = 0   # re-entry by the owning thread must not flock a second fd (that would self-deadlock)

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._thread_lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a+") as fh:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
                self._depth = 1
                try:
                    yield
                finally:
                    self._depth = 0
                    fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# One start lock per machine, shared by every state dir: ports are a machine-wide resource (the bind probe is only
# race-free if nobody else is between probe and bind), and two `ray start`s in one Ray session race on file names.
_START_LOCK = _FileLock(Path(tempfile.gettempdir()) / "ray_nodeless" / "start.lock")


class LocalNodeProcesses:
    """Starts, stops and lists `ray start --block` worker nodes of one state dir. Thread-safe and multi-process-safe."""

    def __init__(self, state_dir: Path | str, gcs_address: str, *,
                 object_store_memory: int = DEFAULT_OBJECT_STORE_MEMORY,
                 port_base: int = DEFAULT_PORT_BASE,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 min_free_memory_mb: int = DEFAULT_MIN_FREE_MEMORY_MB,
                 extra_ray_start_args: list[str] | None = None, prewarm: bool = True):
        self.state_dir = Path(state_dir)
        self.prewarm = prewarm
        self._starter: subprocess.Popen | None = None
        self._starter_lock = threading.Lock()
        self.gcs_address = gcs_address
        self.object_store_memory = int(object_store_memory)
        self.port_base = int(port_base)
        self.start_timeout_s = float(start_timeout_s)
        self.min_free_memory_mb = int(min_free_memory_mb)
        self.extra_ray_start_args = list(extra_ray_start_args or [])
        self._nodes_dir = self.state_dir / "nodes"
        self._logs_dir = self.state_dir / "logs"
        self._labels_dir = self.state_dir / "labels"
        for d in (self._nodes_dir, self._logs_dir, self._labels_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._state_lock = _FileLock(self.state_dir / "state.lock")
        # Popen objects of the nodes *this* process started: polling them reaps zombies (a zombie leader would
        # otherwise keep its group "alive" to kill(0) until we exit).
        self._children: dict[str, subprocess.Popen] = {}
        self._children_lock = threading.Lock()

    # ---------------------------------------------------------------- records

    def _record_path(self, machine_id: str) -> Path:
        return self._nodes_dir / f"{machine_id}.json"

    def _write_record(self, rec: NodeRecord) -> None:
        path = self._record_path(rec.id)
        tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(rec.to_json(), sort_keys=True))
        os.replace(tmp, path)   # atomic: a concurrent reader sees the old or the new record, never half of one

    def _read_record(self, path: Path) -> NodeRecord | None:
        try:
            return NodeRecord.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:
            logger.warning("ignoring unreadable local node record %s: %s", path, e)
            return None

    def _all_records(self) -> list[NodeRecord]:
        out = []
        for path in sorted(self._nodes_dir.glob("*.json")):
            rec = self._read_record(path)
            if rec is not None:
                out.append(rec)
        return out

    def get(self, machine_id: str) -> NodeRecord | None:
        """The stored record (alive or not); cheap: one small file read."""
        return self._read_record(self._record_path(machine_id))

    def _remove_record(self, machine_id: str) -> None:
        for p in (self._record_path(machine_id), self._labels_dir / f"{machine_id}.json"):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def update_tags(self, machine_id: str, tags: dict[str, str]) -> bool:
        """Merge tags into a record; False if there is no such record."""
        with self._state_lock():
            rec = self.get(machine_id)
            if rec is None:
                return False
            rec.tags.update(tags)
            self._write_record(rec)
            return True

    def add_placeholder(self, machine_id: str, node_type: str, ip: str, tags: dict[str, str],
                        resources: dict[str, float] | None = None, request_token: str = "") -> NodeRecord:
        """A record with no process (the head machine: Ray is started on it through the command runner)."""
        rec = NodeRecord(id=machine_id, node_type=node_type, ip=ip, started_at=time.time(), ready=True,
                         resources=dict(resources or {}), tags=dict(tags), request_token=request_token)
        with self._state_lock():
            self._write_record(rec)
        return rec

    # ---------------------------------------------------------------- liveness

    def _marker(self, machine_id: str) -> str:
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
        st = _read_stat(rec.pid)
        if st is None or st.state in ("Z", "X", "x"):
            return False
        # Same pid but a different start time: the pid was recycled for an unrelated process.
        if rec.start_ticks is not None and st.start_ticks != rec.start_ticks:
            return False
        return st.pgrp == rec.pid

    def _group_members(self, rec: NodeRecord, *, leader_ok: bool) -> list[int]:
        """Live (non-zombie) pids of the node's process group.

        When the leader is gone, its pgid could only have been reused by a *new* process whose pid equals it (a
        group id is always created by its leader). So: members must have started no earlier than our leader, and if
        an unrelated process now holds the leader's pid, they must also carry this node's marker variable. (The
        marker alone is not enough: Ray's agents and workers set their process title, which clobbers
        /proc/<pid>/environ.)"""
        if rec.pid is None:
            return []
        stats = list(_iter_proc_stats())
        members = [st for st in stats if st.pgrp == rec.pid and st.state not in ("Z", "X", "x")]
        if leader_ok:
            return [st.pid for st in members]
        if rec.start_ticks is not None:
            members = [st for st in members if st.start_ticks >= rec.start_ticks]
        impostor = any(st.pid == rec.pid and st.start_ticks != rec.start_ticks for st in stats)
        if impostor:
            marker = self._marker(rec.id)
            members = [st for st in members if _has_marker(st.pid, marker)]
        return [st.pid for st in members]

    def rss_bytes(self, rec: NodeRecord) -> int:
        """Resident memory of all processes of the node (for reports and demos)."""
        return sum(_rss_bytes(pid) for pid in self._group_members(rec, leader_ok=self.alive(rec)))

    def _log_has_ready(self, rec: NodeRecord) -> bool:
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
        for rec in self._all_records():
            if self.alive(rec):
                if not rec.ready and self._log_has_ready(rec):
                    # The starter died between "Ray runtime started" and writing ready=True: fix the record.
                    rec.ready = True
                    with self._state_lock():
                        if self.get(rec.id) is not None:
                            self._write_record(rec)
                live.append(rec)
                continue
            logger.info("local node %s (pid %s, %s) is gone; dropping its record", rec.id, rec.pid, rec.ip)
            self._kill_stragglers(rec)
            with self._state_lock():
                current = self.get(rec.id)
                # Only drop what we judged: a concurrent start may have rewritten the record meanwhile.
                if current is not None and current.pid == rec.pid and current.start_ticks == rec.start_ticks:
                    self._remove_record(rec.id)
        return live

    def _kill_stragglers(self, rec: NodeRecord) -> None:
        for pid in self._group_members(rec, leader_ok=False):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    # ---------------------------------------------------------------- start

    def _allocate_slot(self) -> int:
        """Next free slot from the persisted counter, skipping slots of live records and slots whose ports are
        taken (by another state dir, or anything else). Caller holds the start lock, so the probe is race-free
        against other ray_nodeless starters."""
        with self._state_lock():
            counter_path = self.state_dir / "counter.json"
            try:
                counter = int(json.loads(counter_path.read_text()).get("next", 0))
            except (OSError, ValueError):
                counter = 0
            used = {r.slot for r in self._all_records() if r.slot is not None and self.alive(r)}
            for i in range(NUM_SLOTS):
                slot = (counter + i) % NUM_SLOTS
                if slot in used:
                    continue
                base = self.port_base + slot * PORT_STRIDE
                if not all(_port_free(base + off) for off in range(PORT_STRIDE)):
                    logger.debug("slot %d: ports %d-%d partly in use; skipping", slot, base, base + PORT_STRIDE - 1)
                    continue
                counter_path.write_text(json.dumps({"next": slot + 1}))
                return slot
        raise CapacityError(f"no free local node slot in {self.state_dir} ({NUM_SLOTS} IPs x port blocks in use)",
                            category="LocalSlotsExhausted")

    def _command(self, rec: NodeRecord, labels_file: Path | None) -> list[str]:
        res = dict(rec.resources)
        cpus = res.pop("CPU", 0)
        gpus = res.pop("GPU", 0)   # explicit 0: never let Ray autodetect the host's GPUs for an emulated VM
        memory = res.pop("memory", None)
        osm = res.pop("object_store_memory", None) or self.object_store_memory
        p = rec.ports
        cmd = [
            ray_executable(), "start", "--block", "--disable-usage-stats",
            f"--address={self.gcs_address}",
            f"--node-ip-address={rec.ip}",
            f"--num-cpus={int(cpus)}",
            f"--num-gpus={int(gpus)}",
            f"--object-store-memory={int(osm)}",
            f"--resources={json.dumps(res, separators=(',', ':'))}",
            f"--node-manager-port={p['node_manager']}",
            f"--object-manager-port={p['object_manager']}",
            f"--dashboard-agent-listen-port={p['dashboard_agent_listen']}",
            f"--dashboard-agent-grpc-port={p['dashboard_agent_grpc']}",
            f"--runtime-env-agent-port={p['runtime_env_agent']}",
            f"--metrics-export-port={p['metrics_export']}",
            f"--min-worker-port={p['min_worker']}",
            f"--max-worker-port={p['max_worker']}",
        ]
        if memory is not None:
            cmd.append(f"--memory={int(memory)}")
        if labels_file is not None:
            cmd.append(f"--labels-file={labels_file}")
        return cmd + self.extra_ray_start_args

    def start(self, machine_id: str, node_type: str, resources: dict[str, float], labels: dict[str, str],
              extra_env: dict[str, str] | None = None, tags: dict[str, str] | None = None,
              request_token: str = "") -> NodeRecord:
        """Start one node and wait (bounded) until Ray reports it started. Raises BackendError (with the log tail)
        on failure, after killing what was started; CapacityError if the host has no room for another node."""
        for k, v in resources.items():
            if k in ("CPU", "GPU") and not float(v).is_integer():
                raise BackendError(f"local node {machine_id}: {k}={v} must be a whole number for `ray start`")
        if self.min_free_memory_mb > 0:
            avail = mem_available_bytes()
            if avail is not None and avail < self.min_free_memory_mb * 1024 * 1024:
                raise CapacityError(
                    f"host has {avail // 2**20} MB available, below local min_free_memory_mb="
                    f"{self.min_free_memory_mb}; not starting {machine_id}", category="InsufficientHostMemory")
        with _START_LOCK():
            return self._start_locked(machine_id, node_type, resources, labels, extra_env or {}, tags or {},
                                      request_token)

    def _start_locked(self, machine_id: str, node_type: str, resources: dict[str, float], labels: dict[str, str],
                      extra_env: dict[str, str], tags: dict[str, str], request_token: str) -> NodeRecord:
        if self.get(machine_id) is not None:
            raise BackendError(f"local node {machine_id} already has a record in {self.state_dir}")
        slot = self._allocate_slot()
        base = self.port_base + slot * PORT_STRIDE
        rec = NodeRecord(
            id=machine_id, node_type=node_type, ip=f"127.0.0.{FIRST_HOST + slot}", slot=slot,
            ports={name: base + off for name, off in PORT_OFFSETS.items()},
            started_at=time.time(), resources={k: float(v) for k, v in resources.items()},
            labels=dict(labels), tags=dict(tags), log_path=str(self._logs_dir / f"{machine_id}.log"),
            request_token=request_token,
        )
        labels_file = None
        if labels:
            # JSON is YAML: --labels-file spares us quoting a "k=v,k=v" list. Ray validates keys and values itself
            # (Kubernetes-style); a bad label fails the start with its message in the log tail.
            labels_file = self._labels_dir / f"{machine_id}.json"
            labels_file.write_text(json.dumps(labels))
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env.update({str(k): str(v) for k, v in extra_env.items()})
        # What autoscaler v2 matches a Ray node to its instance by (and what ThreadedRayInstaller would export).
        env["RAY_CLOUD_INSTANCE_ID"] = machine_id
        env["RAY_NODE_TYPE_NAME"] = node_type
        env[MARKER_ENV] = self._marker(machine_id)
        cmd = self._command(rec, labels_file)
        logger.info("starting local node %s (%s) at %s: %s", machine_id, node_type, rec.ip, " ".join(cmd))
        proc = self._start_warm(cmd, env, rec.log_path) if self.prewarm else None
        if proc is None:
            log = open(rec.log_path, "ab")
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=env, cwd=str(self.state_dir), start_new_session=True, close_fds=True)
            except OSError as e:
                raise BackendError(f"cannot run `ray start` for {machine_id}: {e}") from e
            finally:
                log.close()
        if self.prewarm:
            self._spawn_starter()   # warm for the next launch: this process is the one that launches
        with self._children_lock:
            self._children[machine_id] = proc
        st = _read_stat(proc.pid)
        rec.pid = proc.pid
        rec.start_ticks = st.start_ticks if st else None
        # Persist before waiting: if this process dies mid-start, the node is still found (and can be stopped).
        with self._state_lock():
            self._write_record(rec)

        deadline = time.monotonic() + self.start_timeout_s
        reason = ""
        while True:
            if self._log_has_ready(rec):
                break
            rc = proc.poll()
            if rc is not None:
                reason = f"`ray start` exited with code {rc}"
                break
            if time.monotonic() > deadline:
                reason = f"no '{READY_MARKER}' within {self.start_timeout_s:.0f} s"
                break
            time.sleep(0.2)
        if reason:
            self._kill_group_now(rec, proc)
            with self._state_lock():
                self._remove_record(machine_id)
            raise BackendError(f"local node {machine_id} failed to start ({reason}); log {rec.log_path}:\n"
                               + self.log_tail(rec))
        rec.ready = True
        with self._state_lock():
            self._write_record(rec)
        logger.info("local node %s ready at %s (pid %d) after %.1f s", machine_id, rec.ip, rec.pid,
                    time.time() - rec.started_at)
        return rec

    def _spawn_starter(self) -> None:
        with self._starter_lock:
            if self._starter is not None and self._starter.poll() is None:
                return
            env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
            try:
                self._starter = subprocess.Popen([sys.executable, "-c", _STARTER_CODE], stdin=subprocess.PIPE,
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                                 cwd=str(self.state_dir), start_new_session=True, close_fds=True)
            except OSError as e:   # pre-warming is an optimisation: a cold start still works
                logger.debug("could not pre-warm a local node starter: %s", e)
                self._starter = None

    def _start_warm(self, cmd: list[str], env: dict[str, str], log_path: str) -> subprocess.Popen | None:
        """Hand the start to the pre-warmed starter, if one is alive; None means: start cold."""
        with self._starter_lock:
            starter, self._starter = self._starter, None
        if starter is None or starter.poll() is not None or starter.stdin is None:
            return None
        req = {"env": env, "log": log_path, "cwd": str(self.state_dir), "argv": ["ray"] + cmd[1:]}
        try:
            starter.stdin.write((json.dumps(req) + "\n").encode())
            starter.stdin.close()
        except OSError as e:
            logger.debug("pre-warmed starter unusable (%s); starting cold", e)
            with contextlib.suppress(OSError):
                starter.kill()
            return None
        return starter

    def close(self) -> None:
        """Let an idle pre-warmed starter exit (it reads EOF). Running nodes are not touched."""
        with self._starter_lock:
            starter, self._starter = self._starter, None
        if starter is not None and starter.stdin is not None:
            with contextlib.suppress(OSError):
                starter.stdin.close()

    def _kill_group_now(self, rec: NodeRecord, proc: subprocess.Popen | None = None) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(rec.pid, signal.SIGKILL)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._reap(rec.id)

    @staticmethod
    def log_tail(rec: NodeRecord, lines: int = 30) -> str:
        try:
            with open(rec.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 16384))
                text = fh.read().decode(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    # ---------------------------------------------------------------- stop

    def stop(self, machine_ids: list[str], timeout: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """Stop these nodes: SIGTERM every group first (they shut down in parallel), wait for all (bounded), SIGKILL
        leftovers, drop the records. Unknown ids are ignored. Placeholders just lose their record."""
        recs = [r for r in (self.get(i) for i in dict.fromkeys(machine_ids)) if r is not None]
        live: list[tuple[NodeRecord, bool]] = []
        for rec in recs:
            if rec.pid is None:
                continue
            leader_ok = self.alive(rec)
            if leader_ok:
                logger.info("stopping local node %s (pid %d, %s)", rec.id, rec.pid, rec.ip)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(rec.pid, signal.SIGTERM)
            live.append((rec, leader_ok))
        deadline = time.monotonic() + timeout
        pending = live
        while pending and time.monotonic() < deadline:
            time.sleep(0.2)
            pending = [(r, ok) for r, ok in pending if (self._reap(r.id), self._group_members(r, leader_ok=ok))[1]]
        for rec, ok in pending:
            members = self._group_members(rec, leader_ok=ok)
            logger.warning("local node %s did not stop within %.0f s; SIGKILL to %d processes", rec.id, timeout,
                           len(members))
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if pending:
            end = time.monotonic() + 5
            while time.monotonic() < end and any(
                    (self._reap(r.id), self._group_members(r, leader_ok=ok))[1] for r, ok in pending):
                time.sleep(0.1)
        with self._state_lock():
            for rec in recs:
                self._remove_record(rec.id)


# ---------------------------------------------------------------- scoped `ray stop`

def _ancestors(pid: int) -> set[int]:
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
            pid = int(raw[raw.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _marked_targets(marker: str) -> tuple[set[int], set[int]]:
    """(pids, sessions): live processes started with `NODELESS_LOCAL_NODE=<marker>` in their environment, plus
    every process in their sessions, except this process's ancestry. Sessions count because Ray's agents and task
    workers clobber their /proc environ when they set their process title; LocalCommandRunner gives each command
    its own session (unless run from a terminal, whose session -- ours -- is never included)."""
    mine = _ancestors(os.getpid())
    own_sessions = {st.session for st in (_read_stat(p) for p in mine) if st is not None}
    stats = [st for st in _iter_proc_stats() if st.pid not in mine and st.state not in ("Z", "X", "x")]
    marked = {st.pid for st in stats if _has_marker(st.pid, marker)}
    sessions = {st.session for st in stats if st.pid in marked} - own_sessions - {0, 1}
    return marked | {st.pid for st in stats if st.session in sessions}, sessions


def marked_pids(marker: str) -> list[int]:
    return sorted(_marked_targets(marker)[0])


# Ray's own `ray stop` waits 16 s before SIGKILL; the head's gcs_server and monitor were seen ignoring SIGTERM
# for longer than that, so waiting much longer buys nothing.
SCOPED_STOP_GRACE_S = 10.0


def stop_marked_processes(marker: str, timeout: float = SCOPED_STOP_GRACE_S, force: bool = False) -> int:
    """`ray stop` limited to the processes started with this marker (e.g. a local head started through
    LocalCommandRunner). A plain `ray stop` would kill every Ray process of the user on the machine, including
    other clusters. Returns how many processes were signalled."""
    pids, sessions = _marked_targets(marker)
    mine = _ancestors(os.getpid())

    def remaining() -> set[int]:
        # Track the sessions found at the start: once the marked processes are gone, the unmarked ones remain.
        return {st.pid for st in _iter_proc_stats()
                if st.state not in ("Z", "X", "x") and st.pid not in mine
                and (st.pid in pids or st.session in sessions)}

    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL if force else signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while not force and time.monotonic() < deadline and remaining():
        time.sleep(0.2)
    for pid in remaining():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


if __name__ == "__main__":
    # Used by LocalCommandRunner's `ray` shell function: `python -m ...local_processes stop-marked <marker> [args]`.
    if len(sys.argv) >= 3 and sys.argv[1] == "stop-marked":
        n = stop_marked_processes(sys.argv[2], force=any(a in ("-f", "--force") for a in sys.argv[3:]))
        print(f"Stopped {n} local Ray processes of {sys.argv[2]} (scoped `ray stop`).")
    else:
        sys.exit(f"usage: {sys.argv[0]} stop-marked <marker> [--force]")
