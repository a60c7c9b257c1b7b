"""Shape-open packing, the pure part: many pending demands -> the machines to open (core/open_plan.py fits one).

`Packer.pack(...)` is first-fit-decreasing in the Karpenter way: demands whose own cheapest fit is dearest first (then
by GPU, CPU, memory) go onto the free capacity of nodes that exist or are launching, then onto machines opened in
this pass, and only then open a new machine, the demand's own cheapest fit (or a bigger one that serves several of
its units cheaper per unit). A placement group (gang) is placed as a whole: bundles of a STRICT_SPREAD gang on
distinct machines, a STRICT_PACK gang on one, and all of a gang's new machines in one zone (`single_zone_gangs`),
trying the zones in the order of the gang's cheapest fit. What no allowed offering can serve is returned with the
reason (the rule or exclusion that removed its last candidate, from the planner's own explanation).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ray_nodeless.core.demand import (ACCELERATOR_RESOURCE, ACCELERATOR_TYPE, Demand, NodeCapacity, fits,
                                      take)
from ray_nodeless.core.open_plan import OpenFitter, OpenType, group_sizes, held_as
from ray_nodeless.core.catalog import Offering
from ray_nodeless.errors import ConfigError, NoFeasibleOffering


@dataclass
class Packing:
    """What one pass decided: machines to open per generated type, and demands nothing allowed can serve."""

    new: Counter[str] = field(default_factory=Counter)          # type name -> machines
    types: dict[str, OpenType] = field(default_factory=dict)
    infeasible: dict[Demand, str] = field(default_factory=dict)  # demand -> why (the planner's reason)

    @property
    def hourly(self) -> float:
        return sum(self.types[n].price * c for n, c in self.new.items())


def _size_key(d: Demand) -> tuple[object, ...]:
    """Demands with label selectors first (they can use fewer machines), then largest first (`pack` puts the
    dearest own fit before this)."""
    r = d.res
    return (not d.selectors, -r.get("GPU", 0.0), -r.get("CPU", 0.0), -r.get("memory", 0.0), d.resources,
            tuple(s.describe() for s in d.selectors))


class Packer:
    """First-fit-decreasing over nodes that exist, are launching, or are opened in this pass."""

    def __init__(self, fitter: OpenFitter, single_zone_gangs: bool = True):
        self.fitter = fitter
        self.single_zone_gangs = single_zone_gangs

    def pack(self, demands: Iterable[Demand], nodes: Iterable[NodeCapacity]) -> Packing:
        """Both ways of opening machines for a demand's units that fit nowhere (`_single`): the cheapest mix of
        machine sizes for all of them at once, and the machine cheapest per unit, one at a time (whose spare room
        the demands after it may fill); the cheaper packing of the two (BENCHMARKS "distance to its LP lower
        bound": the mix wins at 100 demands, one at a time at 1,000)."""
        demands, nodes = list(demands), list(nodes)
        greedy = self._pack(demands, nodes, mix=False)
        if not any(d.count > 1 and not d.gang for d in demands):
            return greedy           # one unit per demand: both ways open the same machines (gangs: the mix always)
        mixed = self._pack(demands, nodes, mix=True)
        return mixed if mixed.hourly < greedy.hourly - 1e-9 else greedy

    def _pack(self, demands: list[Demand], nodes: list[NodeCapacity], mix: bool) -> Packing:
        out = Packing()
        bins = [NodeCapacity(n.name, dict(n.free), dict(n.labels), n.node_type, n.zone, set(n.hosts), n.has_gpu)
                for n in sorted(nodes, key=lambda n: n.name)]
        gangs: dict[str, list[Demand]] = {}
        singles: list[Demand] = []
        for d in demands:
            (gangs.setdefault(d.gang, []) if d.gang else singles).append(d)
        for gid in sorted(gangs):
            self._gang(gid, gangs[gid], bins, out)
        # The dearest machines first: their spare room takes the rest (one A100 task's p4d.24xlarge holds seven more
        # GPUs), measured against the LP bound (benches/bench_packing_bound.py: +19.1 % -> +8.5 % at 100 demands).
        price = {d: self._fit_price(d) for d in singles}
        for d in sorted(singles, key=lambda d: (not d.selectors, -price[d], _size_key(d))):
            remaining = max(1, d.count)
            while remaining > 0:
                placed = self._single(d, bins, out, remaining, mix)
                if not placed:
                    break
                remaining -= placed
        return out

    def _fit_price(self, d: Demand) -> float:
        try:
            return self.fitter.fit(d, d.selectors[0] if d.selectors else None).price or 0.0
        except NoFeasibleOffering:
            return 0.0       # placed last; _open reports why nothing serves it

    # ----- one demand --------------------------------------------------------------------------------------------

    def _single(self, d: Demand, bins: list[NodeCapacity], out: Packing, remaining: int, mix: bool) -> int:
        """Place one unit of `d` on free capacity, else open machines for the `remaining` units: with `mix`, the
        cheapest mix of machine sizes for all of them (`_cheapest_cover`), else the one machine cheapest per unit
        (`_open_per_unit`). Returns units placed."""
        want = d.res
        needs_gpu = want.get("GPU", 0) > 0 or bool(d.accelerator)
        # As Ray's v2 scheduler does: a demand goes on a node that exists or is being launched before any new one
        # (spare room on a machine launched anyway costs nothing); work without GPUs tries non-GPU nodes first.
        order = bins if needs_gpu else sorted(bins, key=lambda b: b.has_gpu)
        for sel in d.selectors or (None,):
            for b in order:
                if sel is not None and not sel.matches(b.labels):
                    continue
                view = _bin_view(want, b)
                if fits(b.free, view):
                    take(b.free, view)
                    return 1
        if not mix:
            return self._open_per_unit(d, bins, out, remaining)
        cover = self._cheapest_cover(Demand(d.resources, d.selectors, 1), remaining, None, out)
        if cover is None:
            return 0
        placed = 0
        for t, units in cover:
            b = self._new_bin(t, out, bins)
            view = _bin_view(want, b)
            n = 0
            while n < units and fits(b.free, view):
                take(b.free, view)
                n += 1
            placed += max(n, 1)
        return placed

    def _open_per_unit(self, d: Demand, bins: list[NodeCapacity], out: Packing, remaining: int) -> int:
        """Open the one machine that serves up to `remaining` units of `d` cheapest per unit (the halvings of
        `remaining`); the units it takes."""
        t = self._open(d, out)
        if t is None:
            return 0
        best, units = t, 1
        for m in group_sizes(remaining):
            g = self._fit_quiet(_scaled(d, m))
            if g is not None and g.price / m < best.price / units - 1e-12:
                best, units = g, m
        b = self._new_bin(best, out, bins)
        n = 0
        view = _bin_view(d.res, b)
        while n < units and fits(b.free, view):
            take(b.free, view)
            n += 1
        return max(n, 1)

    def _fit_quiet(self, d: Demand, zone: str | None = None) -> OpenType | None:
        for sel in d.selectors or (None,):
            try:
                return self.fitter.fit(d, sel, zone, quiet=True)
            except NoFeasibleOffering:
                continue
        return None

    def _open(self, d: Demand, out: Packing, zone: str | None = None) -> OpenType | None:
        first_error = ""
        for sel in d.selectors or (None,):
            try:
                return self.fitter.fit(d, sel, zone)
            except NoFeasibleOffering as e:
                first_error = first_error or str(e)
        if zone is None:
            out.infeasible[_without_count(d)] = first_error
        return None

    @staticmethod
    def _new_bin(t: OpenType, out: Packing, bins: list[NodeCapacity]) -> NodeCapacity:
        out.types[t.name] = t
        out.new[t.name] += 1
        b = NodeCapacity(f"new:{t.name}:{out.new[t.name]}", {k: float(v) for k, v in t.resources},
                         dict(t.labels), t.name, t.offering.zone, has_gpu=t.offering.instance_type.gpu_count > 0)
        bins.append(b)
        return b

    # ----- a gang ------------------------------------------------------------------------------------------------

    def _gang(self, gid: str, bundles: list[Demand], bins: list[NodeCapacity], out: Packing) -> None:
        if any(b.packed for b in bundles):    # STRICT_PACK: one machine holds the sum
            total: dict[str, float] = {}
            for b in bundles:
                for k, v in b.resources:
                    total[k] = total.get(k, 0.0) + v * max(1, b.count)
            units = [Demand(tuple(sorted(total.items())), bundles[0].selectors, 1, gid)]
        else:
            units = [Demand(b.resources, b.selectors, 1, gid, b.spread) for b in bundles
                     for _ in range(max(1, b.count))]
        units.sort(key=_size_key)
        spread = any(b.spread for b in bundles)
        zones: list[str | None] = [None]
        if self.single_zone_gangs:
            first = self._open(units[0], out)
            if first is None:
                return
            seen: Counter[str] = Counter(b.zone for b in bins if b.zone and b.node_type)
            by_use = sorted(seen, key=lambda z: (-seen[z], z != first.offering.zone, z))
            zones = list(by_use)
            if first.offering.zone not in zones:
                zones.append(first.offering.zone)
            zones += sorted({o.zone for o in self._zones_of(units[0])} - set(zones))
        for zone in zones:
            trial = self._place_gang(gid, units, bins, zone, spread, out)
            if trial is not None:
                for placed_on, want in trial[0]:
                    take(placed_on.free, want)
                    placed_on.hosts.add(gid)
                for t, want in trial[1]:
                    nb = self._new_bin(t, out, bins)
                    take(nb.free, _bin_view(want, nb))
                    nb.hosts.add(gid)
                return
        out.infeasible[_without_count(units[0])] = (
            f"placement group {gid}: its {len(units)} bundle(s) fit no single zone"
            + (" (single_zone_gangs: true)" if self.single_zone_gangs else ""))

    def _zones_of(self, d: Demand) -> list[Offering]:
        try:
            req = self.fitter.resolver.request("open", {"CPU": d.res.get("CPU", 0)}, {}, is_head=False)
            return list(self.fitter.planner.plan(req).top(50))
        except (ConfigError, NoFeasibleOffering):
            return []

    def _place_gang(self, gid: str, units: list[Demand], bins: list[NodeCapacity], zone: str | None, spread: bool,
                    out: Packing) -> tuple[list[tuple[NodeCapacity, dict[str, float]]],
                                           list[tuple[OpenType, dict[str, float]]]] | None:
        free = {id(b): dict(b.free) for b in bins}
        used: set[int] = set()
        placed: list[tuple[NodeCapacity, dict[str, float]]] = []
        opened: list[tuple[OpenType, dict[str, float]]] = []      # a new machine, and what the gang takes of it
        homeless: list[Demand] = []
        for u in units:
            want = u.res
            spot: NodeCapacity | None = None
            view: dict[str, float] = {}
            for b in bins:
                if zone is not None and b.zone != zone:
                    continue
                if spread and (id(b) in used or gid in b.hosts):
                    continue
                if not u.accepts(b.labels):
                    continue
                view = _bin_view(want, b)
                if fits(free[id(b)], view):
                    spot = b
                    break
            if spot is not None:
                take(free[id(spot)], view)
                used.add(id(spot))
                placed.append((spot, view))
                continue
            homeless.append(u)
        # What no machine holds gets new ones: one per bundle for a STRICT_SPREAD gang; otherwise, per run of equal
        # bundles, the cheapest mix of machine sizes (`_cheapest_cover`: a bigger machine for some and a smaller one
        # for the rest may cost less than either all on one or one each).
        groups: dict[tuple[object, ...], list[Demand]] = {}
        for u in homeless:
            groups.setdefault((u.resources, u.selectors), []).append(u)
        for group in groups.values():
            cover = [(t, 1) for u in group if (t := self._open(u, out, zone)) is not None] if spread \
                else self._cheapest_cover(group[0], len(group), zone, out)
            if cover is None or sum(n for _, n in cover) < len(group):
                return None
            opened += [(t, _times(group[0].res, n)) for t, n in cover]
        return placed, opened

    def _cheapest_cover(self, unit: Demand, k: int, zone: str | None,
                        out: Packing) -> list[tuple[OpenType, int]] | None:
        """The machines that hold `k` equal demands `unit` cheapest, each with how many it takes: the cheapest fit
        of m x `unit` (m = 1, 2, 3, 4, 6, 8, 12, 16 and the halvings of k), each counted for as many units as it
        holds (a fit for 20 may be a 32-vCPU machine), combined by a small dynamic programme over how many are left
        (the last machine may hold fewer than it could). None when not even one fits anywhere."""
        one = self._open(unit, out, zone)
        if one is None:
            return None
        options: dict[str, tuple[OpenType, int]] = {one.name: (one, max(1, _holds(one, unit.res)))}
        for m in sorted({m for m in COVER_SIZES if m <= k} | set(group_sizes(k))):
            t = self._fit_quiet(_scaled(unit, m), zone)
            if t is not None:
                options.setdefault(t.name, (t, max(m, _holds(t, unit.res))))
        opts = sorted(options.values(), key=lambda o: (-o[1], o[0].name))
        best: list[tuple[float, int]] = [(0.0, -1)] * (k + 1)      # n left -> (cost, option of the first machine)
        for n in range(1, k + 1):
            best[n] = min(((best[max(0, n - cap)][0] + t.price, i) for i, (t, cap) in enumerate(opts)),
                          key=lambda c: (round(c[0], 9), c[1]))    # ties: the option that holds most
        cover: list[tuple[OpenType, int]] = []
        n = k
        while n > 0:
            t, cap = opts[best[n][1]]
            cover.append((t, min(cap, n)))
            n -= cap
        return cover


COVER_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)


