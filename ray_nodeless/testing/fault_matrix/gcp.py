"""The matrix on the real GCP backend (google-cloud-compute, REST) against the fake Compute server
(ray_nodeless/testing/fake_gce).

Faults are the server's answers: an insert operation that ends ZONE_RESOURCE_POOL_EXHAUSTED (in one zone or all,
for spot or standard instances), a regional GPU quota 403, throttling (429 once, or on every insert for one
call), a 503 that did nothing, a lost response (the insert runs, then 503: the client re-sends the same requestId
and GCE answers with the first operation), refused deletes, failed / unauthorised / empty aggregated listings.
Spot preemption deletes the instance out of band and records a `compute.instances.preempted` zone operation, as
GCE does. The cloud's truth is the server's own state (no request).
"""
from __future__ import annotations

import copy
import random
from collections import Counter
from typing import Any

from ray_nodeless.core.catalog import embedded
from ray_nodeless.providers.base import TAG_CAPACITY, TAG_CLUSTER, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_ZONE
from ray_nodeless.providers.gcp.labels import manifest_from_items, tags_from_storage
from ray_nodeless.testing.fake_gce import FakeGce, Fault
from ray_nodeless.testing.fault_matrix.world import CLUSTER, World

PROJECT = "matrix-project"
REGION = "us-central1"
LIVE = ("PROVISIONING", "STAGING", "RUNNING")
MAX_ATTEMPTS = 3
SHAPES: dict[str, dict[str, float]] = {"gpu": {"CPU": 4, "GPU": 1}, "cpu": {"CPU": 4}}
GPU_TYPES = ["n1-standard-4+1xT4", "n1-standard-8+1xT4", "n1-standard-4+1xV100", "g2-standard-8", "a2-highgpu-1g"]
CPU_TYPES = ["e2-standard-4", "n1-standard-8", "n2-standard-8"]


def provider_config(fake: FakeGce) -> dict[str, Any]:
    return {
        "type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "gcp", "region": REGION,
        "project_id": fake.project, "api_endpoint": fake.url, "credentials": "anonymous",
        "retry_base_s": 0.001, "retry_max_s": 0.01, "poll_interval_s": 0.01, "operation_timeout_s": 5,
        "max_attempts": MAX_ATTEMPTS, "call_timeout_s": 10,
        "list_cache_s": 0, "max_candidates_per_launch": 6, "launch_retry_backoff_s": 0,
        # the rules name V100 and n2 types, the exclusions forbid them: they must never run
        "exclude": {"gpus": ["V100", "K80", "M60"], "families": ["n2"]},
        "rules": [
            {"name": "gpu-spot-first", "match": {"GPU": ">=1"}, "capacity": ["spot", "on-demand"],
             "instance_types": GPU_TYPES},
            {"name": "cpu", "match": {}, "capacity": ["on-demand"], "instance_types": CPU_TYPES},
        ],
    }


class RecordingGce(FakeGce):
    """The fake server, recording every instance it creates (also those deleted since)."""

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self.created: list[dict[str, Any]] = []

    def _materialize(self, body: dict, zone: str) -> dict:
        inst = super()._materialize(body, zone)
        self.created.append(copy.deepcopy(inst))
        return inst


def _tags(inst: dict[str, Any]) -> dict[str, str]:
    items = (inst.get("metadata") or {}).get("items", [])
    return tags_from_storage(dict(inst.get("labels") or {}), manifest_from_items(items))


