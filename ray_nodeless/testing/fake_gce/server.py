"""The fake's state and HTTP server: routing, the request log, out-of-band changes (instances of other clusters,
preemption), and `client_kwargs` to point a real google-cloud-compute client at it."""
from __future__ import annotations

import copy
import itertools
import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ray_nodeless.testing.fake_gce.faults import Fault, FaultInjection
from ray_nodeless.testing.fake_gce.handlers import ComputeHandlers, last_segment, now_timestamp
from ray_nodeless.testing.fake_gce.reservations import ReservationHandlers
from ray_nodeless.testing.fake_gce.schema import ApiError, discovery
from ray_nodeless.testing.fake_gce.semantics import MachineTypeSpec

logger = logging.getLogger(__name__)

BASE = "/compute/v1/projects/"
# Instances per page of a list answer when the client asks for more (GCE's maximum).
MAX_PAGE_SIZE = 500
# How often the server thread checks for shutdown: short so stop() returns at once in tests.
SERVE_POLL_S = 0.05

DEFAULT_MACHINE_TYPES: dict[str, MachineTypeSpec] = {
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
    authorization: str | None = None      # the Authorization header: which credentials the client sent
    t: float = field(default_factory=time.monotonic)
    seq: int = 0


class FakeGce(FaultInjection, ReservationHandlers, ComputeHandlers):
    """State + HTTP server. Use as a context manager or call start()/stop()."""

    def __init__(self, project: str = "test-project", zones: dict[str, str] | None = None,
                 machine_types: dict[str, MachineTypeSpec] | None = None,
                 accelerator_types: dict[str, int] | None = None, page_size: int = MAX_PAGE_SIZE):
        self.project = project
        self.zones: dict[str, str] = dict(zones or DEFAULT_ZONES)
        # per zone: name -> spec; tests may delete entries to model zonal availability
        self.machine_types: dict[str, dict[str, MachineTypeSpec]] = {
            z: dict(machine_types or DEFAULT_MACHINE_TYPES) for z in self.zones}
        self.accelerator_types: dict[str, dict[str, int]] = {
            z: dict(accelerator_types or DEFAULT_ACCELERATOR_TYPES) for z in self.zones}
        self.page_size = page_size
        self.instances: dict[str, dict] = {}          # name -> stored resource (names are unique per project)
        self.reservations: dict[str, dict] = {}       # "<zone>/<name>" -> stored reservation (reservations.py)
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
                status, payload = fake.handle(self.command, self.path, raw, self.headers.get("Authorization"))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _handle

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": SERVE_POLL_S},
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


    # ---- out-of-band changes
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
        """The instance disappears out of band (spot preemption with instanceTerminationAction DELETE), and the
        zone records it as GCE does: an operation of type `compute.instances.preempted` by the system."""
        with self.lock:
            inst = self.instances.pop(name, None)
            if inst is not None:
                self._release(inst, last_segment(inst["zone"]))
                op = self._new_op(last_segment(inst["zone"]), "compute.instances.preempted", name)
                op.update(status="DONE", progress=100, endTime=now_timestamp(), user="system",
                          statusMessage="Instance was preempted.")

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
        ("GET", re.compile(r"zones/(?P<zone>[^/]+)/reservations"), "reservations.list"),
        ("POST", re.compile(r"zones/(?P<zone>[^/]+)/reservations"), "reservations.insert"),
        ("GET", re.compile(r"zones/(?P<zone>[^/]+)/reservations/(?P<name>[^/]+)"), "reservations.get"),
        ("DELETE", re.compile(r"zones/(?P<zone>[^/]+)/reservations/(?P<name>[^/]+)"), "reservations.delete"),
        ("GET", re.compile(r"aggregated/reservations"), "reservations.aggregatedList"),
        ("GET", re.compile(r"zones/(?P<zone>[^/]+)/operations"), "zoneOperations.list"),
        ("GET", re.compile(r"zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)"), "zoneOperations.get"),
        ("POST", re.compile(r"zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)/wait"), "zoneOperations.wait"),
    ]

    def handle(self, http_method: str, raw_path: str, raw_body: bytes,
               authorization: str | None = None) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        method = "unknown"
        req = Request(method, http_method, parts.path, query, None, authorization=authorization)
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
                machine_type = last_segment(str(req.body.get("machineType", "")))
            fault = self._take_fault(method, zone, machine_type, kind="http")
            if fault is not None and not fault.after:
                raise ApiError(fault.status, fault.message, reason=fault.reason, domain=fault.domain)
            payload: Any      # the JSON answer
            if self._take_fault(method, zone, None, kind="empty") is not None:
                status, payload = 200, {"items": {} if method.endswith("aggregatedList") else []}
            else:
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


def client_kwargs(fake: FakeGce) -> dict[str, Any]:
    """Keyword arguments that point a google-cloud-compute client at the fake."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    return dict(credentials=AnonymousCredentials(), transport="rest",
                client_options=ClientOptions(api_endpoint=fake.url))
