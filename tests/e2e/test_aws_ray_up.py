"""`ray up` / `ray down` for real with the AWS backend against moto: the head and the workers are EC2 instances in
moto, each played by a local Ray node (registration: local-player), so Ray's own CLI drives the AWS code path.
`ray down` must leave zero instances with the cluster tag and no process behind.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

from ray_nodeless.registrations.local_player import LocalPlayer
from ray_nodeless.providers.local.scoped_stop import stop_marked_processes

from ray_nodeless.testing.moto_server import MotoServer
from tests import REPO_ROOT

pytestmark = pytest.mark.e2e
ROOT = REPO_ROOT
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_up_gpu_task_and_ray_down_leave_nothing(moto: MotoServer, tmp_path: Path) -> None:
    port = _free_port()
    cluster = f"up-{uuid.uuid4().hex[:6]}"
    cfg = yaml.safe_load((ROOT / "cluster-configs" / "local-cpu-head.yaml").read_text())
    cfg["cluster_name"] = cluster
    cfg["idle_timeout_minutes"] = 0.2
    p = cfg["provider"]
    p.pop("simulate_cloud")
    p.update(cloud="aws", region="us-east-1", endpoint_url=moto.url, image_id=moto.ami(), registration="local-player",
             aws_credentials={"aws_access_key_id": "testing", "aws_secret_access_key": "testing"},
             gcs_address=f"127.0.0.1:{port}", player_state_dir=str(tmp_path / "player"))
    cfg["head_start_ray_commands"] = [
        f"RAY_AUTH_MODE=disabled AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing "
        f"AUTOSCALER_UPDATE_INTERVAL_S=1 ray start --head --port={port} --node-ip-address=127.0.0.1 "
        f"--include-dashboard=false --object-store-memory=100000000 --autoscaling-config=~/ray_bootstrap_config.yaml"]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    player = LocalPlayer(dict(p), cluster)
    ec2 = moto.client()

    def instances() -> dict[str, str]:
        r = ec2.describe_instances(Filters=[{"Name": "tag:ray-cluster-name", "Values": [cluster]}])
        return {i["InstanceId"]: i["State"]["Name"] for res in r["Reservations"] for i in res["Instances"]}

    try:
        up = subprocess.run([str(BIN / "ray"), "up", "-y", str(path)], env=env, capture_output=True, text=True,
                            timeout=240)
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        [head] = instances()
        tags = {t["Key"]: t["Value"] for t in ec2.describe_instances(InstanceIds=[head])["Reservations"][0]
                ["Instances"][0]["Tags"]}
        assert tags["ray-node-type"] == "head" and tags["nodeless-rule"] == "head-on-demand"

        driver = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import os, ray
            ray.init(address="127.0.0.1:{port}", logging_level="ERROR", log_to_driver=False)
            @ray.remote(num_gpus=1)
            def f():
                return os.environ["RAY_CLOUD_INSTANCE_ID"]
            print("RESULT", ray.get(f.remote()))
        """)], env=env, capture_output=True, text=True, timeout=240)
        assert driver.returncode == 0, driver.stderr[-2000:]
        worker = next(line.split()[1] for line in driver.stdout.splitlines() if line.startswith("RESULT "))
        assert instances()[worker] == "running"     # the task ran on the EC2 instance the provider launched

        down = subprocess.run([str(BIN / "ray"), "down", "-y", str(path)], env=env, capture_output=True, text=True,
                              timeout=180)
        assert down.returncode == 0, down.stderr[-2000:]
        assert set(instances().values()) <= {"terminated", "shutting-down"}
        assert len(instances()) == 2
        assert player.nodes.list() == []
        assert stop_marked_processes(player.runner_marker) == 0, "ray down left the head's processes behind"
    finally:
        ids = [i for i, s in instances().items() if s not in ("terminated", "shutting-down")]
        if ids:
            ec2.terminate_instances(InstanceIds=ids)
        left = [r.id for r in player.nodes.list()]
        if left:
            player.nodes.stop(left)
        stop_marked_processes(player.runner_marker, force=True)