class GcpWorld(World):
    name = "gcp"
    shapes = SHAPES
    max_count = 7
    max_live = 12
    # The GCP backend tells a deletion (by any provider object) from a preemption by the zone's operations
    # (providers/gcp/vanished.py; the fake records both), so misread interruptions are asserted 0 here too.

    def __init__(self, fake: RecordingGce):
        super().__init__(provider_config(fake))
        self.fake = fake
        self.armed: list[Fault] = []
        self.forbidden = self.forbidden_types("gcp", REGION, {"V100", "K80", "M60"}, {"n2"})
        rc = embedded().region("gcp", REGION)
        # (machine type, accelerator type, count) -> catalog name, to name what actually runs
        self.names = {(t.machine_type, t.attached_gpu or "", t.gpu_count if t.attached_gpu else 0): t.name
                      for t in rc.types}

    def start(self) -> None:
        f = self.fake
        with f.lock:
            f.instances.clear()
            f.faults.clear()
            f.created.clear()
            f.request_ids.clear()       # a fresh project: no requestId answered before
            f.operations.clear()
        f.add_instance("other-cluster-vm", labels={TAG_CLUSTER: "other"}, machine_type="n1-standard-8")
        f.add_instance("manual-vm", machine_type="e2-standard-4")
        self.foreign_ids = ["other-cluster-vm", "manual-vm"]
        self.foreign = {n: copy.deepcopy(f.instances[n]) for n in self.foreign_ids}

    def _type_of(self, inst: dict[str, Any]) -> str:
        mt = inst["machineType"].rsplit("/", 1)[-1]
        accs = inst.get("guestAccelerators") or []
        acc = accs[0]["acceleratorType"].rsplit("/", 1)[-1] if accs else ""
        return self.names.get((mt, acc, int(accs[0].get("acceleratorCount", 1)) if accs else 0), f"{mt}+{acc}")

    def ours(self) -> dict[str, str]:
        with self.fake.lock:
            return {n: self._type_of(i) for n, i in self.fake.instances.items()
                    if i.get("status") in LIVE and (i.get("labels") or {}).get(TAG_CLUSTER) == CLUSTER}

    def cost(self) -> float:
        with self.fake.lock:
            return sum(float(_tags(i).get(TAG_PRICE, 0)) for i in self.fake.instances.values()
                       if i.get("status") in LIVE and (i.get("labels") or {}).get(TAG_CLUSTER) == CLUSTER)

    def arm_orphan(self) -> bool:
        """The insert runs and its answer is lost, every insert after it is throttled and every delete refused
        until the call gives up: the backend cannot clean up what may exist, so create_node raises with the
        instance running (listed at once: GCE's listing is consistent)."""
        f = self.fake
        self._arm(f.ambiguous("instances.insert", times=1))
        self._arm(f.rate_limit(times=None))
        self._arm(f.fail_method("instances.delete", status=503, times=None, message="Service Unavailable"))
        return True

    def check_foreign(self) -> None:
        with self.fake.lock:
            now = {n: copy.deepcopy(self.fake.instances.get(n)) for n in self.foreign_ids}
        assert now == self.foreign, "gcp: a foreign instance changed"

    def batch_mark(self) -> int:
        return len(self.fake.created)

    def batch_made(self, mark: int) -> dict[str, int]:
        """Live instances created since `mark`, per offering. Those the backend deleted after a failed attempt
        (what an insert with a lost answer may have created) do not count: a retry may create them again."""
        made: Counter[str] = Counter()
        live = self.ours()
        for inst in self.fake.created[mark:]:
            t = _tags(inst)
            if t.get(TAG_CLUSTER) == CLUSTER and inst["name"] in live:
                made["/".join((t.get(TAG_INSTANCE_TYPE, ""), t.get(TAG_ZONE, ""), t.get(TAG_CAPACITY, "")))] += 1
        return dict(made)

    def _arm(self, fault: Fault) -> None:
        self.armed.append(fault)

    def inject_launch_fault(self, rng: random.Random) -> str | None:
        r, f = rng.random(), self.fake
        if r < 0.12:
            self._arm(f.fail_insert(zone=rng.choice([None, "us-central1-a", "us-central1-b"]),
                                    spot=rng.choice([True, False, None]), times=None))
            return "zone_resource_pool_exhausted"
        if r < 0.15:
            self._arm(f.quota_error(machine_type=rng.choice(["n1-standard-4", "g2-standard-8"]), times=None))
            return "quota"
        if r < 0.20:
            self._arm(f.ambiguous("instances.insert", times=1))
            return "lost_response"
        if r < 0.23:
            self._arm(f.rate_limit(times=None))
            return "throttling_storm"
        if r < 0.26:
            self._arm(f.rate_limit(times=1))
            return "throttled_once"
        if r < 0.29:
            self._arm(f.fail_method("instances.insert", status=503, times=1, message="Service Unavailable"))
            return "http_503"
        if r < 0.32:
            # The insert runs, its answer is lost, and the retries are throttled until they run out: the backend
            # deletes what may exist, and the launcher tries the same token again.
            self._arm(f.ambiguous("instances.insert", times=1))
            self._arm(f.rate_limit(times=MAX_ATTEMPTS - 1))
            return "lost_response_then_throttled"
        return None

    def _disarm(self) -> None:
        with self.fake.lock:
            self.fake.faults = [x for x in self.fake.faults if not any(x is a for a in self.armed)]
        self.armed.clear()

    def clear_launch_faults(self) -> None:
        self._disarm()

    def fail_terminates(self) -> None:
        self._arm(self.fake.fail_method("instances.delete", status=503, times=None, message="Service Unavailable"))

    def clear_terminate_fault(self) -> None:
        self._disarm()

    def reclaim(self, machine_id: str) -> None:
        self.fake.preempt(machine_id)

    def fail_next_listing(self) -> None:
        self.fake.fail_method("instances.aggregatedList", status=503, times=MAX_ATTEMPTS)

    def glitch_next_listing(self, rng: random.Random) -> str:
        r = rng.random()
        if r < 0.4:
            self.fail_next_listing()
            return "list_failure"
        if r < 0.7:
            self.fake.fail_method("instances.aggregatedList", status=401, times=1, reason="required",
                                  message="Request is missing required authentication credential.")
            return "list_exception"
        # One empty aggregated page, or a run of 2-3 in a row: the second look is instances.get by name (a
        # known machine) or the zonal lists (a fresh object), never that method again (providers/gcp/listing.py).
        times = rng.choice([1, 2, 3])
        self.fake.empty_list(times=times)
        return "list_empty" if times == 1 else f"list_empty_x{times}"

    def empty_first_listing(self) -> bool:
        self.fake.empty_list(times=1 + len(self.fake.created) % 3)
        return True
