"""A fake instance metadata server on 127.0.0.1, in both flavours the interruption watcher reads.

EC2 IMDSv2 (as AWS documents it):
- `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds` (1..21600) -> a token; without it, 400.
- `GET /latest/meta-data/spot/instance-action` with `X-aws-ec2-metadata-token` -> 401 for a missing or expired
  token, 404 while there is no notice, else `{"action": ..., "time": "...Z"}`.
- `GET /latest/meta-data/instance-id`.
GCE metadata server:
- `GET /computeMetadata/v1/instance/preempted` needs `Metadata-Flavor: Google` (else 403), answers `TRUE`/`FALSE`
  with an `ETag`; with `?wait_for_change=true` it hangs until the value's ETag differs from `last_etag` (at once
  if it already does) or `timeout_sec` passes, as the real server does.
- What google-auth's default chain asks on GKE with Workload Identity (google/auth/compute_engine/_metadata.py):
  `GET /` (its ping: 200 with `Metadata-Flavor: Google`), `project/project-id`,
  `instance/service-accounts/default/?recursive=true` and `instance/service-accounts/default/token` (JSON
  `{access_token, expires_in, token_type}`), `universe/universe-domain`; every one needs `Metadata-Flavor: Google`.
  Point google-auth at it with GCE_METADATA_HOST and GCE_METADATA_IP = `host_port`.
EKS Pod Identity agent (what botocore's container provider reads from AWS_CONTAINER_CREDENTIALS_FULL_URI = `url` +
`/v1/credentials`): 401 unless `Authorization` is the pod's token (`eks_token`), else
`{AccessKeyId, SecretAccessKey, Token, AccountId, Expiration}`.

Tests flip it with `aws_notice(...)` / `gce_preempt()`, expire tokens, or make the next answers fail with a status.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

IMDS_MAX_TTL_S = 21600
# The real server's hanging GET waits at most about this long whatever timeout_sec says; bounded for tests.
MAX_WAIT_S = 60.0


@dataclass
class _State:
    instance_id: str = "i-0fake0000000000001"
    action: dict[str, str] | None = None
    preempted: bool = False
    tokens: dict[str, float] = field(default_factory=dict)     # token -> expiry (monotonic)
    fail: list[int] = field(default_factory=list)                # statuses for the next requests, in order
    requests: list[tuple[str, str]] = field(default_factory=list)
    gce_project: str = "test-project"
    gce_email: str = "ray-head@test-project.iam.gserviceaccount.com"
    gce_access_token: str = field(default_factory=lambda: "ya29.fake-" + secrets.token_urlsafe(12))
    eks_token: str = field(default_factory=lambda: "eks-pod-identity-" + secrets.token_urlsafe(12))
    eks_keys: tuple[str, str, str] = ("ASIAFAKEPODIDENTITY1", "fake-secret", "fake-session-token")
    authorizations: list[str] = field(default_factory=list)     # Authorization headers /v1/credentials saw


class FakeMetadataServer:
    def __init__(self, instance_id: str = "i-0fake0000000000001", gce_project: str = "test-project"):
        self.state = _State(instance_id=instance_id, gce_project=gce_project)
        self.changed = threading.Condition()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-metadata", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def host_port(self) -> str:
        """`127.0.0.1:<port>`: google-auth's GCE_METADATA_HOST / GCE_METADATA_IP take a host, not a URL."""
        host, port = self._httpd.server_address[:2]
        return f"{host!s}:{port}"

    def stop(self) -> None:
        with self.changed:
            self.changed.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "FakeMetadataServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ----- what tests change ---------------------------------------------------------------------------------------

    def aws_notice(self, action: str = "terminate", in_s: float = 120.0, at: float | None = None) -> float:
        """Publish a spot instance-action; returns its time (epoch seconds, whole: IMDS has second resolution)."""
        when = float(int(at if at is not None else time.time() + in_s))
        stamp = dt.datetime.fromtimestamp(when, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self.changed:
            self.state.action = {"action": action, "time": stamp}
            self.changed.notify_all()
        return when

    def aws_raw_action(self, body: dict[str, Any] | None) -> None:
        """Publish any instance-action body (None withdraws it), to test what the client makes of odd ones."""
        with self.changed:
            self.state.action = body
            self.changed.notify_all()

    def gce_preempt(self, preempted: bool = True) -> None:
        with self.changed:
            self.state.preempted = preempted
            self.changed.notify_all()

    def expire_tokens(self) -> None:
        with self.changed:
            self.state.tokens.clear()

    def fail_next(self, *statuses: int) -> None:
        """Answer the next requests (any path) with these HTTP statuses, in order."""
        with self.changed:
            self.state.fail.extend(statuses)

    def requests_seen(self) -> list[tuple[str, str]]:
        with self.changed:
            return list(self.state.requests)

    def gce_etag(self) -> str:
        return hashlib.sha1(str(self.state.preempted).encode()).hexdigest()[:16]


def _handler(server: FakeMetadataServer) -> type[BaseHTTPRequestHandler]:
    state = server.state

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:     # quiet: tests read requests_seen() instead
            pass

        def _send(self, status: int, body: str = "", headers: dict[str, str] | None = None,
                  content_type: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _injected(self) -> bool:
            with server.changed:
                state.requests.append((self.command, self.path))
                status = state.fail.pop(0) if state.fail else None
            if status is not None:
                self._send(status, "injected")
                return True
            return False

        def do_PUT(self) -> None:
            if self._injected():
                return
            if urlsplit(self.path).path != "/latest/api/token":
                return self._send(403, "Forbidden")
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            if ttl is None or not ttl.isdigit() or not 1 <= int(ttl) <= IMDS_MAX_TTL_S:
                return self._send(400, "Bad Request")
            token = secrets.token_urlsafe(24)
            with server.changed:
                state.tokens[token] = time.monotonic() + int(ttl)
            self._send(200, token, {"X-aws-ec2-metadata-token-ttl-seconds": ttl})

        def do_GET(self) -> None:
            if self._injected():
                return
            parts = urlsplit(self.path)
            if parts.path.startswith("/latest/"):
                return self._imds(parts.path)
            if parts.path.startswith("/computeMetadata/"):
                return self._gce(parts.path, parse_qs(parts.query))
            if parts.path == "/v1/credentials":
                return self._eks_pod_identity()
            if parts.path == "/":       # google-auth's ping of the metadata server's IP
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._send(403, "Missing Metadata-Flavor:Google header.")
                return self._send(200, "computeMetadata/\n", {"Metadata-Flavor": "Google"})
            self._send(404, "Not Found")

        def _eks_pod_identity(self) -> None:
            auth = self.headers.get("Authorization", "")
            with server.changed:
                state.authorizations.append(auth)
            if auth != state.eks_token:
                return self._send(401, json.dumps({"message": "invalid token"}), content_type="application/json")
            key, secret, session = state.eks_keys
            expiry = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ")
            body = {"AccessKeyId": key, "SecretAccessKey": secret, "Token": session, "AccountId": "123456789012",
                    "Expiration": expiry}
            self._send(200, json.dumps(body), content_type="application/json")

        def _imds(self, path: str) -> None:
            token = self.headers.get("X-aws-ec2-metadata-token", "")
            with server.changed:
                valid = state.tokens.get(token, 0.0) > time.monotonic()
                action = state.action
            if not valid:
                return self._send(401, "Unauthorized")
            if path == "/latest/meta-data/spot/instance-action":
                return self._send(404, "Not Found") if action is None else self._send(200, json.dumps(action))
            if path == "/latest/meta-data/instance-id":
                return self._send(200, state.instance_id)
            self._send(404, "Not Found")

        def _gce(self, path: str, query: dict[str, list[str]]) -> None:
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._send(403, "Missing Metadata-Flavor:Google header.")
            flavour = {"Metadata-Flavor": "Google"}
            if path == "/computeMetadata/v1/instance/name":
                return self._send(200, state.instance_id, flavour)
            if path == "/computeMetadata/v1/project/project-id":
                return self._send(200, state.gce_project, flavour)
            if path == "/computeMetadata/v1/universe/universe-domain":
                return self._send(200, "googleapis.com", flavour)
            if path == "/computeMetadata/v1/instance/service-accounts/default/":
                info = {"email": state.gce_email, "aliases": ["default"],
                        "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
                return self._send(200, json.dumps(info), flavour, content_type="application/json")
            if path == "/computeMetadata/v1/instance/service-accounts/default/token":
                token = {"access_token": state.gce_access_token, "expires_in": 3599, "token_type": "Bearer"}
                return self._send(200, json.dumps(token), flavour, content_type="application/json")
            if path != "/computeMetadata/v1/instance/preempted":
                return self._send(404, "Not Found")
            if query.get("wait_for_change", ["false"])[0] == "true":
                last = query.get("last_etag", [""])[0]
                wait = min(float(query.get("timeout_sec", [str(MAX_WAIT_S)])[0]), MAX_WAIT_S)
                end = time.monotonic() + wait
                with server.changed:
                    while server.gce_etag() == last and time.monotonic() < end:
                        server.changed.wait(end - time.monotonic())
            with server.changed:
                body, etag = ("TRUE" if state.preempted else "FALSE"), server.gce_etag()
            self._send(200, body, {"ETag": etag, "Metadata-Flavor": "Google"})

    return Handler
