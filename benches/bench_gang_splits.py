#!/usr/bin/env python3
"""Placement groups of equal bundles (PACK / SPREAD, not STRICT_*): what the shape-open packer opens for k bundles,
against the two splits it tried before issue 29 (one machine per bundle; one machine for all), on the AWS us-west-2
catalog with `cluster-configs/local-nodeless.yaml`'s rules (spot first). Pure planning, no cloud; about a second.

    .venv/bin/python benches/bench_gang_splits.py [--json]
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ray_nodeless.core.demand import Demand, canonical_resources  # noqa: E402
from ray_nodeless.core.open_pack import Packer  # noqa: E402
from ray_nodeless.core.open_plan import OpenFitter  # noqa: E402
from ray_nodeless.core.planner import Planner  # noqa: E402
from ray_nodeless.core.settings import Resolver  # noqa: E402
from ray_nodeless.operate.config import catalog_for, load_provider  # noqa: E402
from ray_nodeless.core.cluster_plan import load_cluster_yaml  # noqa: E402
from ray_nodeless.core.availability import UnavailableOfferings  # noqa: E402
from ray_nodeless.errors import NoFeasibleOffering  # noqa: E402

GIB = 2 ** 30
CASES = [({"CPU": 3}, 3), ({"CPU": 3}, 6), ({"CPU": 3}, 8), ({"CPU": 6}, 3), ({"CPU": 6}, 6), ({"CPU": 10}, 4),
         ({"CPU": 2, "memory": 20 * GIB}, 5), ({"CPU": 1, "memory": 12 * GIB}, 8), ({"CPU": 1, "GPU": 1}, 4),
         ({"CPU": 4, "GPU": 1}, 8)]


def fitter() -> OpenFitter:
    cfg = load_cluster_yaml(str(ROOT / "cluster-configs" / "local-nodeless.yaml"))
    bundle = load_provider(cfg["provider"])
    resolver = Resolver(bundle.core, bundle.requirement_overrides)
    return OpenFitter(resolver, Planner(catalog_for(bundle.core)), UnavailableOfferings(180),
                      bundle.core.open_node_config)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    f = fitter()
    rows = []
    for shape, k in CASES:
        unit = Demand(canonical_resources(shape))
        zone = f.fit(unit).offering.zone
        price = {}
        for m in (1, k):
            try:
                price[m] = f.fit(Demand(canonical_resources({a: v * m for a, v in shape.items()})), None, zone,
                                 quiet=True).price
            except NoFeasibleOffering:
                price[m] = float("inf")
        p = Packer(f).pack([Demand(canonical_resources(shape), gang="pg") for _ in range(k)], [])
        rows.append({"bundle": {a: (v / GIB if a == "memory" else v) for a, v in shape.items()}, "k": k,
                     "one_each": round(k * price[1], 4), "all_on_one": round(price[k], 4),
                     "packer": round(p.hourly, 4), "machines": dict(sorted(p.new.items()))})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("| bundle | k | one machine each | all on one | the packer | what it opens |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        b = ", ".join(f"{a}: {v:g}{' GiB' if a == 'memory' else ''}" for a, v in r["bundle"].items())
        opens = " + ".join(f"{c} x {n.removeprefix('nl-').rsplit('-us-', 1)[0]}" for n, c in r["machines"].items())
        print(f"| {{{b}}} | {r['k']} | ${r['one_each']:.4f} | ${r['all_on_one']:.4f} | **${r['packer']:.4f}** | "
              f"{opens} |")


if __name__ == "__main__":
    main()
