"""`ray-nodeless plan` for demands: what one Ray demand gets, and the shapes a shape-open cluster can serve.

Every answer comes from the code the monitor runs (`core/open_plan.py`'s `OpenFitter`, built as
`NodelessProvider._open_types` builds it), so the preview is the decision, not an imitation of it:
- the chosen offering is `OpenFitter.fit(demand, selector)` for the demand's selectors in order (Ray's fallbacks);
- the alternatives are what the fitter picks when the offerings before them are unavailable: the order the
  monitor falls back in after capacity errors (an `UnavailableOfferings` whose clock never moves holds them);
- a demand a declared worker node type holds is Ray's to scale (`OpenTypes` leaves it alone): the preview names
  the type Ray's v2 scheduler would launch, scored as `SchedulingNode._compute_score` scores a fresh node of each
  type in Ray 2.60 (labels, GPU avoidance, matching resource types, utilisation; ties by `priority`, then name).
  It is reproduced here because `plan` must not import Ray (tests/cli/test_plan_imports.py).
- what nothing allowed can serve names the key that removed its last candidate (`core/diagnose.py`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.catalog import Offering
from ray_nodeless.core.demand import ACCELERATOR_RESOURCE, Demand, Selector, parse_demand, parse_selector, fits
from ray_nodeless.core.open_plan import OpenFitter, OpenType
from ray_nodeless.core.requirements import GIB
from ray_nodeless.core.settings import Resolver
from ray_nodeless.errors import ConfigError, NoFeasibleOffering

# The representative demands of the menu (`plan CLUSTER_YAML` on a shape-open cluster).
MENU_CPUS = (1, 2, 4, 8, 16, 32, 64)
MENU_GPUS = (1, 2, 4, 8)
MENU_MEMORY_GIB = (16, 64, 256)
MARKETS = ("on-demand", "spot")
# Ray's `accelerator_type="L4"` asks this much of the `accelerator_type:L4` resource.
ACCELERATOR_AMOUNT = 0.001
# The planner's rejection reasons a user may not guess the cause of (core/plan.py's names).
REJECTION_HINTS = {
    "arch": "x86_64 unless a rule or provider.open.node_config sets arch: arm64 or any",
    "unknown_price": "the catalog has no price for them; an unknown price is never chosen",
    "gpu_model_excluded": "provider.exclude.gpus or a rule's exclude_gpus",
    "capacity_type": "not a capacity the rule allows",
}
# The name the fitter's diagnosis gives the demand's node type (core/open_plan.py); rewritten out of its messages.
_PSEUDO = "open"


@dataclass
class Fit:
    chosen: OpenType
    selector: Selector | None            # the selector (of the demand's, in order) the chosen offering matches
    fallback: int                        # its index: 0 is the preferred selector
    alternatives: list[OpenType] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)     # why each preferred selector before it got nothing


@dataclass
class Declared:
    """A declared worker node type that holds the demand, scored as Ray's v2 scheduler scores a fresh node."""

    name: str
    resources: dict[str, float]
    labels: dict[str, str]
    score: tuple


@dataclass
class DemandPreview:
    demand: Demand
    shape_open: bool
    declared: list[Declared]             # best first (Ray's choice is the first)
    on_head: bool                        # the head node type's resources hold it (Ray runs it there when free)
    fit: Fit | None                      # what a shape-open cluster launches for it
    reason: str = ""                     # why nothing can serve it, when fit is None
    over_budget: str = ""                # why the launch of the fit would be refused (provider.max_hourly_cost)


def offering_dict(t: OpenType) -> dict[str, Any]:
    o: Offering = t.offering
    it = o.instance_type
    return {"node_type": t.name, "instance_type": it.name, "zone": o.zone, "capacity": o.capacity,
            "hourly_price": o.hourly_price, "rule": t.rule, "vcpus": it.vcpus, "memory_gib": it.memory_gib,
            "gpu_count": it.gpu_count, "gpu_model": it.gpu_model or None, "resources": dict(t.resources),
            "labels": dict(t.labels)}


