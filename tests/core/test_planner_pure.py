"""The plain-Python planner path (what a process without numpy, e.g. a cold `ray-nodeless plan`, runs) against the
numpy planner: the same candidates in the same order, the same rejection counts and explanations, the same
NoFeasibleOffering messages, over hypothesis-drawn and an exhaustive grid of requests in every region of both
clouds. Also: the region columns as lists equal the numpy arrays, and odd catalog data still meets numpy's
conversion (same errors)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from ray_nodeless.core.catalog.model import RegionCatalog
from ray_nodeless.core.planner import Planner
from ray_nodeless.core.requirements import Request, Requirements, Shape
from ray_nodeless.errors import NoFeasibleOffering
from tests.core.test_planner import CAT, GPUS, REGIONS, requests

NUMPY = Planner(CAT, vectorized=True)
PURE = Planner(CAT, vectorized=False)


def outcome(planner: Planner, request: Request):
    """Everything a plan shows: candidates in order, counts, explanation; or the error's message and counts."""
    try:
        p = planner.plan(request)
    except NoFeasibleOffering as e:
        return ("infeasible", str(e), dict(e.explanation.rejected), e.explanation.considered)
    return ("plan", [o.to_dict() for o in p.candidates()], dict(p.rejected), p.considered, p.explain(5),
            [int(i) for i in p.candidate_index])


def assert_same(request: Request) -> None:
    got, want = outcome(PURE, request), outcome(NUMPY, request)
    assert got == want, request


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_pure_python_plan_equals_numpy_plan(request):
    assert_same(request)


SHAPES = [Shape(cpu=c, gpu=g, memory_gib=m, accelerator_type=a)
          for c, g, m, a in [(0, 0, 0, ""), (1, 0, 1, ""), (4, 0, 16, ""), (16, 1, 64, ""), (4, 1, 0, ""),
                             (8, 1, 0, "T4"), (96, 8, 0, "A100"), (0.5, 0, 0.5, ""), (48, 0, 200, ""),
                             (2, 0, 4000, ""), (1000, 0, 0, "")]]
REQS = [
    Requirements(),
    Requirements(capacity=("spot", "on-demand")),
    Requirements(capacity=("spot",), max_hourly_price=0.5),
    Requirements(instance_types=(("g*", "n1-*"),), exclude_gpus=frozenset({"T4"})),
    Requirements(instance_types=(("t3.*", "e2-*"),)),               # burstable, named explicitly
    Requirements(families=frozenset({"inf2", "trn1", "a2", "g5"})),   # accelerators named by family
    Requirements(exclude_families=frozenset({"g4dn", "n1"}), allow_gpu_instances=True),
    Requirements(arch=("arm64",), min_vcpus=4, min_memory_gib=16),
    Requirements(gpus=frozenset({"L4", "A10G"}), exclude_instance_types=("*2xlarge",)),
    Requirements(max_hourly_price=0.01),
    Requirements(exclude_gpus=frozenset(GPUS)),
]


@pytest.mark.parametrize("cloud,region", REGIONS)
def test_pure_python_plan_equals_numpy_plan_on_a_grid_in_every_region(cloud, region):
    zones = sorted(CAT.region(cloud, region).zones)
    reqs = REQS + [Requirements(zones=frozenset(zones[:1]), capacity=("on-demand", "spot"))]
    for shape, req in itertools.product(SHAPES, reqs):
        assert_same(Request(cloud=cloud, region=region, shape=shape, requirements=req, rule="grid",
                            node_type="w"))


def test_default_follows_whether_numpy_is_imported(monkeypatch):
    import sys

    calls = []
    p = Planner(CAT)
    monkeypatch.setattr(p, "_compute_py", lambda r: calls.append(r) or PURE.plan(r))
    req = Request(cloud="aws", region="us-west-2", shape=Shape(cpu=2, gpu=0, memory_gib=4), requirements=Requirements(),
                  rule="r")
    p.plan(req)
    assert calls == []                        # numpy imported in this process: the numpy path
    monkeypatch.delitem(sys.modules, "numpy")
    p2 = Planner(CAT)
    monkeypatch.setattr(p2, "_compute_py", lambda r: calls.append(r) or PURE.plan(r))
    p2.plan(req)
    assert calls == [req]


@pytest.mark.parametrize("cloud,region", REGIONS)
def test_region_lists_equal_numpy_arrays(cloud, region):
    rc = CAT.region(cloud, region)
    assert rc.type_ids == rc.o_type.tolist() and rc.zone_ids == rc.o_zone.tolist()
    assert rc.cap_ids == rc.o_cap.tolist()
    assert [None if p is None else p for p in rc.prices] == [None if math.isnan(p) else p for p in rc.o_price.tolist()]
    assert rc.o_type.dtype == np.int32 and rc.o_cap.dtype == np.int8 and rc.o_price.dtype == np.float64
    for i in range(0, len(rc), 997):
        o = rc.offering(i)
        assert rc.find(o.instance_type.name, o.zone, o.capacity) == o


def _entry(**over):
    e = {"zones": ["z-a", "z-b"], "type": [0, 1, 1], "zone": [0, 0, 1], "capacity": [0, 1, 0],
         "price": [0.1, None, 2]}
    e.update(over)
    return e


TYPES = CAT.types("aws")[:2]


def test_odd_but_convertible_columns_go_through_numpy():
    rc = RegionCatalog("aws", "r", TYPES, _entry(type=(0, 1, 1), zone=[0.0, 0, 1], capacity=[False, True, 0],
                                                  price=["0.1", float("nan"), 2]))
    assert (rc.type_ids, rc.zone_ids, rc.cap_ids, rc.prices) == ([0, 1, 1], [0, 0, 1], [0, 1, 0], [0.1, None, 2.0])
    plain = RegionCatalog("aws", "r", TYPES, _entry())
    assert [plain.offering(i) for i in range(3)] == [rc.offering(i) for i in range(3)]


@pytest.mark.parametrize("over", [{"type": [0, 1]}, {"type": [0, 1, 5]}, {"zone": [0, 0, -1]},
                                  {"capacity": [0, 1, 2]}, {"price": [0.1, "x", 2]}, {"type": [0, "a", 1]},
                                  {"price": [0.1, None]}])
def test_bad_columns_raise_what_the_numpy_conversion_raised(over):
    def numpy_error(entry):      # the conversion as it was before the plain columns
        try:
            o_type = np.asarray(entry["type"], dtype=np.int32)
            o_zone = np.asarray(entry["zone"], dtype=np.int32)
            o_cap = np.asarray(entry["capacity"], dtype=np.int8)
            o_price = np.array(entry["price"], dtype=np.float64)
            n = len(o_type)
            if not (len(o_zone) == len(o_cap) == len(o_price) == n):
                raise ValueError("aws r: region arrays differ in length")
            if n and (int(o_type.min()) < 0 or int(o_type.max()) >= 2 or int(o_zone.min()) < 0
                      or int(o_zone.max()) >= 2 or int(o_cap.min()) < 0 or int(o_cap.max()) >= 2):
                raise ValueError("aws r: a row refers to a type, zone or capacity the catalog does not have")
        except (TypeError, ValueError) as e:
            return type(e), str(e)
        return None

    want = numpy_error(_entry(**over))
    assert want is not None
    with pytest.raises((TypeError, ValueError)) as got:
        RegionCatalog("aws", "r", TYPES, _entry(**over))
    assert (got.type, str(got.value)) == want
