"""Addresses of local nodes: each worker node gets a *slot*, i.e. its own loopback IP (127.0.0.N) and its own block
of ports.

Concurrent `ray start`s on one host race on random ports, and Ray v1's LoadMetrics keys nodes by IP, so every node
needs a distinct IP and explicit, distinct ports. A slot is free when no live node of the state dir holds it and
none of its ports is bound by anything on the machine (another state dir, another program). The next slot to try
is persisted in `<state_dir>/counter.json`, so a freed slot is not reused at once (its ports may be in TIME_WAIT,
and Ray's GCS may still remember the old node at that IP).
"""
from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

from ray_nodeless.core.files import write_atomic
from ray_nodeless.errors import CapacityError

logger = logging.getLogger(__name__)

# 127.0.0.1 is the host itself (Ray resolves it to the routable IP anyway), 127.0.0.255 is the broadcast address.
FIRST_HOST = 2
LAST_HOST = 254
NUM_SLOTS = LAST_HOST - FIRST_HOST + 1
# Port block of a slot: base + slot * stride + offset. Ray's own defaults are 6379/8265/10001 and workers
# 10002-19999, and Linux's ephemeral range starts at 32768, so blocks from 20000 with a stride of 50 (253 slots ->
# up to 32649) collide with neither.
DEFAULT_PORT_BASE = 20000
PORT_STRIDE = 50
PORT_OFFSETS = {
    "node_manager": 0,
    "object_manager": 1,
    "dashboard_agent_listen": 2,
    "dashboard_agent_grpc": 3,
    "runtime_env_agent": 4,
    "metrics_export": 5,
    "min_worker": 10,
    "max_worker": PORT_STRIDE - 1,   # 40 task-worker ports per node: plenty for an emulated VM
}
# Ports below 1024 are the system's privileged ports, never an emulated node's.
MIN_PORT_BASE = 1024
# The last slot's block must end at or below port 65535.
MAX_PORT_BASE = 65535 - NUM_SLOTS * PORT_STRIDE + 1


def slot_ip(slot: int) -> str:
    return f"127.0.0.{FIRST_HOST + slot}"


def slot_ports(port_base: int, slot: int) -> dict[str, int]:
    base = port_base + slot * PORT_STRIDE
    return {name: base + off for name, off in PORT_OFFSETS.items()}


def port_free(port: int) -> bool:
    # Raylets and agents bind *:port, so probe the wildcard address: that also fails if anything holds the port on
    # any single address. SO_REUSEADDR so that a socket in TIME_WAIT does not count as taken (Ray reuses it too).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def allocate_slot(counter_path: Path, used: set[int], port_base: int) -> int:
    """The next slot from the persisted counter that is not in `used` and whose ports are all free; the counter
    moves past it. The caller holds the state dir's lock (the counter) and the machine-wide start lock (so the port
    probe is race-free against other ray_nodeless starters). CapacityError when every slot is taken."""
    try:
        counter = int(json.loads(counter_path.read_text()).get("next", 0))
    except (OSError, ValueError, TypeError, AttributeError):   # missing or damaged: start over
        counter = 0
    for i in range(NUM_SLOTS):
        slot = (counter + i) % NUM_SLOTS
        if slot in used:
            continue
        base = port_base + slot * PORT_STRIDE
        if not all(port_free(base + off) for off in range(PORT_STRIDE)):
            logger.debug("slot %d: ports %d-%d partly in use; skipping", slot, base, base + PORT_STRIDE - 1)
            continue
        write_atomic(counter_path, json.dumps({"next": slot + 1}))
        return slot
    raise CapacityError(f"no free local node slot in {counter_path.parent} ({NUM_SLOTS} IPs x port blocks in use)",
                        category="LocalSlotsExhausted")


def default_head_ip() -> str:
    """The IP the head's raylet will report. Ray rewrites `--node-ip-address=127.0.0.1` (and the default) to the
    host's routable address, so the head record must carry that, or v1's IP-keyed accounting misses the head."""
    try:
        from ray_nodeless.ray_compat.node_ip import resolve_localhost
        return resolve_localhost("127.0.0.1")
    except Exception:  # no network at all: Ray then falls back to loopback as well
        return "127.0.0.1"
