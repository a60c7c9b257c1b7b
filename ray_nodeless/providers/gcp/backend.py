"""Compute Engine machine backend: one GCE instance per Ray node, launched in the zone the planner chose.

The parts, one module each: `settings.py` (the provider-block keys), `node_config.py` (config-time checks of
node_config), `clients.py` (the google-cloud-compute clients), `retries.py` (google.api_core Retry for every call),
`errors.py` (GCE errors -> our typed exceptions), `instance_body.py` (the insert body, names, requestIds),
`operations.py` (waiting for zone operations), `labels.py` (Ray tags as GCE labels + a metadata manifest).
This class only orders the calls: insert, list, delete, setLabels/setMetadata; `listing.py` answers the second look
at what a listing did not show (instances.get by id, zonal lists).
"""
from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping

from ray_nodeless.core.schema import parse_section
from ray_nodeless.errors import BackendError, ForeignMachineError, TransientBackendError
from ray_nodeless.providers.base import (
    MACHINE_PENDING, MACHINE_RUNNING, TAG_CLUSTER, TAG_RAY_NODE_KIND, LaunchSpec, Machine, MachineBackend, Reservation,
    tag_update,
)
from ray_nodeless.providers.gcp.clients import ComputeClients
from ray_nodeless.providers.gcp.reservations import list_reservations
from ray_nodeless.providers.gcp.errors import Classified, backend_error, classify_http_error
from ray_nodeless.providers.gcp.instance_body import instance_body, instance_name, request_id_for, resource_name
from ray_nodeless.providers.gcp.listing import GcpListing
from ray_nodeless.providers.gcp.labels import (
    METADATA_TAGS_KEY, cluster_label_value, encode_label_text, manifest_from_items, tags_from_storage,
    tags_to_storage,
)
from ray_nodeless.providers.gcp.operations import PendingOp, wait_all
from ray_nodeless.providers.gcp.retries import CallPolicy
from ray_nodeless.providers.gcp.config import GcpConfig
from ray_nodeless.providers.gcp.settings import GcpSettings
from ray_nodeless.providers.gcp.vanished import REASON_CHUNK, reasons, target_filter

logger = logging.getLogger(__name__)

# Instances per aggregatedList page: GCE's maximum, so a cluster is listed in as few calls as possible.
LIST_PAGE_SIZE = 500
# Read-modify-write rounds of set_tags when another writer changes the labels or metadata fingerprint between our
# read and our write; more than a couple of races in a row means something keeps rewriting them.
SET_TAGS_ATTEMPTS = 3
# Names per aggregatedList `name eq (a|b|...)` lookup of instances this backend does not know (a filter has a
# length limit).
FIND_CHUNK = 50
# A GCE instance name (RFC 1035 label): an id not of this form cannot name an instance, so it is gone.
_GCE_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
# Instances whose zone the backend remembers after they left the listing (`vanished_reasons` asks that zone): far
# more than a cluster's machines, so a vanished one is always among them.
SEEN_ZONES_LIMIT = 20_000
# The kind of a stopped instance in `leftovers()` (what `ray-nodeless sweep` shows and ends).
STOPPED_KIND = "stopped-instance"

# GCE status -> machine state. Statuses not here (STOPPING, STOPPED, SUSPENDING, SUSPENDED, TERMINATED) are not
# live machines for Ray: they are left out of the listing and reported by `leftovers()` (sweep deletes them).
_STATE_BY_STATUS = {
    "PROVISIONING": MACHINE_PENDING,
    "STAGING": MACHINE_PENDING,
    "RUNNING": MACHINE_RUNNING,
    # REPAIRING: GCE is recovering the VM in place; it still exists and comes back, so Ray should keep it.
    "REPAIRING": MACHINE_RUNNING,
}


def _parse_time(ts: str) -> float:
    if not ts:
        return 0.0
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


@dataclass
class _Known:
    """What the backend remembers about this cluster's instances between calls: name -> zone of those listed now,
    and of every one seen (bounded, oldest forgotten first), so the zone of an instance that left the listing is
    known when asking the zone why it went (`vanished_reasons`)."""

    zones: dict[str, str] = field(default_factory=dict)
    seen: OrderedDict[str, str] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def saw(self, name: str, zone: str) -> None:
        """Caller holds `lock`."""
        self.seen[name] = zone
        self.seen.move_to_end(name)
        while len(self.seen) > SEEN_ZONES_LIMIT:
            self.seen.popitem(last=False)


