#!/usr/bin/env python3
"""Figures of the seeded fault matrix (ray_nodeless/testing/fault_matrix.py) and of a spot drought.

    .venv/bin/python benches/bench_fault_matrix.py [--seeds 1 2 3] [--steps 600]

Prints: launch requests and create_node calls, faults injected by kind, per-create_node wall time (p50 / p99),
and backend launch calls for one create_node when every spot offering fails (before the bound: one call per
candidate, 345 RunInstances in the reported drought).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ray.autoscaler.node_launch_exception import NodeLaunchException  # noqa: E402

from ray_nodeless.ray_adapter.provider import NodelessProvider  # noqa: E402
from ray_nodeless.testing import fake_backend  # noqa: E402
from ray_nodeless.testing.fault_matrix import PROVIDER, SHAPES, WORKER_TAGS, Matrix  # noqa: E402


def drought_calls(spot_only: bool) -> int:
    """Backend launch calls of one create_node when every spot offering (or every offering) fails."""
    cloud = fake_backend.reset()
    cloud.capacity_faults[("*", "*", "spot" if spot_only else "*")] = "InsufficientInstanceCapacity"
    cfg = {k: v for k, v in PROVIDER.items() if k != "max_candidates_per_launch"}     # the default bound
    p = NodelessProvider(cfg, "drought")
    tags = dict(WORKER_TAGS, **{"ray-user-node-type": "gpu", "ray-launch-request": "r"})
    try:
        p.create_node_with_resources_and_labels({}, tags, 1, SHAPES["gpu"], {})
    except NodeLaunchException:
        pass
    return cloud.calls.get("launch", 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    t0 = time.perf_counter()
    requests = calls = launched = refused = 0
    faults: dict[str, int] = {}
    walls: list[float] = []
    for seed in args.seeds:
        s = Matrix(seed).run(args.steps)
        requests += s.requests
        calls += len(s.launch_wall_s)
        launched += s.launched
        refused += s.refused
        walls += s.launch_wall_s
        for k, v in s.faults.items():
            faults[k] = faults.get(k, 0) + v
    q = statistics.quantiles(walls, n=100)
    print(f"fault matrix: seeds {args.seeds}, {args.steps} steps each, {time.perf_counter() - t0:.1f} s")
    print(f"  launch requests {requests}, create_node calls {calls}, machines launched {launched}, "
          f"calls refused {refused}")
    print(f"  faults injected {sum(faults.values())}: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())))
    print(f"  per create_node wall time: p50 {q[49] * 1000:.2f} ms, p99 {q[98] * 1000:.2f} ms")
    print("  invariants held after every step (machines == returned, no duplicate, no leak, no foreign machine "
          "touched, no query exception, no forbidden offering)")
    print(f"drought: {drought_calls(True)} backend launch calls when every spot offering fails (then on-demand), "
          f"{drought_calls(False)} when every offering fails")


if __name__ == "__main__":
    main()
