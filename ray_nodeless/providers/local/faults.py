"""Fault injection: launches of the local backend that fail like a cloud without capacity, to exercise the
launcher's fallback.

Faults come from `provider.local_faults` (spent in this process only) and from `<state_dir>/faults.json`, re-read at
every launch so a test can add faults while a cluster runs, and spent machine-wide. Both are lists of FaultSpec
(settings.py): omitted match fields are wildcards; `times` omitted (or null) fails every matching launch,
otherwise that many launches.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from filelock import FileLock
from pydantic import ValidationError

from ray_nodeless.core.files import write_atomic
from ray_nodeless.errors import CapacityError
from ray_nodeless.providers.base import LaunchSpec
from ray_nodeless.providers.local.settings import DEFAULT_FAULT_CODE, FaultSpec

logger = logging.getLogger(__name__)


def _matches(fault: FaultSpec, remaining: int | None, spec: LaunchSpec) -> bool:
    offering = spec.offering
    actual = {"instance_type": offering.instance_type.name, "zone": offering.zone, "capacity": offering.capacity,
              "node_type": spec.node_type}
    if any(getattr(fault, k) is not None and getattr(fault, k) != v for k, v in actual.items()):
        return False
    return remaining is None or remaining > 0


def _error(fault: FaultSpec, spec: LaunchSpec) -> CapacityError:
    code = fault.code or DEFAULT_FAULT_CODE
    o = spec.offering
    msg = fault.message or f"injected fault {code} for {o.instance_type.name}/{o.zone}/{o.capacity}"
    logger.info("local backend: %s", msg)
    return CapacityError(msg, category=code)


@dataclass
class _Configured:
    fault: FaultSpec
    remaining: int | None


class FaultInjector:
    def __init__(self, configured: Sequence[FaultSpec], state_dir: Path):
        self._configured = [_Configured(f, f.times) for f in configured]
        self._lock = threading.Lock()
        self.path = state_dir / "faults.json"
        # The file is shared by every process on this state dir; it is spent under this lock so a `times: 1`
        # fault fires exactly once machine-wide.
        self._file_lock = FileLock(state_dir / "faults.lock")

    def check(self, spec: LaunchSpec) -> None:
        """Raise the CapacityError of the first fault that matches this launch, spending one of its times."""
        with self._lock:
            for c in self._configured:
                if _matches(c.fault, c.remaining, spec):
                    if c.remaining is not None:
                        c.remaining -= 1
                    raise _error(c.fault, spec)
        if self.path.exists():
            with self._file_lock:
                self._check_file(spec)

    def _check_file(self, spec: LaunchSpec) -> None:
        try:
            entries: list[Any] = json.loads(self.path.read_text() or "[]")
        except (OSError, ValueError) as e:
            logger.warning("ignoring unreadable %s: %s", self.path, e)
            return
        if not isinstance(entries, list):
            logger.warning("ignoring %s: not a list of faults", self.path)
            return
        for i, entry in enumerate(entries):
            try:
                fault = FaultSpec.model_validate(entry)
            except ValidationError as e:
                logger.warning("ignoring fault %d of %s: %s", i, self.path, e.errors(include_url=False)[0]["msg"])
                continue
            if _matches(fault, fault.times, spec):
                if fault.times is not None:
                    entry["times"] = fault.times - 1
                    write_atomic(self.path, json.dumps(entries, indent=1))
                raise _error(fault, spec)
