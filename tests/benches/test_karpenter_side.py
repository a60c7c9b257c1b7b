"""benches/karpenter_side.py states our problem to Karpenter: the exported offerings are the catalog's priced ones
with the shape as allocatable, and each demand's pod asks for what the demand asks (no Karpenter runs here; the
bench runs it: benches/bench_vs_karpenter.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches"))

import karpenter_side as KS  # noqa: E402

from ray_nodeless.core.demand import IN, NOT_IN, Constraint, Demand, Selector  # noqa: E402
from ray_nodeless.operate.config import catalog_for, load_provider  # noqa: E402


@pytest.fixture(scope="module")
def region():
    settings = load_provider({"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "local",
                              "simulate_cloud": "aws", "region": "us-west-2"}).core
    return catalog_for(settings).region("aws", "us-west-2")


def test_every_priced_offering_once_with_its_shape_as_allocatable(region):
    types = KS.instance_types(region)
    prices = KS.price_table(types)
    priced = {o.key: o.hourly_price for o in region.offerings() if o.hourly_price is not None}
    assert prices == priced
    by_name = {t["name"]: t for t in types}
    g = by_name["g4dn.xlarge"]
    it = next(o.instance_type for o in region.offerings() if o.instance_type.name == "g4dn.xlarge")
    # capacity - kwok's kube-reserved (100m, 10Mi) = the shape
    assert int(g["resources"]["cpu"].rstrip("m")) - KS.KUBE_RESERVED_CPU_M == it.vcpus * 1000
    assert int(g["resources"]["memory"].rstrip("Mi")) - KS.KUBE_RESERVED_MEM_MI == round(it.memory_gib * 1024)
    assert g["resources"]["nvidia.com/gpu"] == "1"
    assert all({"key": KS.GPU_MODEL, "operator": "In", "values": ["T4"]} in o["Requirements"] for o in g["offerings"])
    assert "nvidia.com/gpu" not in by_name["m5.large"]["resources"]


def test_a_demand_becomes_the_pod_that_asks_the_same():
    fallback = Demand((("CPU", 2.0), ("GPU", 1.0), ("accelerator_type:L4", 0.001)), selectors=(
        Selector((Constraint("ray.io/market-type", IN, ("spot",)), Constraint("ray.io/availability-zone", NOT_IN,
                                                                                ("us-west-2a",)))),
        Selector((Constraint("ray.io/market-type", IN, ("on-demand",)),))))
    p = KS.pod("d1", fallback)
    spec = p["spec"]
    assert spec["containers"][0]["resources"]["requests"] == {"cpu": "2000m", "nvidia.com/gpu": "1"}
    assert spec["nodeSelector"] == {KS.GPU_MODEL: "L4"}
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": KS.K_CAPACITY, "operator": "In", "values": ["spot"]},
                                           {"key": KS.K_ZONE, "operator": "NotIn", "values": ["us-west-2a"]}]},
                     {"matchExpressions": [{"key": KS.K_CAPACITY, "operator": "In", "values": ["on-demand"]}]}]
    [pref] = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pref["preference"] == terms[0]                   # Ray's order: the first selector preferred
    # a fallback that matches any node: no requirement, the preference only
    anyway = KS.pod("d2", Demand((("CPU", 1.0),), selectors=(
        Selector((Constraint("ray.io/market-type", IN, ("spot",)),)), Selector(()))))
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anyway["spec"]["affinity"]["nodeAffinity"]
    gang = KS.pod("d3", Demand((("CPU", 1.0), ("memory", 2.0 ** 30)), gang="pg1", spread=True))
    assert gang["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1000m", "memory": str(2 ** 30)}
    anti = gang["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti == [{"labelSelector": {"matchLabels": {"gang": "pg1"}}, "topologyKey": "kubernetes.io/hostname"}]
    same_zone = gang["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert same_zone[0]["topologyKey"] == KS.K_ZONE


def test_the_node_pool_states_the_rules():
    [cls, pool] = KS.node_pool(["m1", "c1"], ["M60", "K80"])
    assert cls["kind"] == "KWOKNodeClass"
    reqs = {r["key"]: r for r in pool["spec"]["template"]["spec"]["requirements"]}
    assert reqs[KS.K_CAPACITY]["values"] == ["spot", "on-demand"]
    assert reqs[KS.K_FAMILY] == {"key": KS.K_FAMILY, "operator": "NotIn", "values": ["c1", "m1"]}
    assert reqs[KS.GPU_MODEL]["values"] == ["K80", "M60"]
    assert pool["spec"]["disruption"]["consolidateAfter"] == "Never"
