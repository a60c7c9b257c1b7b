"""Capacity-error memory: offerings that just failed (or whose spot machine was reclaimed) are skipped for a TTL.

Karpenter keeps the same kind of cache (3 minutes, `ttls.UNAVAILABLE_TTL_S`); `provider.unavailable_ttl_s` sets
ours. A thin layer over `cachetools.TTLCache`: keys are (instance type, zone, capacity type), values the reason.
The clock is injectable so tests can expire entries without sleeping.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from cachetools import TTLCache

from ray_nodeless.core import ttls
from ray_nodeless.core.catalog import Offering

logger = logging.getLogger(__name__)


class UnavailableOfferings:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        # Read at each call, so a test may swap it after construction (`provider.unavailable.clock = FakeClock()`).
        self.clock = clock
        # (instance type, zone, capacity) -> why
        self._entries: TTLCache[tuple[str, str, str], str] = TTLCache(
            maxsize=ttls.UNAVAILABLE_MAX_ENTRIES, ttl=max(ttl_s, 1e-9), timer=lambda: self.clock())
        self._lock = threading.Lock()    # cachetools caches are not thread-safe

    def mark(self, offering: Offering, reason: str) -> None:
        if self.ttl_s <= 0:
            return
        with self._lock:
            self._entries[offering.key] = reason
        logger.info("offering %s %s %s marked unavailable for %.0f s (%s)", *offering.key, self.ttl_s, reason)

    def blocked(self, offering: Offering) -> bool:
        return self.reason(offering) is not None

    def reason(self, offering: Offering) -> str | None:
        with self._lock:
            return self._entries.get(offering.key)

    def snapshot(self) -> dict[tuple[str, str, str], str]:
        """The offerings skipped right now and why, sorted."""
        with self._lock:
            self._entries.expire()
            return dict(sorted(self._entries.items()))
