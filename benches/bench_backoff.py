#!/usr/bin/env python3
"""Capacity-error backoff (core/availability.py) against the fixed TTL of before, same seed, same run: launch
attempts wasted on capacity errors in a spot drought, and what the backoff costs when capacity comes back.

    .venv/bin/python benches/bench_backoff.py [--drought-hours 2] [--every-s 30] [--burst 5] [--seeds 5]

Two measurements, each run twice (fixed: `unavailable_backoff_cap_s` = `unavailable_ttl_s` and
`unavailable_probes: 0`, today's defaults until this change; backoff: the defaults, 180 s doubled up to 600 s,
one probe at a time):

1. The live provider (`NodelessProvider`, the real launcher and capacity memory, on the in-memory backend of the
   fault matrix, whose clock is a fake one moved by the bench): a GPU worker requested every `--every-s` seconds
   (one create_node of Ray's), and every 10 minutes a burst of `--burst` create_node calls at once on threads (Ray
   v2's parallel launch batches), through a spot drought of `--drought-hours` (every spot offering fails with
   InsufficientInstanceCapacity; each request then lands on demand), then spot is back. Counted: backend launch
   calls that failed for capacity (each a wasted RunInstances / instances.insert), and the seconds from spot's
   return to the first spot machine.
2. The replay (simulate, running the same capacity-memory class on its clock): the published workload
   (examples/traces/automl-published.yaml) on cluster-configs/aws-gpu-head.yaml, spot first with reversion, with
   spot interruptions (`--rate` per node-hour, `--seeds` seeds) and a 30-minute drought after each: launch
   attempts that met the drought, cost and makespan.
"""
from __future__ import annotations

import argparse
import logging
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ray.autoscaler.node_launch_exception import NodeLaunchException  # noqa: E402

from ray_nodeless.providers.base import TAG_CAPACITY  # noqa: E402
from ray_nodeless.testing import fake_backend  # noqa: E402
from ray_nodeless.testing.clock import FakeClock  # noqa: E402
from ray_nodeless.testing.fault_matrix import WORKER_TAGS, FakeWorld  # noqa: E402
from ray_nodeless.testing.fault_matrix.fake import PROVIDER  # noqa: E402

POLICIES: dict[str, dict[str, Any]] = {
    "fixed TTL": {"unavailable_ttl_s": 180, "unavailable_backoff_cap_s": 180, "unavailable_probes": 0},
    "backoff": {},      # the defaults
}
BURST_EVERY_S = 600.0
AFTER_S = 1800.0       # how long the bench keeps asking after spot is back


def live_run(extra: dict[str, Any], drought_s: float, every_s: float, burst: int) -> dict[str, float]:
    world = FakeWorld(dict(PROVIDER, **extra, max_candidates_per_launch=20))
    world.start()
    cloud = fake_backend.CLOUD
    p = world.new_provider()
    clock = FakeClock()
    p.unavailable.clock = clock
    start = clock()
    cloud.capacity_faults[("*", "*", "spot")] = "InsufficientInstanceCapacity"
    wasted = 0
    seq = 0
    first_spot: float | None = None
    lock = threading.Lock()

    def create(n: int) -> None:
        nonlocal wasted, first_spot
        tags = dict(WORKER_TAGS, **{"ray-user-node-type": "gpu", "ray-launch-request": f"r{n}"})
        before = cloud.calls.get("launch", 0)
        try:
            created = p.create_node_with_resources_and_labels({}, tags, 1, world.shapes["gpu"], {})
        except NodeLaunchException:
            created = {}
        with lock:
            calls = cloud.calls.get("launch", 0) - before
            wasted += calls - (1 if created else 0)      # one machine per call: every other call failed
            for mid in created:
                if p.node_tags(mid).get(TAG_CAPACITY) == "spot" and first_spot is None:
                    first_spot = clock() - start - drought_s
        p.terminate_nodes(list(created))          # keep the listing small: the bench counts calls, not machines

    t = 0.0
    next_burst = 0.0
    while t < drought_s + AFTER_S:
        if t >= drought_s and ("*", "*", "spot") in cloud.capacity_faults:
            del cloud.capacity_faults[("*", "*", "spot")]
        if t >= next_burst:
            threads = [threading.Thread(target=create, args=(seq + i,)) for i in range(burst)]
            seq += burst
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            next_burst += BURST_EVERY_S
        else:
            create(seq)
            seq += 1
        t += every_s
        clock.advance(every_s)
    return {"requests": seq, "wasted": wasted, "first_spot_s": -1.0 if first_spot is None else first_spot}


