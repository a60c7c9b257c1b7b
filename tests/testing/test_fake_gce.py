"""The fake Compute Engine server is only useful if it is strict: these tests pin its checks and semantics."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from typing import Any, Iterator

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from ray_nodeless.testing.fake_gce import ApiError, FakeGce, client_kwargs, parse_filter, validate_body

PROJECT = "test-project"
ZONE = "us-central1-a"


@pytest.fixture
def fake() -> Iterator[FakeGce]:
    with FakeGce(project=PROJECT) as f:
        yield f


@pytest.fixture
def ic(fake: FakeGce) -> compute_v1.InstancesClient:
    return compute_v1.InstancesClient(**client_kwargs(fake))


def body(name: str = "vm-1", **extra: Any) -> dict:
    b = {"name": name, "machineType": f"zones/{ZONE}/machineTypes/e2-standard-4",
         "disks": [{"boot": True, "autoDelete": True, "initializeParams": {"sourceImage": "projects/x/global/images/y",
                                                                           "diskSizeGb": "20"}}],
         "networkInterfaces": [{"network": "global/networks/default"}]}
    b.update(extra)
    return b


def raw_post(fake: FakeGce, path: str, payload: Any) -> tuple[int, dict]:
    req = urllib.request.Request(f"{fake.url}/compute/v1/projects/{PROJECT}/{path}", method="POST",
                                 data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def insert(ic: compute_v1.InstancesClient, b: dict, request_id: str | None = None, zone: str = ZONE) -> Any:
    req = compute_v1.InsertInstanceRequest(project=PROJECT, zone=zone,
                                           instance_resource=compute_v1.Instance.from_json(json.dumps(b)))
    if request_id is not None:
        req.request_id = request_id
    return ic.insert_unary(request=req)


# ----------------------------------------------------------------------------------------- schema


@pytest.mark.parametrize("payload, fragment", [
    (body(bogusField=1), 'Unknown name "bogusField" at \'instance\''),
    (body(scheduling={"provisioningModel": "SPOT", "spotness": "high"}),
     'Unknown name "spotness" at \'instance.scheduling\''),
    (body(canIpForward="yes"), "Invalid value at 'instance.can_ip_forward' (TYPE_BOOL)"),
    (body(labels=["a", "b"]), "Invalid value at 'instance.labels', expected an object"),
    (body(disks=[{"boot": True, "initializeParams": {"diskSizeGb": "twenty"}}]),
     "Invalid value at 'instance.disks[0].initialize_params.disk_size_gb' (TYPE_INT64)"),
    (body(guestAccelerators=[{"acceleratorType": "x", "acceleratorCount": 1.5}]),
     "instance.guest_accelerators[0].accelerator_count"),
    (body(scheduling={"provisioningModel": "CHEAP"}), "instance.scheduling.provisioning_model"),
])
def test_insert_body_is_validated_against_discovery_schema(fake: FakeGce, payload: dict, fragment: str) -> None:
    status, err = raw_post(fake, f"zones/{ZONE}/instances", payload)
    assert status == 400
    assert err["error"]["code"] == 400
    assert fragment in err["error"]["message"]
    assert err["error"]["errors"][0]["reason"] == "invalid"
    assert fake.instances == {}


def test_schema_accepts_a_full_valid_body() -> None:
    validate_body(body(scheduling={"provisioningModel": "SPOT", "automaticRestart": False,
                                   "instanceTerminationAction": "DELETE", "onHostMaintenance": "TERMINATE"},
                       labels={"a": "b"}, metadata={"items": [{"key": "startup-script", "value": "x"}]},
                       serviceAccounts=[{"email": "e", "scopes": ["s"]}], tags={"items": ["t"]},
                       guestAccelerators=[{"acceleratorType": "t", "acceleratorCount": 1}]),
                  "Instance", "instance")
    with pytest.raises(ApiError):
        validate_body({"labels": {"a": 1}}, "Instance", "instance")   # map values are typed too


def test_bad_enum_through_real_client_is_bad_request(fake: FakeGce, ic: compute_v1.InstancesClient) -> None:
    with pytest.raises(gexc.BadRequest) as ei:
        insert(ic, body(scheduling={"provisioningModel": "CHEAP"}))
    assert "provisioning_model" in str(ei.value)


def test_set_labels_and_metadata_bodies_are_validated(fake: FakeGce) -> None:
    fake.add_instance("vm-1")
    status, err = raw_post(fake, f"zones/{ZONE}/instances/vm-1/setLabels", {"labels": {"a": "b"}, "color": "x"})
    assert status == 400 and 'Unknown name "color"' in err["error"]["message"]
    status, err = raw_post(fake, f"zones/{ZONE}/instances/vm-1/setMetadata", {"items": {"key": "k"}})
    assert status == 400 and "expected a list" in err["error"]["message"]


# ----------------------------------------------------------------------------------------- semantics


def test_request_id_idempotency(fake: FakeGce, ic: compute_v1.InstancesClient) -> None:
    rid = str(uuid.uuid4())
    op1 = insert(ic, body(), rid)
    op2 = insert(ic, body(), rid)
    assert op1.name == op2.name
    assert list(fake.instances) == ["vm-1"]
    with pytest.raises(gexc.Conflict):
        insert(ic, body(), str(uuid.uuid4()))           # a new requestId for the same name: 409
    with pytest.raises(gexc.BadRequest):
        insert(ic, body("vm-2"), "not-a-uuid")
    with pytest.raises(gexc.BadRequest):
        insert(ic, body("vm-2"), str(uuid.UUID(int=0)))


def test_gce_semantic_checks(fake: FakeGce, ic: compute_v1.InstancesClient) -> None:
    gpu = [{"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 1}]
    with pytest.raises(gexc.BadRequest, match="live migration"):
        insert(ic, body(machineType=f"zones/{ZONE}/machineTypes/n1-standard-8", guestAccelerators=gpu))
    with pytest.raises(gexc.BadRequest, match="live migration"):
        insert(ic, body(machineType=f"zones/{ZONE}/machineTypes/g2-standard-8"))   # built-in L4
    with pytest.raises(gexc.BadRequest, match="automatically restarted"):
        insert(ic, body(scheduling={"provisioningModel": "SPOT"}))
    with pytest.raises(gexc.BadRequest, match="labels"):
        insert(ic, body(labels={"Upper": "x"}))
    with pytest.raises(gexc.BadRequest, match="does not exist in zone"):
        insert(ic, body(machineType=f"zones/{ZONE}/machineTypes/zz-huge-999"))
    with pytest.raises(gexc.BadRequest, match="resource.name"):
        insert(ic, body("Bad_Name"))
    assert fake.instances == {}
    op = insert(ic, body(machineType=f"zones/{ZONE}/machineTypes/n1-standard-8", guestAccelerators=gpu,
                         scheduling={"onHostMaintenance": "TERMINATE"}))
    assert op.status == compute_v1.Operation.Status.DONE and "vm-1" in fake.instances


def test_filters_in_both_gce_forms(fake: FakeGce, ic: compute_v1.InstancesClient) -> None:
    fake.add_instance("a1", labels={"ray-cluster-name": "c1"})
    fake.add_instance("a2", zone="us-central1-b", labels={"ray-cluster-name": "c1"})
    fake.add_instance("b1", labels={"ray-cluster-name": "c2"})
    fake.add_instance("n1")
    for flt in ["labels.ray-cluster-name=c1", 'labels.ray-cluster-name = "c1"', '(labels.ray-cluster-name = "c1")']:
        agg_req = compute_v1.AggregatedListInstancesRequest(project=PROJECT, filter=flt)
        agg = [i.name for _, s in ic.aggregated_list(request=agg_req) for i in s.instances]
        assert sorted(agg) == ["a1", "a2"], flt
        zonal = compute_v1.ListInstancesRequest(project=PROJECT, zone=ZONE, filter=flt)
        assert [i.name for i in ic.list(request=zonal)] == ["a1"]
    assert [i.name for i in ic.list(request=compute_v1.ListInstancesRequest(
        project=PROJECT, zone=ZONE, filter="labels.ray-cluster-name != c1"))] == [
        "b1", "n1"]
    with pytest.raises(gexc.BadRequest):
        list(ic.list(request=compute_v1.ListInstancesRequest(project=PROJECT, zone=ZONE, filter="labels.x ~~ y")))
    assert parse_filter('name = "x" AND labels.a=b') == [("name", "=", "x"), ("labels.a", "=", "b")]


def test_aggregated_list_paginates(fake: FakeGce, ic: compute_v1.InstancesClient) -> None:
    fake.page_size = 2
    for i in range(5):
        fake.add_instance(f"vm-{i}", zone=["us-central1-a", "us-central1-b"][i % 2], labels={"c": "x"})
    names = sorted(i.name for _, s in ic.aggregated_list(
        request=compute_v1.AggregatedListInstancesRequest(project=PROJECT, filter="labels.c=x")) for i in s.instances)
    assert names == [f"vm-{i}" for i in range(5)]
    assert [r.query.get("pageToken") for r in fake.calls("instances.aggregatedList")] == [None, "2", "4"]


def test_operations_poll_to_done(fake: FakeGce, ic: compute_v1.InstancesClient) -> None:
    zo = compute_v1.ZoneOperationsClient(**client_kwargs(fake))
    fake.op_delay_polls = 2
    op = insert(ic, body())
    assert op.status == compute_v1.Operation.Status.RUNNING
    assert zo.wait(project=PROJECT, zone=ZONE, operation=op.name).status == compute_v1.Operation.Status.RUNNING
    assert zo.get(project=PROJECT, zone=ZONE, operation=op.name).status == compute_v1.Operation.Status.DONE
    with pytest.raises(gexc.NotFound):
        zo.get(project=PROJECT, zone="us-central1-b", operation=op.name)


def test_fault_injection(fake: FakeGce, ic: compute_v1.InstancesClient) -> None:
    fake.fail_insert(zone=ZONE, code="ZONE_RESOURCE_POOL_EXHAUSTED")
    op = insert(ic, body())
    assert op.status == compute_v1.Operation.Status.DONE
    assert op.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED" and op.http_error_status_code == 503
    assert fake.instances == {}
    fake.quota_error(machine_type="e2-standard-4", quota="NVIDIA_T4_GPUS", times=1)
    with pytest.raises(gexc.Forbidden, match="Quota 'NVIDIA_T4_GPUS' exceeded") as ei:
        insert(ic, body())
    assert ei.value.errors[0]["reason"] == "quotaExceeded"
    fake.rate_limit("instances.insert", times=1)
    with pytest.raises(gexc.TooManyRequests):
        insert(ic, body())
    fake.ambiguous("instances.insert", times=1)
    with pytest.raises(gexc.ServiceUnavailable):
        insert(ic, body(), str(uuid.uuid4()))
    assert list(fake.instances) == ["vm-1"]                # the ambiguous call did the work
    assert [r.status for r in fake.calls("instances.insert")] == [200, 403, 429, 503]
    assert fake.count("instances.insert") == 4


def test_set_labels_needs_current_fingerprint(fake: FakeGce, ic: compute_v1.InstancesClient) -> None:
    fake.add_instance("vm-1", labels={"a": "b"})
    inst = ic.get(project=PROJECT, zone=ZONE, instance="vm-1")
    with pytest.raises(gexc.PreconditionFailed):
        ic.set_labels_unary(project=PROJECT, zone=ZONE, instance="vm-1",
                            instances_set_labels_request_resource=compute_v1.InstancesSetLabelsRequest(
                                labels={"a": "c"}, label_fingerprint="stale"))
    ic.set_labels_unary(project=PROJECT, zone=ZONE, instance="vm-1",
                        instances_set_labels_request_resource=compute_v1.InstancesSetLabelsRequest(
                            labels={"a": "c"}, label_fingerprint=inst.label_fingerprint))
    assert fake.instances["vm-1"]["labels"] == {"a": "c"}


def test_preempt_and_delete(fake: FakeGce, ic: compute_v1.InstancesClient) -> None:
    fake.add_instance("vm-1")
    fake.preempt("vm-1")
    with pytest.raises(gexc.NotFound):
        ic.delete_unary(project=PROJECT, zone=ZONE, instance="vm-1")
    with pytest.raises(gexc.NotFound):
        ic.get(project=PROJECT, zone=ZONE, instance="vm-1")


# ----------------------------------------------------------------------------------------- the zone's record


def test_every_route_is_a_compute_method_of_the_discovery_document() -> None:
    """The fake serves only methods the real API has, at the real API's paths and HTTP methods."""
    import re

    from ray_nodeless.testing.fake_gce import discovery

    resources = discovery()["resources"]
    for verb, rx, name in FakeGce._ROUTES:
        resource, method = name.split(".")
        m = resources[resource]["methods"][method]
        assert m["httpMethod"] == verb, name
        path = re.sub(r"\{(\w+)\}", "x", m["path"].replace("{+", "{"))
        assert path.startswith("projects/x/") and rx.fullmatch(path[len("projects/x/"):]), (name, m["path"])


