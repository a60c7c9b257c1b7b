"""The packing's linear-programming lower bound (issue 29): the cheapest fractional cover of a demand set.

For demands `D` under a cluster's rules (an `OpenFitter`: the resolver's rules, exclusions, pins, price caps, the
planner's catalog), group identical demands (same resources and label selectors; a group `d` of `n_d` demands) and
let `O` be the offerings a demand may be placed on. Variables: `x_o >= 0`, the (fractional) number of machines of
offering `o`, and `y_{d,o} >= 0`, how many demands of group `d` are on machines of `o`, only where one machine of
`o` holds one demand of `d`:

    minimise    sum_o price_o * x_o                                      ($/h)
    subject to  sum_o y_{d,o} = n_d                      for every group d
                sum_d req_{d,o,r} * y_{d,o} <= cap_{o,r} * x_o   for every offering o and resource r

`cap_{o,r}` is the machine's Ray resources as `instance_resources` gives them (CPU, GPU, memory = 70 % of the RAM,
`accelerator_type:<model>` = 1); `req_{d,o,r}` is the demand as the packer places it on such a machine (its
`accelerator_type:<name>` read as the machine's model). Any whole packing (our Packer's plan, or each demand on its own
cheapest fit) is a feasible point with `x_o` the machines it opens, so the optimum is a lower bound of every packing
that uses only these offerings.

Which offerings a group may use (`O`, per group):
- `own_rule=True`: exactly what the fitter chooses from for the demand (`OpenFitter.allowed`: the plan's candidates
  under the demand's rule that hold it and match one of its label selectors; a selector with fallbacks may be
  served under any of them, as Ray serves it, so the union over its selectors).
- `own_rule=False` (the bound the bench checks against our plan): also any offering allowed for another group (or
  opened by a plan passed as `extra`) whose machine holds the demand and matches a selector. The packer, like Ray's
  scheduler, puts work on any machine opened in the same pass that has room: a CPU task goes on the spare CPUs of a
  GPU machine opened for a GPU task, though the planner never offers a GPU machine for a CPU-only demand
  (`gpu_not_requested`). With own rules only, the LP cannot do that, so it can lie above a packing that does: not a
  lower bound of our packer's plan.

With `cuts=True`, one more row per group (valid for any whole packing, so the optimum stays a lower bound and can
only rise): the machines that may hold group `d` number at least `ceil(n_d / k_d)`, `k_d` the most demands of `d`
one such machine holds (`sum_{o allowed for d} x_o >= ceil(n_d / max_o k_{d,o})`). It is what the plain LP misses
for a group that no small machine holds: one A100 demand needs a whole 8-GPU p4d.24xlarge ($6.205/h), where the
plain LP pays 1/8 of it.

Relaxations (each only lowers the optimum, so the bound stays a lower bound): machines are fractional; a
placement group's bundles are separate demands (no STRICT_SPREAD one-bundle-per-machine, no STRICT_PACK one machine,
no single zone); existing nodes are not counted (the bench has none but a CPU-0 head).

To keep the LP small: offerings with the same resources and groups are one (the cheapest), and an offering
is dropped when another has >= every resource, <= the price and serves a superset of its groups (it is never needed
for the optimum). Solved with `scipy.optimize.linprog(method="highs")` on sparse matrices; scipy is the optional
`bench` dependency group (`pip install -e ".[bench]"`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from ray_nodeless.core.catalog import Offering
from ray_nodeless.core.demand import Demand, NodeCapacity, Selector, fits, offering_labels
from ray_nodeless.core.node_resources import instance_resources
from ray_nodeless.core.open_pack import _bin_view
from ray_nodeless.core.open_plan import OpenFitter, OpenType
from ray_nodeless.errors import NoFeasibleOffering

SCALE = {"memory": 1 / 1024 ** 3}       # memory rows in GiB: coefficients near the CPUs' keep the LP well scaled
INSTALL_HINT = 'the LP bound needs scipy: pip install -e ".[bench]"'


def require_scipy() -> None:
    """Fail with the install command when scipy is missing (it is not a dependency of the provider)."""
    try:
        import scipy.optimize  # noqa: F401
        import scipy.sparse  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"{INSTALL_HINT} ({e})") from None


@dataclass
class Bound:
    """The LP's optimum and what it is made of."""

    hourly: float                                   # $/h, the lower bound
    groups: int
    demands: int
    infeasible_demands: int                         # demands no allowed offering holds (not in the bound)
    offerings_allowed: int                          # distinct offerings some group may use
    offerings_in_lp: int                            # after merging equal ones and dropping dominated ones
    variables: int
    constraints: int
    solve_ms: float                                 # linprog alone
    build_ms: float                                 # allowed offerings, pruning, matrices
    machines: dict[str, float] = field(default_factory=dict)    # offering -> fractional machines (x_o > 0)
    spend: dict[str, float] = field(default_factory=dict)       # offering -> $/h in the optimum
    group_spend: dict[str, float] = field(default_factory=dict)  # group -> $/h (the machines' cost by share)
    placed: dict[str, dict[str, float]] = field(default_factory=dict)   # group -> offering -> demands (y > 0)


