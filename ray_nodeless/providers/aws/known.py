"""What the EC2 backend remembers of its cluster's instances between calls, and small helpers over EC2's
instance dicts. The backend's guarantees are in `backend.py`."""
from __future__ import annotations

import datetime

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ray_nodeless.core import ttls


@dataclass
class Known:
    """What this backend last saw of its cluster's instances: the set terminate/set_tags may touch, and when each
    was launched. An instance launched within `ttls.LAUNCH_GRACE_S` is "young": EC2 may not show it yet (a listing
    without it, InvalidInstanceID.NotFound), and none of that means it is gone."""

    tags: dict[str, dict[str, str]] = field(default_factory=dict)
    born: dict[str, float] = field(default_factory=dict)       # id -> launch time, epoch seconds
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Wall clock (launch times are epoch seconds, EC2's LaunchTime too); a test moves a FakeClock past the grace.
    clock: Callable[[], float] = time.time

    def add(self, instance_id: str, tags: dict[str, str], born: float | None = None) -> None:
        with self.lock:
            self.tags[instance_id] = dict(tags)
            if born:
                self.born[instance_id] = born

    def replace(self, mapping: dict[str, dict[str, str]], born: dict[str, float]) -> None:
        """A new listing's instances; young ones the listing does not show yet are kept."""
        with self.lock:
            kept = {i: t for i, t in self.tags.items() if i not in mapping and self._young(i)}
            self.tags = {**mapping, **kept}
            self.born = {i: b for i, b in {**self.born, **born}.items() if i in self.tags}

    def discard(self, ids: Iterable[str]) -> None:
        with self.lock:
            for i in ids:
                self.tags.pop(i, None)
                self.born.pop(i, None)

    def young(self, instance_id: str) -> bool:
        with self.lock:
            return self._young(instance_id)

    def _young(self, instance_id: str) -> bool:
        born = self.born.get(instance_id)
        return born is not None and self.clock() - born < ttls.LAUNCH_GRACE_S

    def has(self, instance_id: str) -> bool:
        with self.lock:
            return instance_id in self.tags

    def merge_tags(self, instance_id: str, tags: dict[str, str]) -> None:
        with self.lock:
            if instance_id in self.tags:
                self.tags[instance_id].update(tags)


@dataclass
class Sorted:
    """Ids sorted by what EC2 says of them (`AwsBackend._sort_out`)."""

    ours: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    unseen: list[str] = field(default_factory=list)


def tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t.get("Value", "") for t in instance.get("Tags", []) or []}


def launch_time(instance: dict[str, Any]) -> float:
    launched = instance.get("LaunchTime")      # botocore parses it into a datetime
    return launched.timestamp() if isinstance(launched, datetime.datetime) else 0.0


def chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
