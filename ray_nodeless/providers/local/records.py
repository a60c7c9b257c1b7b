"""What a state dir persists about its local nodes. Several processes share one state dir (the `ray up` CLI creates
the head record, the head's monitor launches and terminates workers, a restarted monitor rebuilds its view from
disk), so everything lives in files:

    <state_dir>/nodes/<machine_id>.json   one NodeRecord per node (written atomically)
    <state_dir>/logs/<machine_id>.log     stdout+stderr of the node's `ray start --block`
    <state_dir>/labels/<machine_id>.json  the node's labels (passed to `ray start --labels-file`)
    <state_dir>/counter.json              the next slot to try (see slots.py)
    <state_dir>/state.lock                file lock for record and counter updates (held for milliseconds)
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from ray_nodeless.core.files import write_atomic

logger = logging.getLogger(__name__)

# How much of a node's log end is read for an error message: the last lines of a failed `ray start`.
LOG_TAIL_BYTES = 16384
LOG_TAIL_LINES = 30


@dataclass
class NodeRecord:
    """What is persisted about one local node. `pid is None` marks a process-less placeholder (the head machine)."""

    id: str
    node_type: str
    ip: str
    slot: int | None = None
    ports: dict[str, int] = field(default_factory=dict)
    pid: int | None = None            # == pgid: the node is started in a new session
    started_s: float | None = None    # the leader's start, seconds after boot: tells our process from a reused pid
    started_at: float = 0.0           # epoch seconds (the machine's launch time)
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


def log_tail(log_path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
            text = fh.read().decode(errors="replace")
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(text.splitlines()[-lines:])


class RecordStore:
    """The files of one state dir. Writers hold `lock` (a FileLock: excludes other threads and other processes)."""

    def __init__(self, state_dir: Path | str):
        self.state_dir = Path(state_dir)
        self.nodes_dir = self.state_dir / "nodes"
        self.logs_dir = self.state_dir / "logs"
        self.labels_dir = self.state_dir / "labels"
        for d in (self.nodes_dir, self.logs_dir, self.labels_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.counter_path = self.state_dir / "counter.json"
        self.lock = FileLock(self.state_dir / "state.lock")

    def _path(self, machine_id: str) -> Path:
        return self.nodes_dir / f"{machine_id}.json"

    def log_path(self, machine_id: str) -> Path:
        return self.logs_dir / f"{machine_id}.log"

    def write(self, rec: NodeRecord) -> None:
        # Atomic: a concurrent reader sees the old or the new record, never half of one.
        write_atomic(self._path(rec.id), json.dumps(rec.to_json(), sort_keys=True))

    def write_labels(self, machine_id: str, labels: dict[str, str]) -> Path:
        path = self.labels_dir / f"{machine_id}.json"
        write_atomic(path, json.dumps(labels))
        return path

    @staticmethod
    def _read(path: Path) -> NodeRecord | None:
        try:
            return NodeRecord.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:
            logger.warning("ignoring unreadable local node record %s: %s", path, e)
            return None

    def get(self, machine_id: str) -> NodeRecord | None:
        """The stored record (alive or not); cheap: one small file read."""
        return self._read(self._path(machine_id))

    def all(self) -> list[NodeRecord]:
        return [rec for rec in map(self._read, sorted(self.nodes_dir.glob("*.json"))) if rec is not None]

    def remove(self, machine_id: str) -> None:
        for p in (self._path(machine_id), self.labels_dir / f"{machine_id}.json"):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def update_tags(self, machine_id: str, tags: dict[str, str]) -> bool:
        """Merge tags into a record; False if there is no such record."""
        with self.lock:
            rec = self.get(machine_id)
            if rec is None:
                return False
            rec.tags.update(tags)
            self.write(rec)
            return True
