"""`ray-nodeless sweep` on the local backend, with real processes and no Ray: a worker node's process group and
record, the head's record and the processes its command runner left (marked `NODELESS_LOCAL_NODE=<marker>`: what
`ray down`'s scoped `ray stop` would have stopped), and another cluster's node in the same state dir, which must
survive. `sleep` stands in for `ray start --block`: the sweep acts on records, process groups and markers, not Ray."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli.sweep import sweep_command
from ray_nodeless.providers.base import TAG_CLUSTER
from ray_nodeless.providers.local.backend import LocalBackend
from ray_nodeless.providers.local.pids import proc_info, start_of
from ray_nodeless.providers.local.ray_start import MARKER_ENV
from ray_nodeless.providers.local.records import NodeRecord

CLUSTER = "c1"


def run(*args: str):
    return CliRunner().invoke(sweep_command, list(args))


@pytest.fixture
def local(tmp_path: Path):
    provider = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "local",
                "region": "us-west-2", "state_dir": str(tmp_path / "state"), "gcs_address": "127.0.0.1:6399",
                "local_prewarm": False}
    procs: list[subprocess.Popen] = []
    backend = LocalBackend.from_provider(dict(provider), CLUSTER)

    def spawn(env: dict[str, str] | None = None) -> subprocess.Popen:
        p = subprocess.Popen(["sleep", "300"], start_new_session=True, env={**os.environ, **(env or {})})
        procs.append(p)
        return p

    def node(mid: str, cluster: str, kind: str) -> subprocess.Popen:
        p = spawn()
        rec = NodeRecord(id=mid, node_type="cpu" if kind == "worker" else "head", ip="127.0.0.9", pid=p.pid,
                         started_s=start_of(p.pid), started_at=time.time() - 120, ready=True,
                         tags={TAG_CLUSTER: cluster, "ray-node-type": kind, "ray-user-node-type": "cpu",
                               "nodeless-instance-type": "m5.large", "nodeless-zone": "local-a",
                               "nodeless-capacity": "on-demand", "nodeless-hourly-price": "0.096"})
        with backend.nodes.records.lock:
            backend.nodes.records.write(rec)
        return p

    worker = node("local-w1", CLUSTER, "worker")
    foreign = node("local-x1", "other", "worker")
    backend.nodes.add_placeholder("local-h", "head", "127.0.0.1",
                                  {TAG_CLUSTER: CLUSTER, "ray-node-type": "head", "ray-user-node-type": "head"})
    head_ray = spawn({MARKER_ENV: backend.runner_marker})      # what the head's command runner started
    doc = {"cluster_name": CLUSTER, "max_workers": 1, "setup_commands": [], "head_setup_commands": [],
           "worker_setup_commands": [], "provider": provider, "head_node_type": "head",
           "available_node_types": {"head": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
                                    "cpu": {"resources": {"CPU": 1}, "node_config": {}}}}
    path = tmp_path / "c1.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        yield {"yaml": str(path), "backend": backend, "worker": worker, "foreign": foreign, "head_ray": head_ray}
    finally:
        for p in procs:          # only what this test started, by PID
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def alive(p: subprocess.Popen) -> bool:
    p.poll()           # reap it if it ended (a zombie is not alive)
    return proc_info(p.pid) is not None


def test_dry_run_then_sweep_ends_the_clusters_records_and_processes_only(local):
    b = local["backend"]
    r = run(local["yaml"], "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [(t["kind"], t["id"], t["node_kind"]) for t in doc["targets"]] == [
        ("machine", "local-w1", "worker"), ("machine", "local-h", "head"),
        ("process", str(local["head_ray"].pid), "head")]
    assert doc["targets"][0]["instance_type"] == "m5.large" and doc["targets"][0]["hourly_price"] == 0.096
    assert all(alive(local[k]) for k in ("worker", "foreign", "head_ray"))
    assert {r.id for r in b.nodes.records.all()} == {"local-w1", "local-x1", "local-h"}

    r = run(local["yaml"], "--workers-only", "-y")
    assert r.exit_code == 0, r.output
    assert not alive(local["worker"]) and alive(local["head_ray"]) and alive(local["foreign"])
    assert {r.id for r in b.nodes.records.all()} == {"local-x1", "local-h"}

    r = run(local["yaml"], "-y")
    assert r.exit_code == 0, r.output
    assert f"ended 2: process {local['head_ray'].pid}, machine local-h" in r.output
    assert not alive(local["head_ray"])
    assert alive(local["foreign"])                                   # another cluster's node in the same state dir
    assert {r.id for r in b.nodes.records.all()} == {"local-x1"}
    assert run(local["yaml"], "-y").output.strip() == "cluster c1: nothing to end"
