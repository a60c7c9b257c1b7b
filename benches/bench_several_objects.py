#!/usr/bin/env python3
"""Provider objects of one cluster in several processes launching at the same moment, under `max_hourly_cost`:
the highest hourly cost the cloud then runs, as a multiple of the cap, with the cost-cap ledger shared (one
machine's objects: one events dir) and without it (a ledger each: objects on different machines), same run,
interleaved. The real AWS backend against moto; each process launches 6 x {CPU: 4, GPU: 1}
(ray_nodeless/testing/several_objects.py).

    .venv/bin/python benches/bench_several_objects.py [--processes 2 3 4] [--reps 5] [--cap 1.0]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ray_nodeless.testing import several_objects as SO  # noqa: E402
from ray_nodeless.testing.fault_matrix.aws import REGION, provider_config  # noqa: E402
from ray_nodeless.testing.moto_server import start_moto_server  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cap", type=float, default=1.0)
    args = ap.parse_args()
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
