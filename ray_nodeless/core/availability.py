"""Capacity-error memory: offerings that just failed for capacity (or whose spot machine was reclaimed) are skipped,
with exponential backoff per offering and a bounded number of probes when a backoff ends.

Why not a fixed TTL (what this was, and Karpenter's 3-minute cache): in a drought every demand retries the same
offering the moment its entry expires, and each retry is a wasted launch call (Karpenter's backoff RFC measured
76-93 % of launch attempts dying on capacity errors in two production clusters). Here, per offering
(instance type, zone, capacity type):

- the n-th capacity error in a row skips it for `ttl_s * 2**(n-1)` seconds, at most `cap_s`
  (`provider.unavailable_ttl_s`, `provider.unavailable_backoff_cap_s`: 180 s, 360 s, 600 s, 600 s, ...);
- when the backoff ends the offering is *probing*: at most `probes` launch calls (`provider.unavailable_probes`)
  may try it at once (`claim`); the others still skip it until a probe answers. A launch that lands forgets the
  offering (`succeeded`); a capacity error doubles the backoff (`mark`); an attempt that ended otherwise (an auth
  error, a throttle) gives its probe back (`release`);
- an offering quiet for `cap_s` after its backoff ended is forgotten: the next error starts at `ttl_s` again.

`cap_s == ttl_s` with `probes == 0` (no probe limit) is the fixed TTL of before. `ttl_s <= 0` turns the memory off.
The clock is injectable so tests (and simulate's replay, which runs this class on its own clock) move time
without sleeping.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from ray_nodeless.core import ttls

logger = logging.getLogger(__name__)

Key = tuple[str, str, str]          # (instance type, zone, capacity type)


class Keyed(Protocol):
    """What the memory needs of an offering: its key (catalog `Offering`s and simulate's offers both have one)."""

    @property
    def key(self) -> Key: ...


@dataclass
class _Entry:
    reason: str
    failures: int            # capacity errors in a row
    until: float             # skipped until then (clock seconds)
    probes: int = 0          # launch calls trying it since its backoff ended, not yet answered


@dataclass(frozen=True)
class OfferingState:
    """One remembered offering, as `status` and the metrics show it."""

    reason: str
    failures: int
    remaining_s: float       # backoff left; 0 while probing
    probing: bool            # the backoff ended: probes may try it


class UnavailableOfferings:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic, *, cap_s: float | None = None,
                 probes: int = 1):
        self.ttl_s = ttl_s
        self.cap_s = max(ttl_s, cap_s if cap_s is not None else ttl_s)
        self.probes = probes                 # 0: no limit
        # Read at each call, so a test may swap it after construction (`provider.unavailable.clock = FakeClock()`).
        self.clock = clock
        self._entries: dict[Key, _Entry] = {}
        self._lock = threading.Lock()        # Ray's threads, the loop and the reversion lane all launch
        self.wasted_probes = 0               # probes that met another capacity error (the replay's figure)

    # ----- what the launcher tells it --------------------------------------------------------------------------

    def mark(self, offering: Keyed, reason: str) -> None:
        """A capacity error (or a reclaimed spot machine) on this offering: skip it for the next, doubled, backoff."""
        if self.ttl_s <= 0:
            return
        now = self.clock()
        with self._lock:
            e = self._live(offering.key, now)
            if e is not None and now < e.until:
                # Still backing off (several calls failed on it at once, or a region-wide error marks it again):
                # one more error of the same drought, not a reason to double again.
                e.reason = reason
                block = e.until - now
            else:
                failures = 1 if e is None else e.failures + 1
                if e is not None and e.probes:
                    self.wasted_probes += 1
                block = self._backoff_s(failures)
                self._entries[offering.key] = _Entry(reason, failures, now + block)
                self._bound()
                e = self._entries[offering.key]
        logger.info("offering %s %s %s skipped for %.0f s (%s; capacity error %d in a row)", *offering.key, block,
                    reason, e.failures)

    def next_skip(self, offering: Keyed) -> tuple[float, int]:
        """What a capacity error on the offering now would do: (seconds it is skipped, errors in a row); (0, 0)
        with the memory off. The event log says it as the error is recorded, before the launcher marks it."""
        if self.ttl_s <= 0:
            return 0.0, 0
        now = self.clock()
        with self._lock:
            e = self._live(offering.key, now)
            if e is not None and now < e.until:
                return e.until - now, e.failures
            failures = 1 if e is None else e.failures + 1
            return self._backoff_s(failures), failures

    def claim(self, offering: Keyed) -> bool:
        """Whether a launch call may try this offering now; a probing offering counts the call as one of its
        probes (`succeeded`, `mark` or `release` answers it)."""
        now = self.clock()
        with self._lock:
            e = self._live(offering.key, now)
            if e is None:
                return True
            if self._skipped(e, now):
                return False
            e.probes += 1
            return True

    def succeeded(self, offering: Keyed) -> None:
        """A launch on the offering landed: it has capacity; its failures are forgotten."""
        with self._lock:
            self._entries.pop(offering.key, None)

    def release(self, offering: Keyed) -> None:
        """A claimed attempt ended without an answer about capacity: its probe goes back."""
        with self._lock:
            e = self._entries.get(offering.key)
            if e is not None and e.probes:
                e.probes -= 1

    # ----- what the planners and the status read -------------------------------------------------------------

    def blocked(self, offering: Keyed) -> bool:
        return self.reason(offering) is not None

    def reason(self, offering: Keyed) -> str | None:
        """Why the offering is skipped right now (backing off, or probing with every probe out); None: it may be
        tried."""
        now = self.clock()
        with self._lock:
            e = self._live(offering.key, now)
            return e.reason if e is not None and self._skipped(e, now) else None

    def snapshot(self) -> dict[Key, str]:
        """The offerings skipped right now and why, sorted."""
        now = self.clock()
        with self._lock:
            keys = sorted(self._entries)
            return {k: e.reason for k in keys if (e := self._live(k, now)) is not None and self._skipped(e, now)}

    def states(self) -> dict[Key, OfferingState]:
        """Every remembered offering (backing off or probing), sorted: what `status` shows."""
        now = self.clock()
        with self._lock:
            keys = sorted(self._entries)
            return {k: OfferingState(e.reason, e.failures, max(0.0, e.until - now), now >= e.until)
                    for k in keys if (e := self._live(k, now)) is not None}

    # ----- inside ------------------------------------------------------------------------------------------------

    def _skipped(self, e: _Entry, now: float) -> bool:
        """Backing off, or probing with every probe out."""
        return now < e.until or bool(self.probes and e.probes >= self.probes)

    def _backoff_s(self, failures: int) -> float:
        """The skip of the `failures`-th capacity error in a row."""
        return min(self.ttl_s * 2.0 ** (failures - 1), self.cap_s)

    def _live(self, key: Key, now: float) -> _Entry | None:
        """The entry of `key`, forgotten first when it has been quiet for cap_s since its backoff ended."""
        e = self._entries.get(key)
        if e is not None and not e.probes and now >= e.until + self.cap_s:
            del self._entries[key]
            return None
        return e

    def _bound(self) -> None:
        """At most UNAVAILABLE_MAX_ENTRIES offerings: the ones whose backoff ends soonest go first."""
        over = len(self._entries) - ttls.UNAVAILABLE_MAX_ENTRIES
        if over > 0:
            for key in sorted(self._entries, key=lambda k: self._entries[k].until)[:over]:
                del self._entries[key]
