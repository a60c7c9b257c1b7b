"""GcpBackend through the real google-cloud-compute client against the fake Compute server
(ray_nodeless.testing.fake_gce)."""
from __future__ import annotations

import logging
import uuid
from typing import Any, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_nodeless.testing.fake_gce import LABEL_KEY_RE, LABEL_VALUE_RE, FakeGce, Fault
from ray_nodeless.core.catalog import InstanceType, Offering
from ray_nodeless.core.schema import parse_section
from ray_nodeless.errors import (
    BackendError, CapacityError, ConfigError, ForeignMachineError, TransientBackendError,
)
from ray_nodeless.providers.base import MACHINE_PENDING, MACHINE_RUNNING, TAG_CLUSTER, LaunchSpec
from ray_nodeless.providers.gcp.backend import GcpBackend
from ray_nodeless.providers.gcp.instance_body import instance_name
from ray_nodeless.providers.gcp.settings import GcpSettings
from ray_nodeless.providers.gcp.labels import (
    METADATA_TAGS_KEY,
    cluster_label_value,
    decode_label_text,
    encode_label_text,
    tags_from_storage,
    tags_to_storage,
)

PROJECT = "test-project"
REGION = "us-central1"
CLUSTER = "Demo.Cluster"

CPU = InstanceType(cloud="gcp", name="e2-standard-4", family="e2", vcpus=4, memory_gib=16,
                   machine_type="e2-standard-4")
T4 = InstanceType(cloud="gcp", name="n1-standard-8+1xT4", family="n1", vcpus=8, memory_gib=30, gpu_model="T4",
                  gpu_count=1, gpu_memory_gib=16, machine_type="n1-standard-8", attached_gpu="nvidia-tesla-t4")
A2 = InstanceType(cloud="gcp", name="a2-highgpu-1g", family="a2", vcpus=12, memory_gib=85, gpu_model="A100",
                  gpu_count=1, gpu_memory_gib=40, machine_type="a2-highgpu-1g")
G2 = InstanceType(cloud="gcp", name="g2-standard-8", family="g2", vcpus=8, memory_gib=32, gpu_model="L4",
                  gpu_count=1, gpu_memory_gib=24, machine_type="g2-standard-8")

# The tag set Ray + ray_nodeless put on a worker, with awkward values on purpose.
RAY_TAGS = {
    "ray-node-kind": "worker",
    "ray-node-type": "worker",
    "ray-user-node-type": "GPU_Worker.v2",
    "ray-node-name": "ray-Demo.Cluster-worker",
    "ray-node-status": "uninitialized",
    "ray-launch-config": "0f5e1d6c2b9a8e7f6d5c4b3a29180f7e6d5c4b3a2918",
    "nodeless-instance-type": "n1-standard-8+1xT4",
    "nodeless-zone": "us-central1-b",
    "nodeless-capacity": "spot",
    "nodeless-hourly-price": "0.30494",
    "nodeless-rule": "rules[0]: gpu/cheapest",
    "nodeless-catalog": "embedded-2026-11-29@8b12960ea0ef",
}


@pytest.fixture
def fake() -> Iterator[FakeGce]:
    with FakeGce(project=PROJECT) as f:
        yield f


def make_backend(fake: FakeGce, cluster: str = CLUSTER, **extra: Any) -> GcpBackend:
    cfg = {"region": REGION, "project_id": PROJECT, "api_endpoint": fake.url, "credentials": "anonymous",
           "retry_base_s": 0.001, "retry_max_s": 0.01, "poll_interval_s": 0.01, "operation_timeout_s": 5}
    cfg.update(extra)
    return GcpBackend.from_provider(cfg, cluster)


@pytest.fixture
def backend(fake: FakeGce) -> Iterator[GcpBackend]:
    b = make_backend(fake)
    yield b
    b.close()


def spec(it: InstanceType = CPU, zone: str = "us-central1-a", capacity: str = "on-demand", count: int = 1,
         node_config: dict | None = None, tags: dict | None = None, cluster: str = CLUSTER,
         token: str | None = None) -> LaunchSpec:
    t = dict(RAY_TAGS if tags is None else tags)
    t[TAG_CLUSTER] = cluster
    return LaunchSpec(cluster_name=cluster, node_type="worker",
                      offering=Offering(it, REGION, zone, capacity, 0.1), count=count, tags=t,
                      node_config=dict(node_config or {}), request_token=token or str(uuid.uuid4()))