def _holds(t: OpenType, unit: Mapping[str, float]) -> int:
    """How many `unit`s a machine of `t` holds (its Ray resources; an accelerator_type marker never limits)."""
    have = dict(t.resources)
    counts = [int(have.get(k, 0) / v + 1e-9) for k, v in unit.items()
              if v > 0 and not k.startswith(ACCELERATOR_RESOURCE)]
    return min(counts) if counts else 1


def _times(unit: Mapping[str, float], n: int) -> dict[str, float]:
    """`n` units' worth of resources (an accelerator_type marker once: it is a label-like amount)."""
    return {k: (v * n if not k.startswith(ACCELERATOR_RESOURCE) else v) for k, v in unit.items()}


def _scaled(d: Demand, n: int) -> Demand:
    """One demand for `n` units of `d` (what a machine for n of them must hold), its selectors and gang kept."""
    return Demand(tuple(sorted(_times(dict(d.resources), n).items())), d.selectors, 1, d.gang)


def _bin_view(want: Mapping[str, float], b: NodeCapacity) -> dict[str, float]:
    return held_as(want, b.labels.get(ACCELERATOR_TYPE, ""), b.free)


def _without_count(d: Demand) -> Demand:
    return Demand(d.resources, d.selectors, 1, "", d.spread, d.packed)
