#!/usr/bin/env python3
"""Provider objects of one cluster in several processes launching at the same moment, under `max_hourly_cost`:
the highest hourly cost the cloud then runs, as a multiple of the cap, with the cost-cap ledger shared (one
machine's objects: one events dir) and without it (a ledger each: objects on different machines), same run,
interleaved. The real AWS backend against moto; each process launches 6 x {CPU: 4, GPU: 1}
(ray_nodeless/testing/several_objects.py).

    .venv/bin/python benches/bench_several_objects.py [--processes 2 3 4] [--reps 5] [--cap 1.0]

It also prints what the ledger costs a capped create_node: NodelessProvider.create_node_with_resources_and_labels
on the in-memory backend (the provider's own cost, no cloud latency), with the ledger and with the same provider's
budget given none, interleaved, median of `--calls` each.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ray_nodeless.testing import several_objects as SO  # noqa: E402
from ray_nodeless.testing.fault_matrix.aws import REGION, provider_config  # noqa: E402
from ray_nodeless.testing.moto_server import start_moto_server  # noqa: E402


def ledger_cost(calls: int) -> tuple[float, float]:
    """Median ms per capped create_node (launch, then terminate, so the cap never binds): with the ledger, without."""
    from ray_nodeless.ray_adapter.provider import NodelessProvider
    from ray_nodeless.testing import fake_backend
    from ray_nodeless.testing.fault_matrix import PROVIDER, WORKER_TAGS

    fake_backend.reset()
    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as events:
        p = NodelessProvider(dict(PROVIDER, max_hourly_cost=100.0, events_dir=events), "c1")
        budget = p.launcher.budget
        assert budget is not None and budget.shared is not None
        shared = budget.shared
        for i in range(calls):
            for with_ledger in (True, False):
                budget.shared = shared if with_ledger else None
                tags = dict(WORKER_TAGS, **{"ray-user-node-type": "gpu", "ray-launch-request": f"o-{i}-{with_ledger}"})
                t0 = time.perf_counter()
                ids = p.create_node_with_resources_and_labels({}, tags, 1, {"CPU": 4, "GPU": 1}, {})
                times[with_ledger].append((time.perf_counter() - t0) * 1000)
                p.terminate_nodes(list(ids))
    return statistics.median(times[True]), statistics.median(times[False])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cap", type=float, default=1.0)
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    with_ledger, without = ledger_cost(args.calls)
    print(f"capped create_node on the in-memory backend, median of {args.calls}: {with_ledger:.3f} ms with the "
          f"ledger, {without:.3f} ms without ({with_ledger - without:+.3f} ms)")
    moto = start_moto_server()
    try:
        ec2 = moto.client("ec2", REGION)
        config = dict(provider_config(moto), max_hourly_cost=args.cap)
        print(f"cap ${args.cap:.2f}/h; each process launches {SO.COUNT} x {SO.GPU}; {args.reps} reps, interleaved")
        print(f"{'processes':>9}  {'ledger':>8}  {'max x cap':>9}  {'median x cap':>12}  {'launched (median)':>17}")
        for n in args.processes:
            figures: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
            for _ in range(args.reps):
                for shared in (True, False):
                    moto.reset()
                    with tempfile.TemporaryDirectory() as work:
                        out = SO.launch_at_once(config, n, Path(work), shared=shared, ec2=ec2, quiet=True)
                    figures[shared].append((out.cost / args.cap, sum(1 for a in out.answers if "ids" in a)))
            for shared in (True, False):
                ratios = [r for r, _ in figures[shared]]
                print(f"{n:>9}  {'shared' if shared else 'each own':>8}  {max(ratios):>9.2f}  "
                      f"{statistics.median(ratios):>12.2f}  "
                      f"{statistics.median(k for _, k in figures[shared]):>17.0f}")
    finally:
        moto.server.stop()


if __name__ == "__main__":
    main()
