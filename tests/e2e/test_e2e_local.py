"""End to end with the real Ray autoscaler on the local backend: `ray up` (v2) and `ray start --autoscaling-config`
(v1). Each "instance" is a real local Ray node process with the chosen instance type's resources.

These tests start Ray: each uses its own cluster name, GCS port and state dir, and cleans up only what it started
(scoped by the command runner's marker), never a global `ray stop`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from ray_nodeless.core.cluster_plan import plan_cluster
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.providers.local.backend import LocalBackend
from ray_nodeless.providers.local.scoped_stop import stop_marked_processes
from ray_nodeless.testing.clock import wait_for
from tests.e2e.clusters import BIN, RAY_ENV, cluster_copy, end_local_cluster, write_config

pytestmark = pytest.mark.e2e


def _config(tmp_path: Path, **provider_overrides) -> tuple[dict, Path]:
    """local-cpu-head.yaml with a unique cluster, port and state dir, a {CPU: 2} worker type and a CPU-less head."""
    cfg = cluster_copy("local-cpu-head.yaml", "e2e", state_dir=str(tmp_path / "state"), **provider_overrides)
    cfg["available_node_types"]["head"]["resources"] = {"CPU": 0, "GPU": 0}
    cfg["available_node_types"]["gpu_worker"]["max_workers"] = 2
    cfg["available_node_types"]["cpu_worker"] = {"min_workers": 0, "max_workers": 1, "resources": {"CPU": 2},
                                                 "node_config": {}}
    return cfg, write_config(cfg, tmp_path)


def _driver(cfg: dict, body: str, timeout: float = 240) -> dict:
    """Run a driver against the cluster; it prints one line `RESULT <json>`."""
    code = textwrap.dedent(f"""
        import json, os, time, ray
        ray.init(address="{cfg['provider']['gcs_address']}", logging_level="ERROR", log_to_driver=False)
        def node_of():
            return os.environ.get("RAY_CLOUD_INSTANCE_ID")
    """) + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], env=RAY_ENV, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    [line] = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def _machines(cfg: dict) -> dict[str, dict]:
    backend = LocalBackend.from_provider(dict(cfg["provider"]), cfg["cluster_name"])
    return {m.id: m.tags for m in backend.list_machines()}


def _wait(predicate, timeout: float, what: str):
    return wait_for(predicate, timeout, what, interval=1.0)     # a Ray cluster's pace: poll once a second


def test_ray_up_v2_cheapest_fit_fallback_exclusion_replacement_idle_and_down(tmp_path):
    # g6 is the cheapest GPU family for {CPU: 4, GPU: 1}: exclude it, and make the next candidate's first zone fail.
    cfg, path = _config(tmp_path, exclude={"gpus": ["M60", "K80"], "families": ["g6"]})
    plan = plan_cluster(cfg).plans["gpu_worker"]
    first, second = plan.top(2)
    assert first.instance_type.family != "g6" and first.instance_type.name == second.instance_type.name
    (tmp_path / "state").mkdir(parents=True, exist_ok=True)
    (tmp_path / "state" / "faults.json").write_text(json.dumps([
        {"instance_type": first.instance_type.name, "zone": first.zone, "capacity": first.capacity,
         "code": "InsufficientInstanceCapacity", "times": 1}]))
    try:
        up = subprocess.run([str(BIN / "ray"), "up", "-y", str(path)], env=RAY_ENV, capture_output=True, text=True,
                            timeout=240)
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        [head] = _machines(cfg).values()
        assert head["ray-node-type"] == "head"

        # CPU first, while no worker exists: Ray must launch a node for it. (Once a GPU node with free CPUs exists,
        # Ray may place CPU tasks there; what ray_nodeless controls is which instance a launch gets.) Its machine is
        # read as soon as the task returns: idle workers go after 12 s here, and the GPU launch below (after an
        # injected capacity error) can take longer than that on a loaded machine.
        got = _driver(cfg, """
            @ray.remote(num_cpus=1)
            def cpu_task():
                return node_of()
            print("RESULT", json.dumps({"cpu": ray.get(cpu_task.remote())}))
        """)
        # The CPU-only task ran on a machine without GPUs (the cpu_worker type, planned without GPU instances).
        cpu_type = _machines(cfg)[got["cpu"]]["nodeless-instance-type"]
        assert plan_cluster(cfg).plans["cpu_worker"].chosen.instance_type.name == cpu_type
        from ray_nodeless.core.catalog import embedded
        assert embedded().instance_type("aws", cpu_type).gpu_count == 0

        # A {GPU: 1} task brings up the cheapest allowed GPU instance, in the next zone after the injected error.
        got = _driver(cfg, """
            @ray.remote(num_gpus=1, num_cpus=1)
            def gpu_task():
                return node_of()
            print("RESULT", json.dumps({"gpu": ray.get(gpu_task.remote())}))
        """)
        machines = _machines(cfg)
        gpu = machines[got["gpu"]]
        assert gpu["nodeless-instance-type"] == first.instance_type.name
        assert (gpu["nodeless-zone"], gpu["nodeless-capacity"]) == (second.zone, second.capacity)
        assert gpu["nodeless-rule"] == "gpu-workers-spot-first"
        assert not gpu["nodeless-instance-type"].startswith("g6.")

        # A node killed from outside (like a spot reclaim) while work remains is replaced.
        status = tmp_path / "running"
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import os, time, ray
            ray.init(address="{cfg['provider']['gcs_address']}", logging_level="ERROR")
            @ray.remote(num_gpus=1, num_cpus=1, max_retries=3)
            def long_task():
                open("{status}", "a").write(os.environ["RAY_CLOUD_INSTANCE_ID"] + "\\n")
                time.sleep(8)
                return os.environ["RAY_CLOUD_INSTANCE_ID"]
            print(ray.get(long_task.remote()))
        """)], env=RAY_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        victim = _wait(lambda: status.exists() and status.read_text().split(), 120, "the long task to start")[0]
        backend = LocalBackend.from_provider(dict(cfg["provider"]), cfg["cluster_name"])
        rec = backend.nodes.get(victim)
        os.killpg(rec.pgid, signal.SIGKILL)
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-2000:]
        survivor = out.strip().splitlines()[-1]
        assert survivor != victim and survivor in _machines(cfg)
        assert victim not in _machines(cfg)

        # Idle workers are removed after idle_timeout_minutes (0.2 min here).
        _wait(lambda: [t for t in _machines(cfg).values() if t["ray-node-type"] == "head"] == list(
            _machines(cfg).values()), 120, "idle workers to be terminated")

        down = subprocess.run([str(BIN / "ray"), "down", "-y", str(path)], env=RAY_ENV, capture_output=True, text=True,
                              timeout=180)
        assert down.returncode == 0, down.stderr[-2000:]
        assert _machines(cfg) == {}
        # No machine records left: only the fault file the test wrote and the address/port counter. (The head's
        # home keeps ray-nodeless's decision log and cost total, ~/.ray-nodeless/events: `status --events` reads
        # them after `ray down` too.)
        assert sorted(p.name for p in (tmp_path / "state").rglob("*.json")
                      if ".ray-nodeless" not in p.parts) == ["counter.json", "faults.json"]
        assert stop_marked_processes(backend.runner_marker) == 0, "ray down left processes behind"
    finally:
        end_local_cluster(cfg)


