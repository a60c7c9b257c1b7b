"""The KubeRay bridge run exactly as `ray-nodeless convert` writes its container (`autoscalerOptions.command` +
`args`: no flags), far enough for Ray to build the provider: the provider's MonitorContext is the bridge's (the GCS
address derived as Ray's own KubeRay autoscaler derives it, the session's logs dir the head reports, the config
file the bridge writes), so metrics, events, reversion (with its drain) and shape-open types are on.

Played around it, at the two edges the bridge has: the Kubernetes API (a small HTTPS server in this test, reached
as a pod reaches its API server: KUBERNETES_SERVICE_HOST/PORT and the ServiceAccount's token and CA files) and Ray's
head (`ray_compat.kuberay.connect`, the head's node record; `run_monitor`, Ray's monitor, which here runs its first
step only: read the config from the bridge and build the provider through Ray's own provider cache)."""
from __future__ import annotations

import copy
import importlib.metadata
import json
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from click.testing import CliRunner
from kubernetes.config import incluster_config

from ray_nodeless.cli.convert import convert_command
from ray_nodeless.kuberay import bridge as K
from ray_nodeless.kuberay import sidecar as KS
from ray_nodeless.kuberay import convert as KC
from ray_nodeless.metrics import wiring
from ray_nodeless.ray_compat import kuberay as ray_kuberay
from ray_nodeless.registrations.kubernetes import settings as kube_settings

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "kuberay" / "samples" / "ray-cluster.autoscaler.yaml"
JOIN = "{method: eks, cluster: my-eks, endpoint: 'https://X.eks.amazonaws.com', ca: LS0t, cidr: 10.100.0.0/16}"
NS = "ray"


