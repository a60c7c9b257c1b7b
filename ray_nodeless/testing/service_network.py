"""The cluster network a process outside the cluster lacks: Service names (`<svc>.<ns>.svc.cluster.local`) and
the route to the pods behind them, for the REAL KubeRay operator run out of cluster (testing/kuberay_operator.py).

The operator reaches a Ray head's dashboard (a RayJob's submission and its job status) at
`http://<head-svc>.<ns>.svc.<cluster domain>:<dashboard port>` (ray-operator v1.5.0 utils.FetchHeadServiceURL), a
name only the cluster's DNS answers, and an address only its service proxy routes. Its Go HTTP client honours
HTTP_PROXY (never for the API server on 127.0.0.1: Go does not proxy loopback), so `ServiceNetwork` is an HTTP
forward proxy on 127.0.0.1 given to the operator as HTTP_PROXY. It does what DNS and kube-proxy do for such a
name: the Service is read from the API server (no such Service: 502, as a name that does not resolve fails), the
port must be one of its ports, the request goes to its targetPort on a Ready pod its selector matches, at that
pod's `status.podIP` (the head pod's IP, 127.0.0.1, as HeadPodStandIn posts it). Nothing else is proxied.
"""
from __future__ import annotations

import http.client
import http.server
import re
import threading
import urllib.parse
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

SERVICE_HOST = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc\.cluster\.local")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "proxy-connection"}


class Unroutable(Exception):
    """No Service, port or Ready pod for the name: what the caller sees as a failed connection."""


def route(core: client.CoreV1Api, host: str, port: int) -> tuple[str, int]:
    """(pod IP, target port) of `host:port` as the cluster's DNS and service proxy would route it."""
    m = SERVICE_HOST.fullmatch(host)
    if m is None:
        raise Unroutable(f"{host} is not a Service name of this cluster")
    name, namespace = m.group(1), m.group(3)
    try:
        svc = core.read_namespaced_service(name, namespace)
    except ApiException as e:
        raise Unroutable(f"Service {namespace}/{name}: {e.status} {e.reason}") from None
    ports = [p for p in svc.spec.ports or [] if p.port == port]
    if not ports:
        raise Unroutable(f"Service {namespace}/{name} has no port {port}")
    target = ports[0].target_port
    selector = ",".join(f"{k}={v}" for k, v in sorted((svc.spec.selector or {}).items()))
    pods = [p for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if p.status.pod_ip and not p.metadata.deletion_timestamp
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
    if not pods:
        raise Unroutable(f"Service {namespace}/{name} has no Ready pod")
    pod = pods[0]
    if isinstance(target, str) and not target.isdigit():        # a named port: the pod's container port of it
        named = [cp.container_port for c in pod.spec.containers for cp in c.ports or [] if cp.name == target]
        if not named:
            raise Unroutable(f"Service {namespace}/{name}: no container port named {target!r}")
        return pod.status.pod_ip, named[0]
    return pod.status.pod_ip, int(target) if target is not None else port


class ServiceNetwork:
    """The proxy (see the module docstring): `start()`, `url` for HTTP_PROXY, `stop()`; `routed` counts the
    requests it carried, `refused` what it could not route (for a test's failure message)."""

    def __init__(self, api: client.ApiClient):
        self.core = client.CoreV1Api(api)
        self.routed = 0
        self.refused: list[str] = []
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "ServiceNetwork":
        network = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:     # quiet: the test's output is its own
                pass

            def _forward(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                try:
                    if url.scheme != "http" or not url.hostname:
                        raise Unroutable(f"not an absolute http URL: {self.path}")
                    ip, port = route(network.core, url.hostname, url.port or 80)
                except Unroutable as e:
                    network.refused.append(str(e))
                    self.send_error(502, str(e))
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                conn = http.client.HTTPConnection(ip, port, timeout=30)
                try:
                    conn.request(self.command, url.path + (f"?{url.query}" if url.query else ""), body, headers)
                    resp = conn.getresponse()
                    data = resp.read()
                except OSError as e:
                    network.refused.append(f"{ip}:{port}: {e}")
                    self.send_error(502, f"{ip}:{port}: {e}")
                    return
                finally:
                    conn.close()
                network.routed += 1
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_BY_HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="service-network", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
