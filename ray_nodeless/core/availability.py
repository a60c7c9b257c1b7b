"""Capacity-error memory: offerings that just failed (or whose spot machine was reclaimed) are skipped for a TTL.

Karpenter keeps the same kind of cache (3 minutes); ours defaults to 180 s and is set by
`provider.unavailable_ttl_s`. Keys are (instance type, zone, capacity type). The clock is injectable so tests can
expire entries without sleeping.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ray_nodeless.core.catalog import Offering

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unavailable:
    reason: str          # the cloud's error category, or "interrupted"
    until: float


class UnavailableOfferings:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[tuple[str, str, str], Unavailable] = {}
        self._lock = threading.Lock()

    def mark(self, offering: Offering, reason: str) -> None:
        with self._lock:
            self._entries[offering.key] = Unavailable(reason=reason, until=self._clock() + self.ttl_s)
        logger.info("offering %s %s %s marked unavailable for %.0f s (%s)", *offering.key, self.ttl_s, reason)

    def blocked(self, offering: Offering) -> bool:
        return self.reason(offering) is not None

    def reason(self, offering: Offering) -> str | None:
        now = self._clock()
        with self._lock:
            hit = self._entries.get(offering.key)
            if hit is None:
                return None
            if hit.until <= now:
                del self._entries[offering.key]
                return None
            return hit.reason

    def snapshot(self) -> dict[tuple[str, str, str], Unavailable]:
        now = self._clock()
        with self._lock:
            return {k: v for k, v in sorted(self._entries.items()) if v.until > now}
