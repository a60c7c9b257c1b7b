"""Compute Engine machine backend: one GCE instance per Ray node, launched in the zone the planner chose.

Talks to Compute Engine through google-cloud-compute over REST. Operations are polled with our own
`ZoneOperationsClient` built with the same client options: the ExtendedOperation returned by `insert()` polls
through an internal client that ignores `api_endpoint` (see /work/shared/notes/cloud-testing.md §3), so we use
`insert_unary()` / `delete_unary()` and `ZoneOperationsClient.wait`.

Tags and labels
---------------
Ray tags are stored as GCE labels set in the insert body, so no instance ever exists untagged; the reversible
mapping, and the metadata manifest for tags that labels cannot hold, are in `gcp_labels.py`.

"""
from __future__ import annotations

import copy
import json
import logging
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Mapping, Any, Callable, TypeVar

from ray_nodeless.errors import BackendError, CapacityError, ConfigError, TransientBackendError
from ray_nodeless.core.gpus import canonical_gpu
from ray_nodeless.providers.gcp.labels import (  # noqa: F401  (decode_label_text: re-exported for callers)
    _LABEL_KEY_RE, _LABEL_VALUE_RE, MAX_LABEL_LEN, METADATA_TAGS_KEY, _manifest_from_items, cluster_label_value,
    decode_label_text, encode_label_text, tags_from_storage, tags_to_storage,
)
from ray_nodeless.providers.base import (
    MACHINE_PENDING,
    MACHINE_RUNNING,
    TAG_CLUSTER,
    LaunchSpec,
    Machine,
    MachineBackend,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
# Namespace for deriving per-instance request ids and names from a launch's request token (uuid5).
_TOKEN_NAMESPACE = uuid.UUID("5f0b8f5e-8d0a-4c59-9a55-2a8f1b0c6e11")

# Every property of the Compute v1 `Instance` resource (discovery revision 20261106). node_config may use the
# writable ones; output-only ones and the ones ray_nodeless sets itself are rejected with a clear message.
INSTANCE_FIELDS = frozenset({
    "advancedMachineFeatures", "canIpForward", "confidentialInstanceConfig", "cpuPlatform", "creationTimestamp",
    "deletionProtection", "description", "disks", "displayDevice", "fingerprint", "guestAccelerators", "hostname",
    "id", "instanceEncryptionKey", "keyRevocationActionType", "kind", "labelFingerprint", "labels",
    "lastStartTimestamp", "lastStopTimestamp", "lastSuspendedTimestamp", "localSsdEncryptionMode", "machineType",
    "metadata", "minCpuPlatform", "name", "networkInterfaces", "networkPerformanceConfig", "params",
    "privateIpv6GoogleAccess", "reservationAffinity", "resourcePolicies", "resourceStatus", "satisfiesPzi",
    "satisfiesPzs", "scheduling", "selfLink", "serviceAccounts", "shieldedInstanceConfig",
    "shieldedInstanceIntegrityPolicy", "sourceMachineImage", "sourceMachineImageEncryptionKey", "startRestricted",
    "status", "statusMessage", "tags", "workloadIdentityConfig", "zone",
})
OUTPUT_ONLY_FIELDS = frozenset({
    "cpuPlatform", "creationTimestamp", "id", "kind", "lastStartTimestamp", "lastStopTimestamp",
    "lastSuspendedTimestamp", "resourceStatus", "satisfiesPzi", "satisfiesPzs", "selfLink", "startRestricted",
    "status", "statusMessage", "zone", "fingerprint", "labelFingerprint",
})
SET_BY_BACKEND_FIELDS = frozenset({"name"})

# Cloud error codes that mean "no capacity / quota for this offering right now": the launcher moves on.
CAPACITY_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "ZONE_RESOURCE_POOL_EXHAUSTED", "STOCKOUT",
                  "QUOTA_EXCEEDED")
