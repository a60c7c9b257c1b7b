#!/usr/bin/env python3
"""The packing's distance to its LP lower bound (issue 29).

    pip install -e ".[bench]"                                    # scipy, for the LP
    .venv/bin/python benches/bench_packing_bound.py              # sizes 10, 100, 1000
    .venv/bin/python benches/bench_packing_bound.py --sizes 100 --json

The demands are bench_open_types.py's (same generator, same seed: CPU 1/2/4/16, GPU 1/2, L4/A100, 64 GiB, label
selectors with a fallback, STRICT_SPREAD placement groups) on `cluster-configs/local-nodeless.yaml` (AWS us-west-2
catalog, spot-first rules, max_workers raised to 5,000). Per size, $/h: (a) every demand's own cheapest fit, summed;
(b) our Packer's plan (the first `OpenTypes.step`, as bench_open_types.py's (b)); the LP lower bound
(benches/lp_bound.py: the demands may use any offering the plan may open that holds them), the same with the
machine-count cuts (still a lower bound, tighter for demands only big machines hold), and the LP with
each demand on the offerings of its own rule only (`own rule`, the issue's literal wording; not a bound of a
packing that puts CPU work on a GPU machine's spare CPUs, see lp_bound.py). Then (a)'s and (b)'s distance to the
bound, the LP's build and solve time, and what each spends on (the plan's machines, the LP's fractional machines
and its cost split over the demand groups).

A bound above (a) or (b) is a bug in the bound (both are feasible packings): the bench fails.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

from lp_bound import lp_bound, require_scipy  # noqa: E402

TOLERANCE = 1e-6      # $/h: the LP solver's feasibility tolerance on sums of a few hundred prices


def measure(n: int, top: int) -> dict[str, Any]:
    from bench_open_types import ShapeOpen, cluster_state, demand_units, own_fit_sum

    from ray_nodeless.providers.base import TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE, Machine
    from ray_nodeless.ray_adapter.open_driver import snapshot_of
    from ray_nodeless.ray_compat.demand import state_from_proto

    state = cluster_state(n)
    so = ShapeOpen(vectorized=False)
    head = {"head-0": Machine("head-0", {TAG_RAY_USER_NODE_TYPE: "head", TAG_RAY_NODE_KIND: "head"})}
    first = so.step(state, head)
    packing = first.packing
    units = [d for d, _ in demand_units(state)]       # one per pending demand (each keeps its request's count)
    demands = snapshot_of(state_from_proto(state)).demands      # as the packer gets them: counted
    assert sum(max(1, d.count) for d in demands) == len(units) == n
    own, own_infeasible = own_fit_sum(so.fitter, units)
    planned = packing.hourly
    bound = lp_bound(so.fitter, demands, extra=packing.types.values())
    cut = lp_bound(so.fitter, demands, extra=packing.types.values(), cuts=True)
    own_rule = lp_bound(so.fitter, demands, own_rule=True)
    for name, value in (("(a) own fits", own), ("(b) our plan", planned)):
        for which, lp in (("LP bound", bound), ("LP bound with cuts", cut)):
            if lp.hourly > value + TOLERANCE:
                raise AssertionError(f"{n} demands: {which} ${lp.hourly:.4f}/h above {name} ${value:.4f}/h")
    if cut.hourly < bound.hourly - TOLERANCE:
        raise AssertionError(f"{n} demands: the cuts lowered the LP (${bound.hourly:.4f} -> ${cut.hourly:.4f})")
    if own_rule.hourly > own + TOLERANCE:
        raise AssertionError(f"{n} demands: own-rule LP ${own_rule.hourly:.4f}/h above (a) ${own:.4f}/h")
    if own_infeasible or bound.infeasible_demands or packing.infeasible:
        raise AssertionError(f"{n} demands: infeasible demands ({own_infeasible}, {bound.infeasible_demands}, "
                             f"{dict(packing.infeasible)}): the figures would not cover the same work")
    spend: Counter[str] = Counter()
    machines: Counter[str] = Counter()
    for t, c in packing.new.items():
        o = packing.types[t].offering
        key = f"{o.instance_type.name} {o.zone} {o.capacity}"
        spend[key] += packing.types[t].price * c
        machines[key] += c
    used, paid = _resources(units, packing)
    return {
        "demands": n, "groups": bound.groups,
        "a_own_fits_per_h": round(own, 4), "b_plan_per_h": round(planned, 4),
        "b_machines": sum(packing.new.values()),
        "lp_bound_per_h": round(bound.hourly, 4), "lp_cuts_per_h": round(cut.hourly, 4),
        "lp_own_rule_per_h": round(own_rule.hourly, 4),
        "a_over_bound_pct": round(100 * (own / bound.hourly - 1), 2),
        "b_over_bound_pct": round(100 * (planned / bound.hourly - 1), 2),
        "a_over_cuts_pct": round(100 * (own / cut.hourly - 1), 2),
        "b_over_cuts_pct": round(100 * (planned / cut.hourly - 1), 2),
        "b_over_own_rule_lp_pct": round(100 * (planned / own_rule.hourly - 1), 2),
        "lp": {k: getattr(bound, k) for k in ("offerings_allowed", "offerings_in_lp", "variables", "constraints")}
        | {"build_ms": round(bound.build_ms, 1), "solve_ms": round(bound.solve_ms, 1)},
        "lp_own_rule": {k: getattr(own_rule, k) for k in ("offerings_allowed", "offerings_in_lp", "variables",
                                                          "constraints")}
        | {"build_ms": round(own_rule.build_ms, 1), "solve_ms": round(own_rule.solve_ms, 1)},
        "lp_cuts_solve_ms": round(cut.solve_ms, 1),
        "demand_resources": used, "plan_resources": paid,
        "plan_spend_per_h": {k: round(v, 4) for k, v in spend.most_common(top)},
        "plan_machines": {k: machines[k] for k, _ in spend.most_common(top)},
        "lp_spend_per_h": {k: round(v, 4) for k, v in list(bound.spend.items())[:top]},
        "lp_machines": {k: round(bound.machines[k], 3) for k in list(bound.spend)[:top]},
        "lp_group_spend_per_h": {k: round(v, 4) for k, v in bound.group_spend.items()},
        "lp_cuts_spend_per_h": {k: round(v, 4) for k, v in list(cut.spend.items())[:top]},
        "lp_cuts_machines": {k: round(cut.machines[k], 3) for k in list(cut.spend)[:top]},
        "lp_cuts_group_spend_per_h": {k: round(v, 4) for k, v in cut.group_spend.items()},
        "lp_cuts_placed": cut.placed,
    }


def _resources(units: list[Any], packing: Any) -> tuple[dict[str, float], dict[str, float]]:
    """CPU, GPU and memory (GiB) the demands ask for, and what the plan's machines have."""
    used: Counter[str] = Counter()
    paid: Counter[str] = Counter()
    for d in units:
        for k, v in d.resources:
            if k in ("CPU", "GPU", "memory"):
                used[k] += v / 1024 ** 3 if k == "memory" else v
    for t, c in packing.new.items():
        for k, v in packing.types[t].resources:
            if k in ("CPU", "GPU", "memory"):
                paid[k] += c * (v / 1024 ** 3 if k == "memory" else v)
    return ({k: round(used[k], 1) for k in ("CPU", "GPU", "memory")},
            {k: round(paid[k], 1) for k in ("CPU", "GPU", "memory")})


