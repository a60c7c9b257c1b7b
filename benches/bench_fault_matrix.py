#!/usr/bin/env python3
"""Figures of the seeded fault matrix (ray_nodeless/testing/fault_matrix/) per backend, and of a spot drought.

    .venv/bin/python benches/bench_fault_matrix.py [--backends fake aws aws-no-client-token gcp] [--seeds 1 2 3]
        [--steps fake=600 aws=150 aws-no-client-token=150 gcp=200] [--capped]

`--capped`: the capped matrix instead (provider.max_hourly_cost per backend, CAPS; bursts of concurrent and
Ray v2 parallel-batch create_node calls, fresh providers, orphans of failed calls; tests/launch/test_fault_matrix.py's
capped tests, default steps CAPPED_STEPS): prints the highest hourly cost the cloud held against the cap.

Per backend (in-memory; the real AWS backend against moto, with EC2's ClientToken semantics emulated on the wire
and without them, as an endpoint that ignores the token; the real GCP backend against the fake Compute server):
launch requests and create_node calls, faults injected by kind, duplicates (machines a batch made beyond its
count), returned-but-terminated ids, offerings misread as interrupted, issue 28's figures (young machines ended
outside, Ray retries after outside terminations and how many failed, machines reported terminated while running,
cap refusals caused by phantoms), per-create_node wall time (p50 / p99), wall
time, and backend launch calls (RunInstances / instances.insert) for one create_node when every spot offering
fails (and when every offering fails). The default steps are the test suite's (tests/launch/test_fault_matrix.py), so
`--seeds 1` for aws and gcp reproduces its figures.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ray.autoscaler.node_launch_exception import NodeLaunchException  # noqa: E402

from ray_nodeless.testing.fault_matrix import WORKER_TAGS, FakeWorld, Matrix, Stats  # noqa: E402
from ray_nodeless.testing.fault_matrix.world import World  # noqa: E402

STEPS = {"fake": 600, "aws": 150, "aws-no-client-token": 150, "gcp": 200}
CAPS = {"fake": 12.0, "aws": 2.0, "aws-no-client-token": 2.0, "gcp": 3.0}
CAPPED_STEPS = {"fake": 600, "aws": 60, "aws-no-client-token": 60, "gcp": 80}
CAP: dict[str, float | None] = {"cap": None}     # set by --capped: the cap of the backend being run


def drought(world: World, fail_spot: Callable[[bool], None], launches: Callable[[], int], spot_only: bool) -> int:
    """Backend launch calls of one create_node of the GPU shape (spot first) when every spot offering (or every
    offering) fails, with the default candidate bound."""
    world.start()
    cfg = {k: v for k, v in world.provider_config.items() if k != "max_candidates_per_launch"}
    world.provider_config, saved = cfg, world.provider_config
    try:
        p = world.new_provider()
    finally:
        world.provider_config = saved
    fail_spot(spot_only)
    before = launches()
    tags = dict(WORKER_TAGS, **{"ray-user-node-type": "gpu", "ray-launch-request": f"drought-{spot_only}"})
    try:
        p.create_node_with_resources_and_labels({}, tags, 1, world.shapes["gpu"], {})
    except NodeLaunchException:
        pass
    world.clear_launch_faults()
    return launches() - before


def fake_backend_run(seeds: list[int], steps: int) -> tuple[list[Stats], tuple[int, int]]:
    from ray_nodeless.testing import fake_backend

    stats = [Matrix(FakeWorld(), s, cap=CAP["cap"]).run(steps) for s in seeds]
    w = FakeWorld()

    def fail(spot_only: bool) -> None:
        w.cloud.capacity_faults[("*", "*", "spot" if spot_only else "*")] = "InsufficientInstanceCapacity"
    return stats, (drought(w, fail, lambda: fake_backend.CLOUD.calls.get("launch", 0), True),
                   drought(w, fail, lambda: fake_backend.CLOUD.calls.get("launch", 0), False))


def aws_run(seeds: list[int], steps: int, honour_token: bool = True) -> tuple[list[Stats], tuple[int, int]]:
    from ray_nodeless.testing.fault_matrix.aws import AwsWorld
    from ray_nodeless.testing.moto_server import start_moto_server

    srv = start_moto_server()
    try:
        stats = [Matrix(AwsWorld(srv, honour_token), s, cap=CAP["cap"]).run(steps) for s in seeds]
        w = AwsWorld(srv, honour_token)

        def fail(spot_only: bool) -> None:
            w.wire.capacity.append(("*", "spot" if spot_only else "*"))
        return stats, (drought(w, fail, lambda: w.wire.requests["RunInstances"], True),
                       drought(w, fail, lambda: w.wire.requests["RunInstances"], False))
    finally:
        srv.server.stop()


def gcp_run(seeds: list[int], steps: int) -> tuple[list[Stats], tuple[int, int]]:
    from ray_nodeless.testing.fault_matrix.gcp import PROJECT, GcpWorld, RecordingGce

    with RecordingGce(project=PROJECT) as fake:
        stats = [Matrix(GcpWorld(fake), s, cap=CAP["cap"]).run(steps) for s in seeds]
        w = GcpWorld(fake)

        def fail(spot_only: bool) -> None:
            w._arm(fake.fail_insert(spot=True if spot_only else None, times=None))
        return stats, (drought(w, fail, lambda: fake.count("instances.insert"), True),
                       drought(w, fail, lambda: fake.count("instances.insert"), False))


RUNS: dict[str, Callable[[list[int], int], tuple[list[Stats], tuple[int, int]]]] = {
    "fake": fake_backend_run, "aws": aws_run,
    "aws-no-client-token": lambda seeds, steps: aws_run(seeds, steps, honour_token=False), "gcp": gcp_run}


def report(name: str, seeds: list[int], steps: int, stats: list[Stats], dry: tuple[int, int]) -> dict[str, Any]:
    faults: dict[str, int] = {}
    walls: list[float] = []
    for s in stats:
        walls += s.launch_wall_s
        for k, v in s.faults.items():
            faults[k] = faults.get(k, 0) + v
    q = statistics.quantiles(walls, n=100)
    row = {"requests": sum(s.requests for s in stats), "calls": sum(s.calls for s in stats),
           "launched": sum(s.launched for s in stats), "refused": sum(s.refused for s in stats),
           "wall_s": sum(s.wall_s for s in stats)}
    print(f"{name}: seeds {seeds}, {steps} steps each, {row['wall_s']:.1f} s")
    print(f"  launch requests {row['requests']}, create_node calls {row['calls']}, machines launched "
          f"{row['launched']}, calls refused {row['refused']}")
    print(f"  faults injected {sum(faults.values())}: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())))
    print(f"  duplicates {sum(s.duplicates for s in stats)}, returned-but-terminated "
          f"{sum(s.returned_terminated for s in stats)}, offerings misread as interrupted "
          f"{sum(s.misread_interruptions for s in stats)}")
    print(f"  issue 28: {sum(s.young_ended for s in stats)} young machines ended outside before any listing, "
          f"{sum(s.outside_retries for s in stats)} Ray retries after outside terminations "
          f"({sum(s.failed_retries for s in stats)} failed); machines reported terminated while running "
          f"{sum(s.terminated_while_running for s in stats)}, cap refusals caused by phantoms "
          f"{sum(s.phantom_refusals for s in stats)}")
    if stats and stats[0].cap is not None:
        print(f"  capped: max hourly cost reached ${max(s.max_cost for s in stats):.4f} vs cap "
              f"${stats[0].cap:.4f}; {sum(s.bursts for s in stats)} bursts, "
              f"{sum(s.cost_refused for s in stats)} calls refused by the cap, "
              f"{sum(s.orphans for s in stats)} orphans of failed calls")
    print(f"  per create_node wall time: p50 {q[49] * 1000:.2f} ms, p99 {q[98] * 1000:.2f} ms")
    print(f"  drought: {dry[0]} backend launch calls when every spot offering fails (then on-demand), "
          f"{dry[1]} when every offering fails")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="default: 1 2 3 for fake, 1 for aws and gcp (the suite's)")
    ap.add_argument("--steps", nargs="*", default=[], help="per backend, e.g. aws=300")
    ap.add_argument("--capped", action="store_true", help="run the capped matrix (CAPS, CAPPED_STEPS)")
    args = ap.parse_args()
    logging.disable(logging.CRITICAL)
    steps = dict(CAPPED_STEPS if args.capped else STEPS, **{k: int(v) for k, v in (s.split("=") for s in args.steps)})
    total = 0
    t0 = time.perf_counter()
    for name in args.backends:
        seeds = args.seeds or ([1] if args.capped else [1, 2, 3] if name == "fake" else [1])
        CAP["cap"] = CAPS[name] if args.capped else None
        stats, dry = RUNS[name](seeds, steps[name])
        total += report(name, seeds, steps[name], stats, dry)["requests"]
    print(f"total: {total} launch requests in {time.perf_counter() - t0:.1f} s; invariants held after every step "
          "(machines == returned, no duplicate, no leak, no foreign machine touched, no query exception, no "
          "forbidden offering)")


if __name__ == "__main__":
    main()
