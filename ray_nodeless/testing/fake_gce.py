"""A small fake Compute Engine REST server that the real google-cloud-compute client talks to.

There is no Compute Engine emulator (see /work/shared/notes/cloud-testing.md §3), and MagicMock-level fakes skip
the parts that break in production: serialization, URL shapes, pagination, filters, operation polling. This
server sits behind `compute_v1.*Client(transport="rest", client_options=ClientOptions(api_endpoint=url))` and
implements just the endpoints ray_nodeless uses, with GCE's observable semantics:

- every request body is validated against the real Compute API schema from the discovery document shipped with
  google-api-python-client (`compute.v1.json`): unknown fields and wrong JSON types answer HTTP 400 with a
  GCE-style error body, so a body the fake accepts is one GCE would parse;
- a few semantic checks GCE makes (label syntax, instance name syntax, unknown machine type, GPUs need
  `onHostMaintenance: TERMINATE`, spot cannot restart automatically, requestId must be a UUID);
- `requestId` idempotency: a repeated insert with the same requestId returns the same operation and creates
  nothing new;
- fault injection (capacity errors in the operation, quota 403, 429 throttling, "ambiguous" 5xx after the work
  was done, operations that stay RUNNING) and out-of-band changes (instances of other clusters, preemption);
- a request log (`server.requests`) for assertions on counts and ordering.

Operations complete synchronously unless `op_delay_polls` says otherwise; `wait` answers at once.
"""
from __future__ import annotations

import copy
import itertools
import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

logger = logging.getLogger(__name__)

BASE = "/compute/v1/projects/"
URL_ROOT = "https://www.googleapis.com/compute/v1/projects/"

# --------------------------------------------------------------------------------------------- schema


def _discovery_path() -> str:
    import googleapiclient  # test extra; ships the Compute discovery document

    return os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache", "documents", "compute.v1.json")


_DISCOVERY: dict | None = None
_DISCOVERY_LOCK = threading.Lock()


def discovery() -> dict:
    """The Compute v1 discovery document, parsed once per process (5 MB, ~0.1 s)."""
    global _DISCOVERY
    with _DISCOVERY_LOCK:
        if _DISCOVERY is None:
            with open(_discovery_path(), encoding="utf-8") as f:
                _DISCOVERY = json.load(f)
        return _DISCOVERY


class ApiError(Exception):
    """An error the fake answers with a GCE-style JSON body."""

    def __init__(self, status: int, message: str, reason: str = "invalid", domain: str = "global"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason
        self.domain = domain

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message,
                          "errors": [{"message": self.message, "domain": self.domain, "reason": self.reason}]}}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


_INT_RE = re.compile(r"-?\d+")


def validate(value: Any, schema: dict, path: str) -> None:
    """Check `value` against a discovery-document schema; raise ApiError(400) the way GCE's JSON parser does.

    Follows `$ref`s into `schemas`, inline `properties`/`items`/`additionalProperties`, and the JSON mapping of
    proto3 scalar types: int64/uint64 are strings (numbers accepted too), int32 numbers (numeric strings
    accepted), booleans strict, enums checked against the listed values.
    """
    schemas = discovery()["schemas"]
    while "$ref" in schema:
        schema = schemas[schema["$ref"]]
    typ = schema.get("type")
    if typ == "object" or "properties" in schema:
        if not isinstance(value, dict):
            raise ApiError(400, f"Invalid value at '{path}', expected an object: {json.dumps(value)}")
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            if props is not None and k in props:
                validate(v, props[k], f"{path}.{_snake(k)}")
            elif extra is not None:
                validate(v, extra, f"{path}[{k}]")
            else:
                raise ApiError(400, f"Invalid JSON payload received. Unknown name \"{k}\" at '{path}': "
                                    "Cannot find field.")
        return
    if typ == "array":
        if not isinstance(value, list):
            raise ApiError(400, f"Invalid value at '{path}', expected a list: {json.dumps(value)}")
        for i, item in enumerate(value):
            validate(item, schema["items"], f"{path}[{i}]")
        return
    if typ == "boolean":
        if not isinstance(value, bool):
            raise ApiError(400, f"Invalid value at '{path}' (TYPE_BOOL), {json.dumps(value)}")
        return
    if typ == "integer" or (typ == "string" and schema.get("format") in ("int64", "uint64")):
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, str) and _INT_RE.fullmatch(value) is not None)
        if not ok:
            raise ApiError(400, f"Invalid value at '{path}' (TYPE_INT64), {json.dumps(value)}")
        return
    if typ == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ApiError(400, f"Invalid value at '{path}' (TYPE_DOUBLE), {json.dumps(value)}")
        return
    if typ == "string":
        if not isinstance(value, str):
            raise ApiError(400, f"Invalid value at '{path}' (TYPE_STRING), {json.dumps(value)}")
        enum = schema.get("enum")
        if enum is not None and value not in enum:
            raise ApiError(400, f"Invalid value at '{path}' (type.googleapis.com/enum), \"{value}\"")
        return
    if typ == "any" or typ is None:
        return
    raise ApiError(500, f"fake_gce: unsupported schema type {typ!r} at {path}")


