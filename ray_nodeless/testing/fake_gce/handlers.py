"""The Compute endpoints the fake serves (zones, machine types, accelerator types, instances, zone operations: get,
wait, list) and the resources they return, with GCE's observable semantics: requestId idempotency, fingerprints on
labels and metadata, paging, operations that complete synchronously unless `op_delay_polls` says otherwise, and
the zone's record of what happened to an instance (its insert, delete and preemption operations)."""
from __future__ import annotations

import copy
import itertools
import threading
import time
import uuid
from typing import Any, Callable

from ray_nodeless.testing.fake_gce.faults import Fault
from ray_nodeless.testing.fake_gce.filters import filter_match, parse_filter
from ray_nodeless.testing.fake_gce.schema import ApiError, validate_body
from ray_nodeless.testing.fake_gce.semantics import MachineTypeSpec, check_instance, check_labels

URL_ROOT = "https://www.googleapis.com/compute/v1/projects/"


def now_timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00", time.gmtime())


def last_segment(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


class ComputeHandlers:
    """The endpoint half of FakeGce (a mixin: the state lives on the server). A handler is named after the API
    method (`instances.insert` -> `_instances_insert`) and takes (query, body, **path parameters)."""

    project: str
    zones: dict[str, str]
    machine_types: dict[str, dict[str, MachineTypeSpec]]
    accelerator_types: dict[str, dict[str, int]]
    page_size: int
    instances: dict[str, dict]
    operations: dict[str, dict]
    request_ids: dict[str, str]
    op_delay_polls: int
    op_never_done: bool
    initial_status: str
    lock: threading.RLock
    _op_polls: dict[str, int]
    _ids: itertools.count
    _ips: itertools.count

    _take_fault: Callable[..., Fault | None]     # from FaultInjection
    _consume: Callable[[dict, str, str], dict | None]     # from ReservationHandlers
    _release: Callable[[dict, str], None]

    # ---- resources
    def _zone_url(self, zone: str) -> str:
        return f"{URL_ROOT}{self.project}/zones/{zone}"

    def _materialize(self, body: dict, zone: str) -> dict:
        """Turn an insert body into the stored resource, adding the output-only fields GCE adds."""
        inst = copy.deepcopy(body)
        n = next(self._ids)
        inst.update(kind="compute#instance", id=str(n), creationTimestamp=now_timestamp(),
                    zone=self._zone_url(zone),
                    selfLink=f"{self._zone_url(zone)}/instances/{body['name']}",
                    labelFingerprint=f"lf{n}", fingerprint=f"f{n}", status="PROVISIONING")
        inst["machineType"] = f"{self._zone_url(zone)}/machineTypes/{last_segment(body['machineType'])}"
        md = inst.setdefault("metadata", {})
        md.setdefault("items", [])
        md.update(kind="compute#metadata", fingerprint=f"mf{n}")
        for i, nic in enumerate(inst.get("networkInterfaces", [])):
            nic.setdefault("name", f"nic{i}")
            nic["networkIP"] = f"10.128.0.{next(self._ips) % 250 + 2}"
            for ac in nic.get("accessConfigs", []):
                ac["natIP"] = f"34.1.{n % 250}.{i + 1}"
        return inst

    def _new_op(self, zone: str, op_type: str, target: str, error: dict | None = None,
                http_status: int | None = None, http_message: str | None = None) -> dict:
        n = next(self._ids)
        name = f"operation-{n}-{uuid.uuid4().hex[:8]}"
        done = self.op_delay_polls == 0 and not self.op_never_done
        op: dict[str, Any] = {
            "kind": "compute#operation", "id": str(n), "name": name, "zone": self._zone_url(zone),
            "operationType": op_type, "targetLink": f"{self._zone_url(zone)}/instances/{target}",
            "status": "DONE" if done else "RUNNING", "progress": 100 if done else 0, "insertTime": now_timestamp(),
            "startTime": now_timestamp(), "selfLink": f"{self._zone_url(zone)}/operations/{name}",
            "user": "fake@example.com",
        }
        if done:
            op["endTime"] = now_timestamp()
        if error is not None:
            op["error"] = error
            op["httpErrorStatusCode"] = http_status
            op["httpErrorMessage"] = http_message
        self.operations[name] = op
        self._op_polls[name] = 0
        return op

    def _poll(self, name: str, zone: str) -> dict:
        with self.lock:
            op = self.operations.get(name)
            if op is None or not op["zone"].endswith("/" + zone):
                raise ApiError(404, f"The resource 'projects/{self.project}/zones/{zone}/operations/{name}' "
                                    "was not found", reason="notFound")
            self._op_polls[name] += 1
            if op["status"] != "DONE" and not self.op_never_done and self._op_polls[name] >= self.op_delay_polls:
                op.update(status="DONE", progress=100, endTime=now_timestamp())
            return copy.deepcopy(op)

    def _get_inst(self, name: str, zone: str) -> dict:
        inst = self.instances.get(name)
        if inst is None or not inst["zone"].endswith("/" + zone):
            raise ApiError(404, f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not "
                                "found", reason="notFound")
        return inst

    # ---- handlers: zones, machine types, accelerator types
    def _zones_list(self, q: dict, body: Any) -> dict:
        items = [{"kind": "compute#zone", "name": z, "status": "UP", "region": f"{URL_ROOT}{self.project}/regions/{r}",
                  "selfLink": self._zone_url(z), "id": str(i)} for i, (z, r) in enumerate(sorted(self.zones.items()))]
        if q.get("filter"):
            terms = parse_filter(q["filter"])
            items = [i for i in items if filter_match(i, terms)]
        return self._page(items, q, "compute#zoneList")

    def _zones_get(self, q: dict, body: Any, zone: str) -> dict:
        return {"kind": "compute#zone", "name": zone, "status": "UP",
                "region": f"{URL_ROOT}{self.project}/regions/{self.zones[zone]}"}

    def _machineTypes_list(self, q: dict, body: Any, zone: str) -> dict:
        items = []
        for name, (cpus, mem, accs, shared, arch) in sorted(self.machine_types[zone].items()):
            mt: dict[str, Any] = {"kind": "compute#machineType", "name": name, "guestCpus": cpus, "memoryMb": mem,
                                  "isSharedCpu": shared, "architecture": arch, "zone": zone,
                                  "selfLink": f"{self._zone_url(zone)}/machineTypes/{name}"}
            if accs:
                mt["accelerators"] = [{"guestAcceleratorType": a, "guestAcceleratorCount": c} for a, c in accs]
            items.append(mt)
        return self._page(items, q, "compute#machineTypeList")

    def _acceleratorTypes_list(self, q: dict, body: Any, zone: str) -> dict:
        items = [{"kind": "compute#acceleratorType", "name": n, "maximumCardsPerInstance": c, "zone": zone,
                  "description": n, "selfLink": f"{self._zone_url(zone)}/acceleratorTypes/{n}"}
                 for n, c in sorted(self.accelerator_types[zone].items())]
        return self._page(items, q, "compute#acceleratorTypeList")

    def _page(self, items: list, q: dict, kind: str) -> dict:
        size = min(int(q.get("maxResults") or self.page_size), self.page_size)
        start = int(q.get("pageToken") or 0)
        out: dict[str, Any] = {"kind": kind, "items": items[start:start + size]}
        if start + size < len(items):
            out["nextPageToken"] = str(start + size)
        return out

    # ---- handlers: instances
    def _instances_insert(self, q: dict, body: Any, zone: str) -> dict:
        rid = q.get("requestId")
        if rid is not None:
            try:
                parsed = uuid.UUID(rid)
            except ValueError:
                raise ApiError(400, f"Invalid value for field 'requestId': '{rid}'. Must be a valid UUID.") from None
            if parsed.int == 0:
                raise ApiError(400, "Invalid value for field 'requestId': zero UUID is not supported.")
        validate_body(body, "Instance", "instance")
        with self.lock:
            if rid is not None and rid in self.request_ids:  # idempotent retry: same operation, nothing new
                return self._poll_nocount(self.request_ids[rid])
            check_instance(body, zone, self.machine_types[zone], self.accelerator_types[zone])
            name = body["name"]
            if name in self.instances:
                raise ApiError(409, f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' "
                                    "already exists", reason="alreadyExists")
            mt = last_segment(body["machineType"])
            sched = body.get("scheduling") or {}
            spot = sched.get("provisioningModel") == "SPOT" or sched.get("preemptible") is True
            fault = self._take_fault("instances.insert", zone, mt, kind="insert-op", spot=spot)
            refused = None if fault is not None else self._consume(body, zone, mt)     # reservations.py
            if refused is not None:
                op = self._new_op(zone, "insert", name, error=refused, http_status=412,
                                  http_message="PRECONDITION FAILED")
                op.update(status="DONE", progress=100, endTime=now_timestamp())
            elif fault is not None:
                op = self._new_op(zone, "insert", name, error={"errors": [
                    {"code": fault.code, "message": fault.message}]},
                    http_status=fault.status, http_message="SERVICE UNAVAILABLE" if fault.status == 503 else "ERROR")
                op.update(status="DONE", progress=100, endTime=now_timestamp())  # a failed insert is DONE with an error
                if fault.leave_instance:
                    inst = self._materialize(body, zone)
                    inst["status"] = "TERMINATED"
                    self.instances[name] = inst
            else:
                inst = self._materialize(body, zone)
                inst["status"] = self.initial_status
                self.instances[name] = inst
                op = self._new_op(zone, "insert", name)
            if rid is not None:
                self.request_ids[rid] = op["name"]
            return copy.deepcopy(op)

    def _poll_nocount(self, name: str) -> dict:
        return copy.deepcopy(self.operations[name])

    def _instances_get(self, q: dict, body: Any, zone: str, name: str) -> dict:
        with self.lock:
            return copy.deepcopy(self._get_inst(name, zone))

    def _instances_delete(self, q: dict, body: Any, zone: str, name: str) -> dict:
        with self.lock:
            rid = q.get("requestId")
            if rid is not None and rid in self.request_ids:
                return self._poll_nocount(self.request_ids[rid])
            self._release(self._get_inst(name, zone), zone)
            del self.instances[name]
            op = self._new_op(zone, "delete", name)
            if rid is not None:
                self.request_ids[rid] = op["name"]
            return copy.deepcopy(op)

    def _instances_setLabels(self, q: dict, body: Any, zone: str, name: str) -> dict:
        validate_body(body, "InstancesSetLabelsRequest", "instances_set_labels_request")
        with self.lock:
            inst = self._get_inst(name, zone)
            if body.get("labelFingerprint") != inst["labelFingerprint"]:
                raise ApiError(412, "Labels fingerprint either invalid or resource labels have changed",
                               reason="conditionNotMet")
            labels = body.get("labels", {})
            check_labels(labels, "labels")
            inst["labels"] = dict(labels)
            inst["labelFingerprint"] = f"lf{next(self._ids)}"
            return copy.deepcopy(self._new_op(zone, "setLabels", name))

    def _instances_setMetadata(self, q: dict, body: Any, zone: str, name: str) -> dict:
        validate_body(body, "Metadata", "metadata")
        with self.lock:
            inst = self._get_inst(name, zone)
            if body.get("fingerprint") != inst["metadata"]["fingerprint"]:
                raise ApiError(412, "Supplied fingerprint does not match current metadata fingerprint.",
                               reason="conditionNotMet")
            inst["metadata"] = {"kind": "compute#metadata", "items": list(body.get("items", [])),
                                "fingerprint": f"mf{next(self._ids)}"}
            return copy.deepcopy(self._new_op(zone, "setMetadata", name))

    def _filtered(self, q: dict, zone: str | None) -> list[dict]:
        terms = parse_filter(q["filter"]) if q.get("filter") else []
        out = []
        for name in sorted(self.instances):
            inst = self.instances[name]
            if zone is not None and not inst["zone"].endswith("/" + zone):
                continue
            if filter_match(inst, terms):
                out.append(copy.deepcopy(inst))
        return out

    def _instances_list(self, q: dict, body: Any, zone: str) -> dict:
        with self.lock:
            return self._page(self._filtered(q, zone), q, "compute#instanceList")

    def _instances_aggregatedList(self, q: dict, body: Any) -> dict:
        with self.lock:
            matched = self._filtered(q, None)
        size = min(int(q.get("maxResults") or self.page_size), self.page_size)
        start = int(q.get("pageToken") or 0)
        page = matched[start:start + size]
        items: dict[str, Any] = {}
        for z in sorted(self.zones):
            insts = [i for i in page if i["zone"].endswith("/" + z)]
            items[f"zones/{z}"] = {"instances": insts} if insts else {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope 'zones/%s' on this page." % z,
                "data": [{"key": "scope", "value": f"zones/{z}"}]}}
        out: dict[str, Any] = {"kind": "compute#instanceAggregatedList", "items": items}
        if start + size < len(matched):
            out["nextPageToken"] = str(start + size)
        return out

    # ---- handlers: operations
    def _zoneOperations_list(self, q: dict, body: Any, zone: str) -> dict:
        """The zone's operations, oldest first (GCE keeps them for a while; the fake keeps all): inserts,
        deletes, label writes, and what the system did (`compute.instances.preempted`), filtered and paged."""
        terms = parse_filter(q["filter"]) if q.get("filter") else []
        with self.lock:
            ops = [copy.deepcopy(op) for op in self.operations.values()
                   if op["zone"].endswith("/" + zone) and filter_match(op, terms)]
        return self._page(sorted(ops, key=lambda o: int(o["id"])), q, "compute#operationList")

    def _zoneOperations_get(self, q: dict, body: Any, zone: str, op: str) -> dict:
        return self._poll(op, zone)

    def _zoneOperations_wait(self, q: dict, body: Any, zone: str, op: str) -> dict:
        return self._poll(op, zone)
