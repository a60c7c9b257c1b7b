"""The cost cap's ledger shared by a cluster's provider objects on one machine (launch/shared_holds.py): seen
across processes, its entries aging out as written, and a servant, not a master: a corrupt, misplaced or locked
ledger is set aside or skipped, logged, and never blocks a launch. (Provider objects over it:
tests/launch/test_cost_reservation.py, the overlapping-objects tests; the capped fault matrix's
`several_objects_burst`.)"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ray_nodeless.core import ttls
from ray_nodeless.launch import shared_holds as S
from tests.helpers import FakeClock


def ledger(tmp_path: Path, clock=time.time) -> S.SharedHolds:
    return S.SharedHolds(tmp_path / "c1.holds.json", max_hold_s=600, clock=clock)


def reserve(h: S.SharedHolds, serial: int, token: str, price: float = 0.5, count: int = 2) -> None:
    with h.locked() as entries:
        assert entries is not None
        h.add(entries, serial, token, price, count)


def others(h: S.SharedHolds) -> list[S.Entry]:
    with h.locked() as entries:
        assert entries is not None
        return h.others(entries)


def test_an_objects_reservation_is_seen_by_the_others_and_not_by_itself(tmp_path):
    a, b = ledger(tmp_path), ledger(tmp_path)
    reserve(a, 0, "tok-a")
    assert others(a) == []
    [e] = others(b)
    assert (e.token, e.price, e.count, e.state, e.pid) == ("tok-a", 0.5, 2, "holding", os.getpid())
    a.landed(0, [("m-1", {"k": "v"}), ("m-2", {})])
    [e] = others(b)
    assert e.state == "landed" and e.machines == (("m-1", {"k": "v"}), ("m-2", {}))
    b.release(0)                                   # b cannot drop a's entry
    assert len(others(b)) == 1
    a.release(0)
    assert others(b) == []


def test_a_reservation_of_another_process_is_seen_here(tmp_path):
    """The ledger's point: objects in different processes (an old and a new monitor, the bridge beside a command)."""
    script = textwrap.dedent(f"""
        from pathlib import Path
        from ray_nodeless.launch.shared_holds import SharedHolds
        h = SharedHolds(Path({str(tmp_path / 'c1.holds.json')!r}), max_hold_s=600)
        with h.locked() as entries:
            h.add(entries, 7, "tok-child", 1.25, 3)
        print("reserved", flush=True)
        import sys; sys.stdin.read()
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "reserved"
        [e] = others(ledger(tmp_path))
        assert (e.token, e.price, e.count, e.pid, e.serial) == ("tok-child", 1.25, 3, child.pid, 7)
    finally:
        child.communicate("", timeout=30)


def test_entries_age_out_as_written(tmp_path):
    clock = FakeClock(1_000_000.0)
    a, b = ledger(tmp_path, clock), ledger(tmp_path, clock)
    reserve(a, 0, "landed")
    a.landed(0, [("m-1", {})])
    reserve(a, 1, "orphan")
    a.orphan(1, frozenset({"m-9"}))
    reserve(a, 2, "in-flight")
    clock.advance(ttls.LAUNCH_GRACE_S + 1)
    # landed and orphaned launches count for the listing lag only; a live process's launch in flight counts on
    assert [e.token for e in others(b)] == ["in-flight"]
    clock.advance(600 + ttls.LAUNCH_GRACE_S)
    assert others(b) == []                         # no launch lasts that long: a leftover


def test_a_dead_processs_launch_stops_counting_after_the_listing_lag(tmp_path):
    clock = FakeClock(1_000_000.0)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    entry = S.Entry(owner="other", serial=0, token="t", price=1.0, count=1, at=clock(), pid=pid,
                    host=ledger(tmp_path).host)
    (tmp_path / "c1.holds.json").write_text(json.dumps({"version": 1, "entries": [entry.record()]}))
    b = ledger(tmp_path, clock)
    assert len(others(b)) == 1                     # its machines may still appear in the listing lag
    clock.advance(ttls.LAUNCH_GRACE_S + 1)
    assert others(b) == []


@pytest.mark.parametrize("text", [b"\xff\xfe not utf-8", b"{not json", b'{"version": 1, "entries": [{"x": 1}]}',
                                  json.dumps({"version": 1, "entries": [{
                                      "owner": "o", "serial": 0, "token": "t", "price": float("nan"), "count": 1,
                                      "at": 1.0, "pid": 1, "host": "h"}]}).encode(),
                                  json.dumps({"version": 1, "entries": [{
                                      "owner": "o", "serial": 0, "token": "t", "price": -3.0, "count": 1,
                                      "at": 1.0, "pid": 1, "host": "h"}]}).encode(),
                                  b'{"version": 99, "entries": []}', b"[]"])
def test_a_ledger_that_is_not_one_is_set_aside_and_started_anew(tmp_path, caplog, text):
    path = tmp_path / "c1.holds.json"
    path.write_bytes(text)
    h = ledger(tmp_path)
    with caplog.at_level(logging.WARNING, logger=S.__name__):
        assert others(h) == []
        reserve(h, 0, "after")
    assert "set aside" in caplog.text
    [aside] = tmp_path.glob("c1.holds.json.bad-*")
    assert aside.read_bytes() == text
    assert [e.token for e in others(ledger(tmp_path))] == ["after"]


def test_a_ledger_path_that_is_a_directory_is_set_aside(tmp_path):
    (tmp_path / "c1.holds.json").mkdir()
    h = ledger(tmp_path)
    reserve(h, 0, "after")
    assert (tmp_path / "c1.holds.json").is_file() and list(tmp_path.glob("c1.holds.json.bad-*"))


def test_a_ledger_that_cannot_be_made_is_skipped_and_logged_once(tmp_path, caplog):
    (tmp_path / "file").write_text("")
    h = S.SharedHolds(tmp_path / "file" / "c1.holds.json", max_hold_s=600)   # its directory is a file
    with caplog.at_level(logging.WARNING, logger=S.__name__):
        for _ in range(3):
            with h.locked() as entries:
                assert entries is None
    assert caplog.text.count("cannot be opened") == 1


def test_a_ledger_locked_by_another_process_never_blocks_a_launch(tmp_path, caplog):
    h = ledger(tmp_path)
    script = textwrap.dedent(f"""
        import fcntl, os, sys
        fd = os.open({str(h.lock_path)!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("locked", flush=True)
        sys.stdin.read()
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger=S.__name__):
            with h.locked() as entries:
                assert entries is None
        waited = time.monotonic() - t0
        assert S.LOCK_WAIT_S <= waited < S.LOCK_WAIT_S + 5, waited
        assert "locked by another process" in caplog.text
    finally:
        child.communicate("", timeout=30)
    with h.locked() as entries:                    # released with its holder
        assert entries == []