class OpenPreview:
    """The monitor's fitter for one cluster YAML, as `plan` has it (no cloud I/O: the embedded catalog, or the
    catalog file the YAML names, with nothing marked unavailable)."""

    def __init__(self, cfg: Mapping[str, Any], bundle: Any, head: str, shape_open: bool, head_price: float = 0.0):
        from ray_nodeless.core.cluster_plan import planner_for
        from ray_nodeless.launch.catalog import catalog_for

        self.cfg = cfg
        self.settings = bundle.core
        self.bundle = bundle
        self.head = head
        self.shape_open = shape_open
        self.head_price = head_price
        self.catalog = catalog_for(self.settings)
        self.planner = planner_for(self.catalog)
        self.resolver = Resolver(self.settings, bundle.requirement_overrides)
        self.fitter = OpenFitter(self.resolver, self.planner, None, self.settings.open.node_config)
        self.region = self.catalog.region(self.settings.price_cloud, self.settings.region)

    # ----- one demand ----------------------------------------------------------------------------------------

    def fit(self, demand: Demand, alternatives: int = 0) -> Fit:
        """The chosen offering for `demand` (its selectors in order) and the next `alternatives` the monitor would
        fall back to. Raises NoFeasibleOffering naming the key at fault."""
        errors: list[NoFeasibleOffering] = []
        for i, sel in enumerate(demand.selectors or (None,)):
            try:
                chosen = self.fitter.fit(demand, sel)
            except NoFeasibleOffering as e:
                errors.append(e)
                continue
            out = Fit(chosen, sel, i, skipped=[str(e).split("\n", 1)[0] for e in errors])
            if alternatives > 0:
                # Each offering shown is marked unavailable for good (the clock never moves), so the next fit is
                # the monitor's next choice after a capacity error on it.
                shown = UnavailableOfferings(ttl_s=1.0, clock=lambda: 0.0)
                walk = OpenFitter(self.resolver, self.planner, shown, self.settings.open.node_config)
                shown.mark(chosen.offering, "shown")
                while len(out.alternatives) < alternatives:
                    try:
                        alt = walk.fit(demand, sel)
                    except NoFeasibleOffering:
                        break
                    out.alternatives.append(alt)
                    shown.mark(alt.offering, "shown")
            return out
        raise self._diagnosed(demand, errors[0])

    def _diagnosed(self, demand: Demand, error: NoFeasibleOffering) -> NoFeasibleOffering:
        """The fitter's error (which names the key that removed the demand's last candidate, `core/diagnose.py`),
        led by the exclusion of the GPU model it names, with the planner's own reasons where no key alone is at
        fault (a model priced nowhere in the catalog, one only on Arm types), then the planner's explanation."""
        cause = error.__cause__
        plan = getattr(cause, "explanation", None)
        request = getattr(plan, "request", None)
        if request is None:          # the planner had candidates: a selector, or a resource no instance has
            return error
        text = _demand_words(str(error).split("\n", 1)[0].removeprefix(demand.describe() + ": "),
                             self.settings.open.key("node_config"))
        model = request.shape.accelerator_type
        if model and ("no single key" in text or " at once " in text):
            text = self._model_text(request, model) or text
        if model in self.settings.rules.exclude.exclude_gpus and not text.startswith("provider.exclude.gpus"):
            text = f"provider.exclude.gpus excludes {model}; {text}"
        return NoFeasibleOffering(f"{demand.describe()}: {text}\n{cause}", explanation=plan)

    def _model_text(self, request: Any, model: str) -> str:
        """Why the offerings that have `model` were all rejected, in the planner's words (a model priced nowhere in
        the catalog, one only on Arm types)."""
        where = f"{self.settings.price_cloud} {self.settings.region}"
        names = tuple(sorted({o.instance_type.name for o in self.region.offerings()
                              if o.instance_type.gpu_model == model}))
        if not names:
            return f"--demand.accelerator_type:{model}: no instance type in {where} has a {model} GPU"
        only = dataclasses.replace(request, requirements=dataclasses.replace(
            request.requirements, instance_types=request.requirements.instance_types + (names,)))
        try:
            self.planner.plan(only)
            return ""
        except NoFeasibleOffering as e:
            rejected = dict(getattr(e.explanation, "rejected", None) or {})
        except ConfigError:
            return ""
        rejected.pop("instance_type_not_allowed", None)      # the restriction to the model's types, ours
        if not rejected:
            return ""
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        why = "; ".join(f"{k}={v}" + (f" ({REJECTION_HINTS[k]})" if k in REJECTION_HINTS else "")
                        for k, v in sorted(rejected.items()))
        return f"the {model} types of {where} ({shown}) are rejected: {why}"

    def declared_for(self, demand: Demand) -> list[Declared]:
        """Declared worker node types whose resources and labels hold `demand` (the monitor's own test,
        `OpenTypes._declared_serves`), best first as Ray's v2 scheduler scores a fresh node of each."""
        from ray_nodeless.launch.open_types import is_open_type

        types = self.cfg.get("available_node_types") or {}
        out = []
        for name in sorted(types, key=str):
            t = types[name]
            if name == self.head or is_open_type(t):
                continue
            res = {str(k): float(v) for k, v in (t.get("resources") or {}).items()}
            labels = {str(k): str(v) for k, v in (t.get("labels") or {}).items()}
            if res and fits(res, demand.res) and demand.accepts(labels):
                out.append(Declared(name, res, labels, _ray_score(demand, res, labels, int(t.get("priority", 0)))))
        # Ray sorts by score, highest first; its tie order is the node types' order, here their names.
        out.sort(key=lambda d: (tuple(-x for x in d.score), d.name))
        return out

    def preview(self, demand: Demand, alternatives: int) -> DemandPreview:
        declared = self.declared_for(demand)
        head_res = {str(k): float(v) for k, v in
                    ((self.cfg.get("available_node_types") or {}).get(self.head, {}).get("resources") or {}).items()}
        on_head = bool(head_res) and fits(head_res, demand.res) and not demand.selectors
        try:
            fit, reason = self.fit(demand, alternatives), ""
        except NoFeasibleOffering as e:
            fit, reason = None, str(e)
        return DemandPreview(demand, self.shape_open, declared, on_head, fit, reason,
                             self.over_budget(fit.chosen) if fit is not None else "")

    def over_budget(self, t: OpenType) -> str:
        """Why the launcher would refuse `t` on a cluster at rest (the head alone), or ''."""
        cap = self.settings.max_hourly_cost
        if cap is None or self.head_price + t.price <= cap + 1e-9:
            return ""
        return (f"with the head (${self.head_price:.4f}/h) it takes the cluster to ${self.head_price + t.price:.4f}/h, "
                f"over provider.max_hourly_cost = ${cap:.4f}/h: the launch is refused")

    # ----- the menu ------------------------------------------------------------------------------------------

    def dearest_offering(self) -> Offering | None:
        """The dearest offering some demand may get: under each rule that may decide a demand (not head-only, its
        globs admitting the demands' node type name), or the default when no catch-all does, narrowed by the
        generated types' node_config and `exclude`, GPU machines allowed (a GPU demand gets one). What one machine
        of a shape-open cluster can cost at most."""
        import fnmatch

        from ray_nodeless.core.requirements import Request, Requirements, Shape, parse_requirements, split_node_config
        from ray_nodeless.core.rules import OPEN_DEMAND_NODE_TYPE

        s = self.settings
        ours, theirs = split_node_config(s.open.node_config)
        key = s.open.key("node_config")
        template = parse_requirements(ours, key).narrowed_by(
            parse_requirements(self.bundle.requirement_overrides(dict(theirs)), key), key)
        rules = [r for r in s.rules.rules if r.node_kind != "head" and
                 (not r.node_types or any(fnmatch.fnmatchcase(OPEN_DEMAND_NODE_TYPE, g) for g in r.node_types))]
        bases = [r.requirements for r in rules]
        if not any(not r.node_types and r.node_kind is None and not r.predicates for r in rules):
            bases.append(Requirements())          # demands no rule matches get the defaults
        best: Offering | None = None
        for base in bases:
            try:
                req = base.narrowed_by(template, key).narrowed_by(s.rules.exclude, "provider.exclude")
                plan = self.planner.plan(Request(
                    cloud=s.price_cloud, region=s.region, shape=Shape(), node_type=OPEN_DEMAND_NODE_TYPE,
                    requirements=dataclasses.replace(req, allow_gpu_instances=True), rule="ceiling"))
            except (ConfigError, NoFeasibleOffering):
                continue                          # a rule whose lists leave nothing: no machine of its
            for o in plan.top(len(plan)):
                if o.hourly_price is not None and (best is None or o.hourly_price > (best.hourly_price or 0)):
                    best = o
        return best

    def menu_demands(self) -> list[tuple[str, Demand]]:
        """Representative demands: CPUs, GPUs, one row per GPU model the region has or a rule names, memory, and
        one CPU demand per market type."""
        rows: list[tuple[str, Demand]] = [(f"CPU {n}", parse_demand({"CPU": n})) for n in MENU_CPUS]
        rows += [(f"GPU {n}", parse_demand({"GPU": n})) for n in MENU_GPUS]
        for model in self.gpu_models():
            rows.append((f"GPU 1 {model}", parse_demand({"GPU": 1, f"{ACCELERATOR_RESOURCE}{model}":
                                                         ACCELERATOR_AMOUNT})))
        rows += [(f"memory {g} GiB", parse_demand({"CPU": 1, "memory": g * GIB})) for g in MENU_MEMORY_GIB]
        for market in MARKETS:
            rows.append((f"CPU 4 {market}", parse_demand({"CPU": 4}, [{"ray.io/market-type": market}])))
        return rows

    def gpu_models(self) -> list[str]:
        """The region's GPU models, and those the rules or exclusions name (an excluded model's row says so)."""
        models = {o.instance_type.gpu_model for o in self.region.offerings() if o.instance_type.gpu_count}
        rules = self.settings.rules
        for req in [r.requirements for r in rules.rules] + [rules.exclude]:
            models |= set(req.gpus or ()) | set(req.exclude_gpus)
        return sorted(m for m in models if m)

    def menu(self) -> tuple[list[tuple[str, Demand, OpenType]], list[tuple[str, Demand, str]]]:
        """(label, demand, cheapest fit) for what can be served; (label, demand, why) for what is forbidden."""
        served, forbidden = [], []
        for label, d in self.menu_demands():
            try:
                t = self.fit(d).chosen
                if self.over_budget(t):
                    forbidden.append((label, d, f"its cheapest fit {t.offering.instance_type.name} "
                                                f"${t.price:.4f}/h {self.over_budget(t).split(' it ', 1)[1]}"))
                else:
                    served.append((label, d, t))
            except NoFeasibleOffering as e:
                why = str(e).split("\n", 1)[0].removeprefix(d.describe() + ": ").replace("--demand.", "")
                forbidden.append((label, d, why))
        return served, forbidden


