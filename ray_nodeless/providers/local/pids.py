"""Which live process is which, read through psutil.

A recorded process is identified by its pid *and* its start time: once a process is gone its pid can be given to
an unrelated one, which must never be judged alive or signalled as ours. Start times are kept as seconds after
boot: psutil's `create_time()` is wall-clock based (boot time + start tick), so a clock step between recording and
checking would move it; the boot time read at the same moment cancels that out.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import psutil

# Linux counts process start times in clock ticks of 10 ms: two start times closer than this are the same tick
# (the tolerance only absorbs float rounding, it never merges two ticks).
SAME_START_TOLERANCE_S = 0.001

_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    pgid: int
    sid: int
    started_s: float      # seconds after boot


def _started_s(p: psutil.Process) -> float:
    return p.create_time() - psutil.boot_time()


def start_of(pid: int) -> float | None:
    """When the process holding `pid` started (seconds after boot), zombie or not; None if no process holds it."""
    try:
        return _started_s(psutil.Process(pid))
    except psutil.Error:
        return None


def same_start(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) < SAME_START_TOLERANCE_S


def proc_info(pid: int) -> ProcInfo | None:
    """The live process holding `pid`; None if there is none, or only a zombie."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            if p.status() in _GONE:
                return None
            started = _started_s(p)
        return ProcInfo(pid=pid, pgid=os.getpgid(pid), sid=os.getsid(pid), started_s=started)
    except (psutil.Error, OSError):   # gone between two reads
        return None


def live_processes() -> list[ProcInfo]:
    """Every live (non-zombie) process of the machine."""
    return [info for info in map(proc_info, psutil.pids()) if info is not None]


def has_env(pid: int, name: str, value: str) -> bool:
    """Was the process started with `name=value` in its environment? (A process that rewrites its title may have
    clobbered what the kernel shows as its environment: then this is False.)"""
    try:
        return psutil.Process(pid).environ().get(name) == value
    except psutil.Error:
        return False


def ancestors(pid: int) -> set[int]:
    """`pid` and every process above it."""
    try:
        return {pid} | {p.pid for p in psutil.Process(pid).parents()}
    except psutil.Error:
        return {pid}


def rss_bytes(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


def mem_available_bytes() -> int:
    return psutil.virtual_memory().available


def signal_pid(pid: int, sig: int) -> None:
    """Signal one process; a process that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def signal_group(pgid: int, sig: int) -> None:
    """Signal a whole process group; a group that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
