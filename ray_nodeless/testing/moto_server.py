"""A moto server for the AWS tests, plus fault-injection helpers (botocore `before-send` hooks).

The pytest fixtures `moto_server` and `moto` (tests/conftest.py) are built on `start_moto_server`: one
ThreadedMotoServer per test module (start-up is instant, the first describe_images takes about 1.5 s), reset between
tests with POST /moto-api/reset.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator
from urllib.parse import parse_qs

import boto3
import requests
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.client import BaseClient

from ray_nodeless.testing import moto_reservations

REGION = "us-east-1"
CREDS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@dataclass
class MotoServer:
    url: str
    server: Any
    _ami: str | None = None

    def reset(self) -> None:
        r = requests.post(f"{self.url}/moto-api/reset", timeout=30)
        r.raise_for_status()
        moto_reservations.reset()

    def client(self, service: str = "ec2", region: str = REGION, **kw: Any) -> BaseClient:
        args: dict[str, Any] = dict(endpoint_url=self.url, region_name=region, **CREDS)
        args.update(kw)
        return boto3.client(service, **args)

    def ami(self) -> str:
        """An x86_64 AMI id moto knows (looked up once per server: the first describe_images is slow)."""
        if self._ami is None:
            images = self.client().describe_images(
                Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])["Images"]
            self._ami = sorted(i["ImageId"] for i in images)[0]
        return self._ami


def start_moto_server() -> MotoServer:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)   # one access-log line per request otherwise
    moto_reservations.install()       # EC2's capacity reservations, which moto lacks (moto_reservations.py)
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    return MotoServer(url=f"http://{host}:{port}", server=srv)


# ---------------------------------------------------------------------------------------------- fault injection


class _Raw:
    """The `raw` object botocore's AWSResponse reads a body from."""

    def __init__(self, body: bytes):
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


def ec2_error(request: AWSPreparedRequest, code: str, message: str = "injected", status: int = 500) -> AWSResponse:
    """An EC2 (query protocol) error response, as AWS sends it."""
    body = (f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
            f"<RequestID>injected-{code}</RequestID></Response>").encode()
    return AWSResponse(request.url, status, {"Content-Type": "text/xml"}, _Raw(body))


def ec2_empty_describe(request: AWSPreparedRequest) -> AWSResponse:
    """A DescribeInstances answer with no reservation at all (a lagging or glitched listing)."""
    body = (b'<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
            b'<requestId>injected-empty</requestId><reservationSet/></DescribeInstancesResponse>')
    return AWSResponse(request.url, 200, {"Content-Type": "text/xml"}, _Raw(body))


def ec2_not_found(request: AWSPreparedRequest, instance_ids: list[str]) -> AWSResponse:
    """InvalidInstanceID.NotFound naming `instance_ids`, as EC2 answers for an instance it does not know (yet)."""
    ids = ", ".join(f"'{i}'" for i in instance_ids)
    return ec2_error(request, "InvalidInstanceID.NotFound", f"The instance IDs {ids} do not exist", 400)


def forward(request: AWSPreparedRequest) -> requests.Response:
    """Send the request to the server itself (so it takes effect) and return the real response."""
    body = request.body
    if hasattr(body, "read"):
        body = body.read()
    return requests.request(request.method, request.url, data=body,
                            headers={k: v for k, v in request.headers.items()}, timeout=30)


def query_params(request: AWSPreparedRequest) -> dict[str, str]:
    """The form parameters of an EC2 query-protocol request (`InstanceType`, `Placement.AvailabilityZone`, ...)."""
    body = request.body
    if hasattr(body, "read"):
        pos = body.tell()
        raw = body.read()
        body.seek(pos)
        body = raw
    if isinstance(body, bytes):
        body = body.decode()
    return {k: v[0] for k, v in parse_qs(body or "").items()}


@dataclass
class Hook:
    """A before-send hook on one EC2 operation that counts calls and answers with `respond` (None = pass on)."""

    respond: Callable[[AWSPreparedRequest, int], AWSResponse | None]
    calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request: AWSPreparedRequest, **_: Any) -> AWSResponse | None:
        with self.lock:
            self.calls += 1
            n = self.calls
        return self.respond(request, n)


def install(client: BaseClient, operation: str, respond: Callable[[AWSPreparedRequest, int], AWSResponse | None],
            event: str = "before-send") -> Hook:
    hook = Hook(respond)
    client.meta.events.register(f"{event}.ec2.{operation}", hook)
    return hook


def counter(client: BaseClient, operation: str) -> Hook:
    """Count the HTTP requests one client sends for `operation` (retries included)."""
    return install(client, operation, lambda _r, _n: None)


_ids = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_ids)}"


def ec2_describe_without(request: AWSPreparedRequest, hidden: Callable[[str], bool]) -> AWSResponse:
    """Forward a DescribeInstances and answer with the real page less the instances `hidden(id)` names (a listing
    that lags, or a short page): reservations left empty are dropped, as EC2 shows no empty reservation."""
    import xml.etree.ElementTree as ET

    resp = forward(request)
    if resp.status_code != 200:
        return AWSResponse(request.url, resp.status_code, {"Content-Type": "text/xml"}, _Raw(resp.content))
    root = ET.fromstring(resp.content)
    ns = root.tag[1:].split("}", 1)[0] if root.tag.startswith("{") else ""
    q = (lambda t: f"{{{ns}}}{t}") if ns else (lambda t: t)
    ET.register_namespace("", ns)
    rset = root.find(q("reservationSet"))
    for res in list(rset if rset is not None else []):
        iset = res.find(q("instancesSet"))
        if iset is not None:
            for inst in list(iset):
                if hidden(inst.findtext(q("instanceId")) or ""):
                    iset.remove(inst)
        if rset is not None and (iset is None or len(iset) == 0):
            rset.remove(res)
    return AWSResponse(request.url, 200, {"Content-Type": "text/xml"}, _Raw(ET.tostring(root)))