def _demand_words(text: str, open_key: str = "provider.open.node_config") -> str:
    """The diagnosis speaks of a node type; here it is the demand (the fitter rewrites most of it already).
    `open_key`: the generated types' node_config as the YAML spells it."""
    return (text.replace(f"available_node_types.{_PSEUDO}.resources", "--demand")
            .replace("the demand's resources", "--demand")
            .replace(f"available_node_types.{_PSEUDO}.node_config.", open_key + ".")
            .replace(f"available_node_types.{_PSEUDO}", "--demand")
            .replace(f"node type {_PSEUDO!r} ", "the demand "))


def _ray_score(demand: Demand, total: Mapping[str, float], labels: Mapping[str, str], priority: int) -> tuple:
    """Ray 2.60 `SchedulingNode._compute_score` for `demand` on a fresh node of a type, then its `priority`."""
    if not demand.selectors:
        matches = 0
    else:
        n = len(demand.selectors)
        matches = next((n - i for i, s in enumerate(demand.selectors) if s.matches(labels)), 0)
    want = demand.res
    gpu_ok = not (total.get("GPU", 0) > 0 and "GPU" not in want)
    matching = sum(1 for k in want if k in total)
    utils = [v * (min(want.get(k, 0.0), v) / v) ** 3 for k, v in sorted(total.items()) if v > 0]
    return (matches, int(gpu_ok), matching, min(utils) if utils else 0.0,
            sum(utils) / len(utils) if utils else 0.0, priority)


def parse_cli_demand(text: str, selectors: tuple[str, ...]) -> Demand:
    """`--demand` and its `--label-selector`s (Ray's syntax, fallbacks in order) as one Demand."""
    for i, s in enumerate(selectors):
        parse_selector(s, f"--label-selector[{i}]")    # names which one is bad
    d = parse_demand(text, selectors)
    if not d.resources:
        raise ConfigError("--demand", "asks for nothing: name at least one resource, e.g. '{\"CPU\": 1}'")
    return d
