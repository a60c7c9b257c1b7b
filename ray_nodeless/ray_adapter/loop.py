"""The provider's own loop in the monitor: its periodic work on daemon threads of its own, off Ray's calls.

Ray's monitor calls `non_terminated_nodes` once or more per update and waits for it: when that call did the
provider's work (list the cloud, poll the interruption queue, pack shape-open demands, run the reverter's launches
and drains, end machines the registration gave up on), one slow cloud call stalled Ray's loop for every other
demand. In the monitor that work runs here instead, in *lanes*: each lane is one step run every `interval_s` on its
own daemon thread, so a lane stuck in the cloud (a reverter's launch walking its candidates for up to
`launch_timeout_s`) holds back neither Ray's calls nor the other lanes. Ray's listing call only reads the view's
latest snapshot (ray_adapter/provider.py).

- A step that raises is logged and the lane goes on at its next interval: the loop never dies of an exception.
- Passes of one lane never overlap: `run_once` (a test's deterministic step, or a caller that needs a pass now)
  takes the same lock as the lane's thread.
- Time is read from an injected `Clock`: a pass is due when `clock()` has moved `interval_s` past the last one, or
  when `wake()` asks for one. With a test's fake clock that is not advanced, a started lane runs its first pass and
  then only what the test asks for. Waiting is in real time, at most `interval_s` per check.
- `stop()` ends every lane's thread (after the pass under way, which is not interrupted); the threads are daemon
  threads, so a process that exits without calling it is not held up.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

logger = logging.getLogger(__name__)


class Clock(Protocol):
    """Seconds on a monotonic scale (time.monotonic; tests pass ray_nodeless.testing.clock.FakeClock)."""

    def __call__(self) -> float: ...


@dataclass
class Lane:
    name: str
    step: Callable[[], object]
    interval_s: float
    passes: int = 0
    errors: int = 0
    last_error: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _wake: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)


class ProviderLoop:
    def __init__(self, name: str, lanes: list[Lane], clock: Clock = time.monotonic):
        if len({lane.name for lane in lanes}) != len(lanes):
            raise ValueError(f"lane names must be unique: {[lane.name for lane in lanes]}")
        self.name = name
        self.lanes = {lane.name: lane for lane in lanes}
        self.clock = clock
        self._stop = threading.Event()
        self._started = False
        self._start_lock = threading.Lock()
        self._passed = threading.Condition()

    @property
    def running(self) -> bool:
        return self._started and not self._stop.is_set()

    def start(self) -> None:
        """Start every lane's thread (once; a stopped loop is not restarted)."""
        with self._start_lock:
            if self._started:
                return
            self._started = True
            for lane in self.lanes.values():
                lane._thread = threading.Thread(target=self._run, args=(lane,), daemon=True,
                                                name=f"ray-nodeless-{self.name}-{lane.name}")
                lane._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop the lanes; True when every thread ended within `timeout_s` (a pass stuck in the cloud may not)."""
        self._stop.set()
        for lane in self.lanes.values():
            lane._wake.set()
        deadline = time.monotonic() + timeout_s
        ended = True
        for lane in self.lanes.values():
            if lane._thread is not None:
                lane._thread.join(max(0.0, deadline - time.monotonic()))
                ended &= not lane._thread.is_alive()
        return ended

    def wake(self, name: str | None = None) -> None:
        """Ask for a pass now (of lane `name`, else of every lane)."""
        for lane in ([self.lanes[name]] if name else self.lanes.values()):
            lane._wake.set()

    def run_once(self, name: str | None = None) -> None:
        """One pass of lane `name` (else of every lane, in order) on the caller's thread, after any pass under way."""
        for lane in ([self.lanes[name]] if name else self.lanes.values()):
            self._pass(lane)

    def wait_for_pass(self, name: str, passes: int, timeout_s: float) -> bool:
        """Wait (real time) until lane `name` has run `passes` passes in all; True when it has."""
        lane = self.lanes[name]
        with self._passed:
            return self._passed.wait_for(lambda: lane.passes >= passes, timeout_s)

    def _pass(self, lane: Lane) -> None:
        with lane._lock:
            try:
                lane.step()
            except Exception as e:      # never let one failure end the loop: the next interval tries again
                lane.errors += 1
                lane.last_error = f"{type(e).__name__}: {e}"
                logger.exception("provider loop %s: %s failed; trying again in %.0f s", self.name, lane.name,
                                 lane.interval_s)
            finally:
                lane.passes += 1
        with self._passed:
            self._passed.notify_all()

    def _run(self, lane: Lane) -> None:
        due = self.clock()
        while not self._stop.is_set():
            if lane._wake.is_set() or self.clock() >= due:
                lane._wake.clear()
                self._pass(lane)
                due = self.clock() + lane.interval_s
            lane._wake.wait(lane.interval_s)
        logger.debug("provider loop %s: lane %s stopped", self.name, lane.name)