def validate_body(body: Any, schema_name: str, path: str) -> None:
    validate(body, {"$ref": schema_name}, path)


# --------------------------------------------------------------------------------------------- data

NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
LABEL_KEY_RE = re.compile(r"[a-z][-_a-z0-9]{0,62}")
LABEL_VALUE_RE = re.compile(r"[-_a-z0-9]{0,63}")
METADATA_KEY_RE = re.compile(r"[a-zA-Z0-9-_]{1,128}")

# name: (vCPUs, memory MiB, built-in accelerators [(type, count)], shared core, architecture)
DEFAULT_MACHINE_TYPES: dict[str, tuple[int, int, list[tuple[str, int]], bool, str]] = {
    "e2-small": (2, 2048, [], True, "X86_64"),
    "e2-standard-4": (4, 16384, [], False, "X86_64"),
    "n1-standard-4": (4, 15360, [], False, "X86_64"),
    "n1-standard-8": (8, 30720, [], False, "X86_64"),
    "n2-standard-8": (8, 32768, [], False, "X86_64"),
    "t2a-standard-4": (4, 16384, [], False, "ARM64"),
    "a2-highgpu-1g": (12, 87040, [("nvidia-tesla-a100", 1)], False, "X86_64"),
    "g2-standard-8": (8, 32768, [("nvidia-l4", 1)], False, "X86_64"),
}
DEFAULT_ACCELERATOR_TYPES: dict[str, int] = {  # name -> maximumCardsPerInstance
    "nvidia-tesla-t4": 4, "nvidia-tesla-v100": 8, "nvidia-tesla-a100": 16, "nvidia-l4": 8,
}
DEFAULT_ZONES: dict[str, str] = {
    "us-central1-a": "us-central1", "us-central1-b": "us-central1", "us-central1-c": "us-central1",
    "us-central1-f": "us-central1", "europe-west4-a": "europe-west4", "europe-west4-b": "europe-west4",
}


@dataclass
class Request:
    """One request as the fake saw it; `method` is the API method id without the `compute.` prefix."""

    method: str
    http_method: str
    path: str
    query: dict[str, str]
    body: Any
    status: int = 0
    t: float = field(default_factory=time.monotonic)
    seq: int = 0


@dataclass
class Fault:
    """An injected failure; `times` counts down to 0 (None = forever)."""

    kind: str                          # "insert-op" | "http"
    methods: tuple[str, ...]
    times: int | None
    zone: str | None = None
    machine_type: str | None = None
    status: int = 503
    code: str = ""
    message: str = ""
    reason: str = ""
    domain: str = "global"
    after: bool = False                # ambiguous: perform the call, then answer the error
    leave_instance: bool = False       # insert-op: the failed instance stays behind (as GCE sometimes shows)
    skip: int = 0                      # let this many matching calls through first (fail the Nth instance)

    def matches(self, method: str, zone: str | None, machine_type: str | None) -> bool:
        if method not in self.methods or self.times == 0:
            return False
        if self.zone is not None and zone != self.zone:
            return False
        if self.machine_type is not None and machine_type != self.machine_type:
            return False
        return True

    def consume(self) -> bool:
        """Account for one matching call; False while the fault is still skipping calls."""
        if self.skip > 0:
            self.skip -= 1
            return False
        if self.times is not None:
            self.times -= 1
        return True


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00", time.gmtime())


