"""End to end with the real Ray autoscaler (`ray up`, local backend): node types pinned to m5.large with
`resources: {}` (as in Ray's own examples) get m5.large's resources, so `request_resources([{CPU: 2}] * 2)` launches
one m5.large worker (the head holds the other bundle).

Starts Ray: run serialised with the other e2e tests (`flock /tmp/rnl-e2e.lock ...`); cleans up only what it started.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from ray_nodeless.providers.local.backend import LocalBackend
from ray_nodeless.testing.ray_processes import free_port
from tests.e2e.clusters import BIN, RAY_ENV, end_local_cluster, write_config

pytestmark = pytest.mark.e2e

def _machines(cfg: dict) -> dict[str, dict]:
    backend = LocalBackend.from_provider(dict(cfg["provider"]), cfg["cluster_name"])
    return {m.id: m.tags for m in backend.list_machines()}


def test_request_resources_launches_a_worker_of_the_pinned_type(tmp_path: Path) -> None:
    port = free_port()
    pinned = {"instance_types": ["m5.large"]}
    cfg = {
        "cluster_name": f"swapin-{uuid.uuid4().hex[:6]}", "max_workers": 2, "upscaling_speed": 1.0,
        "idle_timeout_minutes": 5,
        "provider": {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "local",
                     "simulate_cloud": "aws", "region": "us-west-2", "gcs_address": f"127.0.0.1:{port}",
                     "state_dir": str(tmp_path / "state"), "disable_node_updaters": True,
                     "disable_launch_config_check": True},
        "auth": {"ssh_user": "root"},
        "available_node_types": {
            "head": {"resources": {}, "node_config": dict(pinned)},
            "worker": {"min_workers": 0, "max_workers": 2, "resources": {}, "node_config": dict(pinned)}},
        "head_node_type": "head",
        "file_mounts": {}, "cluster_synced_files": [], "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "worker_start_ray_commands": [],
        "head_start_ray_commands": [
            f"RAY_AUTH_MODE=disabled AUTOSCALER_UPDATE_INTERVAL_S=1 ray start --head --port={port} "
            "--node-ip-address=127.0.0.1 --num-cpus=2 --include-dashboard=false --object-store-memory=100000000 "
            "--autoscaling-config=~/ray_bootstrap_config.yaml"],
    }
    path = write_config(cfg, tmp_path)
    try:
        up = subprocess.run([str(BIN / "ray"), "up", "-y", str(path)], env=RAY_ENV, capture_output=True, text=True,
                            timeout=240)
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        assert [t["ray-node-type"] for t in _machines(cfg).values()] == ["head"]
        code = textwrap.dedent(f"""
            import ray
            from ray.autoscaler.sdk import request_resources
            ray.init(address="127.0.0.1:{port}", logging_level="ERROR", log_to_driver=False)
            request_resources(bundles=[{{"CPU": 2}}] * 2)
        """)
        out = subprocess.run([sys.executable, "-c", code], env=RAY_ENV, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        deadline = time.monotonic() + 150
        workers: list[dict] = []
        while time.monotonic() < deadline and not workers:
            workers = [t for t in _machines(cfg).values() if t["ray-node-type"] == "worker"]
            time.sleep(1)
        assert len(workers) == 1, _machines(cfg)
        assert workers[0]["nodeless-instance-type"] == "m5.large"
        time.sleep(5)
        assert len([t for t in _machines(cfg).values() if t["ray-node-type"] == "worker"]) == 1
        down = subprocess.run([str(BIN / "ray"), "down", "-y", str(path)], env=RAY_ENV, capture_output=True, text=True,
                              timeout=180)
        assert down.returncode == 0, down.stderr[-2000:]
        assert _machines(cfg) == {}
    finally:
        end_local_cluster(cfg)
