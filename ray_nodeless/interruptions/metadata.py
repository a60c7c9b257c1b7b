"""Reading a machine's own interruption notice from its metadata server (EC2 IMDSv2, GCE metadata server).

Standard library HTTP only: the watcher runs on every spot worker beside Ray, so it imports nothing a Ray worker
image might lack. The base URL is a parameter (and `RAY_NODELESS_METADATA_URL` in the watcher) so the tests point
both clients at a fake server on 127.0.0.1.
"""
from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable

from ray_nodeless.errors import MetadataError
from ray_nodeless.interruptions.notices import Notice, parse_gce_preempted, parse_imds_instance_action

AWS_METADATA_URL = "http://169.254.169.254"
GCE_METADATA_URL = "http://metadata.google.internal"

IMDS_TOKEN_PATH = "/latest/api/token"
IMDS_ACTION_PATH = "/latest/meta-data/spot/instance-action"
IMDS_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
IMDS_TOKEN_HEADER = "X-aws-ec2-metadata-token"
# IMDSv2 tokens live up to 6 h; we ask for 6 h and renew a minute early, so one PUT serves thousands of polls.
IMDS_TOKEN_TTL_S = 21600
IMDS_TOKEN_RENEW_MARGIN_S = 60.0

GCE_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
GCE_FLAVOR = {"Metadata-Flavor": "Google"}
# A metadata server answers in milliseconds on the link-local network; 2 s means it is not there.
REQUEST_TIMEOUT_S = 2.0


def _request(method: str, url: str, headers: dict[str, str], timeout: float) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers). HTTP error statuses are answers (404 is "no notice"), not exceptions; only a
    server that cannot be reached at all raises MetadataError."""
    req = urllib.request.Request(url, method=method, headers=headers, data=b"" if method == "PUT" else None)
    # No proxy: metadata is link-local and an HTTP(S)_PROXY in the environment must never see the IMDS token.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read(), dict(resp.headers.items())
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers.items()) if e.headers else {}
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise MetadataError(f"metadata server {url} unreachable: {getattr(e, 'reason', e)}") from None


class ImdsClient:
    """EC2 IMDSv2: one session token (PUT), then `spot/instance-action` reads with it."""

    def __init__(self, base_url: str = AWS_METADATA_URL, timeout: float = REQUEST_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._clock = clock
        self._token: str | None = None
        self._token_until = 0.0

    def _get_token(self) -> str:
        if self._token is None or self._clock() >= self._token_until:
            status, body, _ = _request("PUT", self.base_url + IMDS_TOKEN_PATH,
                                       {IMDS_TTL_HEADER: str(IMDS_TOKEN_TTL_S)}, self.timeout)
            if status != 200 or not body:
                raise MetadataError(f"IMDSv2 token request answered HTTP {status}")
            self._token = body.decode().strip()
            self._token_until = self._clock() + IMDS_TOKEN_TTL_S - IMDS_TOKEN_RENEW_MARGIN_S
        return self._token

    def poll(self) -> Notice | None:
        """The current notice, or None. A 401 (the token expired early, IMDS restarted) renews the token once."""
        for attempt in range(2):
            status, body, _ = _request("GET", self.base_url + IMDS_ACTION_PATH,
                                       {IMDS_TOKEN_HEADER: self._get_token()}, self.timeout)
            if status == 401 and attempt == 0:
                self._token = None
                continue
            if status not in (200, 404):
                raise MetadataError(f"IMDS {IMDS_ACTION_PATH} answered HTTP {status}")
            return parse_imds_instance_action(status, body)
        raise MetadataError("IMDS refused a freshly issued token (HTTP 401)")


class GceClient:
    """GCE metadata server `instance/preempted`, read with the server's hanging GET: the first read answers at once,
    then `wait_for_change=true&last_etag=...` returns as soon as the value changes (or after `timeout_sec`), so the
    notice arrives within milliseconds without polling every second."""

    def __init__(self, base_url: str = GCE_METADATA_URL, timeout: float = REQUEST_TIMEOUT_S,
                 clock: Callable[[], float] = time.time):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._clock = clock
        self._etag: str | None = None

    def poll(self, wait_s: float = 0.0) -> Notice | None:
        """The current notice, or None; with `wait_s` > 0 (and a value seen before), wait up to that long for a
        change first."""
        url = self.base_url + GCE_PREEMPTED_PATH
        timeout = self.timeout
        if wait_s > 0 and self._etag is not None:
            wait = max(1, int(wait_s))
            url += "?" + urllib.parse.urlencode({"wait_for_change": "true", "last_etag": self._etag,
                                                 "timeout_sec": str(wait)})
            timeout += wait
        status, body, headers = _request("GET", url, dict(GCE_FLAVOR), timeout)
        if status != 200:
            raise MetadataError(f"GCE metadata {GCE_PREEMPTED_PATH} answered HTTP {status}")
        self._etag = headers.get("ETag") or headers.get("Etag") or self._etag
        return parse_gce_preempted(body, self._clock())