def table(runs: list[dict[str, Any]]) -> str:
    lines = ["| demands (groups) | (a) own fits | (b) our plan (machines) | LP bound: (a), (b) over it | "
             "LP with cuts: (a), (b) over it | LP, own rule only | LP build / solve (with cuts) |",
             "|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(
            f"| {r['demands']:,} ({r['groups']}) | ${r['a_own_fits_per_h']:.4f} | ${r['b_plan_per_h']:.4f} "
            f"({r['b_machines']}) | ${r['lp_bound_per_h']:.4f}: {r['a_over_bound_pct']:+.1f} %, "
            f"{r['b_over_bound_pct']:+.1f} % | ${r['lp_cuts_per_h']:.4f}: {r['a_over_cuts_pct']:+.1f} %, "
            f"{r['b_over_cuts_pct']:+.1f} % | ${r['lp_own_rule_per_h']:.4f} | "
            f"{r['lp']['build_ms']:.0f} / {r['lp']['solve_ms']:.0f} ({r['lp_cuts_solve_ms']:.0f}) ms |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,100,1000", help="pending demands per run, comma-separated")
    ap.add_argument("--top", type=int, default=8, help="offerings listed in each spend breakdown")
    ap.add_argument("--json", action="store_true", help="print the runs as JSON on one line (no table)")
    args = ap.parse_args(argv)
    require_scipy()
    logging.getLogger("ray").setLevel(logging.ERROR)
    logging.getLogger("ray_nodeless").setLevel(logging.ERROR)
    runs = [measure(int(s), args.top) for s in args.sizes.split(",")]
    if args.json:
        print(json.dumps(runs))
    else:
        print(table(runs))
        print(json.dumps(runs, indent=2))
    return runs


if __name__ == "__main__":
    main()
