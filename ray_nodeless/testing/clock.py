"""Time in tests: `FakeClock`, a clock a test moves by hand (like Karpenter's fake clock), and `wait_for`, the one
polling loop for what a test cannot drive by a clock (a process starting, a server answering).

Pass a FakeClock where a class takes a `clock` callable (`UnavailableOfferings`, `MachineView`, `Launcher`, the AWS
backend's `clock`, the interruption watchers and metadata clients) and `advance` it past a TTL instead of sleeping.
It serves monotonic and wall-clock readers alike: start it at `time.time()` for code that compares it against
epoch timestamps (EC2 launch times), anywhere for code that only measures durations."""
from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

T = TypeVar("T")


class FakeClock:
    def __init__(self, start: float = 1_000_000.0):
        self._now = float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock forward by `seconds` (never backward: monotonic readers rely on it); the new time."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        with self._lock:
            self._now += seconds
            return self._now

    def sleep(self, seconds: float) -> None:
        """A `sleep` to inject beside the clock: returns at once, having advanced the clock by `seconds`."""
        self.advance(max(0.0, seconds))


def wait_for(predicate: Callable[[], T], timeout: float, what: str = "condition", interval: float = 0.1, *,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> T:
    """`predicate()`'s first truthy value, polled every `interval` seconds; AssertionError naming `what` (and the
    last value seen) if none comes within `timeout` seconds of `clock`. The predicate runs at least once, and once
    more at the deadline, so a slow machine never fails a wait whose condition holds by then."""
    deadline = clock() + timeout
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - clock()
        if left <= 0:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {value!r})")
        sleep(min(interval, left))