def group_demands(demands: Iterable[Demand]) -> list[tuple[Demand, int]]:
    """Identical demands (resources and selectors) as one group with a count; gang bundles join as single demands."""
    counts: dict[tuple[Any, ...], int] = {}
    first: dict[tuple[Any, ...], Demand] = {}
    for d in demands:
        key = (d.resources, d.selectors)
        counts[key] = counts.get(key, 0) + max(1, d.count)
        first.setdefault(key, Demand(d.resources, d.selectors))
    return [(first[k], counts[k]) for k in sorted(counts, key=lambda k: (k[0], tuple(s.describe() for s in k[1])))]


def _own_allowed(fitter: OpenFitter, d: Demand) -> dict[Offering, OpenType]:
    out: dict[Offering, OpenType] = {}
    sels: tuple[Selector | None, ...] = d.selectors or (None,)
    for sel in sels:
        try:
            for t in fitter.allowed(d, sel):
                out.setdefault(t.offering, t)
        except NoFeasibleOffering:
            continue
    return out


def _caps(o: Offering) -> dict[str, float]:
    return instance_resources(o.instance_type, {})


def _need(d: Demand, o: Offering, caps: dict[str, float], labels: dict[str, str]) -> dict[str, float] | None:
    """The demand as the packer places it on a machine of `o` (`Packer._single`'s check), or None if it doesn't fit."""
    if not d.accepts(labels):
        return None
    view = _bin_view(d.res, NodeCapacity(str(o), dict(caps), labels))
    return view if fits(caps, view) else None


def lp_bound(fitter: OpenFitter, demands: Iterable[Demand], own_rule: bool = False,
             extra: Iterable[OpenType] = (), cuts: bool = False) -> Bound:
    """The LP lower bound of packing `demands` (module docstring). `extra`: offerings a plan opened, which the
    demands may use besides the allowed ones (ignored with `own_rule`). `cuts`: add the machine-count cuts."""
    import numpy as np
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    t0 = time.perf_counter()
    groups = group_demands(demands)
    allowed = [_own_allowed(fitter, d) for d, _ in groups]
    offerings: dict[Offering, None] = {}
    for a in allowed:
        offerings.update(dict.fromkeys(a))
    if not own_rule:
        offerings.update(dict.fromkeys(t.offering for t in extra))
    caps = {o: _caps(o) for o in offerings}
    labels = {o: offering_labels(o) for o in offerings}
    # need[(g, o)]: group g's demand on a machine of o, where o may serve it.
    need: dict[tuple[int, Offering], dict[str, float]] = {}
    for g, (d, _) in enumerate(groups):
        for o in (allowed[g] if own_rule else offerings):
            n = _need(d, o, caps[o], labels[o])
            if n is not None:
                need[g, o] = n
            elif o in allowed[g]:
                raise AssertionError(f"{o} is allowed for {d.describe()} but does not hold it")
    served: dict[Offering, int] = {}
    for g, o in need:
        served[o] = served.get(o, 0) | (1 << g)
    feasible = {g for g, _ in need}
    infeasible = sum(n for g, (_, n) in enumerate(groups) if g not in feasible)
    kept = _prune([o for o in offerings if o in served], caps, served)

    # Columns: x_o for each kept offering, then y_{g,o}. Rows: one equality per group, one <= per (o, resource).
    x_col = {o: i for i, o in enumerate(kept)}
    y_cols = [(g, o) for o in kept for g in range(len(groups)) if (g, o) in need]
    nx = len(kept)
    eq_r: list[int] = []
    eq_c: list[int] = []
    eq_v: list[float] = []
    ub_r: list[int] = []
    ub_c: list[int] = []
    ub_v: list[float] = []
    row: dict[tuple[Offering | None, str], int] = {}
    floors: list[float] = []       # the cuts' right-hand sides (their rows come after the resource rows)
    for o in kept:
        for k, cap in caps[o].items():       # a demand's every resource is one the machine has (it fits)
            row[o, k] = len(row)
            ub_r.append(row[o, k])
            ub_c.append(x_col[o])
            ub_v.append(-cap * SCALE.get(k, 1.0))
    group_row = {g: i for i, g in enumerate(sorted(feasible))}
    for j, (g, o) in enumerate(y_cols):
        eq_r.append(group_row[g])
        eq_c.append(nx + j)
        eq_v.append(1.0)
        for k, v in need[g, o].items():
            if v > 0:
                ub_r.append(row[o, k])
                ub_c.append(nx + j)
                ub_v.append(v * SCALE.get(k, 1.0))
    if cuts:
        for g in sorted(feasible):
            on = [o for o in kept if (g, o) in need]
            most = max(_units(need[g, o], caps[o]) for o in on)
            row[None, str(g)] = r = len(row)        # -sum x_o <= -machines: at least that many hold the group
            ub_r.extend([r] * len(on))
            ub_c.extend(x_col[o] for o in on)
            ub_v.extend([-1.0] * len(on))
            floors.append(-float(math.ceil(groups[g][1] / most - 1e-9)))
    ncol = nx + len(y_cols)
    cost = np.zeros(ncol)
    cost[:nx] = [o.hourly_price or 0.0 for o in kept]
    a_ub = coo_matrix((ub_v, (ub_r, ub_c)), shape=(len(row), ncol)).tocsr()
    a_eq = coo_matrix((eq_v, (eq_r, eq_c)), shape=(len(group_row), ncol)).tocsr()
    b_eq = np.array([float(groups[g][1]) for g in sorted(feasible)])
    build_ms = (time.perf_counter() - t0) * 1000
    t1 = time.perf_counter()
    b_ub = np.array([0.0] * (len(row) - len(floors)) + floors)
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    solve_ms = (time.perf_counter() - t1) * 1000
    if res.status != 0:
        raise RuntimeError(f"linprog failed: {res.message}")
    x = res.x
    machines = {_name(o): float(x[x_col[o]]) for o in kept if x[x_col[o]] > 1e-9}
    spend = {_name(o): float(x[x_col[o]] * (o.hourly_price or 0.0)) for o in kept if x[x_col[o]] > 1e-9}
    group_spend = _group_spend(groups, y_cols, x[nx:], need, caps, x, x_col)
    placed: dict[str, dict[str, float]] = {}
    for (g, o), v in zip(y_cols, x[nx:]):
        if v > 1e-9:
            placed.setdefault(groups[g][0].describe(), {})[_name(o)] = round(float(v), 3)
    return Bound(hourly=float(res.fun), groups=len(groups), demands=sum(n for _, n in groups),
                 infeasible_demands=infeasible, offerings_allowed=len(offerings), offerings_in_lp=len(kept),
                 variables=ncol, constraints=len(row) + len(group_row), solve_ms=solve_ms, build_ms=build_ms,
                 machines=dict(sorted(machines.items(), key=lambda kv: -spend[kv[0]])),
                 spend=dict(sorted(spend.items(), key=lambda kv: -kv[1])), group_spend=group_spend,
                 placed=placed)


