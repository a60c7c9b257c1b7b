"""End to end: Ray's autoscaler (v2) drives NodelessProvider's real AWS code path against moto, and every EC2
instance it launches is played by a local Ray node (`registration: local-player`).

One test, one cluster: the head instance is created through the provider (so moto has it, tagged head), the local
head runs `ray start --head --autoscaling-config` with RAY_CLOUD_INSTANCE_ID=<that id>; a driver's {GPU: 1} task
makes the autoscaler launch the planner's spot choice; the instance is then preempted in moto (and its machine, the
player, dies as a preempted VM would), the task is retried and the autoscaler launches a replacement; once idle, the
replacement is terminated in moto. Cleanup terminates everything through the provider (what `ray down` does), kills
the head's own process group and the player's marked processes: never a global `ray stop`.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ray_nodeless.core.cluster_plan import plan_cluster
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.providers.local.scoped_stop import marked_pids, stop_marked_processes

from ray_nodeless.testing.moto_server import MotoServer
from ray_nodeless.testing.ray_processes import free_port, head_process, kill_group, wait_for

pytestmark = pytest.mark.e2e

TAG_CLUSTER = "ray-cluster-name"


def cluster_config(moto: MotoServer, name: str, gcs_port: int, player_dir: str) -> dict[str, Any]:
    return {
        "cluster_name": name,
        "max_workers": 2,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 0.2,
        "provider": {
            "type": "external", "module": "ray_nodeless.NodelessProvider",
            "cloud": "aws", "region": "us-east-1", "endpoint_url": moto.url,
            "aws_credentials": {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"},
            "aws_retry_base_delay_s": 0.0,
            "image_id": moto.ami(),
            "registration": "local-player",
            "player_state_dir": player_dir,
            "gcs_address": f"127.0.0.1:{gcs_port}",
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "list_cache_s": 1.0,
            "exclude": {"gpus": ["M60", "K80"]},
            "rules": [
                {"name": "head-on-demand", "match": {"node_kind": "head"}, "capacity": ["on-demand"]},
                {"name": "gpu-workers-spot-first", "match": {"node_kind": "worker", "GPU": ">=1"},
                 "capacity": ["spot", "on-demand"]},
                {"name": "cpu-on-demand", "match": {}, "capacity": ["on-demand"]},
            ],
        },
        "auth": {"ssh_user": "root"},
        "available_node_types": {
            "head": {"resources": {"CPU": 0}, "node_config": {}},
            "gpu_worker": {"min_workers": 0, "max_workers": 2, "resources": {"CPU": 1, "GPU": 1},
                           "node_config": {}},
        },
        "head_node_type": "head",
        "file_mounts": {}, "cluster_synced_files": [], "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def instances(moto: MotoServer, cluster: str, states: list[str] | None = None) -> list[dict]:
    f = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
    if states:
        f.append({"Name": "instance-state-name", "Values": states})
    out: list[dict] = []
    for page in moto.client().get_paginator("describe_instances").paginate(Filters=f):
        for r in page["Reservations"]:
            out.extend(r["Instances"])
    return out


def tags_of(inst: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


def live_workers(moto: MotoServer, cluster: str) -> list[dict]:
    return [i for i in instances(moto, cluster, ["pending", "running"])
            if tags_of(i).get("ray-node-type") == "worker"]


def state_of(moto: MotoServer, instance_id: str) -> str:
    (r,) = moto.client().describe_instances(InstanceIds=[instance_id])["Reservations"]
    return r["Instances"][0]["State"]["Name"]


DRIVER = textwrap.dedent("""
    import os, sys, time, ray
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)

    @ray.remote(num_gpus=1, num_cpus=1, max_retries=3)
    def work(mark, seconds):
        iid = os.environ.get("RAY_CLOUD_INSTANCE_ID", "?")
        with open(mark, "a") as fh:
            fh.write(iid + "\\n")
        time.sleep(seconds)
        return iid

    print("RESULT", ray.get(work.remote(sys.argv[2], float(sys.argv[3])), timeout=150), flush=True)