def _last(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


# --------------------------------------------------------------------------------------------- filters

_FILTER_TERM = re.compile(
    r"""\(?\s*(?P<field>[A-Za-z][\w.\-]*)\s*(?P<op>!=|=|:|\beq\b|\bne\b)\s*(?P<value>"[^"]*"|[^\s()"]+)\s*\)?""")


def parse_filter(expr: str) -> list[tuple[str, str, str]]:
    """GCE list filter subset: `field = value`, `field != value`, `labels.k = "v"`, `labels.k=v`, `field eq regex`,
    joined by whitespace or AND. Anything else answers 400, like GCE's "Invalid list filter expression"."""
    terms: list[tuple[str, str, str]] = []
    rest = expr.strip()
    while rest:
        m = _FILTER_TERM.match(rest)
        if not m:
            raise ApiError(400, f"Invalid list filter expression '{expr}'.")
        value = m.group("value")
        if value.startswith('"'):
            value = value[1:-1]
        terms.append((m.group("field"), m.group("op"), value))
        rest = rest[m.end():].strip()
        if rest.upper().startswith("AND "):
            rest = rest[4:].strip()
    return terms


def _field_value(obj: dict, path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def filter_match(obj: dict, terms: list[tuple[str, str, str]]) -> bool:
    for fld, op, value in terms:
        actual = _field_value(obj, fld)
        actual_s = None if actual is None else str(actual)
        if op == "=":
            # `=` is exact with `*` as a wildcard
            ok = actual_s is not None and re.fullmatch(re.escape(value).replace(r"\*", ".*"), actual_s) is not None
        elif op == "!=":
            ok = actual_s is None or re.fullmatch(re.escape(value).replace(r"\*", ".*"), actual_s) is None
        elif op == ":":
            ok = actual_s is not None and (value == "*" or actual_s == value)
        elif op == "eq":
            ok = actual_s is not None and re.fullmatch(value, actual_s) is not None
        else:  # ne
            ok = actual_s is None or re.fullmatch(value, actual_s) is None
        if not ok:
            return False
    return True


# --------------------------------------------------------------------------------------------- server


class FakeGce:
    """State + HTTP server. Use as a context manager or call start()/stop()."""

    def __init__(self, project: str = "test-project", zones: dict[str, str] | None = None,
                 machine_types: dict[str, tuple[int, int, list[tuple[str, int]], bool, str]] | None = None,
                 accelerator_types: dict[str, int] | None = None, page_size: int = 500):
        self.project = project
        self.zones: dict[str, str] = dict(zones or DEFAULT_ZONES)
        # per zone: name -> spec; tests may delete entries to model zonal availability
        self.machine_types: dict[str, dict[str, tuple]] = {
            z: dict(machine_types or DEFAULT_MACHINE_TYPES) for z in self.zones}
        self.accelerator_types: dict[str, dict[str, int]] = {
            z: dict(accelerator_types or DEFAULT_ACCELERATOR_TYPES) for z in self.zones}
        self.page_size = page_size
        self.instances: dict[str, dict] = {}          # name -> stored resource (names are unique per project)
        self.operations: dict[str, dict] = {}
        self.request_ids: dict[str, str] = {}         # requestId -> operation name
        self.requests: list[Request] = []
        self.faults: list[Fault] = []
        self.op_delay_polls = 0                       # polls an operation stays RUNNING before DONE
        self.op_never_done = False
        self.initial_status = "RUNNING"               # status of a newly inserted instance
        self._op_polls: dict[str, int] = {}
        self._ids = itertools.count(1000)
        self._seq = itertools.count(1)
        self._ips = itertools.count(2)
        self.lock = threading.RLock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        discovery()  # parse once up front so the first request is not slow

    # ---- lifecycle
    def start(self) -> "FakeGce":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True   # headers and body go out in two writes: avoid 40 ms delayed ACKs

            def log_message(self, fmt: str, *args: Any) -> None:  # keep pytest output clean
                logger.debug("fake_gce: " + fmt, *args)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, payload = fake.handle(self.command, self.path, raw)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _handle

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-gce", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "FakeGce":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    # ---- fault injection and out-of-band changes
    def fail_insert(self, zone: str | None = None, machine_type: str | None = None,
                    code: str = "ZONE_RESOURCE_POOL_EXHAUSTED", times: int | None = 1, message: str | None = None,
                    http_status: int = 503, leave_instance: bool = False, skip: int = 0) -> Fault:
        """The insert is accepted, but its operation ends DONE with `error.errors[0].code = code`."""
        msg = message or (f"The zone 'projects/{self.project}/zones/{zone or 'ZONE'}' does not have enough "
                          f"resources available to fulfill the request. Try a different zone, or try again later.")
        f = Fault("insert-op", ("instances.insert",), times, zone=zone, machine_type=machine_type, code=code,
                  message=msg, status=http_status, leave_instance=leave_instance, skip=skip)
        self.faults.append(f)
        return f

    def quota_error(self, machine_type: str | None = None, zone: str | None = None,
                    quota: str = "NVIDIA_T4_GPUS", times: int | None = None, region: str = "us-central1") -> Fault:
        """instances.insert answers HTTP 403 "Quota '<quota>' exceeded", reason quotaExceeded."""
        f = Fault("http", ("instances.insert",), times, zone=zone, machine_type=machine_type, status=403,
                  message=f"Quota '{quota}' exceeded.  Limit: 0.0 in region {region}.", reason="quotaExceeded",
                  domain="usageLimits")
        self.faults.append(f)
        return f

    def rate_limit(self, method: str = "instances.insert", times: int | None = 1, status: int = 429) -> Fault:
        """Answer `status` (429, or 403 as GCE sometimes does) with reason rateLimitExceeded, doing nothing."""
        f = Fault("http", (method,), times, status=status, message="Rate Limit Exceeded",
                  reason="rateLimitExceeded", domain="usageLimits")
        self.faults.append(f)
        return f

    def ambiguous(self, method: str = "instances.insert", times: int | None = 1, status: int = 503) -> Fault:
        """Perform the call (create the instance), then answer `status` as if the reply was lost."""
        f = Fault("http", (method,), times, status=status, message="Backend Error", reason="backendError",
                  after=True)
        self.faults.append(f)
        return f

    def fail_method(self, method: str, status: int = 500, times: int | None = 1, message: str = "Internal Error",
                    reason: str = "backendError") -> Fault:
        f = Fault("http", (method,), times, status=status, message=message, reason=reason)
        self.faults.append(f)
        return f

    def add_instance(self, name: str, zone: str = "us-central1-a", labels: dict[str, str] | None = None,
                     status: str = "RUNNING", machine_type: str = "e2-standard-4",
                     metadata_items: list[dict[str, str]] | None = None) -> dict:
        """Create an instance out of band (another cluster's, an unlabelled one, a manual one)."""
        body: dict[str, Any] = {
            "name": name, "machineType": f"zones/{zone}/machineTypes/{machine_type}",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/x"}}],
            "networkInterfaces": [{"network": "global/networks/default"}],
        }
        if labels is not None:
            body["labels"] = labels
        if metadata_items is not None:
            body["metadata"] = {"items": metadata_items}
        with self.lock:
            inst = self._materialize(body, zone)
            inst["status"] = status
            self.instances[name] = inst
            return copy.deepcopy(inst)

    def preempt(self, name: str) -> None:
        """The instance disappears out of band (spot preemption with instanceTerminationAction DELETE)."""
        with self.lock:
            self.instances.pop(name, None)

    def set_status(self, name: str, status: str) -> None:
        with self.lock:
            self.instances[name]["status"] = status

    # ---- request log helpers
    def calls(self, method: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.method == method]

    def count(self, method: str) -> int:
        return len(self.calls(method))

    def reset_log(self) -> None:
        with self.lock:
            self.requests.clear()

    # ---- dispatch
    _ROUTES: list[tuple[str, re.Pattern, str]] = [
        ("GET", re.compile(r"zones"), "zones.list"),
        ("GET", re.compile(r"zones/(?P<zone>[^/]+)"), "zones.get"),
        ("GET", re.compile(r"zones/(?P<zone>[^/]+)/machineTypes"), "machineTypes.list"),
        ("GET", re.compile(r"zones/(?P<zone>[^/]+)/acceleratorTypes"), "acceleratorTypes.list"),
        ("GET", re.compile(r"zones/(?P<zone>[^/]+)/instances"), "instances.list"),
        ("POST", re.compile(r"zones/(?P<zone>[^/]+)/instances"), "instances.insert"),
        ("GET", re.compile(r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)"), "instances.get"),
        ("DELETE", re.compile(r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)"), "instances.delete"),
        ("POST", re.compile(r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/setLabels"), "instances.setLabels"),
        ("POST", re.compile(r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/setMetadata"),
         "instances.setMetadata"),
        ("GET", re.compile(r"aggregated/instances"), "instances.aggregatedList"),
        ("GET", re.compile(r"zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)"), "zoneOperations.get"),
        ("POST", re.compile(r"zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)/wait"), "zoneOperations.wait"),
    ]

    def handle(self, http_method: str, raw_path: str, raw_body: bytes) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        method = "unknown"
        req = Request(method, http_method, parts.path, query, None)
        try:
            if not parts.path.startswith(BASE):
                raise ApiError(404, f"The requested URL {parts.path} was not found.", reason="notFound")
            project, _, rest = parts.path[len(BASE):].partition("/")
            params: dict[str, str] = {}
            for verb, rx, name in self._ROUTES:
                m = rx.fullmatch(rest)
                if verb == http_method and m:
                    method, params = name, m.groupdict()
                    break
            req.method = method
            try:
                req.body = json.loads(raw_body) if raw_body else None
            except ValueError:
                raise ApiError(400, "Invalid JSON payload received. Unexpected token.") from None
            with self.lock:
                req.seq = next(self._seq)
                self.requests.append(req)
            if method == "unknown":
                raise ApiError(404, f"fake_gce: no route for {http_method} {parts.path}", reason="notFound")
            if project != self.project:
                raise ApiError(404, f"The resource 'projects/{project}' was not found", reason="notFound")
            zone = params.get("zone")
            if zone is not None and zone not in self.zones:
                raise ApiError(404, f"The resource 'projects/{project}/zones/{zone}' was not found",
                               reason="notFound")
            machine_type = None
            if method == "instances.insert" and isinstance(req.body, dict):
                machine_type = _last(str(req.body.get("machineType", "")))
            fault = self._take_fault(method, zone, machine_type, kind="http")
            if fault is not None and not fault.after:
                raise ApiError(fault.status, fault.message, reason=fault.reason, domain=fault.domain)
            status, payload = 200, getattr(self, "_" + method.replace(".", "_"))(query, req.body, **params)
            if fault is not None:  # ambiguous: the work is done, but the caller sees an error
                raise ApiError(fault.status, fault.message, reason=fault.reason, domain=fault.domain)
        except ApiError as e:
            status, payload = e.status, e.body()
        except Exception as e:  # a bug in the fake: answer 500 so the test sees it
            logger.exception("fake_gce crashed on %s %s", http_method, raw_path)
            status, payload = 500, ApiError(500, f"fake_gce internal error: {e!r}", reason="backendError").body()
        req.status = status
        return status, payload

    def _take_fault(self, method: str, zone: str | None, machine_type: str | None, kind: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.kind == kind and f.matches(method, zone, machine_type) and f.consume():
                    return f
        return None

    # ---- resources
    def _zone_url(self, zone: str) -> str:
        return f"{URL_ROOT}{self.project}/zones/{zone}"

    def _materialize(self, body: dict, zone: str) -> dict:
        """Turn an insert body into the stored resource, adding the output-only fields GCE adds."""
        inst = copy.deepcopy(body)
        n = next(self._ids)
        inst.update(kind="compute#instance", id=str(n), creationTimestamp=_now(), zone=self._zone_url(zone),
                    selfLink=f"{self._zone_url(zone)}/instances/{body['name']}",
                    labelFingerprint=f"lf{n}", fingerprint=f"f{n}", status="PROVISIONING")
        inst["machineType"] = f"{self._zone_url(zone)}/machineTypes/{_last(body['machineType'])}"
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
            "status": "DONE" if done else "RUNNING", "progress": 100 if done else 0, "insertTime": _now(),
            "startTime": _now(), "selfLink": f"{self._zone_url(zone)}/operations/{name}", "user": "fake@example.com",
        }
        if done:
            op["endTime"] = _now()
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
                op.update(status="DONE", progress=100, endTime=_now())
            return copy.deepcopy(op)

    def _check_instance(self, body: dict, zone: str) -> None:
        """Semantic checks GCE makes beyond the schema."""
        name = body.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ApiError(400, f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                                "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
        mt = body.get("machineType")
        if not mt:
            raise ApiError(400, "Invalid value for field 'resource.machineType': ''. Machine type not specified.")
        m = re.search(r"zones/([^/]+)/machineTypes/([^/]+)$", mt)
        if not m or m.group(1) != zone:
            raise ApiError(400, f"Invalid value for field 'resource.machineType': '{mt}'. "
                                f"Machine type must be in zone '{zone}'.")
        if m.group(2) not in self.machine_types[zone]:
            raise ApiError(400, f"Invalid value for field 'resource.machineType': '{mt}'. "
                                f"Machine type with name '{m.group(2)}' does not exist in zone '{zone}'.")
        labels = body.get("labels", {})
        if len(labels) > 64:
            raise ApiError(400, "Invalid value for field 'resource.labels': more than 64 labels.")
        self._check_labels(labels, "resource.labels")
        for item in body.get("metadata", {}).get("items", []):
            if not METADATA_KEY_RE.fullmatch(item.get("key", "")):
                raise ApiError(400, f"Invalid value for field 'resource.metadata.items.key': '{item.get('key')}'")
        if not body.get("disks"):
            raise ApiError(400, "Invalid value for field 'resource.disks': ''. No boot disk specified.")
        if not body.get("networkInterfaces"):
            raise ApiError(400, "Invalid value for field 'resource.networkInterfaces': ''. "
                                "At least one network interface is required.")
        sched = body.get("scheduling", {})
        gpus = body.get("guestAccelerators", [])
        for acc in gpus:
            am = re.search(r"zones/([^/]+)/acceleratorTypes/([^/]+)$", acc.get("acceleratorType", ""))
            if not am or am.group(1) != zone or am.group(2) not in self.accelerator_types[zone]:
                raise ApiError(400, "Invalid value for field 'resource.guestAccelerators[0].acceleratorType': "
                                    f"'{acc.get('acceleratorType')}'. Accelerator type does not exist in zone.")
        builtin = self.machine_types[zone][m.group(2)][2]
        if (gpus or builtin) and sched.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
            raise ApiError(400, "Instances with guest accelerators do not support live migration.")
        spot = sched.get("provisioningModel") == "SPOT" or sched.get("preemptible") is True
        if spot and sched.get("automaticRestart", True):
            raise ApiError(400, "Invalid value for field 'resource.scheduling.automaticRestart': 'true'. "
                                "Preemptible instances cannot be automatically restarted.")

    @staticmethod
    def _check_labels(labels: dict, where: str) -> None:
        for k, v in labels.items():
            if not LABEL_KEY_RE.fullmatch(k) or not LABEL_VALUE_RE.fullmatch(v):
                raise ApiError(400, f"Invalid value for field '{where}': '{k}={v}'. Label keys must start with a "
                                    "lowercase letter; keys and values may contain only lowercase letters, digits, "
                                    "'_' and '-', at most 63 characters.")

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
            self._check_instance(body, zone)
            name = body["name"]
            if name in self.instances:
                raise ApiError(409, f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' "
                                    "already exists", reason="alreadyExists")
            mt = _last(body["machineType"])
            fault = self._take_fault("instances.insert", zone, mt, kind="insert-op")
            if fault is not None:
                op = self._new_op(zone, "insert", name, error={"errors": [
                    {"code": fault.code, "message": fault.message}]},
                    http_status=fault.status, http_message="SERVICE UNAVAILABLE" if fault.status == 503 else "ERROR")
                op.update(status="DONE", progress=100, endTime=_now())  # a failed insert is DONE with an error
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
            self._get_inst(name, zone)
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
            self._check_labels(labels, "labels")
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
    def _zoneOperations_get(self, q: dict, body: Any, zone: str, op: str) -> dict:
        return self._poll(op, zone)

    def _zoneOperations_wait(self, q: dict, body: Any, zone: str, op: str) -> dict:
        return self._poll(op, zone)


def client_kwargs(fake: FakeGce) -> dict[str, Any]:
    """Keyword arguments that point a google-cloud-compute client at the fake."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    return dict(credentials=AnonymousCredentials(), transport="rest",
                client_options=ClientOptions(api_endpoint=fake.url))