def _units(need: dict[str, float], caps: dict[str, float]) -> int:
    """How many demands of `need` one machine of `caps` holds (each resource whole: the packer's `fits`)."""
    return max(1, min(int(caps[k] / v + 1e-9) for k, v in need.items() if v > 0))


def _name(o: Offering) -> str:
    return f"{o.instance_type.name} {o.zone} {o.capacity}"


def _prune(offerings: list[Offering], caps: dict[Offering, dict[str, float]], served: dict[Offering, int]
           ) -> list[Offering]:
    """Offerings that can be in an optimum: one per (resources, groups served), the cheapest, and none dominated
    (another with >= every resource, <= price, serving a superset of its groups; ties keep the earlier one)."""
    import numpy as np

    cheapest: dict[tuple[Any, ...], Offering] = {}
    for o in sorted(offerings, key=lambda o: (o.hourly_price or 0.0, _name(o))):
        cheapest.setdefault((tuple(sorted(caps[o].items())), served[o]), o)
    cand = list(cheapest.values())          # price order
    keys = sorted({k for o in cand for k in caps[o]})
    res = np.array([[caps[o].get(k, 0.0) for k in keys] for o in cand])
    price = np.array([o.hourly_price or 0.0 for o in cand])
    masks = [served[o] for o in cand]
    kept = []
    for i, o in enumerate(cand):
        # candidates j < i are no dearer (price order); any with >= every resource and a superset of groups wins.
        better = np.nonzero((res[:i] >= res[i] - 1e-9).all(axis=1) & (price[:i] <= price[i] + 1e-12))[0]
        if not any((masks[j] & masks[i]) == masks[i] for j in better):
            kept.append(o)
    return kept


def _group_spend(groups: list[tuple[Demand, int]], y_cols: list[tuple[int, Offering]], y: Any,
                 need: dict[tuple[int, Offering], dict[str, float]], caps: dict[Offering, dict[str, float]],
                 x: Any, x_col: dict[Offering, int]) -> dict[str, float]:
    """The optimum's $/h split over the groups: each offering's cost shared by the groups on it, by their share of
    the resource that offering is fullest of (a reading aid for where the bound is cheap, not part of the bound)."""
    by_o: dict[Offering, list[tuple[int, float]]] = {}
    for (g, o), v in zip(y_cols, y):
        if v > 1e-9:
            by_o.setdefault(o, []).append((g, float(v)))
    out: dict[str, float] = {}
    for o, placed in by_o.items():
        machines = float(x[x_col[o]])
        if machines <= 1e-12:
            continue
        use = {k: sum(need[g, o].get(k, 0.0) * v for g, v in placed) / (caps[o][k] * machines)
               for k in caps[o] if caps[o][k] > 0}
        top = max(use, key=lambda k: use[k])
        total = sum(need[g, o].get(top, 0.0) * v for g, v in placed) or 1.0
        for g, v in placed:
            label = groups[g][0].describe()
            out[label] = out.get(label, 0.0) + (o.hourly_price or 0.0) * machines * need[g, o].get(top, 0.0) * v / total
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
