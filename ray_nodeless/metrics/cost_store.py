"""`ray_nodeless_cost_dollars_total` across monitor restarts: a small state file next to the head's event log.

The recorder writes {total, at, hourly} (USD so far, the wall time it was true at, the hourly price then) at most
every `SAVE_EVERY_S`, atomically. A new recorder (a restarted monitor, or v1 building a new provider object) starts
from it: at its first listing it adds, for each machine listed then, its price from the save (or from its launch, if
later) to now, since those machines were billed while no monitor counted. A machine that ended while no monitor ran
is not counted for that gap (its end time is unknown): the counter may run short by that, never over.

A state file that cannot be true (not JSON, a field missing, NaN, infinity, a negative amount, a directory in its
place) is logged and set aside (`state_files.set_aside`) and the counter starts from zero; a total that is not finite
is never written.
"""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ray_nodeless.metrics.state_files import amount, directory_ready, file_ready, set_aside

logger = logging.getLogger(__name__)

SAVE_EVERY_S = 10.0


@dataclass(frozen=True)
class SavedCost:
    total: float      # USD accumulated until `at`
    at: float         # wall clock (time.time), seconds
    hourly: float     # USD per hour of the machines listed at `at`


class CostStore:
    def __init__(self, path: Path):
        self.path = path

    def load(self) -> SavedCost | None:
        """The saved state, or None (none yet, or one set aside). Never raises."""
        if not file_ready(self.path):
            return None
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            logger.warning("metrics: cannot read the cost state %s (%s): starting from zero", self.path, e)
            return None
        try:
            d = json.loads(raw.decode("utf-8"))
            if not isinstance(d, dict):
                raise ValueError(f"not a JSON object: {type(d).__name__}")
            # `at` is a wall time (seconds since 1970): positive; the amounts finite and never negative.
            at = amount(d.get("at"), "at")
            if at <= 0:
                raise ValueError(f"at must be a wall time, not {d.get('at')!r}")
            return SavedCost(amount(d.get("total"), "total"), at, amount(d.get("hourly"), "hourly"))
        except ValueError as e:        # a torn, foreign or corrupted file (UnicodeDecodeError is a ValueError)
            set_aside(self.path, f"is not a cost state ({e})")
            return None

    def save(self, saved: SavedCost) -> None:
        if not all(math.isfinite(v) and v >= 0 for v in (saved.total, saved.at, saved.hourly)):
            logger.error("metrics: not saving an impossible cost state %s to %s", saved, self.path)
            return
        if not directory_ready(self.path.parent) or not file_ready(self.path):
            return
        try:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps({"total": saved.total, "at": saved.at, "hourly": saved.hourly}, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as e:       # a full disk must not stop the monitor
            logger.warning("metrics: cannot write %s: %s", self.path, e)
