"""`ray_nodeless_cost_dollars_total` across monitor restarts: a small state file next to the head's event log.

The recorder writes {total, at, hourly} (USD so far, the wall time it was true at, the hourly price then) at most
every `SAVE_EVERY_S`, atomically. A new recorder (a restarted monitor, or v1 building a new provider object) starts
from it: at its first listing it adds, for each machine listed then, its price from the save (or from its launch, if
later) to now, since those machines were billed while no monitor counted. A machine that ended while no monitor ran
is not counted for that gap (its end time is unknown): the counter may run short by that, never over.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

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
        try:
            d = json.loads(self.path.read_text())
            return SavedCost(float(d["total"]), float(d["at"]), float(d["hourly"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:     # a torn or foreign file: start from zero
            logger.warning("metrics: ignoring unreadable cost state %s: %s", self.path, e)
            return None

    def save(self, saved: SavedCost) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps({"total": saved.total, "at": saved.at, "hourly": saved.hourly}, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as e:       # a full disk must not stop the monitor
            logger.warning("metrics: cannot write %s: %s", self.path, e)