class FakeApiServer:
    """The Kubernetes API calls the bridge and its registration make at start, answered over HTTPS on 127.0.0.1:
    the RayCluster (get, patch), SelfSubjectAccessReviews (allowed), empty Node and pod lists (watches end after a
    second, empty), the version."""

    def __init__(self, work: Path, ray_cr: dict):
        self.ray_cr = ray_cr
        self.patches: list[dict] = []
        cert, key = work / "tls.crt", work / "tls.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                        "-out", str(cert)], check=True, capture_output=True)
        self.ca = cert
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def do_GET(self):
                url = urlparse(self.path)
                if "watch=true" in (url.query or ""):
                    time.sleep(1.0)
                    return self._send(200, {})
                if url.path.endswith(f"/rayclusters/{server.ray_cr['metadata']['name']}"):
                    return self._send(200, server.ray_cr)
                if url.path in ("/api/v1/nodes", f"/api/v1/namespaces/{NS}/pods"):
                    kind = "NodeList" if "nodes" in url.path else "PodList"
                    return self._send(200, {"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                                            "items": []})
                if url.path == "/version":
                    return self._send(200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0"})
                self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})

            def do_POST(self):
                body = self._body()
                if self.path.endswith("/selfsubjectaccessreviews"):
                    return self._send(201, {**body, "status": {"allowed": True}})
                self._send(404, {"kind": "Status", "code": 404})

            def do_PATCH(self):
                body = self._body()
                server.patches.append(body)
                finalizers = (body.get("metadata") or {}).get("finalizers")
                if finalizers is not None:
                    server.ray_cr["metadata"]["finalizers"] = finalizers
                self._send(200, server.ray_cr)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def converted_manifest(tmp_path: Path) -> dict:
    """KubeRay's autoscaler sample through `ray-nodeless convert` (AWS), as a user applies it."""
    out = tmp_path / "converted.yaml"
    r = CliRunner().invoke(convert_command, [str(SAMPLE), "--cloud", "aws", "--region", "us-west-2", "--join", JOIN,
                                             "-o", str(out)])
    assert r.exit_code == 0, r.output
    [doc] = [d for d in yaml.safe_load_all(out.read_text()) if KC.is_kuberay(d)]
    return doc


def test_the_bridge_as_convert_writes_it_acts_on_the_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    manifest = converted_manifest(tmp_path)
    container = KS.autoscaler_container(manifest["spec"]["headGroupSpec"]["template"]["spec"])
    assert container is not None and manifest["spec"]["enableInTreeAutoscaling"] is False
    command = list(container["command"]) + list(container.get("args") or [])
    # The console script the container runs, as the installed package declares it.
    [script] = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == command[0]]
    cli = script.load()

    # What the API server returns of the applied RayCluster (namespace, uid), with the cluster's own settings in
    # the annotation as a user would keep them: no metrics port clash with other runs, no `ray status` block
    # (it would write to the head's GCS), reversion on, shape-open on.
    ray_cr = copy.deepcopy(manifest)
    ray_cr["metadata"].update(namespace=NS, uid="uid-1", resourceVersion="7")
    settings = yaml.safe_load(ray_cr["metadata"]["annotations"][K.ANNOTATION])
    settings.update(metrics_port=45219, ray_status_events=0, reversion={"enabled": True}, open_shapes=True)
    ray_cr["metadata"]["annotations"][K.ANNOTATION] = yaml.safe_dump(settings)

    # The pod's ServiceAccount, as the kubernetes client finds it in a pod.
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("token-of-the-head")
    session = tmp_path / "ray" / "session_latest"
    (session / "logs").mkdir(parents=True)
    monkeypatch.setenv("RAY_CLUSTER_NAME", ray_cr["metadata"]["name"])        # KubeRay sets both in the container
    monkeypatch.setenv("RAY_CLUSTER_NAMESPACE", NS)
    monkeypatch.setenv("RAY_NODELESS_EVENTS_DIR", str(tmp_path / "events"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")

    # Ray's head: its node record names the session (as _get_log_dir reads it); Ray's monitor, its first step.
    heads: list[str] = []
    built: list[tuple[dict, object]] = []

    def connect(address: str) -> ray_kuberay.Head:
        heads.append(address)
        return ray_kuberay.Head(gcs_client=None, gcs_address=address, logs_dir=str(session / "logs"))

    def run_monitor(config_reader, head) -> None:
        cfg = config_reader()
        built.append((cfg, ray_kuberay.node_provider(cfg["provider"], cfg["cluster_name"])))

    monkeypatch.setattr(ray_kuberay, "connect", connect)
    monkeypatch.setattr(ray_kuberay, "run_monitor", run_monitor)
    # The endpoint would listen on every interface (the head pod's address is not loopback); this machine allows
    # listeners on 127.0.0.1 only, so what is served is recorded instead of bound.
    served: list[tuple[int, str]] = []
    monkeypatch.setattr(wiring, "serve", lambda metrics, port, addr: served.append((port, addr)) or (addr, port))

    with FakeApiServer(tmp_path, ray_cr) as api:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
        monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(sa / "token"))
        monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(api.ca))
        monkeypatch.setattr(kube_settings, "IN_CLUSTER_TOKEN", str(sa / "token"))   # where the registration looks
        r = CliRunner().invoke(cli, command[1:], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        [(cfg, provider)] = built
        try:
            from ray._private.services import get_node_ip_address

            gcs = f"{get_node_ip_address()}:6379"     # Ray's run_kuberay_autoscaler: this pod's IP, port 6379
            assert heads == [gcs]
            ctx = provider.context
            assert ctx.acts_on_cluster and ctx.gcs_address == gcs
            assert ctx.logs_dir == str(session / "logs")
            assert ctx.config_path == str(session / K.CONFIG_FILE)
            # The bridge wrote the config it handed Ray to that file: the shape-open driver's store.
            written = yaml.safe_load(Path(ctx.config_path).read_text())
            assert set(written["available_node_types"]) == set(cfg["available_node_types"])
            assert provider.open is not None and str(provider.open.open_types.store.path) == ctx.config_path
            # Metrics (the endpoint on its port), events (the head's log), reversion and its drain through the GCS.
            assert served == [(45219, "0.0.0.0")]
            assert provider.instruments.recorder.events is not None
            assert provider.reverter is not None and provider.reverter.drainer.gcs_address == gcs
            assert provider.loop is not None and not provider.loop.running      # starts at Ray's first listing
            assert any("finalizers" in (p.get("metadata") or {}) for p in api.patches)
        finally:
            provider.stop()
            provider.registration.close()


def test_the_context_reaches_the_provider_through_its_block():
    ctx = K.monitor_context("10.1.2.3:6379", "/tmp/ray/session_latest/logs")
    assert ctx.config_path == "/tmp/ray/session_latest/" + K.CONFIG_FILE
    from ray_nodeless.ray_adapter.context import MonitorContext

    assert MonitorContext.from_mapping(ctx.to_mapping(), "provider.kuberay.monitor") == ctx
    with pytest.raises(Exception, match="provider.kuberay.monitor.extra"):
        MonitorContext.from_mapping({**ctx.to_mapping(), "extra": 1}, "provider.kuberay.monitor")


def test_the_gcs_address_is_the_pods_ip_on_the_heads_port():
    rc = {"spec": {"headGroupSpec": {"rayStartParams": {}}}}
    assert K.gcs_address_of(rc, "10.0.0.9") == "10.0.0.9:6379"
    rc["spec"]["headGroupSpec"]["rayStartParams"]["port"] = "6380"
    assert K.gcs_address_of(rc, "10.0.0.9") == "10.0.0.9:6380"
