"""`bootstrap_config` for `cloud: gcp`: `project_id: null` refused before anything launches (against the fake GCE
server), and the steps of Ray's GCP bootstrap that go through Compute (project SSH key, subnet) against a small stub
of the three Compute calls they make, which the fake GCE server does not serve (projects.get /
setCommonInstanceMetadata, globalOperations.wait, subnetworks.list). The service-account step needs the IAM and
Resource Manager APIs: not served by either, skipped with `credentials: anonymous`."""
from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from ray_nodeless.errors import ConfigError
from ray_nodeless.ray_adapter.bootstrap import bootstrap_config
from ray_nodeless.testing.fake_gce import FakeGce
from tests.helpers import GPU_WORKER, cluster_config

PROJECT = "p"
REGION = "us-central1"


def config(endpoint: str, **provider: Any) -> dict[str, Any]:
    return cluster_config({"cloud": "gcp", "region": REGION, "project_id": PROJECT, "api_endpoint": endpoint,
                           "credentials": "anonymous", **provider},
                          name="gbs", max_workers=1, workers={"gpu": GPU_WORKER}, auth={"ssh_user": "ubuntu"},
                          head_node={})


class ComputeStub:
    """projects.get / setCommonInstanceMetadata, globalOperations.wait and subnetworks.list of one project."""

    def __init__(self) -> None:
        self.metadata: dict[str, Any] = {"fingerprint": "f0", "items": [{"key": "other", "value": "x"}]}
        self.calls: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def _send(self, body: dict, status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                stub.calls.append(f"GET {path}")
                if path == f"/compute/v1/projects/{PROJECT}":
                    return self._send({"name": PROJECT, "commonInstanceMetadata": stub.metadata})
                if path == f"/compute/v1/projects/{PROJECT}/regions/{REGION}/subnetworks":
                    link = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/regions/{REGION}/subnetworks/default"
                    return self._send({"items": [{"name": "default", "selfLink": link}]})
                self._send({"error": {"code": 404, "message": "no route"}}, 404)

            def do_POST(self) -> None:
                path = self.path.split("?")[0]
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                stub.calls.append(f"POST {path}")
                if path == f"/compute/v1/projects/{PROJECT}/setCommonInstanceMetadata":
                    if body.get("fingerprint") != stub.metadata["fingerprint"]:
                        return self._send({"error": {"code": 412, "message": "fingerprint"}}, 412)
                    stub.metadata = dict(body, fingerprint="f1")
                    return self._send({"name": "op-1", "status": "RUNNING", "kind": "compute#operation"})
                if path == f"/compute/v1/projects/{PROJECT}/global/operations/op-1/wait":
                    return self._send({"name": "op-1", "status": "DONE", "kind": "compute#operation"})
                self._send({"error": {"code": 404, "message": "no route"}}, 404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ssh_keys(self) -> list[str]:
        return [ln for i in self.metadata["items"] if i["key"] == "ssh-keys" for ln in i["value"].split("\n")]


@pytest.fixture
def stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ComputeStub]:
    monkeypatch.setenv("HOME", str(tmp_path))          # Ray's key files go to ~/.ssh
    s = ComputeStub()
    try:
        yield s
    finally:
        s.server.shutdown()


def test_project_id_null_fails_before_anything_launches() -> None:
    with FakeGce(project=PROJECT) as fake:
        for value in (None, ""):
            with pytest.raises(ConfigError) as e:
                bootstrap_config(config(fake.url, project_id=value))
            assert e.value.key == "provider.project_id"
        assert fake.instances == {} and fake.requests == []       # refused before any call


def test_local_player_runs_no_gcp_step(tmp_path: Path) -> None:
    with FakeGce(project=PROJECT) as fake:
        got = bootstrap_config(config(fake.url, registration="local-player", player_state_dir=str(tmp_path)))
    assert "ssh_private_key" not in got["auth"]
    assert all("networkInterfaces" not in t["node_config"] for t in got["available_node_types"].values())


def test_vm_gets_a_project_ssh_key_and_the_regions_subnet_like_ray(stub: ComputeStub) -> None:
    from ray.autoscaler._private.util import generate_ssh_key_name, generate_ssh_key_paths

    got = bootstrap_config(config(stub.url))
    name = generate_ssh_key_name("gcp", 0, REGION, PROJECT, "ubuntu")
    public_path, private_path = generate_ssh_key_paths(name)
    assert got["auth"]["ssh_private_key"] == private_path and os.path.exists(private_path)
    [line] = stub.ssh_keys()
    pub = Path(public_path).read_text().split(" ")
    assert line == f"ubuntu:ssh-rsa {pub[1]} ubuntu"              # Ray's format, Ray's key name and paths
    assert {"key": "other", "value": "x"} in stub.metadata["items"]   # other project metadata kept
    for t in got["available_node_types"].values():
        [ni] = t["node_config"]["networkInterfaces"]
        assert ni["subnetwork"].endswith(f"/regions/{REGION}/subnetworks/default")
        assert ni["accessConfigs"] == [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
    assert "serviceAccounts" not in got["head_node"]     # needs IAM / Resource Manager: not with anonymous
    # a second bootstrap finds the key (project + local file) and adds nothing
    again = bootstrap_config(config(stub.url))
    assert again["auth"]["ssh_private_key"] == private_path and len(stub.ssh_keys()) == 1


def test_given_keys_and_interfaces_are_kept(stub: ComputeStub) -> None:
    cfg = config(stub.url)
    cfg["auth"]["ssh_private_key"] = "/keys/mine.pem"
    for t in cfg["available_node_types"].values():
        t["node_config"]["networkInterfaces"] = [{"network": "global/networks/mine"}]
    got = bootstrap_config(cfg)
    assert got["auth"]["ssh_private_key"] == "/keys/mine.pem"
    assert all(t["node_config"]["networkInterfaces"] == [{"network": "global/networks/mine"}]
               for t in got["available_node_types"].values())
    assert stub.calls == []


def test_an_unreachable_compute_api_is_a_config_error(stub: ComputeStub) -> None:
    with pytest.raises(ConfigError) as e:
        bootstrap_config(config(stub.url, project_id="other"))
    assert e.value.key == "auth.ssh_private_key" and "'other'" in str(e.value)
