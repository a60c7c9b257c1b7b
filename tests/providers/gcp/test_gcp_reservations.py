"""Capacity `reserved` on GCP: the GCP backend and NodelessProvider against the fake Compute Engine, which learned
reservations (testing/fake_gce/reservations.py: bodies and stored resources checked against the Compute discovery
document, the count enforced as GCE does). A rule `[reserved, spot, on-demand]` takes a specific reservation
first, never over its count, then spot, then on-demand."""
from __future__ import annotations

import pytest

from ray_nodeless.providers.base import TAG_CAPACITY, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_RESERVATION
from ray_nodeless.testing.fake_gce import FakeGce, client_kwargs, validate
from tests.providers.gcp.test_gcp_backend import _GPU_TAGS, PROJECT, _provider

GPU = {"CPU": 8, "GPU": 1}
RULES = [{"name": "gpu", "match": {"GPU": ">=1"}, "capacity": ["reserved", "spot", "on-demand"],
          "instance_types": ["n1-standard-8+1xT4", "g2-standard-8"]}]


@pytest.fixture
def fake():
    with FakeGce(project=PROJECT) as f:
        yield f


def reserve(fake: FakeGce, zone: str, name: str, machine_type: str, count: int, specific: bool = True,
            accelerators: list[dict] | None = None) -> None:
    """A reservation made through the real google-cloud-compute client (ReservationsClient.insert)."""
    from google.cloud import compute_v1

    props: dict = {"machine_type": machine_type}
    if accelerators:
        props["guest_accelerators"] = accelerators
    body = compute_v1.Reservation(name=name, specific_reservation_required=specific,
                                  specific_reservation=compute_v1.AllocationSpecificSKUReservation(
                                      count=count, instance_properties=props))
    compute_v1.ReservationsClient(**client_kwargs(fake)).insert_unary(project=PROJECT, zone=zone,
                                                                      reservation_resource=body)


def reserve_for(fake: FakeGce, o, name: str, count: int) -> None:
    """A specific reservation for offering `o`'s VM: its machine type, and its attached GPU where it has one."""
    t = o.instance_type
    accs = [{"accelerator_type": f"nvidia-tesla-{t.gpu_model.lower()}", "accelerator_count": 1}] \
        if t.attached_gpu else None
    reserve(fake, o.zone, name, t.machine_type or t.name, count, accelerators=accs)


def launch(p, n: int = 1) -> list[dict]:
    return [p.node_tags(i) for i in sorted(p.create_node_with_resources_and_labels({}, dict(_GPU_TAGS), n, GPU, {}))]


def plan_first(p):
    plan = p.planner.plan(p.resolver.request("gpu_worker", GPU, {}, False))
    o = next(o for o in plan.candidates())
    return o, plan.region.find(o.instance_type.name, o.zone, "on-demand")


def test_a_specific_reservation_first_never_over_its_count_then_spot(fake: FakeGce):
    p = _provider(fake, rules=RULES, reservations={"refresh_s": 0})
    o, od = plan_first(p)
    t = o.instance_type
    reserve_for(fake, o, "gpus-a", 2)
    got = launch(p, 2)
    assert {g[TAG_CAPACITY] for g in got} == {"reserved"} and {g[TAG_RESERVATION] for g in got} == {"gpus-a"}
    assert {g[TAG_INSTANCE_TYPE] for g in got} == {t.name}
    assert [float(g[TAG_PRICE]) for g in got] == pytest.approx([od.hourly_price] * 2)
    r = fake.reservations[f"{o.zone}/gpus-a"]
    assert r["specificReservation"]["inUseCount"] == "2"
    validate(r, {"$ref": "Reservation"}, "reservation")          # GCE's own schema, output fields included
    inst = [i for i in fake.instances.values() if i.get("reservationAffinity")]
    assert len(inst) == 2 and inst[0]["scheduling"]["provisioningModel"] == "STANDARD"
    [third] = launch(p)                                         # full: spot
    assert third[TAG_CAPACITY] == "spot"
    p.terminate_nodes([n for n in p.non_terminated_nodes({}) if p.node_tags(n).get(TAG_RESERVATION)][:1])
    assert r["specificReservation"]["inUseCount"] == "1"
    assert launch(p)[0][TAG_RESERVATION] == "gpus-a"


def test_the_count_is_enforced_by_the_fake_gce_as_gce_does(fake: FakeGce):
    """Two provider objects listed one free place each: GCE refuses the second insert (CONDITION_NOT_MET in its
    operation), which the launcher walks past to spot."""
    a = _provider(fake, rules=RULES, reservations={"refresh_s": 3600})
    b = _provider(fake, rules=RULES, reservations={"refresh_s": 3600})
    o, _ = plan_first(a)
    reserve_for(fake, o, "one", 1)
    plan = a.planner.plan(a.resolver.request("gpu_worker", GPU, {}, False))
    assert a.launcher.reservations.candidates(plan, 1) and b.launcher.reservations.candidates(plan, 1)
    caps = sorted([launch(a)[0][TAG_CAPACITY], launch(b)[0][TAG_CAPACITY]])
    assert caps == ["reserved", "spot"]
    assert fake.reservations[f"{o.zone}/one"]["specificReservation"]["inUseCount"] == "1"


def test_open_reservations_are_not_targeted_and_others_regions_are_not_listed(fake: FakeGce):
    p = _provider(fake, rules=RULES, reservations={"refresh_s": 0})
    o, _ = plan_first(p)
    reserve(fake, o.zone, "open-one", o.instance_type.machine_type or o.instance_type.name, 3, specific=False)
    assert p.backend.reservations() == []
    assert launch(p)[0][TAG_CAPACITY] == "spot"
