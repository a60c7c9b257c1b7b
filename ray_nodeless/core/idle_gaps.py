"""Idle release that learns the workload's gaps: per worker node type, how long its idle gaps have lasted in the
run so far, and so whether an idle machine is kept (the break-even timeout of core/idle.py) or released at once.

Why: the break-even needs no forecast, and pays for it. Whatever the next gap, it keeps an idle machine one launch
latency, so a workload whose gaps are all longer than a launch (a sweep's stages with head-only phases of 7-15
minutes between them) pays a launch latency of idle time for every gap, and a rule that knew the gaps would pay
none. Gaps of one node type repeat within a run (the same stages, the same trials), so the run so far tells:
**a type whose recent gaps were longer than a launch releases its idle machines at once; one whose gaps were
shorter keeps them** (the break-even: keeping costs less than the relaunch it saves).

What a gap is: from the moment a machine that has run work has nothing to run, to the moment work for its node
type comes back: to that machine (it becomes busy again) or, once it is gone, as a launch of the type (the most
recently released machine's gap closes: the conservative reading, the shorter gap). A machine's first idle time,
before it ran anything, is not a gap (it was launched for work on its way). Gaps shorter than `min_gap_s` are not
gaps either: the next task came at once (a Tune trial after the one before), and "at once" is also how soon a
machine predicted to stay idle is released, so the release never cuts such a hand-over. A gap still open after
a launch latency counts as a long one (it is known to be longer than a launch, whatever it turns into).

The timeout for a type is the one that would have cost least over its last `window` gaps, open long ones included
(`timeout_s`: the learned ski-rental rule): gaps longer than a launch -> release at once; gaps shorter -> keep
through them; no gap seen yet -> the break-even. Pure: times are the caller's seconds (a replay's
clock, or the monitor's), no I/O. One object per provider, fed from one thread (the monitor's idle lane, or the
replay's loop); `timeout_s` is a read.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

DEFAULT_WINDOW = 5
DEFAULT_MIN_GAP_S = 5.0


@dataclass
class _TypeGaps:
    closed: deque[float]                                       # the last gaps that ended, oldest first
    idle: dict[str, float] = field(default_factory=dict)       # machine still up -> idle since
    released: list[float] = field(default_factory=list)        # idle-since of machines gone while idle


class GapLearner:
    def __init__(self, launch_s: float, window: int = DEFAULT_WINDOW, min_gap_s: float = DEFAULT_MIN_GAP_S):
        if window < 1 or launch_s < 0 or min_gap_s < 0:
            raise ValueError(f"window must be >= 1, launch_s and min_gap_s >= 0 (got {window}, {launch_s}, "
                             f"{min_gap_s})")
        self.launch_s = float(launch_s)
        self.window = int(window)
        self.min_gap_s = float(min_gap_s)
        self._types: dict[str, _TypeGaps] = {}

    def _of(self, node_type: str) -> _TypeGaps:
        t = self._types.get(node_type)
        if t is None:
            t = self._types[node_type] = _TypeGaps(closed=deque(maxlen=self.window))
        return t

    def _record(self, t: _TypeGaps, gap_s: float) -> None:
        if gap_s >= self.min_gap_s:
            t.closed.append(gap_s)

    # -- what happened ------------------------------------------------------------------------------------------
    def idle(self, node_type: str, machine: str, since: float) -> None:
        """`machine`, which has run work, has had nothing to run since `since` (idempotent: call it as often as
        the machine is seen idle). A different `since` for a machine already idle is a new gap: the earlier one
        ended at most then."""
        t = self._of(node_type)
        before = t.idle.get(machine)
        if before is not None and since > before:
            self._record(t, since - before)
        if before is None or since > before:
            t.idle[machine] = since

    def busy(self, node_type: str, machine: str, at: float) -> None:
        """`machine` runs work again at `at`: its gap, if it had one, ends."""
        t = self._of(node_type)
        since = t.idle.pop(machine, None)
        if since is not None:
            self._record(t, at - since)

    def released(self, node_type: str, machine: str, at: float) -> None:
        """`machine` is gone at `at`; idle, its gap stays open until the type's next launch (`launched`)."""
        t = self._of(node_type)
        since = t.idle.pop(machine, None)
        if since is not None and at - since >= 0:
            t.released.append(since)
            del t.released[:-4 * self.window]          # bounded: only the newest ones can still close

    def launched(self, node_type: str, at: float) -> None:
        """A machine of `node_type` was asked for at `at`: work came back for the type, which closes the gap of its
        most recently released idle machine."""
        t = self._of(node_type)
        if t.released:
            self._record(t, at - t.released.pop())

    # -- what it says -------------------------------------------------------------------------------------------
    def gaps(self, node_type: str, now: float) -> list[float]:
        """The type's last `window` gaps: the closed ones, then the open ones already longer than a launch (at
        their age now)."""
        t = self._types.get(node_type)
        if t is None:
            return []
        long_open = sorted(now - s for s in [*t.idle.values(), *t.released] if now - s > self.launch_s)
        return ([*t.closed] + long_open)[-self.window:]

    def timeout_s(self, node_type: str, default_s: float | None, now: float) -> float | None:
        """How long an idle machine of `node_type` is kept now: of `min_gap_s`, each recent gap (plus `min_gap_s`,
        one sampling step) and `default_s` (the break-even or the cluster's timeout; None: never), the one that
        would have cost least over the type's recent gaps; `default_s` with no gap seen yet, and on a tie the longer
        one. A gap g costs a timeout T: g of idle time when g <= T (kept through it), else T of idle time and a
        relaunch (`launch_s` billed before the new machine can work). So gaps longer than a launch choose `min_gap_s`
        (release at once), gaps shorter choose to keep (through the longest of them that is worth it)."""
        gaps = self.gaps(node_type, now)
        if not gaps:
            return default_s
        top = float("inf") if default_s is None else default_s
        options = {min(self.min_gap_s, top), top} | {g + self.min_gap_s for g in gaps if g + self.min_gap_s < top}

        def cost(t: float) -> float:
            return sum(g if g <= t else t + self.launch_s for g in gaps)

        best = min(sorted(options, reverse=True), key=cost)     # stable: the longest of the cheapest
        return None if best == float("inf") else best

    def changes_at(self, node_type: str, now: float) -> float | None:
        """The next time after `now` an open gap of the type becomes a long one (which may change `timeout_s`
        with nothing else happening: a replay that skips quiet ticks looks again then); None: none will."""
        t = self._types.get(node_type)
        if t is None:
            return None
        later = [s + self.launch_s for s in [*t.idle.values(), *t.released] if s + self.launch_s >= now]
        return min(later) if later else None

    def forget(self, machine: str) -> None:
        """`machine` ended while busy (an interruption, a termination of its work): no gap of it stays open."""
        for t in self._types.values():
            t.idle.pop(machine, None)
