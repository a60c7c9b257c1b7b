"""LocalNodeProcesses against a real Ray head.

Safety: other engineers may run Ray on this machine, so nothing here runs `ray stop` (which kills every Ray process
of the user). The head is our own `ray start --head --block` in a new session, on free ports and a private
--temp-dir (worker nodes inherit the head's temp dir through GCS), and is stopped by signalling its process group
only. Every node a test starts is stopped by a fixture finalizer, also when the test fails.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from ray_nodeless.errors import BackendError, CapacityError
from ray_nodeless.providers.local import pids
from ray_nodeless.providers.local.processes import LocalNodeProcesses
from ray_nodeless.providers.local.records import NodeRecord
from ray_nodeless.providers.local.slots import NUM_SLOTS, PORT_STRIDE, allocate_slot
from ray_nodeless.testing.ray_processes import (
    alive_nodes_by_instance, free_port, group_alive, ray_head, stop_everything, wait_for,
)


@pytest.fixture(scope="module")
def gcs_address() -> Iterator[str]:
    with ray_head() as address:
        yield address


@pytest.fixture
def nodes(tmp_path: Path, gcs_address: str) -> Iterator[LocalNodeProcesses]:
    lnp = LocalNodeProcesses(tmp_path / "state", gcs_address)
    try:
        yield lnp
    finally:
        stop_everything(lnp)


@pytest.mark.e2e
def test_start_list_restart_stop_and_preemption(nodes: LocalNodeProcesses, gcs_address: str) -> None:
    t0 = time.monotonic()
    a = nodes.start("local-aaaa0001", "gpu-type", {"CPU": 1, "GPU": 1, "memory": 2 * 2**30, "accel_x": 2},
                    {"nodeless/instance-type": "g4dn.xlarge", "note": "a.b-c"},
                    extra_env={"RAY_CLOUD_INSTANCE_TYPE_NAME": "g4dn.xlarge"}, tags={"k": "v"})
    t1 = time.monotonic()
    b = nodes.start("local-bbbb0002", "cpu-type", {"CPU": 2}, {})
    t2 = time.monotonic()
    print(f"\nnode start times: {t1 - t0:.1f} s, {t2 - t1:.1f} s")
    assert a.ip != b.ip and a.ip.startswith("127.0.0.") and b.ip.startswith("127.0.0.")
    assert set(a.ports.values()).isdisjoint(b.ports.values())
    assert {r.id for r in nodes.list()} == {a.id, b.id}

    seen = wait_for(lambda: (lambda m: m if {a.id, b.id} <= m.keys() else None)(
        alive_nodes_by_instance(gcs_address)), 30, "both nodes registered in GCS")
    na, nb = seen[a.id], seen[b.id]
    assert na.node_manager_address == a.ip and nb.node_manager_address == b.ip
    ra = dict(na.resources_total)
    assert ra["CPU"] == 1 and ra["GPU"] == 1 and ra["accel_x"] == 2 and ra["memory"] == 2 * 2**30
    assert dict(nb.resources_total)["CPU"] == 2 and "GPU" not in dict(nb.resources_total)
    assert na.node_type_name == "gpu-type" and na.instance_type_name == "g4dn.xlarge"
    assert dict(na.labels)["note"] == "a.b-c" and dict(na.labels)["ray.io/node-group"] == "gpu-type"
    rss = [nodes.rss_bytes(r) for r in (a, b)]
    print(f"node RSS: {[round(x / 2**20) for x in rss]} MB")
    assert all(100 * 2**20 < x < 1500 * 2**20 for x in rss)

    # Restart recovery: a fresh instance on the same state dir (another process, or a restarted monitor).
    fresh = LocalNodeProcesses(nodes.state_dir, gcs_address)
    again = {r.id: r for r in fresh.list()}
    assert again.keys() == {a.id, b.id} and again[a.id].ip == a.ip and again[a.id].tags == {"k": "v"}
    assert fresh.update_tags(a.id, {"k2": "v2"}) and nodes.get(a.id).tags == {"k": "v", "k2": "v2"}

    # Graceful stop: the node leaves the cluster and the listing.
    t3 = time.monotonic()
    nodes.stop([a.id, "local-unknown"])
    print(f"stop took {time.monotonic() - t3:.1f} s")
    assert not group_alive(a.pid)
    assert [r.id for r in nodes.list()] == [b.id]
    wait_for(lambda: a.id not in alive_nodes_by_instance(gcs_address), 20, "stopped node marked dead in GCS")

    # Preemption: kill the group from outside. `fresh` is not the parent, so it sees a zombie leader (or none).
    os.killpg(b.pid, signal.SIGKILL)
    wait_for(lambda: not fresh.list(), 10, "killed node dropped by a non-parent instance")
    assert nodes.list() == [] and nodes.get(b.id) is None
    wait_for(lambda: not group_alive(b.pid), 10, "killed group gone")


def test_reused_pid_is_not_alive_and_is_never_signalled(tmp_path: Path) -> None:
    lnp = LocalNodeProcesses(tmp_path / "state", "127.0.0.1:1")
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        started = pids.start_of(victim.pid)
        assert started is not None
        # The record's process started one clock tick (10 ms) before the process now holding its pid.
        forged = NodeRecord(id="local-f0f0f0f0", node_type="x", ip="127.0.0.9", slot=7, pid=victim.pid,
                            started_s=started - 0.01, started_at=time.time())
        lnp.records.write(forged)
        assert not lnp.alive(forged)
        assert lnp.list() == [] and lnp.get(forged.id) is None
        lnp.records.write(forged)
        lnp.stop([forged.id], timeout=1)
        assert lnp.get(forged.id) is None
        # Any signal would have been sent before stop() returned; give it time to act, and it must not have.
        with pytest.raises(subprocess.TimeoutExpired):
            victim.wait(timeout=0.5)
        # The same pid with the right start time is alive.
        assert lnp.alive(NodeRecord(id="x", node_type="x", ip="", pid=victim.pid, started_s=started))
    finally:
        victim.kill()
        victim.wait()


def test_slot_allocation_skips_used_slots_and_ports_in_use(tmp_path: Path) -> None:
    base = 20000 + PORT_STRIDE * 200   # a block far from what other tests use
    counter = tmp_path / "counter.json"
    counter.write_text('{"next": 0}')
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        try:
            blocker.bind(("127.0.0.1", base + 3))   # one port of slot 0's block
            blocker.listen()
        except OSError:
            pytest.skip("port in use by someone else")
        slot = allocate_slot(counter, set(), base)
        assert slot >= 1
        assert allocate_slot(counter, set(), base) == slot + 1   # the counter is persisted
        assert allocate_slot(counter, {slot + 2}, base) == slot + 3   # slots of live nodes are skipped
        with pytest.raises(CapacityError) as ei:
            allocate_slot(counter, set(range(NUM_SLOTS)), base)
        assert ei.value.category == "LocalSlotsExhausted"
    finally:
        blocker.close()


def test_damaged_counter_starts_over(tmp_path: Path) -> None:
    counter = tmp_path / "counter.json"
    counter.write_text("{not json")
    base = 20000 + PORT_STRIDE * 220
    assert allocate_slot(counter, set(range(5)), base) >= 5


@pytest.mark.e2e
def test_failed_start_raises_with_log_tail_and_leaves_nothing(tmp_path: Path) -> None:
    # Nothing listens on this GCS address: `ray start` gives up; we bound the wait to keep the test short.
    lnp = LocalNodeProcesses(tmp_path / "state", f"127.0.0.1:{free_port()}", start_timeout_s=5)
    try:
        with pytest.raises(BackendError) as ei:
            lnp.start("local-dead0001", "t", {"CPU": 1}, {})
        assert "local-dead0001" in str(ei.value) and "failed to start" in str(ei.value)
        assert lnp.list() == [] and lnp.get("local-dead0001") is None
    finally:
        stop_everything(lnp)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
