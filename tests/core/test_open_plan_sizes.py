"""OpenFitter's derived plans (`OpenFitter._plan`, derive_sizes=True): the candidates of a bigger shape taken from a
smaller shape's plan must be exactly the planner's, so the packing is the same as when every size asks the planner.

Both planner paths: plain Python (the monitor's, numpy not imported) and numpy."""
from __future__ import annotations

import random

import pytest
import yaml

from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.demand import Demand, NodeCapacity, canonical_resources, parse_selector
from ray_nodeless.core.open_pack import Packer
from ray_nodeless.core.open_plan import OpenFitter
from ray_nodeless.core.planner import Planner
from ray_nodeless.core.settings import Resolver
from ray_nodeless.errors import NoFeasibleOffering
from ray_nodeless.operate.config import catalog_for, load_provider
from tests import REPO_ROOT

GIB = 1024 ** 3
PATHS = [pytest.param(False, id="plain-python"), pytest.param(True, id="numpy")]


def _fitter(vectorized: bool, derive: bool, **provider) -> OpenFitter:
    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "local-nodeless.yaml").read_text())
    cfg["provider"].update(provider)
    bundle = load_provider(cfg["provider"])
    planner = Planner(catalog_for(bundle.core), vectorized=vectorized)
    return OpenFitter(Resolver(bundle.core, bundle.requirement_overrides), planner, UnavailableOfferings(180),
                      bundle.core.open_node_config, derive_sizes=derive)


SELECTORS = [None, {"ray.io/market-type": "on-demand"}, {"ray.io/availability-zone": "us-west-2b"},
             {"ray.io/market-type": "spot", "ray.io/availability-zone": "!us-west-2a"}]
KINDS = [{"CPU": 1}, {"CPU": 2}, {"CPU": 4}, {"CPU": 16}, {"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 2},
         {"CPU": 1, "GPU": 1, "accelerator_type:L4": 0.001}, {"CPU": 1, "GPU": 1, "accelerator_type:A100": 0.001},
         {"CPU": 1, "memory": 64 * GIB}, {"CPU": 8, "memory": 300 * GIB}, {"CPU": 0.5}]


def _demand(res: dict, sel: dict | None, count: int = 1, **kw) -> Demand:
    return Demand(canonical_resources(res), (parse_selector(sel),) if sel else (), count, **kw)


@pytest.mark.parametrize("vectorized", PATHS)
def test_derived_candidates_are_the_planners(vectorized):
    """Every size of every kind, smaller first (what the packer's probes do) and in a shuffled order: the fitter's
    plan has the planner's candidates, in its order, or fails as the planner does."""
    derived, planner_only = _fitter(vectorized, True), _fitter(vectorized, False)
    rng = random.Random(5)
    sizes = [(res, m) for res in KINDS for m in (1, 2, 3, 5, 8, 16, 40, 100, 300)]
    for order in (sizes, rng.sample(sizes, len(sizes))):
        for res, m in order:
            group = {k: (v * m if not k.startswith("accelerator_type:") else v) for k, v in res.items()}
            shape = {"CPU": group.get("CPU", 0), "GPU": int(group.get("GPU", 0))}
            node_config = {}
            if "memory" in group:
                shape["memory"] = group["memory"]
                node_config["min_memory_gib"] = group["memory"] / GIB / 0.7
            accel = [k for k in group if k.startswith("accelerator_type:")]
            if accel:
                shape[accel[0]] = 1
            request = derived.resolver.request("open", shape, node_config, is_head=False)
            try:
                want = list(planner_only.planner.plan(request).candidate_index)
            except NoFeasibleOffering as e:
                with pytest.raises(NoFeasibleOffering) as got:
                    derived._plan(request, quiet=False)
                assert str(got.value) == str(e)      # not quiet: the planner's own message
                with pytest.raises(NoFeasibleOffering):
                    derived._plan(request, quiet=True)
                continue
            assert [int(i) for i in derived._plan(request, quiet=False).candidate_index] == [int(i) for i in want]
    assert derived._derived, "no plan was derived: the test did not exercise the derivation"


def _workload(rng: random.Random) -> tuple[list[Demand], list[NodeCapacity]]:
    demands = [_demand(rng.choice(KINDS), rng.choice(SELECTORS), rng.choice([1, 1, 2, 3, 7, 12, 30]))
               for _ in range(rng.randint(3, 9))]
    for g in range(rng.randint(0, 2)):
        bundle = rng.choice([{"CPU": 1, "GPU": 1}, {"CPU": 2}, {"CPU": 4, "memory": 16 * GIB}])
        demands += [_demand(bundle, None, gang=f"pg{g}", spread=True) for _ in range(rng.randint(2, 3))]
    nodes = [NodeCapacity(f"ray:n{i}", {"CPU": rng.choice([2.0, 8.0]), "memory": 8.0 * GIB},
                          {"ray.io/market-type": rng.choice(["spot", "on-demand"]),
                           "ray.io/availability-zone": rng.choice(["us-west-2a", "us-west-2b"])},
                          "nl-x", "us-west-2a") for i in range(rng.randint(0, 2))]
    return demands, nodes


@pytest.mark.parametrize("vectorized", PATHS)
def test_packing_is_unchanged_by_derived_plans(vectorized):
    derived, planner_only = Packer(_fitter(vectorized, True)), Packer(_fitter(vectorized, False))
    rng = random.Random(17)
    for _ in range(12):
        demands, nodes = _workload(rng)
        a, b = derived.pack(demands, nodes), planner_only.pack(demands, nodes)
        assert (dict(a.new), sorted(a.types), a.infeasible) == (dict(b.new), sorted(b.types), b.infeasible)
        assert a.hourly == b.hourly
    assert derived.fitter._derived
