#!/usr/bin/env python3
"""Ray's listing call (`non_terminated_nodes`) with a slow cloud: the provider's own loop (in the monitor) next to
today's synchronous path (ray up / ray down / sweep), in one run.

    .venv/bin/python benches/bench_listing.py                         # 100 and 1,000 machines, 30 s cloud
    .venv/bin/python benches/bench_listing.py --machines 100 1000 --cloud-s 30 --sync-cloud-s 0.3 --json

Setup: NodelessProvider on the in-memory backend (ray_nodeless.testing.fake_backend) with N machines of the
cluster, `list_cache_s: 0` (every listing asks the cloud). The cloud's list call takes `--cloud-s` seconds
(fake_backend `delay_s["list"]`).
- "loop": the provider built with a MonitorContext that acts on the cluster (as Ray's monitor or the KubeRay bridge
  builds it). Its first snapshot is taken before the delay is switched on (the first call's one bounded wait is not
  what is measured); then the loop's listing lane is woken into a `--cloud-s` list call, and while it is held there
  `--calls` listing calls are timed, each followed, as Ray's update does, by `node_tags` / `is_running` /
  `internal_ip` of every node (timed separately: "update"). The lane must still be in the cloud when the last call
  returns (checked: otherwise the figures would not be "with a slow cloud").
- "sync": the provider built outside the monitor (MonitorContext OUTSIDE): every listing call lists the cloud. A
  30 s call per listing would make the run last minutes per figure, so the sync side's cloud answers in
  `--sync-cloud-s` (0.3 s by default) and is timed for `--sync-calls` calls; its listing call takes that delay plus
  the work, i.e. with a 30 s cloud, 30 s and more.
Times are wall clock (time.perf_counter): what Ray's monitor waits.
Target (issue 26): loop p99 < 50 ms at 1,000 machines with the 30 s cloud.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ray_nodeless.providers.base import (  # noqa: E402
    TAG_CAPACITY, TAG_CLUSTER, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_RULE, TAG_ZONE, Machine,
)
from ray_nodeless.ray_adapter.context import OUTSIDE, MonitorContext  # noqa: E402
from ray_nodeless.ray_adapter.provider import NodelessProvider  # noqa: E402
from ray_nodeless.testing import fake_backend  # noqa: E402

PROVIDER = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "fake", "simulate_cloud": "aws",
            "region": "us-west-2", "list_cache_s": 0, "metrics_port": None, "ray_status_events": 0,
            "reversion": {"enabled": False},
            "rules": [{"name": "all", "match": {}, "capacity": ["spot", "on-demand"]}]}
MONITOR = MonitorContext(gcs_address="127.0.0.1:1", acts_on_cluster=True)   # no GCS is reached: nothing here needs one
TARGET_P99_MS = 50.0


def populate(cloud: fake_backend.Cloud, cluster: str, n: int) -> None:
    with cloud.lock:
        for i in range(n):
            mid = f"fake-{cluster}-{uuid.uuid4().hex[:8]}"
            cloud.machines[mid] = Machine(id=mid, internal_ip=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                                          launched_at=time.time(), tags={
                TAG_CLUSTER: cluster, TAG_INSTANCE_TYPE: "m5.large", TAG_CAPACITY: "on-demand",
                TAG_ZONE: "us-west-2a", TAG_PRICE: "0.0960", TAG_RULE: "all", "ray-node-type": "worker",
                "ray-user-node-type": "w", "ray-node-status": "up-to-date"})


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def figures(ms: list[float], count_key: str = "calls") -> dict:
    return {count_key: len(ms), "p50_ms": round(statistics.median(ms), 3), "p99_ms": round(pct(ms, 0.99), 3),
            "max_ms": round(max(ms), 3)}


def timed_update(p: Any, batching: bool = False) -> tuple[float, float, int]:
    """Ray's update on provider `p`: (the listing call's ms, the whole update's ms, nodes listed). A batching
    provider (Ray's KubeRay one, benches/bench_kwok_scale.py) has no `is_running`: Ray reads its node_tags and
    internal_ip only."""
    t0 = time.perf_counter()
    nodes = p.non_terminated_nodes({})
    t1 = time.perf_counter()
    for nid in nodes:
        p.node_tags(nid)
        if not batching:
            p.is_running(nid)
        p.internal_ip(nid)
    return (t1 - t0) * 1000, (time.perf_counter() - t0) * 1000, len(nodes)


def loop_side(n: int, cloud_s: float, calls: int) -> dict:
    cloud = fake_backend.reset()
    cluster = f"loop{n}"
    populate(cloud, cluster, n)
    p = NodelessProvider(dict(PROVIDER), cluster, context=MONITOR)
    try:
        assert len(p.non_terminated_nodes({})) == n            # the first snapshot (the one bounded wait)
        lane = p.loop.lanes["listing"]
        entered = threading.Event()
        cloud.gates["list"] = lambda _: entered.set()     # says when the lane's call is in the cloud
        cloud.delay_s["list"] = cloud_s
        p.loop.wake("listing")
        assert entered.wait(10), "the listing lane did not reach the cloud"
        passes, started = lane.passes, time.monotonic()
        listing, update = timed_updates(p, n, calls)
        held = lane.passes == passes and time.monotonic() - started < cloud_s
        assert held, "the lane's cloud call ended during the measurement: raise --cloud-s or lower --calls"
        return {"listing": figures(listing), "update": figures(update), "lane_held_in_cloud": held,
                "measured_for_s": round(time.monotonic() - started, 2)}
    finally:
        cloud.wake.set()             # the held cloud call returns at once
        p.stop()


def timed_updates(p: NodelessProvider, n: int, calls: int) -> tuple[list[float], list[float]]:
    """`calls` of Ray's updates (timed_update), each listing all `n` machines: the listing calls' and the whole
    updates' milliseconds."""
    listing, update = [], []
    for _ in range(calls):
        ms, whole, count = timed_update(p)
        assert count == n
        listing.append(ms)
        update.append(whole)
    return listing, update


def sync_side(n: int, cloud_s: float, calls: int) -> dict:
    cloud = fake_backend.reset()
    cluster = f"sync{n}"
    populate(cloud, cluster, n)
    p = NodelessProvider(dict(PROVIDER), cluster, context=OUTSIDE)
    assert len(p.non_terminated_nodes({})) == n               # the first listing (checked twice) before the delay
    cloud.delay_s["list"] = cloud_s
    listing, update = timed_updates(p, n, calls)
    return {"listing": figures(listing), "update": figures(update)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machines", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--cloud-s", type=float, default=30.0)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--sync-cloud-s", type=float, default=0.3)
    ap.add_argument("--sync-calls", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    events = tempfile.TemporaryDirectory(prefix="bench-listing-")
    os.environ["RAY_NODELESS_EVENTS_DIR"] = events.name        # the monitor's event log, not the user's
    runs = []
    for n in a.machines:
        loop = loop_side(n, a.cloud_s, a.calls)
        sync = sync_side(n, a.sync_cloud_s, a.sync_calls)
        runs.append({"machines": n, "loop": loop, "sync": sync,
                     "sync_over_loop_p50": round(sync["listing"]["p50_ms"] / max(loop["listing"]["p50_ms"], 1e-6), 1),
                     "loop_p99_under_target": loop["listing"]["p99_ms"] < TARGET_P99_MS})
    events.cleanup()
    doc = {"cloud_s": a.cloud_s, "sync_cloud_s": a.sync_cloud_s, "target_p99_ms": TARGET_P99_MS, "runs": runs}
    if a.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"listing call (non_terminated_nodes), wall ms; loop: cloud list call {a.cloud_s:g} s, held during "
          f"{a.calls} calls; sync: cloud {a.sync_cloud_s:g} s, {a.sync_calls} calls")
    print(f"{'machines':>8}  {'path':<5} {'p50':>9} {'p99':>9} {'max':>9}  {'update p50':>10} {'update p99':>10}")
    for r in runs:
        for side in ("loop", "sync"):
            f, u = r[side]["listing"], r[side]["update"]
            print(f"{r['machines']:>8}  {side:<5} {f['p50_ms']:>9.3f} {f['p99_ms']:>9.3f} {f['max_ms']:>9.3f}  "
                  f"{u['p50_ms']:>10.3f} {u['p99_ms']:>10.3f}")
        print(f"{'':>8}  sync/loop p50 = {r['sync_over_loop_p50']:g}x (sync with a {a.sync_cloud_s:g} s cloud; "
              f"with {a.cloud_s:g} s each sync call waits that long); loop p99 < {TARGET_P99_MS:g} ms: "
              f"{r['loop_p99_under_target']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