def replay_run(extra: dict[str, Any], seeds: int, rate: float) -> dict[str, float]:
    import dataclasses

    from ray_nodeless.simulate.config import config_from_cluster
    from ray_nodeless.simulate.engine import simulate
    from ray_nodeless.trace.model import load_trace

    root = Path(__file__).resolve().parent.parent
    trace = load_trace(str(root / "examples" / "traces" / "automl-published.yaml"))
    cfg = config_from_cluster(str(root / "cluster-configs" / "aws-gpu-head.yaml"), trace.default_schedule, False,
                              reversion=True)
    ttl_ms = int(extra.get("unavailable_ttl_s", cfg.unavailable_ttl_ms / 1000) * 1000)
    cfg = dataclasses.replace(
        cfg, unavailable_ttl_ms=ttl_ms,
        unavailable_cap_ms=int(extra.get("unavailable_backoff_cap_s", cfg.unavailable_cap_ms / 1000) * 1000),
        unavailable_probes=int(extra.get("unavailable_probes", cfg.unavailable_probes)))
    errors = cost = hours = 0.0
    for s in range(seeds):
        r = simulate(trace, cfg, spot_interruptions_per_hour=rate, seed=s, spot_outage_ms=30 * 60_000)
        errors += r.capacity_errors
        cost += r.workload_cost
        hours += r.elapsed_hours
    return {"capacity_errors": errors, "cost": cost / seeds, "hours": hours / seeds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drought-hours", type=float, default=2.0)
    ap.add_argument("--every-s", type=float, default=30.0)
    ap.add_argument("--burst", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rate", type=float, default=0.5, help="spot interruptions per node-hour in the replay")
    args = ap.parse_args()
    logging.disable(logging.CRITICAL)
    drought_s = args.drought_hours * 3600
    live = {name: live_run(extra, drought_s, args.every_s, args.burst) for name, extra in POLICIES.items()}
    print(f"live provider, in-memory cloud: a GPU worker every {args.every_s:g} s and {args.burst} at once every "
          f"{BURST_EVERY_S / 60:g} min through a {args.drought_hours:g} h spot drought, then {AFTER_S / 60:g} min "
          "of spot")
    for name, r in live.items():
        print(f"  {name:9s}: {r['requests']:.0f} create_node calls, {r['wasted']:.0f} launch calls wasted on "
              f"capacity errors, first spot machine {r['first_spot_s']:.0f} s after spot came back")
    fixed, back = live["fixed TTL"], live["backoff"]
    print(f"  wasted calls: backoff / fixed = {back['wasted'] / max(fixed['wasted'], 1):.3f}")
    replay = {name: replay_run(extra, args.seeds, args.rate) for name, extra in POLICIES.items()}
    print(f"replay (published automl sweep, aws-gpu-head, spot first, {args.rate:g} interruptions/node-h + "
          f"30-min drought after each, {args.seeds} seeds)")
    for name, r in replay.items():
        print(f"  {name:9s}: {r['capacity_errors']:.0f} capacity errors, ${r['cost']:.2f} per run, "
              f"{r['hours']:.2f} h")
    f, b = replay["fixed TTL"], replay["backoff"]
    print(f"  capacity errors: backoff / fixed = {b['capacity_errors'] / max(f['capacity_errors'], 1):.3f}; "
          f"cost {100 * (b['cost'] / f['cost'] - 1):+.2f} %")


if __name__ == "__main__":
    main()
