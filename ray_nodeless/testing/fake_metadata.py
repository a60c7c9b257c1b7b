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


class FakeMetadataServer:
    def __init__(self, instance_id: str = "i-0fake0000000000001"):
        self.state = _State(instance_id=instance_id)
        self.changed = threading.Condition()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-metadata", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

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

        def _send(self, status: int, body: str = "", headers: dict[str, str] | None = None) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
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
            self._send(404, "Not Found")

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
            if path == "/computeMetadata/v1/instance/name":
                return self._send(200, state.instance_id, {"Metadata-Flavor": "Google"})
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