class GcpBackend(GcpConfig, GcpListing, MachineBackend):
    """Compute Engine instances. Instance names are the machine ids (unique per project). Provider keys and
    node_config checks: `GcpConfig`."""

    settings: GcpSettings

    def __init__(self, settings: GcpSettings, cluster_name: str):
        super().__init__(settings, cluster_name)
        self.project = self.settings.project_id
        self.region = self.settings.region
        self._policy = CallPolicy(self.settings)
        self._known = _Known()
        # Launch tokens whose instances this backend deleted after a failed launch -> how many times. GCE answers a
        # re-sent requestId with the first operation (DONE, success) even after that instance was deleted, so a
        # retry of the same token must not reuse the requestIds (nor the names) of the deleted instances.
        self._cleaned: dict[str, int] = {}
        self._clients = ComputeClients.connect(self.settings)

    def close(self) -> None:
        self._clients.close()

    @classmethod
    def bootstrap(cls, cluster_config: dict[str, Any], registration: str,
                  allowed_zones: Mapping[str, frozenset[str] | None]) -> bool:
        from ray_nodeless.providers.gcp.bootstrap import bootstrap_gcp_resources

        return bootstrap_gcp_resources(
            cluster_config, parse_section(GcpSettings, cluster_config["provider"], "provider"), registration)

    # ---- calls
    def _wait_all(self, ops: list[PendingOp], what: str) -> dict[str, Classified | None]:
        return wait_all(self._clients.zone_operations, self.project, ops, what, self.settings.operation_timeout_s,
                        self.settings.poll_interval_s)

    # ---- launch
    def launch(self, spec: LaunchSpec) -> list[str]:
        from google.cloud import compute_v1

        zone = spec.offering.zone
        what = f"launch {spec.offering.instance_type.name} {spec.offering.capacity} in {zone}"
        issued: list[PendingOp] = []
        first_error: BackendError | None = None
        stray: PendingOp | None = None
        for i in range(spec.count):
            token = self._token_generation(spec.request_token)
            name = instance_name(self.cluster_name, token, i)
            rid = request_id_for(token, i)
            body = instance_body(spec, name, rid, self.settings)
            request = compute_v1.InsertInstanceRequest(
                project=self.project, zone=zone, request_id=rid,
                instance_resource=compute_v1.Instance.from_json(json.dumps(body)))
            try:
                op = self._insert(request, name, rid, what)
            except BackendError as e:
                first_error = e
                if isinstance(e, TransientBackendError):
                    # throttled or 5xx until retries ran out, possibly after an ambiguous 5xx that did create the
                    # instance: clean this name up too (a 404 on delete is fine). Other errors created nothing,
                    # and a name collision (alreadyExists) is someone else's instance.
                    stray = PendingOp(name, zone, None)
                break
            issued.append(PendingOp(name, zone, op))
        results = self._wait_all(issued, "insert") if issued else {}
        failed = {n: c for n, c in results.items() if c is not None}
        if first_error is None and not failed:
            with self._known.lock:
                for p in issued:
                    self._known.zones[p.name] = zone
                    self._known.saw(p.name, zone)
            logger.info("%s: created %s", what, [p.name for p in issued])
            return [p.name for p in issued]
        # Never leave a machine behind when raising: delete every instance of this launch that may exist,
        # including the failed ones (a failed insert can leave a stopped instance).
        self._cleanup(issued + ([stray] if stray is not None else []), what)
        with self._known.lock:
            self._cleaned[spec.request_token] = self._cleaned.get(spec.request_token, 0) + 1
        if first_error is not None:
            raise first_error
        # report a capacity error first: it is the one the launcher acts on (next candidate)
        name, c = sorted(failed.items(), key=lambda kv: kv[1].kind != "capacity")[0]
        raise backend_error(c, f"{what}: instance {name}")

    def _token_generation(self, token: str) -> str:
        """The token the names and requestIds of this launch derive from: the launch token itself, or after this
        backend deleted what an earlier attempt of it created, a new generation of it."""
        with self._known.lock:
            n = self._cleaned.get(token, 0)
        return token if n == 0 else f"{token}#{n}"

    def _insert(self, request: Any, name: str, rid: str, what: str) -> Any:
        """instances.insert, retried on the same requestId; 409 on our own earlier attempt is success."""
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        try:
            return self._policy.call(f"insert {name}", self._clients.instances.insert_unary, request=request)
        except gexc.GoogleAPICallError as e:
            c = classify_http_error(e)
            if c.kind == "conflict":
                existing = self._get_instance(request.zone, name)
                manifest = manifest_from_items(existing.metadata.items) if existing is not None else None
                if manifest is not None and manifest.get("request_id") == rid:
                    # Our own earlier attempt (GCE forgot its requestId): done, nothing to create.
                    logger.info("insert %s: already exists from an earlier attempt with the same request id", name)
                    return compute_v1.Operation(name=f"existing-{name}", status=compute_v1.Operation.Status.DONE)
            raise backend_error(c, f"{what}: insert {name}") from e

    def _get_instance(self, zone: str, name: str) -> Any | None:
        from google.api_core import exceptions as gexc

        try:
            return self._policy.call(f"get {name}", self._clients.instances.get,
                                     project=self.project, zone=zone, instance=name)
        except gexc.NotFound:
            return None
        except gexc.GoogleAPICallError as e:
            raise backend_error(classify_http_error(e), f"get {name}") from e

    def _cleanup(self, issued: list[PendingOp], what: str) -> None:
        try:
            self._delete([(p.name, p.zone) for p in issued])
        except BackendError as e:
            logger.error("%s: could not clean up %s after a failed launch: %s", what,
                         [p.name for p in issued], e)

    # ---- list
    def _aggregated(self, what: str, filter_expr: str) -> list[tuple[str, Any]]:
        """(zone, instance) of every instance `filter_expr` matches, in any zone: one aggregatedList whose pager
        follows nextPageToken, each page under the same retry policy. Errors on any page raise BackendError."""
        from google.cloud import compute_v1

        request = compute_v1.AggregatedListInstancesRequest(project=self.project, filter=filter_expr,
                                                            max_results=LIST_PAGE_SIZE)
        out: list[tuple[str, Any]] = []
        try:
            pager = self._policy.call(what, self._clients.instances.aggregated_list, request=request)
            for scope, scoped in pager:
                zone = resource_name(scope)
                out += [(zone, inst) for inst in scoped.instances]
        except BackendError:
            raise
        except Exception as e:  # noqa: BLE001 - API, requests and google.auth errors, on any page
            raise TransientBackendError(f"{what} of cluster {self.cluster_name}: {e}",
                                        category=classify_http_error(e).category) from e
        return out

    def reservations(self) -> list[Reservation]:
        from google.cloud import compute_v1

        request = compute_v1.AggregatedListReservationsRequest(project=self.project)
        try:
            return list_reservations(lambda: self._policy.call(
                "list reservations", self._clients.reservations.aggregated_list, request=request), self.region)
        except BackendError:
            raise
        except Exception as e:  # noqa: BLE001 - API, requests and google.auth errors, on any page
            raise TransientBackendError(f"list reservations: {e}", category=classify_http_error(e).category) from e

    def _cluster_instances(self) -> list[tuple[str, Any]]:
        """(zone, instance) of every instance labelled with this cluster in this region, whatever its status."""
        found = self._aggregated("list instances",
                                 f'labels.{TAG_CLUSTER} = "{cluster_label_value(self.cluster_name)}"')
        return [(zone, inst) for zone, inst in found if zone.startswith(self.region + "-")]

    def list_machines(self) -> list[Machine]:
        machines: list[Machine] = []
        zones: dict[str, str] = {}
        for zone, inst in self._cluster_instances():
            m = self._machine(inst)
            if m is not None:
                machines.append(m)
                zones[m.id] = zone
        with self._known.lock:
            self._known.zones = zones
            for name, zone in zones.items():
                self._known.saw(name, zone)
        return machines

    def vanished_reasons(self, machine_ids: list[str]) -> dict[str, str]:
        """Why these instances went, from their zones' operations (`vanished.py`): a preemption recorded ->
        "interrupted", a delete call (from anyone) -> "terminated"; an instance whose zone the backend never saw,
        or with neither recorded, is left out. One zoneOperations.list per zone and chunk of names."""
        from google.cloud import compute_v1

        with self._known.lock:
            by_zone: dict[str, list[str]] = {}
            for m in machine_ids:
                if m in self._known.seen:
                    by_zone.setdefault(self._known.seen[m], []).append(m)
        out: dict[str, str] = {}
        for zone in sorted(by_zone):
            names = sorted(set(by_zone[zone]))
            for i in range(0, len(names), REASON_CHUNK):
                chunk = names[i:i + REASON_CHUNK]
                request = compute_v1.ListZoneOperationsRequest(project=self.project, zone=zone,
                                                               filter=target_filter(chunk))
                what = f"operations on {len(chunk)} instance(s) in {zone}"
                try:
                    ops = list(self._policy.call(what, self._clients.zone_operations.list, request=request))
                except BackendError:
                    raise
                except Exception as e:  # noqa: BLE001 - API, requests and google.auth errors, on any page
                    raise TransientBackendError(f"{what}: {e}", category=classify_http_error(e).category) from e
                out.update(reasons(ops, chunk))
        return out

    def leftovers(self) -> list[dict[str, str]]:
        """Instances labelled with this cluster that are not live (STOPPING, TERMINATED = stopped, SUSPENDING,
        SUSPENDED): not Ray nodes (not listed), but their disks keep costing, so `ray-nodeless sweep` deletes them.
        Listed afresh."""
        out = []
        for zone, inst in self._cluster_instances():
            if inst.status in _STATE_BY_STATUS:
                continue
            tags = self._tags(inst)
            if tags.get(TAG_CLUSTER) == self.cluster_name:
                with self._known.lock:
                    self._known.zones[inst.name] = zone     # terminate may delete it (stopped, still ours)
                out.append({"kind": STOPPED_KIND, "name": inst.name, "machine_id": inst.name,
                            "node_kind": tags.get(TAG_RAY_NODE_KIND, ""), "state": inst.status})
        return sorted(out, key=lambda d: d["name"])

    def end_leftovers(self, leftovers: list[dict[str, str]]) -> None:
        """Delete the stopped instances among `leftovers` (checked again by `terminate`)."""
        names = [d["name"] for d in leftovers if d.get("kind") == STOPPED_KIND]
        if names:
            self.terminate(names)

    @staticmethod
    def _tags(inst: Any) -> dict[str, str]:
        return tags_from_storage(dict(inst.labels), manifest_from_items(inst.metadata.items))

    def _machine(self, inst: Any) -> Machine | None:
        state = _STATE_BY_STATUS.get(inst.status)
        if state is None:
            return None
        tags = self._tags(inst)
        if tags.get(TAG_CLUSTER) != self.cluster_name:
            # the server filter matched a hashed stand-in or a foreign label: not ours
            return None
        internal_ip = external_ip = None
        if inst.network_interfaces:
            nic = inst.network_interfaces[0]
            internal_ip = nic.network_i_p or None
            external_ip = next((ac.nat_i_p for ac in nic.access_configs if ac.nat_i_p), None)
        return Machine(id=inst.name, tags=tags, state=state, internal_ip=internal_ip, external_ip=external_ip,
                       launched_at=_parse_time(inst.creation_timestamp))

    # ---- terminate
    def _sort_out(self, machine_ids: list[str]) -> tuple[list[tuple[str, str]], list[str], list[str]]:
        """(ours as (name, zone), gone, foreign) by what GCE says: names this backend does not know are looked up
        by name in every zone (one aggregatedList per chunk), so a restarted provider reaches the cloud too, and a
        foreign instance (another cluster's label, none, another region) is told apart from a gone one."""
        with self._known.lock:
            known = dict(self._known.zones)
        ours = [(m, known[m]) for m in machine_ids if m in known]
        missing = [m for m in machine_ids if m not in known]
        found: dict[str, tuple[str, Any]] = {}
        names = [m for m in missing if _GCE_NAME.fullmatch(m)]      # anything else cannot be an instance
        for i in range(0, len(names), FIND_CHUNK):
            chunk = names[i:i + FIND_CHUNK]
            for zone, inst in self._aggregated("find instances", f'name eq "({"|".join(chunk)})"'):
                if inst.name in chunk:
                    found[inst.name] = (zone, inst)
        gone, foreign = [], []
        for m in missing:
            if m not in found:
                gone.append(m)
                continue
            zone, inst = found[m]
            if self._tags(inst).get(TAG_CLUSTER) == self.cluster_name and zone.startswith(self.region + "-"):
                ours.append((m, zone))
                with self._known.lock:
                    self._known.zones[m] = zone
                    self._known.saw(m, zone)
            else:
                foreign.append(m)
        return ours, gone, foreign

    def terminate(self, machine_ids: list[str]) -> None:
        if not machine_ids:
            return
        ours, gone, foreign = self._sort_out(list(dict.fromkeys(machine_ids)))
        if gone:
            logger.info("terminate: already gone %s", gone[:20])
        self._delete(ours)
        if foreign:
            raise ForeignMachineError(f"terminate: {foreign[:20]} are not instances of cluster {self.cluster_name} "
                                      f"in {self.region}; not touched", foreign)

    def _delete(self, targets: list[tuple[str, str]]) -> None:
        """Issue every delete first, then wait for all the operations; 404s are ignored."""
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        issued: list[PendingOp] = []
        errors: list[str] = []
        for name, zone in targets:
            # one requestId per delete, kept by every retry of it
            request = compute_v1.DeleteInstanceRequest(project=self.project, zone=zone, instance=name,
                                                       request_id=str(uuid.uuid4()))
            try:
                op = self._policy.call(f"delete {name}", self._clients.instances.delete_unary, request=request)
            except gexc.NotFound:
                self._forget(name)
                continue
            except (BackendError, gexc.GoogleAPICallError) as e:
                errors.append(f"{name}: {e}")
                continue
            issued.append(PendingOp(name, zone, op))
        for name, c in self._wait_all(issued, "delete").items():
            if c is None or c.kind == "notfound":
                self._forget(name)
            else:
                errors.append(f"{name}: {c.message}")
        if errors:
            raise TransientBackendError(f"terminate: {len(errors)} of {len(targets)} deletes failed: "
                                        + "; ".join(errors), category="DeleteFailed")

    def _forget(self, name: str) -> None:
        with self._known.lock:
            self._known.zones.pop(name, None)

    # ---- tags
    def set_tags(self, machine_id: str, tags: dict[str, str]) -> bool:
        from google.api_core import exceptions as gexc

        tags = tag_update(self.cluster_name, machine_id, tags)
        if not tags:
            return True
        ours, gone, foreign = self._sort_out([machine_id])
        if foreign:
            raise ForeignMachineError(f"set_tags: {machine_id} is not an instance of cluster {self.cluster_name} in "
                                      f"{self.region}; not tagging", [machine_id])
        if gone:
            logger.info("set_tags: %s is gone; not tagging", machine_id)
            return False
        _, zone = ours[0]
        for _ in range(SET_TAGS_ATTEMPTS):
            inst = self._get_instance(zone, machine_id)
            if inst is None:
                self._forget(machine_id)
                logger.info("set_tags: %s is gone; not tagging", machine_id)
                return False
            try:
                ops = self._write_tags(inst, zone, tags)
            except gexc.GoogleAPICallError as e:
                c = classify_http_error(e)
                if c.kind == "precondition":
                    continue       # a fingerprint race with another writer: re-read and merge again
                if c.kind == "notfound":
                    self._forget(machine_id)
                    return False
                raise backend_error(c, f"set_tags {machine_id}") from e
            for name, failed in self._wait_all(ops, "set tags on").items():
                if failed is not None:
                    raise backend_error(failed, f"set_tags {name}")
            return True
        raise TransientBackendError(f"set_tags {machine_id}: labels kept changing underneath",
                                    category="conditionNotMet")

    def _write_tags(self, inst: Any, zone: str, tags: dict[str, str]) -> list[PendingOp]:
        """Merge `tags` into the instance's tags and write labels and metadata that changed (fingerprinted)."""
        from google.cloud import compute_v1

        old_manifest = manifest_from_items(inst.metadata.items)
        current = tags_from_storage(dict(inst.labels), old_manifest)
        merged = {**current, **tags}
        if merged == current:
            return []
        old_tag_label_keys = {encode_label_text(k) for k in current} | {TAG_CLUSTER}
        storage = tags_to_storage(merged, request_id=(old_manifest or {}).get("request_id"))
        user_labels = {k: v for k, v in inst.labels.items() if k not in old_tag_label_keys}
        new_labels = {**user_labels, **storage.labels}
        ops: list[PendingOp] = []
        if new_labels != dict(inst.labels):
            req = compute_v1.SetLabelsInstanceRequest(
                project=self.project, zone=zone, instance=inst.name,
                instances_set_labels_request_resource=compute_v1.InstancesSetLabelsRequest(
                    labels=new_labels, label_fingerprint=inst.label_fingerprint))
            ops.append(PendingOp(inst.name, zone, self._policy.call(
                f"setLabels {inst.name}", self._clients.instances.set_labels_unary, request=req)))
        if old_manifest is None or storage.manifest != old_manifest:
            items = [compute_v1.Items(key=i.key, value=i.value) for i in inst.metadata.items
                     if i.key != METADATA_TAGS_KEY]
            items.append(compute_v1.Items(key=METADATA_TAGS_KEY, value=storage.metadata_value()))
            mreq = compute_v1.SetMetadataInstanceRequest(
                project=self.project, zone=zone, instance=inst.name,
                metadata_resource=compute_v1.Metadata(items=items, fingerprint=inst.metadata.fingerprint))
            ops.append(PendingOp(inst.name + "#metadata", zone, self._policy.call(
                f"setMetadata {inst.name}", self._clients.instances.set_metadata_unary, request=mreq)))
        return ops