def test_zone_operations_list_records_deletes_and_preemptions(fake: FakeGce, ic: compute_v1.InstancesClient) -> None:
    zo = compute_v1.ZoneOperationsClient(**client_kwargs(fake))
    fake.add_instance("vm-1")
    fake.add_instance("vm-2")
    fake.add_instance("vm-3", zone="us-central1-b")
    ic.delete_unary(project=PROJECT, zone=ZONE, instance="vm-1")
    fake.preempt("vm-2")
    fake.preempt("vm-3")
    ops = list(zo.list(request=compute_v1.ListZoneOperationsRequest(
        project=PROJECT, zone=ZONE, filter='targetLink eq ".*/instances/(vm-1|vm-2)"')))
    assert [(o.operation_type, o.target_link.rsplit("/", 1)[-1]) for o in ops] == [
        ("delete", "vm-1"), ("compute.instances.preempted", "vm-2")]
    assert ops[1].user == "system" and ops[1].status == compute_v1.Operation.Status.DONE
    preempted = list(zo.list(request=compute_v1.ListZoneOperationsRequest(
        project=PROJECT, zone="us-central1-b", filter='operationType = "compute.instances.preempted"')))
    assert [o.target_link.rsplit("/", 1)[-1] for o in preempted] == ["vm-3"]
    fake.page_size = 1
    assert len(list(zo.list(project=PROJECT, zone=ZONE))) == 2          # the pager follows nextPageToken
