#!/usr/bin/env python3
"""What the metrics and events (ray_nodeless/metrics/) cost the monitor per autoscaler update, at 1,000 machines,
side by side with metrics off in the same run.

    .venv/bin/python benches/bench_metrics.py                      # 1,000 machines, 300 updates per side
    .venv/bin/python benches/bench_metrics.py --machines 1000 --updates 300 --json

Setup: two NodelessProvider objects on the in-memory backend (ray_nodeless.testing.fake_backend), two clusters of
the same 1,000 machines (decision tags as a launch writes them), `list_cache_s: 0` so every update lists (the worst
case for the metrics: the cost integration runs once per listing). "on" is the provider as built (metered backend,
view, launcher, planner); "off" is the same provider with its view, backend and launcher swapped back to the
unwrapped objects, i.e. the provider without ray_nodeless/metrics; a second "off" provider ("control") gives the
noise floor of the comparison.
One autoscaler update = what Ray asks per loop: `non_terminated_nodes({})`, then `node_tags`, `is_running` and
`internal_ip` for every node. Updates alternate on/off, the first side alternating too (this machine's speed drifts);
the figure is the median of
each side and the difference of the medians, in this thread's CPU time (`time.thread_time`), so that other
processes on the shared cores do not count. A scrape (the registry rendered as Prometheus text, the gauges read
from the view) is timed separately: it runs when Prometheus asks, not per update.
Target (issue 20): on - off < 1 ms per update at 1,000 machines.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import generate_latest  # noqa: E402

from ray_nodeless.metrics.cost_store import CostStore  # noqa: E402
from ray_nodeless.metrics.registry import process_metrics  # noqa: E402
from ray_nodeless.providers.base import (  # noqa: E402
    TAG_CAPACITY, TAG_CLUSTER, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_RULE, TAG_ZONE, Machine,
)
from ray_nodeless.ray_adapter.provider import NodelessProvider  # noqa: E402
from ray_nodeless.testing import fake_backend  # noqa: E402

PROVIDER = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "fake", "simulate_cloud": "aws",
            "region": "us-west-2", "list_cache_s": 0,
            "rules": [{"name": "all", "match": {}, "capacity": ["spot", "on-demand"]}]}
TYPES = [("g6.xlarge", "spot", "0.3200"), ("g5.xlarge", "on-demand", "1.0060"), ("m5.large", "on-demand", "0.0960")]
ZONES = ["us-west-2a", "us-west-2b", "us-west-2c"]


def populate(cloud: fake_backend.Cloud, cluster: str, n: int) -> None:
    with cloud.lock:
        for i in range(n):
            it, cap, price = TYPES[i % len(TYPES)]
            mid = f"fake-{cluster}-{uuid.uuid4().hex[:8]}"
            cloud.machines[mid] = Machine(id=mid, internal_ip=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                                          launched_at=time.time(), tags={
                TAG_CLUSTER: cluster, TAG_INSTANCE_TYPE: it, TAG_CAPACITY: cap, TAG_ZONE: ZONES[i % 3],
                TAG_PRICE: price, TAG_RULE: "all", "ray-node-type": "worker", "ray-user-node-type": "w",
                "ray-node-status": "up-to-date"})


def update(p: NodelessProvider) -> float:
    """One update's CPU time in this thread (time.thread_time: the other processes sharing the cores do not count)."""
    t0 = time.thread_time()
    for nid in p.non_terminated_nodes({}):
        p.node_tags(nid)
        p.is_running(nid)
        p.internal_ip(nid)
    return time.thread_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machines", type=int, default=1000)
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cloud = fake_backend.reset()
    populate(cloud, "on", a.machines)
    populate(cloud, "off", a.machines)
    populate(cloud, "control", a.machines)
    on = NodelessProvider(dict(PROVIDER), "on")
    off, control = NodelessProvider(dict(PROVIDER), "off"), NodelessProvider(dict(PROVIDER), "control")
    for p in (off, control):
        # Metrics off: the same provider with the unwrapped parts (the view calls the backend itself).
        p.view = p.view.wrapped
        p.view.backend = p.backend
        p.launcher = p.launcher.wrapped
    on.instruments.watch(on.view, on.unavailable)     # the scrape reads the metered provider
    # As in the monitor: the cost counter's state is saved next to the head's log (at most every 10 s).
    state = tempfile.TemporaryDirectory(prefix="bench-metrics-")
    on.instruments.recorder.cost_store = CostStore(Path(state.name) / "on.cost.json")
    assert len(on.non_terminated_nodes({})) == len(off.non_terminated_nodes({})) == a.machines
    sides = {"off": off, "on": on, "control": control}
    times: dict[str, list[float]] = {k: [] for k in sides}
    order = list(sides)
    for _ in range(a.updates):      # alternating, the first side rotating (this machine's speed drifts)
        for side in order:
            times[side].append(update(sides[side]))
        order = order[1:] + order[:1]
    scrapes = []
    registry = process_metrics().registry
    for _ in range(max(10, a.updates // 10)):
        t0 = time.thread_time()
        text = generate_latest(registry)
        scrapes.append(time.thread_time() - t0)
    assert b"ray_nodeless_machines{" in text
    assert (Path(state.name) / "on.cost.json").is_file()
    state.cleanup()
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    doc = {"machines": a.machines, "updates": a.updates, "update_ms_off": round(med["off"], 3),
           "update_ms_on": round(med["on"], 3), "metrics_ms_per_update": round(med["on"] - med["off"], 3),
           "noise_ms": round(med["control"] - med["off"], 3),
           "scrape_ms": round(statistics.median(scrapes) * 1000, 3), "target_ms": 1.0}
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"{a.machines} machines, {a.updates} updates per side (alternating), medians:")
        print(f"  update, metrics off: {doc['update_ms_off']:.3f} ms")
        print(f"  update, metrics on:  {doc['update_ms_on']:.3f} ms")
        print(f"  metrics per update:  {doc['metrics_ms_per_update']:.3f} ms (target < 1 ms)")
        print(f"  noise floor (a second metrics-off provider minus the first): {doc['noise_ms']:.3f} ms")
        print(f"  one scrape (not per update): {doc['scrape_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