def stored(fake: FakeGce, name: str) -> dict:
    return fake.instances[name]


# ----------------------------------------------------------------------------------------- round trips


def test_on_demand_round_trip_insert_list_terminate(fake: FakeGce, backend: GcpBackend) -> None:
    s = spec(count=2)
    ids = backend.launch(s)
    assert len(ids) == 2 and len(set(ids)) == 2
    assert all(i.startswith("ray-demo-cluster-") for i in ids)
    body = stored(fake, ids[0])
    assert body["machineType"].endswith("/zones/us-central1-a/machineTypes/e2-standard-4")
    assert body["scheduling"]["provisioningModel"] == "STANDARD"
    assert "guestAccelerators" not in body
    # defaults when node_config has no disks / network
    assert body["disks"][0]["boot"] is True
    assert body["disks"][0]["initializeParams"]["sourceImage"] == "projects/debian-cloud/global/images/family/debian-12"
    assert body["networkInterfaces"][0]["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
    assert body["labels"][TAG_CLUSTER] == encode_label_text(CLUSTER)
    # one requestId per instance, each a UUID (GCE requires it)
    rids = [r.query["requestId"] for r in fake.calls("instances.insert")]
    assert len(set(rids)) == 2 and all(uuid.UUID(r) for r in rids)

    machines = backend.list_machines()
    assert sorted(m.id for m in machines) == sorted(ids)
    for m in machines:
        assert m.tags == s.tags                      # exactly the tags given
        assert m.state == MACHINE_RUNNING
        assert m.internal_ip and m.internal_ip.startswith("10.")
        assert m.external_ip and m.external_ip.startswith("34.")
        assert m.launched_at > 1_700_000_000
    assert fake.count("instances.aggregatedList") == 1
    assert "labels.ray-cluster-name" in fake.calls("instances.aggregatedList")[0].query["filter"]

    backend.terminate(ids)
    assert fake.instances == {}
    assert backend.list_machines() == []


def test_spot_scheduling(fake: FakeGce, backend: GcpBackend) -> None:
    [name] = backend.launch(spec(capacity="spot"))
    sched = stored(fake, name)["scheduling"]
    assert sched == {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE", "automaticRestart": False,
                     "onHostMaintenance": "TERMINATE"}


@pytest.mark.parametrize("capacity", ["on-demand", "spot"])
def test_gpu_host_gets_guest_accelerators(fake: FakeGce, backend: GcpBackend, capacity: str) -> None:
    [name] = backend.launch(spec(T4, zone="us-central1-b", capacity=capacity))
    body = stored(fake, name)
    assert body["machineType"].endswith("/machineTypes/n1-standard-8")
    assert body["guestAccelerators"] == [
        {"acceleratorType": "zones/us-central1-b/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 1}]
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    if capacity == "spot":
        assert body["scheduling"]["automaticRestart"] is False


@pytest.mark.parametrize("it", [A2, G2], ids=lambda t: t.name)
def test_builtin_gpu_types_have_no_guest_accelerators(fake: FakeGce, backend: GcpBackend, it: InstanceType) -> None:
    [name] = backend.launch(spec(it))
    body = stored(fake, name)
    assert "guestAccelerators" not in body
    assert body["machineType"].endswith(f"/machineTypes/{it.name}")
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"   # the fake rejects GPUs + MIGRATE


def test_ray_gcp_yaml_node_config_swaps_in(fake: FakeGce, backend: GcpBackend) -> None:
    """A node_config copied from a Ray GCP cluster YAML (camelCase insert-body keys) passes through."""
    node_config = {
        "machineType": "n1-standard-8",
        "disks": [{"boot": True, "autoDelete": True, "type": "PERSISTENT", "initializeParams": {
            "diskSizeGb": 100, "sourceImage": "projects/deeplearning-platform-release/global/images/family/x",
            "diskType": "zones/us-west1-b/diskTypes/pd-ssd"}}],
        "serviceAccounts": [{"email": "ray@test-project.iam.gserviceaccount.com",
                             "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}],
        "metadata": {"items": [{"key": "startup-script", "value": "#!/bin/bash\necho hi"}]},
        "scheduling": {"preemptible": True},
        "labels": {"team": "ml"},
        "tags": {"items": ["ray-worker"]},
        "minCpuPlatform": "Intel Skylake",
    }
    backend.check_node_config(backend.settings, "worker", node_config, "available_node_types.worker.node_config")
    assert backend.requirement_overrides(backend.settings, node_config) == {
        "instance_types": ["n1-standard-8"], "capacity": ["spot"]}
    n1 = InstanceType(cloud="gcp", name="n1-standard-8", family="n1", vcpus=8, memory_gib=30,
                      machine_type="n1-standard-8")
    [name] = backend.launch(spec(n1, zone="us-central1-c", node_config=node_config))
    body = stored(fake, name)
    assert body["disks"][0]["initializeParams"]["diskType"] == "zones/us-central1-c/diskTypes/pd-ssd"
    assert body["disks"][0]["initializeParams"]["diskSizeGb"] == "100"
    assert body["serviceAccounts"][0]["email"].startswith("ray@")
    assert body["tags"] == {"items": ["ray-worker"]}
    assert body["minCpuPlatform"] == "Intel Skylake"
    assert body["labels"]["team"] == "ml"
    assert body["scheduling"]["provisioningModel"] == "STANDARD" and "preemptible" not in body["scheduling"]
    keys = [i["key"] for i in body["metadata"]["items"]]
    assert keys == ["startup-script", METADATA_TAGS_KEY]
    [m] = backend.list_machines()
    assert "team" not in m.tags and m.tags[TAG_CLUSTER] == CLUSTER   # user labels are not tags


def test_pending_and_stopped_states(fake: FakeGce, backend: GcpBackend) -> None:
    fake.initial_status = "STAGING"
    a, b, c = backend.launch(spec(count=3))
    assert {m.id: m.state for m in backend.list_machines()} == dict.fromkeys([a, b, c], MACHINE_PENDING)
    fake.set_status(a, "RUNNING")
    fake.set_status(b, "TERMINATED")
    fake.set_status(c, "STOPPING")
    assert [(m.id, m.state) for m in backend.list_machines()] == [(a, MACHINE_RUNNING)]


# ----------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("code", ["ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                                  "STOCKOUT", "QUOTA_EXCEEDED"])
@pytest.mark.parametrize("leave_instance", [False, True])
def test_capacity_error_in_operation(fake: FakeGce, backend: GcpBackend, code: str, leave_instance: bool) -> None:
    fake.fail_insert(zone="us-central1-b", machine_type="n1-standard-8", code=code, leave_instance=leave_instance)
    with pytest.raises(CapacityError) as ei:
        backend.launch(spec(T4, zone="us-central1-b"))
    assert ei.value.category == code
    assert fake.instances == {}                  # nothing left behind, even when GCE kept a failed instance
    assert backend.list_machines() == []
    # the same type in another zone still launches
    assert len(backend.launch(spec(T4, zone="us-central1-c"))) == 1


def test_stockout_message_without_code_is_capacity(fake: FakeGce, backend: GcpBackend) -> None:
    fake.fail_insert(code="UNKNOWN_CODE")  # the message says "does not have enough resources available"
    with pytest.raises(CapacityError) as ei:
        backend.launch(spec())
    assert ei.value.category == "STOCKOUT"


def test_quota_403_is_capacity_error(fake: FakeGce, backend: GcpBackend) -> None:
    fake.quota_error(machine_type="n1-standard-8", quota="NVIDIA_T4_GPUS")
    with pytest.raises(CapacityError) as ei:
        backend.launch(spec(T4))
    assert ei.value.category == "QUOTA_EXCEEDED"
    assert "NVIDIA_T4_GPUS" in str(ei.value)
    assert fake.count("instances.insert") == 1   # not retried: quota does not come back in milliseconds
    assert fake.instances == {}
    assert len(backend.launch(spec(CPU))) == 1   # other machine types are unaffected


def test_partial_failure_of_a_multi_instance_launch_cleans_up(fake: FakeGce, backend: GcpBackend) -> None:
    fake.fail_insert(code="ZONE_RESOURCE_POOL_EXHAUSTED", skip=1)   # the 2nd of 3 instances fails
    with pytest.raises(CapacityError):
        backend.launch(spec(count=3))
    assert fake.count("instances.insert") == 3
    assert fake.instances == {}


def test_rate_limited_twice_then_ok_creates_one_instance(fake: FakeGce, backend: GcpBackend) -> None:
    fake.rate_limit("instances.insert", times=2)
    ids = backend.launch(spec())
    assert len(ids) == 1 and list(fake.instances) == ids
    inserts = fake.calls("instances.insert")
    assert [r.status for r in inserts] == [429, 429, 200]
    assert len({r.query["requestId"] for r in inserts}) == 1      # every retry reuses the requestId


def test_rate_limit_403_reason_is_retried(fake: FakeGce, backend: GcpBackend) -> None:
    fake.rate_limit("instances.insert", times=1, status=403)
    assert len(backend.launch(spec())) == 1


def test_persistent_rate_limit_is_transient_error(fake: FakeGce) -> None:
    b = make_backend(fake, max_attempts=3)
    fake.rate_limit("instances.insert", times=None)
    with pytest.raises(TransientBackendError):
        b.launch(spec())
    assert fake.count("instances.insert") == 3
    assert fake.instances == {}


def test_call_deadline_ends_retries_before_the_attempts_run_out(fake: FakeGce) -> None:
    b = make_backend(fake, max_attempts=1000, retry_base_s=0.05, retry_max_s=0.05, call_timeout_s=0.3)
    fake.rate_limit("instances.insert", times=None)
    with pytest.raises(TransientBackendError) as ei:
        b.launch(spec())
    assert "within 0.3s" in str(ei.value) and ei.value.category == "rateLimitExceeded"
    inserts = fake.calls("instances.insert")
    assert 2 <= len(inserts) < 100
    assert len({r.query["requestId"] for r in inserts}) == 1
    assert fake.instances == {}


def test_a_later_list_page_is_retried_too(fake: FakeGce) -> None:
    fake.page_size = 2
    b = make_backend(fake)
    ids = b.launch(spec(count=5))
    fake.faults.append(Fault("http", ("instances.aggregatedList",), times=1, status=503, message="Backend Error",
                             reason="backendError", skip=1))          # the second page fails once
    fake.reset_log()
    assert sorted(m.id for m in b.list_machines()) == sorted(ids)
    calls = fake.calls("instances.aggregatedList")
    assert [c.status for c in calls] == [200, 503, 200, 200]
    assert [c.query.get("pageToken") for c in calls] == [None, "2", "2", "4"]


def test_ambiguous_failure_retry_with_same_request_id_creates_one(fake: FakeGce, backend: GcpBackend) -> None:
    fake.ambiguous("instances.insert", times=1, status=503)
    ids = backend.launch(spec())
    assert list(fake.instances) == ids
    inserts = fake.calls("instances.insert")
    assert [r.status for r in inserts] == [503, 200]
    assert inserts[0].query["requestId"] == inserts[1].query["requestId"]


def test_ambiguous_then_throttled_leaves_nothing_behind(fake: FakeGce) -> None:
    b = make_backend(fake, max_attempts=3)
    fake.ambiguous("instances.insert", times=1, status=503)      # the instance is created, the reply is lost
    fake.rate_limit("instances.insert", times=None)              # ... and every retry is throttled
    with pytest.raises(TransientBackendError):
        b.launch(spec())
    assert fake.instances == {}
    assert fake.count("instances.delete") == 1


def test_relaunch_with_same_token_is_idempotent(fake: FakeGce, backend: GcpBackend) -> None:
    s = spec(count=2)
    first = backend.launch(s)
    assert backend.launch(s) == first                    # requestId answered with the original operations
    fake.request_ids.clear()                             # GCE forgot the requestIds: 409 on our own names
    assert backend.launch(s) == first
    assert sorted(fake.instances) == sorted(first)


def test_name_collision_with_foreign_instance_is_not_success(fake: FakeGce, backend: GcpBackend) -> None:
    s = spec()
    fake.add_instance(instance_name(CLUSTER, s.request_token, 0), labels={"owner": "someone"})
    with pytest.raises(BackendError) as ei:
        backend.launch(s)
    assert not isinstance(ei.value, CapacityError)
    assert ei.value.category == "alreadyExists"
    assert instance_name(CLUSTER, s.request_token, 0) in fake.instances      # never cleaned up: not ours
    assert fake.count("instances.delete") == 0


def test_bad_request_is_backend_error(fake: FakeGce, backend: GcpBackend) -> None:
    ghost = InstanceType(cloud="gcp", name="n9-mega-1", family="n9", vcpus=1, memory_gib=1, machine_type="n9-mega-1")
    with pytest.raises(BackendError) as ei:
        backend.launch(spec(ghost))
    assert type(ei.value) is BackendError and "does not exist in zone" in str(ei.value)
    assert fake.instances == {}


def test_operation_timeout_names_operation_and_cleans_up(fake: FakeGce) -> None:
    b = make_backend(fake, operation_timeout_s=0.3)
    fake.op_never_done = True
    with pytest.raises(BackendError) as ei:
        b.launch(spec())
    assert "operation-" in str(ei.value) and "did not finish within 0.3s" in str(ei.value)
    assert fake.instances == {}                  # the delete was issued even though its operation never ends
    assert fake.count("instances.delete") == 1


def test_operation_polled_until_done(fake: FakeGce, backend: GcpBackend) -> None:
    fake.op_delay_polls = 3
    assert len(backend.launch(spec())) == 1
    assert fake.count("zoneOperations.wait") == 3
    assert fake.count("zoneOperations.get") == 0


def test_list_error_is_transient(fake: FakeGce) -> None:
    b = make_backend(fake, max_attempts=2)
    fake.fail_method("instances.aggregatedList", status=500, times=None)
    with pytest.raises(TransientBackendError):
        b.list_machines()
    fake.faults.clear()
    fake.fail_method("instances.aggregatedList", status=400, times=1, message="Invalid filter", reason="invalid")
    with pytest.raises(TransientBackendError):
        b.list_machines()


# ----------------------------------------------------------------------------------------- ownership


def test_foreign_and_unlabelled_instances_are_never_listed_or_deleted(fake: FakeGce, backend: GcpBackend) -> None:
    ours = backend.launch(spec())
    fake.add_instance("other-cluster-node", labels={TAG_CLUSTER: "other"})
    fake.add_instance("unlabelled-node")
    fake.add_instance("prefix-cluster-node", labels={TAG_CLUSTER: encode_label_text(CLUSTER) + "-2"})
    fake.add_instance("other-region-node", zone="europe-west4-a", labels={TAG_CLUSTER: encode_label_text(CLUSTER)})
    assert [m.id for m in backend.list_machines()] == ours
    foreign = ["other-cluster-node", "unlabelled-node", "prefix-cluster-node", "other-region-node"]
    fake.reset_log()
    with pytest.raises(ForeignMachineError) as ei:      # ours ended, the others refused by name
        backend.terminate(foreign + ours)
    assert ei.value.machine_ids == sorted(foreign)
    deleted = [r.path.rsplit("/", 1)[-1] for r in fake.calls("instances.delete")]
    assert deleted == ours
    assert sorted(fake.instances) == sorted(foreign)
    # a fresh backend (after a restart: no zone map yet) is just as careful
    b2 = make_backend(fake)
    fake.reset_log()
    with pytest.raises(ForeignMachineError):
        b2.terminate(foreign)
    assert fake.count("instances.delete") == 0 and sorted(fake.instances) == sorted(foreign)


def test_preempted_instance_disappears_and_terminate_ignores_it(fake: FakeGce, backend: GcpBackend) -> None:
    a, b = backend.launch(spec(count=2, capacity="spot"))
    backend.list_machines()
    fake.preempt(a)                                   # gone after the listing: still in the zone map
    backend.terminate([a, b])                         # 404 on a is ignored
    assert fake.instances == {}
    assert [r.status for r in fake.calls("instances.delete")] == [404, 200]
    assert backend.list_machines() == []


def test_terminate_issues_all_deletes_before_waiting(fake: FakeGce, backend: GcpBackend) -> None:
    ids = backend.launch(spec(count=6))
    fake.reset_log()
    fake.op_delay_polls = 2
    backend.terminate(ids)
    log = [r.method for r in fake.requests]
    deletes = [i for i, m in enumerate(log) if m == "instances.delete"]
    waits = [i for i, m in enumerate(log) if m == "zoneOperations.wait"]
    assert len(deletes) == 6 and waits
    assert max(deletes) < min(waits)
    assert fake.instances == {}


def test_list_is_one_paginated_call(fake: FakeGce) -> None:
    fake.page_size = 2
    b = make_backend(fake)
    ids = b.launch(spec(count=5))
    for i in range(3):
        fake.add_instance(f"foreign-{i}", labels={TAG_CLUSTER: "other"})
    fake.reset_log()
    assert sorted(m.id for m in b.list_machines()) == sorted(ids)
    calls = fake.calls("instances.aggregatedList")
    assert len(calls) == 3                        # 5 matching instances, 2 per page
    assert [c.query.get("pageToken") for c in calls] == [None, "2", "4"]
    assert len(fake.requests) == 3


def test_long_cluster_name_round_trips(fake: FakeGce) -> None:
    cluster = "A-Very.Long_Cluster/Name" * 4          # encodes far beyond 63 characters
    b = make_backend(fake, cluster=cluster)
    [name] = b.launch(spec(cluster=cluster))
    assert len(name) <= 63
    label = stored(fake, name)["labels"][TAG_CLUSTER]
    assert label == cluster_label_value(cluster) and len(label) <= 63
    [m] = b.list_machines()
    assert m.tags[TAG_CLUSTER] == cluster
    # another backend whose cluster name differs only after the truncation point sees nothing
    other = make_backend(fake, cluster=cluster + "x")
    assert other.list_machines() == []


# ----------------------------------------------------------------------------------------- tags


def test_tags_round_trip_exactly(fake: FakeGce, backend: GcpBackend) -> None:
    tags = {
        "ray-user-node-type": "GPU.Worker/Large",
        "ray-launch-config": "f" * 64,                        # too long for a label once... it is 64 chars
        "ray-node-name": "ray-Demo.Cluster-worker-" + "9" * 50,
        "Custom.Key/With Space": "Value_With_Underscores",
        "empty": "",
        "unicode": "naïve café",
    }
    [name] = backend.launch(spec(tags=tags))
    labels = stored(fake, name)["labels"]
    for k, v in labels.items():                               # everything stored is a legal GCE label
        assert LABEL_KEY_RE.fullmatch(k) and LABEL_VALUE_RE.fullmatch(v)
    assert "ray-launch-config" not in labels and "ray-node-name" not in labels   # went to metadata
    assert labels["ray-user-node-type"] == encode_label_text("GPU.Worker/Large")
    [m] = backend.list_machines()
    assert m.tags == {**tags, TAG_CLUSTER: CLUSTER}


def test_set_tags_merges_and_moves_between_labels_and_metadata(fake: FakeGce, backend: GcpBackend) -> None:
    s = spec(node_config={"labels": {"team": "ml"}})
    [name] = backend.launch(s)
    backend.set_tags(name, {"ray-node-status": "up-to-date", "ray-launch-config": "A" * 70})
    [m] = backend.list_machines()
    assert m.tags == {**s.tags, "ray-node-status": "up-to-date", "ray-launch-config": "A" * 70}
    backend.set_tags(name, {"ray-launch-config": "short"})     # back into a label
    body = stored(fake, name)
    assert body["labels"]["ray-launch-config"] == "short"
    assert body["labels"]["team"] == "ml"                      # user labels survive
    [m] = backend.list_machines()
    assert m.tags["ray-launch-config"] == "short"
    n_calls = len(fake.requests)
    backend.set_tags(name, {"ray-launch-config": "short"})     # no change: no write
    assert [r.method for r in fake.requests[n_calls:]] == ["instances.get"]


def test_set_tags_retries_on_fingerprint_race(fake: FakeGce, backend: GcpBackend) -> None:
    [name] = backend.launch(spec())
    real = fake._instances_get

    def racing_get(q: dict, body: Any, zone: str, name: str) -> dict:
        out = real(q, body, zone, name)
        if fake.count("instances.get") == 1:                   # someone else writes labels right after our read
            fake.instances[name]["labelFingerprint"] = "changed"
        return out

    fake._instances_get = racing_get  # type: ignore[method-assign]
    backend.set_tags(name, {"ray-node-status": "up-to-date"})
    assert [r.status for r in fake.calls("instances.setLabels")] == [412, 200]
    [m] = backend.list_machines()
    assert m.tags["ray-node-status"] == "up-to-date"


def test_set_tags_gives_up_when_the_fingerprint_keeps_changing(fake: FakeGce, backend: GcpBackend) -> None:
    [name] = backend.launch(spec())
    real = fake._instances_get

    def always_racing_get(q: dict, body: Any, zone: str, name: str) -> dict:
        out = real(q, body, zone, name)
        fake.instances[name]["labelFingerprint"] = f"changed-{fake.count('instances.get')}"
        return out

    fake._instances_get = always_racing_get  # type: ignore[method-assign]
    with pytest.raises(TransientBackendError) as ei:
        backend.set_tags(name, {"ray-node-status": "up-to-date"})
    assert ei.value.category == "conditionNotMet"
    assert [r.status for r in fake.calls("instances.setLabels")] == [412, 412, 412]


def test_set_tags_on_foreign_instance_refused(fake: FakeGce, backend: GcpBackend) -> None:
    fake.add_instance("foreign", labels={TAG_CLUSTER: "other"})
    with pytest.raises(ForeignMachineError):
        backend.set_tags("foreign", {"x": "y"})
    assert fake.count("instances.setLabels") == 0


label_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(label_text)
def test_label_encoding_is_reversible_and_legal(text: str) -> None:
    enc = encode_label_text(text)
    assert decode_label_text(enc) == text
    assert all(c in "abcdefghijklmnopqrstuvwxyz0123456789-_" for c in enc)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(label_text, label_text, max_size=12), label_text)
def test_tag_storage_round_trip(tags: dict[str, str], cluster: str) -> None:
    tags = {**tags, TAG_CLUSTER: cluster}
    storage = tags_to_storage(tags, request_id="r")
    assert len(storage.labels) <= 64
    for k, v in storage.labels.items():
        assert LABEL_KEY_RE.fullmatch(k), k
        assert LABEL_VALUE_RE.fullmatch(v), v
    assert storage.labels[TAG_CLUSTER] == cluster_label_value(cluster)
    # user labels next to the tag labels do not leak into the tags
    labels = {**{"zz-user-label": "x"}, **storage.labels}
    import json

    manifest = json.loads(storage.metadata_value())
    assert tags_from_storage(labels, manifest) == tags


# ----------------------------------------------------------------------------------------- node_config


def test_validate_node_config_rejects_unknown_and_bad_fields(backend: GcpBackend) -> None:
    key = "available_node_types.w.node_config"
    with pytest.raises(ConfigError) as ei:
        backend.check_node_config(backend.settings, "w", {"machineTypo": "n1-standard-4"}, key)
    assert ei.value.key == f"{key}.machineTypo"
    with pytest.raises(ConfigError) as ei:
        backend.check_node_config(backend.settings, "w", {"scheduling": {"preemptable": True}}, key)
    assert ei.value.key == f"{key}.scheduling"
    with pytest.raises(ConfigError) as ei:
        backend.check_node_config(backend.settings, "w", {"canIpForward": "yes"}, key)
    assert ei.value.key == f"{key}.canIpForward"
    for k in ("status", "selfLink", "name"):
        with pytest.raises(ConfigError) as ei:
            backend.check_node_config(backend.settings, "w", {k: "x"}, key)
        assert ei.value.key == f"{key}.{k}"
    with pytest.raises(ConfigError) as ei:
        backend.check_node_config(backend.settings, "w", {"labels": {"Team": "ML"}}, key)
    assert ei.value.key == f"{key}.labels.Team"
    with pytest.raises(ConfigError) as ei:
        backend.check_node_config(backend.settings, "w", {"guestAccelerators": [
            {"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}]}, key)
    assert ei.value.key == f"{key}.guestAccelerators"
    backend.check_node_config(backend.settings, "w", {}, key)


def test_requirement_overrides(backend: GcpBackend) -> None:
    assert backend.requirement_overrides(backend.settings, {}) == {}
    machine_type = {"machineType": "zones/us-central1-a/machineTypes/n2-standard-8"}
    assert backend.requirement_overrides(backend.settings, machine_type) == {"instance_types": ["n2-standard-8"]}
    assert backend.requirement_overrides(backend.settings, {"machineType": "n1-standard-8", "guestAccelerators": [
        {"acceleratorType": "projects/p/zones/z/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 2}]}) == {
        "instance_types": ["n1-standard-8+2xT4"]}


def test_missing_provider_keys_are_config_errors() -> None:
    with pytest.raises(ConfigError) as ei:
        GcpBackend.from_provider({"region": REGION}, CLUSTER)
    assert ei.value.key == "provider.project_id"


def test_instance_names_follow_gce_rules() -> None:
    import re

    for cluster in ["Demo.Cluster", "x" * 100, "---", "UPPER_case cluster", "1numeric"]:
        n = instance_name(cluster, "tok", 0)
        assert re.fullmatch(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?", n), n
    assert instance_name("c", "tok", 0) == instance_name("c", "tok", 0) != instance_name("c", "tok", 1)


def test_no_warning_noise_on_success(fake: FakeGce, backend: GcpBackend, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ray_nodeless"):
        ids = backend.launch(spec(count=2))
        backend.list_machines()
        backend.terminate(ids)
    assert caplog.records == []


def test_config_checks_are_class_level() -> None:
    """`bootstrap_config` and `plan` call these on the class: no clients, no backend object."""
    provider = parse_section(GcpSettings, {"region": REGION, "project_id": "p"}, "provider")
    GcpBackend.check_node_config(provider, "w", {"machineType": "n1-standard-4", "disks": []}, "k")
    assert GcpBackend.requirement_overrides(provider, {"machineType": "n1-standard-4"}) == {
        "instance_types": ["n1-standard-4"]}
    with pytest.raises(ConfigError):
        GcpBackend.check_node_config(provider, "w", {"acceleratorType": "v4-8"}, "k")   # a Ray TPU key: not a VM field


def test_boot_script_becomes_the_startup_script(fake: FakeGce, backend: GcpBackend) -> None:
    s = spec()
    s.boot_script = "#!/bin/bash\nray start --address=$RAY_HEAD_IP:6379\n"
    [name] = backend.launch(s)
    items = {i["key"]: i["value"] for i in stored(fake, name)["metadata"]["items"]}
    assert items["startup-script"] == s.boot_script
    # the user's own startup script wins (and must start Ray itself)
    s2 = spec(node_config={"metadata": {"items": [{"key": "startup-script", "value": "echo mine"}]}})
    s2.boot_script = "#!/bin/bash\nray start\n"
    [name2] = backend.launch(s2)
    items2 = {i["key"]: i["value"] for i in stored(fake, name2)["metadata"]["items"]}
    assert items2["startup-script"] == "echo mine"


# ----------------------------------------------------------------- the provider's fallback, through the real client

def _provider(fake: FakeGce, **provider: Any):
    from ray_nodeless.ray_adapter.provider import NodelessProvider

    cfg = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "gcp", "region": REGION,
           "project_id": PROJECT, "api_endpoint": fake.url, "credentials": "anonymous", "list_cache_s": 0,
           "retry_base_s": 0.001, "retry_max_s": 0.01, "poll_interval_s": 0.01, "operation_timeout_s": 5,
           "exclude": {"gpus": ["K80", "M60"]},
           "rules": [{"name": "gpu-spot-first", "match": {"GPU": ">=1"}, "capacity": ["spot", "on-demand"],
                      # the machine types the fake server knows
                      "instance_types": ["n1-standard-4+1xT4", "n1-standard-8+1xT4", "g2-standard-8"]}]}
    cfg.update(provider)
    return NodelessProvider(cfg, CLUSTER)


_GPU_TAGS = {"ray-node-type": "worker", "ray-user-node-type": "gpu_worker", "ray-node-status": "uninitialized",
             "ray-node-name": "w", "ray-launch-config": "x"}


def test_provider_zone_exhausted_in_the_cheapest_zone_launches_in_the_next_zone(fake: FakeGce) -> None:
    p = _provider(fake)
    plan = p.planner.plan(p.resolver.request("gpu_worker", {"CPU": 4, "GPU": 1}, {}, False))
    first, second = plan.top(2)
    assert first.instance_type.name == second.instance_type.name and first.zone != second.zone
    fake.fail_insert(zone=first.zone, machine_type=first.instance_type.machine_type)
    p.create_node_with_resources_and_labels({}, dict(_GPU_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    [name] = p.non_terminated_nodes({})
    tags = p.node_tags(name)
    assert (tags["nodeless-instance-type"], tags["nodeless-zone"]) == (second.instance_type.name, second.zone)
    assert p.unavailable.reason(first) == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert [n for n, i in fake.instances.items() if i["zone"].endswith(first.zone)] == []   # nothing left behind
    p.backend.close()


def test_provider_quota_error_moves_to_the_next_type(fake: FakeGce) -> None:
    p = _provider(fake)
    plan = p.planner.plan(p.resolver.request("gpu_worker", {"CPU": 4, "GPU": 1}, {}, False))
    first = plan.chosen
    fake.quota_error(machine_type=first.instance_type.machine_type)
    p.create_node_with_resources_and_labels({}, dict(_GPU_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    [name] = p.non_terminated_nodes({})
    tags = p.node_tags(name)
    # GCE quotas are regional: one refusal and the provider goes straight to another type, in the first zone.
    assert tags["nodeless-instance-type"] != first.instance_type.name
    nxt = next(o for o in plan.candidates() if o.instance_type.name != first.instance_type.name)
    assert (tags["nodeless-instance-type"], tags["nodeless-zone"]) == (nxt.instance_type.name, nxt.zone)
    p.backend.close()