_STOCKOUT_PHRASES = ("does not have enough resources available", "resource pool exhausted")
_QUOTA_RE = re.compile(r"Quota '[^']*' exceeded", re.IGNORECASE)
_RATE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"})
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

_STATE_BY_STATUS = {
    "PROVISIONING": MACHINE_PENDING,
    "STAGING": MACHINE_PENDING,
    "RUNNING": MACHINE_RUNNING,
    # REPAIRING: GCE is recovering the VM in place; it still exists and comes back, so Ray should keep it.
    "REPAIRING": MACHINE_RUNNING,
}

# Families whose machine types accept only Hyperdisk boot disks (pd-* is rejected), used for the default disk.
_HYPERDISK_ONLY_FAMILIES = frozenset({"c4", "c4a", "c4d", "n4", "x4", "a4", "a4x", "m4", "h4d", "c3d-lssd"})


# ----------------------------------------------------------------------------------------- names


def instance_name(cluster_name: str, token: str, index: int) -> str:
    """`ray-<cluster>-<10 hex>` in GCE name syntax, derived from the request token so retries reuse it."""
    short = uuid.uuid5(_TOKEN_NAMESPACE, f"{token}/{index}").hex[:10]
    c = re.sub(r"[^a-z0-9-]+", "-", cluster_name.lower())
    c = re.sub(r"-{2,}", "-", c).strip("-")[:MAX_LABEL_LEN - len("ray--") - len(short)].rstrip("-")
    return f"ray-{c}-{short}" if c else f"ray-{short}"


def request_id_for(token: str, index: int) -> str:
    """The GCE requestId (must be a non-zero UUID) of instance `index` of a launch."""
    if index == 0:
        try:
            u = uuid.UUID(token)
            if u.int != 0:
                return str(u)
        except ValueError:
            pass
    return str(uuid.uuid5(_TOKEN_NAMESPACE, f"{token}/{index}/request"))