def test_v1_autoscaler_launches_and_removes_a_gpu_node(tmp_path):
    cfg, path = _config(tmp_path)
    boot = NodelessProvider.bootstrap_config(cfg)
    provider = NodelessProvider(boot["provider"], cfg["cluster_name"])
    head_tags = {"ray-node-type": "head", "ray-user-node-type": "head", "ray-node-name": "head",
                 "ray-node-status": "up-to-date", "ray-launch-config": "v1"}
    provider.create_node({}, head_tags, 1)
    [head_id] = provider.non_terminated_nodes({"ray-node-type": "head"})
    boot_path = tmp_path / "boot.yaml"
    boot_path.write_text(yaml.safe_dump(boot))
    port = cfg["provider"]["gcs_address"].rsplit(":", 1)[1]
    # v1: a plain `ray start --head --autoscaling-config` (no RAY_enable_autoscaler_v2), through the cluster's
    # command runner so the head's processes carry its marker and are cleaned up with it.
    runner = provider.backend.command_runner("", head_id, {}, cfg["cluster_name"], subprocess, True)
    try:
        runner.run(f"RAY_AUTH_MODE=disabled RAY_enable_autoscaler_v2=0 AUTOSCALER_UPDATE_INTERVAL_S=1 "
                   f"ray start --head --port={port} --node-ip-address=127.0.0.1 --num-cpus=0 "
                   f"--include-dashboard=false --object-store-memory=100000000 --autoscaling-config={boot_path}",
                   exit_on_fail=True, with_output=True)
        got = _driver(cfg, """
            @ray.remote(num_gpus=1, num_cpus=1)
            def gpu_task():
                return node_of()
            print("RESULT", json.dumps({"gpu": ray.get(gpu_task.remote())}))
        """)
        tags = _machines(cfg)[got["gpu"]]
        assert tags["nodeless-instance-type"] == plan_cluster(cfg).plans["gpu_worker"].chosen.instance_type.name
        _wait(lambda: list(_machines(cfg)) == [head_id], 120, "the idle GPU node to be removed under v1")
    finally:
        end_local_cluster(cfg)