""")


def local_head(env: dict[str, str], port: int, yaml_path: Path, temp_dir: str):
    return head_process(env, port, temp_dir, (f"--autoscaling-config={yaml_path}",))


def monitor_log_tail(temp_dir: str, lines: int = 60) -> str:
    logs = sorted(Path(temp_dir).glob("session_*/logs/monitor.log"))
    if not logs:
        return "(no monitor.log)"
    return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:])


def test_autoscaler_launches_replaces_and_terminates_on_moto(moto: MotoServer, tmp_path: Path) -> None:
    t_start = time.monotonic()
    cluster = f"e2e-aws-{os.getpid()}"
    temp_dir = tempfile.mkdtemp(prefix="rnl-", dir="/tmp")   # short: raylet socket paths are limited
    player_dir = str(Path(temp_dir) / "player")
    port = free_port()
    cfg = cluster_config(moto, cluster, port, player_dir)
    boot = NodelessProvider.bootstrap_config(cfg)
    yaml_path = tmp_path / "cluster.yaml"
    yaml_path.write_text(yaml.safe_dump(boot))
    expected = plan_cluster(cfg).plans["gpu_worker"].chosen
    assert expected.capacity == "spot"

    provider = NodelessProvider(boot["provider"], cluster)
    marker = provider.backend.runner_marker        # the played machines' decorator (providers/local/played.py)
    player_nodes = provider.backend.player.nodes
    head_tags = {"ray-node-type": "head", "ray-user-node-type": "head", "ray-node-name": f"ray-{cluster}-head",
                 "ray-node-status": "up-to-date", "ray-launch-config": "e2e"}
    provider.create_node({}, head_tags, 1)
    (head_id,) = provider.non_terminated_nodes({"ray-node-type": "head"})

    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update(RAY_AUTH_MODE="disabled", RAY_enable_autoscaler_v2="1", RAY_CLOUD_INSTANCE_ID=head_id,
               RAY_NODE_TYPE_NAME="head", AUTOSCALER_UPDATE_INTERVAL_S="1", RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
               AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
               AWS_ENDPOINT_URL=moto.url)
    timings: dict[str, float] = {}
    driver: subprocess.Popen | None = None
    try:
        with local_head(env, port, yaml_path, temp_dir):
            timings["head_up"] = time.monotonic() - t_start
            mark = tmp_path / "ran_on.txt"
            drv_env = {k: v for k, v in env.items() if k not in ("RAY_CLOUD_INSTANCE_ID", "RAY_NODE_TYPE_NAME")}
            driver = subprocess.Popen([sys.executable, "-c", DRIVER, f"127.0.0.1:{port}", str(mark), "12"],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=drv_env,
                                      start_new_session=True)
            try:
                # 1. Scale up: the planner's spot choice, tagged with the cluster, runs the task.
                t0 = time.monotonic()
                first = wait_for(lambda: mark.exists() and mark.read_text().split(), 75,
                                 "the GPU task to run on a launched worker")[0]
                timings["demand_to_task_running"] = time.monotonic() - t0
                (inst,) = live_workers(moto, cluster)
                tags = tags_of(inst)
                assert inst["InstanceId"] == first
                assert inst["InstanceType"] == expected.instance_type.name == tags["nodeless-instance-type"]
                assert inst.get("InstanceLifecycle") == "spot" and tags["nodeless-capacity"] == "spot"
                assert tags["ray-user-node-type"] == "gpu_worker" and tags[TAG_CLUSTER] == cluster

                # 2. Preemption while the task still runs: the instance goes in moto, and its machine dies with it.
                moto.client().terminate_instances(InstanceIds=[first])
                player_nodes.stop([first], timeout=10)
                t0 = time.monotonic()
                second = wait_for(lambda: [i["InstanceId"] for i in live_workers(moto, cluster)
                                           if i["InstanceId"] != first], 60, "a replacement instance")[0]
                timings["preempt_to_replacement"] = time.monotonic() - t0
                out, _ = driver.communicate(timeout=90)
                assert driver.returncode == 0, out[-3000:]
                assert f"RESULT {second}" in out, out[-3000:]
                timings["task_done"] = time.monotonic() - t_start
            except BaseException:
                print(monitor_log_tail(temp_dir))
                raise

            # 3. Idle scale-down: the replacement is terminated in moto.
            t0 = time.monotonic()
            wait_for(lambda: state_of(moto, second) in ("shutting-down", "terminated"), 60,
                     "the idle worker to be terminated")
            timings["idle_to_terminated"] = time.monotonic() - t0
            assert live_workers(moto, cluster) == []
    finally:
        if driver is not None and driver.poll() is None:
            kill_group(driver)
        # What `ray down` guarantees: every instance of the cluster terminated, every player stopped.
        with contextlib.suppress(Exception):
            provider.terminate_nodes(provider.non_terminated_nodes({}))
        leftover = [i["InstanceId"] for i in instances(moto, cluster, ["pending", "running", "stopping", "stopped"])]
        if leftover:
            moto.client().terminate_instances(InstanceIds=leftover)
        ids = [r.id for r in player_nodes._all_records()]
        if ids:
            player_nodes.stop(ids, timeout=10)
        stop_marked_processes(marker)
        shutil.rmtree(temp_dir, ignore_errors=True)
    print(f"\ntimings (s): { {k: round(v, 1) for k, v in timings.items()} }, total {time.monotonic() - t_start:.1f}")
    assert leftover == [], f"instances left running: {leftover}"
    assert instances(moto, cluster, ["pending", "running", "stopping", "stopped"]) == []
    assert player_nodes.list() == [] and marked_pids(marker) == []
    for mid in (first, second):
        assert marked_pids(player_nodes._marker(mid)) == []