def _last(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _parse_time(ts: str) -> float:
    if not ts:
        return 0.0
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


# ----------------------------------------------------------------------------------------- error mapping


@dataclass
class _Classified:
    kind: str          # "capacity" | "retry" | "notfound" | "conflict" | "precondition" | "fatal"
    category: str
    message: str


def _error_reasons(exc: Any) -> list[str]:
    reasons: list[str] = []
    for e in getattr(exc, "errors", None) or []:
        if isinstance(e, dict):
            reasons.append(str(e.get("reason", "")))
        else:
            reasons.append(str(getattr(e, "reason", "")))
    r = getattr(exc, "reason", None)
    if r:
        reasons.append(str(r))
    return reasons


def classify_http_error(exc: Exception) -> _Classified:
    """Map a google.api_core exception (or a transport failure) to what the backend does next."""
    from google.api_core import exceptions as gexc

    text = str(exc)
    if not isinstance(exc, gexc.GoogleAPICallError):
        return _Classified("retry", type(exc).__name__, text)     # connection reset, DNS, timeout
    status = int(exc.code or 0) if isinstance(exc.code, int) else 0
    reasons = _error_reasons(exc)
    for code in CAPACITY_CODES:
        if code in text:
            return _Classified("capacity", code, text)
    if status == 429 or any(r in _RATE_REASONS for r in reasons):
        return _Classified("retry", "rateLimitExceeded", text)
    if "quotaExceeded" in reasons or _QUOTA_RE.search(text):
        return _Classified("capacity", "QUOTA_EXCEEDED", text)
    if any(p in text for p in _STOCKOUT_PHRASES):
        return _Classified("capacity", "STOCKOUT", text)
    if status == 404:
        return _Classified("notfound", "notFound", text)
    if status == 409:
        return _Classified("conflict", "alreadyExists", text)
    if status == 412:
        return _Classified("precondition", "conditionNotMet", text)
    if status in _RETRY_STATUSES:
        return _Classified("retry", f"HTTP{status}", text)
    return _Classified("fatal", reasons[0] if reasons and reasons[0] else f"HTTP{status}", text)


def classify_operation_error(op: Any) -> _Classified | None:
    """The error a DONE operation carries, classified; None if it succeeded."""
    errs = list(op.error.errors) if op.error and op.error.errors else []
    if not errs:
        return None
    code = errs[0].code or "UNKNOWN"
    msg = "; ".join(f"{e.code}: {e.message}" for e in errs)
    for c in CAPACITY_CODES:
        if any(e.code == c for e in errs):
            return _Classified("capacity", c, msg)
    if any(p in msg for p in _STOCKOUT_PHRASES):
        return _Classified("capacity", "STOCKOUT", msg)
    if _QUOTA_RE.search(msg):
        return _Classified("capacity", "QUOTA_EXCEEDED", msg)
    if code == "RESOURCE_NOT_FOUND":
        return _Classified("notfound", code, msg)
    if code in ("RATE_LIMIT_EXCEEDED",):
        return _Classified("retry", code, msg)
    return _Classified("fatal", code, msg)


def _raise_for(c: _Classified, what: str) -> None:
    if c.kind == "capacity":
        # Quotas are regional: no other zone of the region can launch this type either.
        raise CapacityError(f"{what}: {c.message}", category=c.category,
                            scope="region" if c.category == "QUOTA_EXCEEDED" else "zone")
    if c.kind == "retry":
        raise TransientBackendError(f"{what}: {c.message}", category=c.category)
    raise BackendError(f"{what}: {c.message}", category=c.category)


# ----------------------------------------------------------------------------------------- backend


@dataclass
class _PendingOp:
    """An issued zone operation we still have to wait for."""

    name: str                # instance name
    zone: str
    operation: Any           # compute_v1.Operation


@dataclass
class _Known:
    """What the backend remembers about this cluster's instances between calls (name -> zone)."""

    zones: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class GcpBackend(MachineBackend):
    """Compute Engine instances. Instance names are the machine ids (unique per project)."""

    cloud = "gcp"

    def __init__(self, provider_config: dict[str, Any], cluster_name: str):
        super().__init__(provider_config, cluster_name)
        try:
            self.project: str = provider_config["project_id"]
            self.region: str = provider_config["region"]
        except KeyError as e:
            raise ConfigError(f"provider.{e.args[0]}", "is required for the gcp backend") from None
        self.operation_timeout_s = float(provider_config.get("operation_timeout_s", 300))
        self.call_timeout_s = float(provider_config.get("call_timeout_s", 60))
        self.max_attempts = int(provider_config.get("max_attempts", 6))
        self.retry_base_s = float(provider_config.get("retry_base_s", 0.5))
        self.retry_max_s = float(provider_config.get("retry_max_s", 16.0))
        self.poll_interval_s = float(provider_config.get("poll_interval_s", 1.0))
        self._known = _Known()
        self._instances, self._zone_ops = self._make_clients()

    # ---- clients
    def _make_clients(self) -> tuple[Any, Any]:
        from google.api_core.client_options import ClientOptions
        from google.cloud import compute_v1

        kwargs: dict[str, Any] = {"transport": "rest"}
        endpoint = self.provider_config.get("api_endpoint")
        if endpoint:
            kwargs["client_options"] = ClientOptions(api_endpoint=endpoint)
        creds = self.provider_config.get("credentials")
        if creds == "anonymous":
            from google.auth.credentials import AnonymousCredentials

            kwargs["credentials"] = AnonymousCredentials()
        elif creds is not None and not isinstance(creds, str):
            kwargs["credentials"] = creds          # an explicit google.auth Credentials object
        # otherwise google.auth.default() inside the client
        # Both clients share the options so operations are polled where they were created.
        return compute_v1.InstancesClient(**kwargs), compute_v1.ZoneOperationsClient(**kwargs)

    def close(self) -> None:
        for c in (self._instances, self._zone_ops):
            try:
                c.transport.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                logger.debug("closing a compute client failed", exc_info=True)

    # ---- retries
    def _backoff(self, attempt: int) -> float:
        # full jitter: spreads retries of many launching threads instead of synchronising them
        return random.uniform(0, min(self.retry_max_s, self.retry_base_s * (2 ** attempt)))

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one API call, retrying throttling and 5xx with jittered backoff.

        The callers build the request (including its requestId) once, outside `fn`, so every retry of a mutating
        call carries the same requestId and GCE answers a repeat with the original operation instead of acting
        twice. Raises the google.api_core exception for non-retryable errors, TransientBackendError when
        retries run out.
        """
        last: _Classified | None = None
        for attempt in range(self.max_attempts):
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 - classified below
                c = classify_http_error(e)
                if c.kind != "retry":
                    raise
                last = c
                if attempt + 1 < self.max_attempts:
                    delay = self._backoff(attempt)
                    logger.info("%s: %s (attempt %d/%d), retrying in %.2fs", what, c.category, attempt + 1,
                                self.max_attempts, delay)
                    time.sleep(delay)
        assert last is not None
        raise TransientBackendError(f"{what}: still failing after {self.max_attempts} attempts: {last.message}",
                                    category=last.category)

    def _wait_all(self, ops: list[_PendingOp], what: str) -> dict[str, _Classified | None]:
        """Wait for every operation (they run concurrently server-side) within one shared deadline.

        Returns instance name -> classified error (None = success). An operation that does not finish in time
        is reported as a `timeout` error naming the operation.
        """
        from google.cloud import compute_v1

        done_status = compute_v1.Operation.Status.DONE
        deadline = time.monotonic() + self.operation_timeout_s
        results: dict[str, _Classified | None] = {}
        for p in ops:
            op = p.operation
            polls = 0
            while op.status != done_status:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    results[p.name] = _Classified(
                        "timeout", "OperationTimeout",
                        f"operation {op.name} ({what} {p.name} in {p.zone}) did not finish within "
                        f"{self.operation_timeout_s:g}s")
                    break
                if polls:
                    # `wait` blocks up to ~2 min on GCE; a server that answers at once must not make us spin
                    time.sleep(min(self.poll_interval_s, 0.05 * (2 ** min(polls, 5)), max(remaining, 0)))
                polls += 1
                name = op.name
                try:
                    op = self._call(f"wait {name}", lambda: self._zone_ops.wait(
                        project=self.project, zone=p.zone, operation=name, retry=None,
                        timeout=max(1.0, min(remaining, 130.0))))
                except TransientBackendError:
                    continue   # keep polling until the deadline
                except Exception as e:  # noqa: BLE001
                    results[p.name] = classify_http_error(e)
                    break
            else:
                results[p.name] = classify_operation_error(op)
        return results

    # ---- node_config
    @classmethod
    def requirement_overrides(cls, provider: Mapping[str, Any], node_config: dict[str, Any]) -> dict[str, Any]:
        mt = node_config.get("machineType")
        if not mt:
            return {}
        name = _last(str(mt))
        accs = node_config.get("guestAccelerators") or []
        if accs:
            acc = accs[0]
            count = int(acc.get("acceleratorCount", 1))
            model = canonical_gpu(_last(str(acc.get("acceleratorType", ""))))
            name = f"{name}+{count}x{model}"
        return {"instance_types": [name]}

    @classmethod
    def check_node_config(cls, provider: Mapping[str, Any], node_type: str, node_config: dict[str, Any],
                          key: str) -> None:
        from google.cloud import compute_v1
        from google.protobuf import json_format

        for k in node_config:
            if k not in INSTANCE_FIELDS:
                raise ConfigError(f"{key}.{k}", f"not a Compute Engine Instance field (node type {node_type!r}); "
                                                "node_config takes the instances.insert body keys")
            if k in OUTPUT_ONLY_FIELDS:
                raise ConfigError(f"{key}.{k}", "is output-only in the Compute Engine API and cannot be set")
            if k in SET_BY_BACKEND_FIELDS:
                raise ConfigError(f"{key}.{k}", "ray_nodeless names every instance itself; remove it")
        # Nested keys and JSON types: parse with the client's own proto schema (what insert would send).
        try:
            compute_v1.Instance.from_json(json.dumps(node_config))
        except (json_format.ParseError, TypeError, ValueError) as e:
            m = re.search(r'at "?Instance\.?([\w.\[\]]*)', str(e))
            sub = f".{m.group(1)}" if m and m.group(1) else ""
            raise ConfigError(f"{key}{sub}", str(e).splitlines()[0]) from None
        accs = node_config.get("guestAccelerators") or []
        if accs and not node_config.get("machineType"):
            raise ConfigError(f"{key}.guestAccelerators", "needs a machineType beside it; to choose GPUs by "
                                                          "model let the planner pick with `gpus: [...]`")
        if len(accs) > 1:
            raise ConfigError(f"{key}.guestAccelerators", "only one accelerator type per instance is supported")
        for lk, lv in (node_config.get("labels") or {}).items():
            if not _LABEL_KEY_RE.fullmatch(str(lk)) or not _LABEL_VALUE_RE.fullmatch(str(lv)):
                raise ConfigError(f"{key}.labels.{lk}", "GCE labels must be lowercase [a-z0-9_-], keys start "
                                                        "with a letter, at most 63 characters")
        sched = node_config.get("scheduling") or {}
        if "preemptible" in sched or "provisioningModel" in sched:
            logger.warning("%s.scheduling: preemptible/provisioningModel are decided by the offering's capacity "
                           "type (use the `capacity` requirement); they are overridden at launch", key)

    # ---- launch
    def _instance_body(self, spec: LaunchSpec, name: str, request_id: str) -> dict[str, Any]:
        it = spec.offering.instance_type
        zone = spec.offering.zone
        body: dict[str, Any] = copy.deepcopy(spec.node_config)
        body["name"] = name
        body["machineType"] = f"zones/{zone}/machineTypes/{it.machine_type or it.name}"
        # The offering decides the accelerators: node_config's guestAccelerators became an allow-list
        # (requirement_overrides), so copying them too would attach them twice or to the wrong host.
        body.pop("guestAccelerators", None)
        if it.attached_gpu and it.gpu_count:
            body["guestAccelerators"] = [{
                "acceleratorType": f"zones/{zone}/acceleratorTypes/{it.attached_gpu}",
                "acceleratorCount": int(it.gpu_count)}]
        sched = {k: v for k, v in (body.get("scheduling") or {}).items()
                 if k not in ("preemptible", "provisioningModel", "instanceTerminationAction")}
        if spec.offering.capacity == "spot":
            # spot VMs cannot live-migrate or restart; DELETE so a preempted node vanishes from the listing
            sched.update(provisioningModel="SPOT", instanceTerminationAction="DELETE", automaticRestart=False,
                         onHostMaintenance="TERMINATE")
        else:
            sched["provisioningModel"] = "STANDARD"
        if it.gpu_count or it.accelerator_count:
            sched["onHostMaintenance"] = "TERMINATE"     # GPU VMs do not support live migration
        body["scheduling"] = sched
        if not body.get("disks"):
            body["disks"] = [self._default_boot_disk(it.family, zone)]
        else:
            body["disks"] = [self._zonal_disk(d, zone) for d in body["disks"]]
        if not body.get("networkInterfaces"):
            body["networkInterfaces"] = [{
                "network": self.provider_config.get("network", "global/networks/default"),
                "accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}]
        storage = tags_to_storage(spec.tags, request_id=request_id)
        labels = {str(k): str(v) for k, v in (body.get("labels") or {}).items()}
        labels.update(storage.labels)
        body["labels"] = labels
        md = dict(body.get("metadata") or {})
        items = [i for i in (md.get("items") or []) if i.get("key") != METADATA_TAGS_KEY]
        items.append({"key": METADATA_TAGS_KEY, "value": storage.metadata_value()})
        if spec.boot_script:
            if any(i.get("key") == "startup-script" for i in items):
                logger.warning("node type %s: metadata startup-script given with disable_node_updaters; it must "
                               "start Ray itself (ray_nodeless's boot script is not added)", spec.node_type)
            else:
                items.append({"key": "startup-script", "value": spec.boot_script})
        md["items"] = items
        body["metadata"] = md
        return body

    def _default_boot_disk(self, family: str, zone: str) -> dict[str, Any]:
        disk_type = "hyperdisk-balanced" if family in _HYPERDISK_ONLY_FAMILIES else "pd-balanced"
        return {"boot": True, "autoDelete": True, "initializeParams": {
            "sourceImage": self.provider_config.get("image", DEFAULT_IMAGE),
            "diskSizeGb": str(int(self.provider_config.get("disk_size_gb", 50))),
            "diskType": f"zones/{zone}/diskTypes/{disk_type}"}}

    @staticmethod
    def _zonal_disk(disk: dict[str, Any], zone: str) -> dict[str, Any]:
        # A YAML written for one zone names disk types in that zone; the planner may pick another one.
        d = copy.deepcopy(disk)
        params = d.get("initializeParams") or {}
        dt = params.get("diskType")
        if isinstance(dt, str) and dt and not dt.startswith(("https://", "projects/")):
            params["diskType"] = f"zones/{zone}/diskTypes/{_last(dt)}"
        return d

    def launch(self, spec: LaunchSpec) -> list[str]:
        from google.cloud import compute_v1

        zone = spec.offering.zone
        what = f"launch {spec.offering.instance_type.name} {spec.offering.capacity} in {zone}"
        issued: list[_PendingOp] = []
        first_error: BackendError | None = None
        stray: _PendingOp | None = None
        for i in range(spec.count):
            name = instance_name(self.cluster_name, spec.request_token, i)
            rid = request_id_for(spec.request_token, i)
            body = self._instance_body(spec, name, rid)
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
                    stray = _PendingOp(name, zone, None)
                break
            issued.append(_PendingOp(name, zone, op))
        results = self._wait_all(issued, "insert") if issued else {}
        failed = {n: c for n, c in results.items() if c is not None}
        if first_error is None and not failed:
            with self._known.lock:
                for p in issued:
                    self._known.zones[p.name] = zone
            logger.info("%s: created %s", what, [p.name for p in issued])
            return [p.name for p in issued]
        # Never leave a machine behind when raising: delete every instance of this launch that may exist,
        # including the failed ones (a failed insert can leave a stopped instance).
        self._cleanup(issued + ([stray] if stray is not None else []), what)
        if first_error is not None:
            raise first_error
        # report a capacity error first: it is the one the launcher acts on (next candidate)
        ranked = sorted(failed.items(), key=lambda kv: kv[1].kind != "capacity")
        name, c = ranked[0]
        _raise_for(c, f"{what}: instance {name}")
        raise AssertionError("unreachable")

    def _insert(self, request: Any, name: str, rid: str, what: str) -> Any:
        """instances.insert with retries on the same requestId; 409 on our own earlier attempt is success."""
        from google.api_core import exceptions as gexc

        try:
            return self._call(f"insert {name}", lambda: self._instances.insert_unary(
                request=request, retry=None, timeout=self.call_timeout_s))
        except BackendError:
            raise
        except gexc.GoogleAPICallError as e:
            c = classify_http_error(e)
            if c.kind == "conflict":
                existing = self._get_instance(request.zone, name)
                manifest = _manifest_from_items(existing.metadata.items) if existing is not None else None
                if manifest is not None and manifest.get("request_id") == rid:
                    # Our own earlier attempt (its requestId was forgotten): done, nothing to create.
                    logger.info("insert %s: already exists from an earlier attempt with the same request id", name)
                    from google.cloud import compute_v1

                    return compute_v1.Operation(name=f"existing-{name}",
                                                status=compute_v1.Operation.Status.DONE)
            _raise_for(c, f"{what}: insert {name}")
            raise AssertionError("unreachable")

    def _get_instance(self, zone: str, name: str) -> Any | None:
        from google.api_core import exceptions as gexc

        try:
            return self._call(f"get {name}", lambda: self._instances.get(
                project=self.project, zone=zone, instance=name, retry=None, timeout=self.call_timeout_s))
        except gexc.NotFound:
            return None
        except gexc.GoogleAPICallError as e:
            _raise_for(classify_http_error(e), f"get {name}")
            raise AssertionError("unreachable")

    def _cleanup(self, issued: list[_PendingOp], what: str) -> None:
        try:
            self._delete([(p.name, p.zone) for p in issued])
        except BackendError as e:
            logger.error("%s: could not clean up %s after a failed launch: %s", what,
                         [p.name for p in issued], e)

    # ---- list
    def list_machines(self) -> list[Machine]:
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        cluster_label = cluster_label_value(self.cluster_name)
        request = compute_v1.AggregatedListInstancesRequest(
            project=self.project, filter=f'labels.{TAG_CLUSTER} = "{cluster_label}"', max_results=500)
        machines: list[Machine] = []
        zones: dict[str, str] = {}
        try:
            # One logical call: the pager follows nextPageToken.
            pager = self._call("list instances", lambda: self._instances.aggregated_list(
                request=request, retry=None, timeout=self.call_timeout_s))
            for scope, scoped in pager:
                zone = _last(scope)
                if not zone.startswith(self.region + "-"):
                    continue
                for inst in scoped.instances:
                    m = self._machine(inst)
                    if m is not None:
                        machines.append(m)
                        zones[m.id] = zone
        except BackendError:
            raise
        except (gexc.GoogleAPICallError, OSError) as e:
            raise TransientBackendError(f"list instances of cluster {self.cluster_name}: {e}",
                                        category=classify_http_error(e).category) from e
        except Exception as e:  # noqa: BLE001 - requests/google.auth transport errors mid-pagination
            raise TransientBackendError(f"list instances of cluster {self.cluster_name}: {e!r}",
                                        category=type(e).__name__) from e
        with self._known.lock:
            self._known.zones = zones
        return machines

    def _machine(self, inst: Any) -> Machine | None:
        state = _STATE_BY_STATUS.get(inst.status)
        if state is None:
            return None
        manifest = _manifest_from_items(inst.metadata.items)
        tags = tags_from_storage(dict(inst.labels), manifest)
        if tags.get(TAG_CLUSTER) != self.cluster_name:
            # the server filter matched a hashed stand-in or a foreign label: not ours
            return None
        internal_ip = external_ip = None
        if inst.network_interfaces:
            nic = inst.network_interfaces[0]
            internal_ip = nic.network_i_p or None
            for ac in nic.access_configs:
                if ac.nat_i_p:
                    external_ip = ac.nat_i_p
                    break
        return Machine(id=inst.name, tags=tags, state=state, internal_ip=internal_ip, external_ip=external_ip,
                       launched_at=_parse_time(inst.creation_timestamp))

    # ---- terminate
    def _ours(self, machine_ids: list[str]) -> list[tuple[str, str]]:
        with self._known.lock:
            missing = [m for m in machine_ids if m not in self._known.zones]
        if missing:
            self.list_machines()   # refresh: only instances labelled with this cluster end up in the map
        with self._known.lock:
            known = dict(self._known.zones)
        out = []
        for m in machine_ids:
            if m in known:
                out.append((m, known[m]))
            else:
                logger.warning("terminate: %s is not a live instance of cluster %s; not touching it", m,
                               self.cluster_name)
        return out

    def terminate(self, machine_ids: list[str]) -> None:
        if not machine_ids:
            return
        self._delete(self._ours(list(dict.fromkeys(machine_ids))))

    def _delete(self, targets: list[tuple[str, str]]) -> None:
        """Issue every delete first, then wait for all the operations; 404s are ignored."""
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        issued: list[_PendingOp] = []
        errors: list[str] = []
        for name, zone in targets:
            request = compute_v1.DeleteInstanceRequest(project=self.project, zone=zone, instance=name,
                                                       request_id=str(uuid.uuid4()))
            try:
                op = self._call(f"delete {name}", lambda: self._instances.delete_unary(
                    request=request, retry=None, timeout=self.call_timeout_s))
            except gexc.NotFound:
                self._forget(name)
                continue
            except (BackendError, gexc.GoogleAPICallError) as e:
                errors.append(f"{name}: {e}")
                continue
            issued.append(_PendingOp(name, zone, op))
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
    def set_tags(self, machine_id: str, tags: dict[str, str]) -> None:
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        targets = self._ours([machine_id])
        if not targets:
            raise BackendError(f"set_tags: {machine_id} is not a live instance of cluster {self.cluster_name}",
                               category="notFound")
        _, zone = targets[0]
        for attempt in range(3):  # fingerprints can race with another writer: re-read and try again
            inst = self._get_instance(zone, machine_id)
            if inst is None:
                self._forget(machine_id)
                logger.info("set_tags: %s is gone", machine_id)
                return
            old_manifest = _manifest_from_items(inst.metadata.items)
            current = tags_from_storage(dict(inst.labels), old_manifest)
            merged = {**current, **tags}
            if merged == current:
                return
            old_tag_label_keys = {encode_label_text(k) for k in current} | {TAG_CLUSTER}
            rid = (old_manifest or {}).get("request_id")
            storage = tags_to_storage(merged, request_id=rid)
            user_labels = {k: v for k, v in inst.labels.items() if k not in old_tag_label_keys}
            new_labels = {**user_labels, **storage.labels}
            ops: list[_PendingOp] = []
            try:
                if new_labels != dict(inst.labels):
                    req = compute_v1.SetLabelsInstanceRequest(
                        project=self.project, zone=zone, instance=machine_id,
                        instances_set_labels_request_resource=compute_v1.InstancesSetLabelsRequest(
                            labels=new_labels, label_fingerprint=inst.label_fingerprint))
                    ops.append(_PendingOp(machine_id, zone, self._call(
                        f"setLabels {machine_id}", lambda: self._instances.set_labels_unary(
                            request=req, retry=None, timeout=self.call_timeout_s))))
                if old_manifest is None or storage.manifest != old_manifest:
                    items = [compute_v1.Items(key=i.key, value=i.value) for i in inst.metadata.items
                             if i.key != METADATA_TAGS_KEY]
                    items.append(compute_v1.Items(key=METADATA_TAGS_KEY, value=storage.metadata_value()))
                    mreq = compute_v1.SetMetadataInstanceRequest(
                        project=self.project, zone=zone, instance=machine_id,
                        metadata_resource=compute_v1.Metadata(items=items, fingerprint=inst.metadata.fingerprint))
                    ops.append(_PendingOp(machine_id + "#metadata", zone, self._call(
                        f"setMetadata {machine_id}", lambda: self._instances.set_metadata_unary(
                            request=mreq, retry=None, timeout=self.call_timeout_s))))
            except gexc.GoogleAPICallError as e:
                c = classify_http_error(e)
                if c.kind == "precondition" and attempt < 2:
                    continue
                if c.kind == "notfound":
                    self._forget(machine_id)
                    return
                _raise_for(c, f"set_tags {machine_id}")
            for name, c in self._wait_all(ops, "set tags on").items():
                if c is not None:
                    _raise_for(c, f"set_tags {name}")
            return
        raise TransientBackendError(f"set_tags {machine_id}: labels kept changing underneath",
                                    category="conditionNotMet")
