"""`scripts/smoke.sh aws` (what a user runs against a real account) against moto by endpoint: `ray up` with the
AWS bootstrap a local-player cluster gets (Ray's security group, subnets of the allowed zones, default AMI check), a {GPU: 1} task through `ray exec`, the cost
report, `ray down`, and the script's own proof that nothing is left. Instances are EC2 instances in moto, each played
by a local Ray node (`registration: local-player`, as in test_aws_ray_up.py)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from ray_nodeless.providers.local.scoped_stop import stop_marked_processes
from ray_nodeless.registrations.local_player import LocalPlayer
from ray_nodeless.testing.moto_server import MotoServer
from tests import REPO_ROOT

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).parent
SMOKE = REPO_ROOT / "scripts" / "smoke.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(moto: MotoServer, cluster: str, port: int, player_dir: Path) -> dict:
    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "local-cpu-head.yaml").read_text())
    cfg["cluster_name"] = cluster
    cfg["idle_timeout_minutes"] = 0.2
    p = cfg["provider"]
    p.pop("simulate_cloud")
    p.update(cloud="aws", region="us-east-1", endpoint_url=moto.url, image_id=moto.ami(), registration="local-player",
             aws_credentials={"aws_access_key_id": "testing", "aws_secret_access_key": "testing"},
             gcs_address=f"127.0.0.1:{port}", player_state_dir=str(player_dir))
    cfg["head_start_ray_commands"] = [
        f"RAY_AUTH_MODE=disabled AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing "
        f"AUTOSCALER_UPDATE_INTERVAL_S=1 ray start --head --port={port} --node-ip-address=127.0.0.1 "
        f"--include-dashboard=false --object-store-memory=100000000 --autoscaling-config=~/ray_bootstrap_config.yaml"]
    # What Ray's prepare_config would need anyway; the keys Ray reads after the head launches are left out on
    # purpose: bootstrap_config fills them from Ray's AWS defaults...
    for key in ("file_mounts", "initialization_commands", "worker_start_ray_commands"):
        cfg.pop(key)
    return cfg


def test_smoke_script_against_moto(moto: MotoServer, tmp_path: Path) -> None:
    port = _free_port()
    cluster = f"smoke-{uuid.uuid4().hex[:6]}"
    cfg = _config(moto, cluster, port, tmp_path / "player")
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PATH=f"{BIN}:{os.environ.get('PATH', '')}",
               RAY=str(BIN / "ray"), RAY_NODELESS=str(BIN / "ray-nodeless"), PYTHON=sys.executable,
               SMOKE_UP_TIMEOUT="300", SMOKE_TASK_TIMEOUT="240", SMOKE_DOWN_TIMEOUT="180",
               SMOKE_RAY_ADDRESS=f"127.0.0.1:{port}", AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    player = LocalPlayer(dict(cfg["provider"]), cluster)
    ec2 = moto.client()

    def instances() -> list[dict]:
        r = ec2.describe_instances(Filters=[{"Name": "tag:ray-cluster-name", "Values": [cluster]}])
        return [i for res in r["Reservations"] for i in res["Instances"]]

    try:
        run = subprocess.run(["bash", str(SMOKE), "aws", str(path)], env=env, capture_output=True, text=True,
                             timeout=900)
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-6000:]
        assert "[smoke " in run.stdout and "PASSED" in run.stdout
        assert "nothing left" in run.stdout and "leftovers: 0 instance(s)" in run.stdout
        task = next(line for line in run.stdout.splitlines() if "GPU task ran on" in line)
        seen = instances()
        assert len(seen) == 2 and {i["State"]["Name"] for i in seen} <= {"terminated", "shutting-down"}
        head = next(i for i in seen if any(t["Key"] == "ray-node-type" and t["Value"] == "head" for t in i["Tags"]))
        worker = next(i for i in seen if i is not head)
        assert worker["InstanceId"] in task and worker["InstanceType"] in task
        # the bootstrap's keys reached RunInstances: Ray's security group, a default-VPC subnet
        for inst in seen:
            assert [g["GroupName"] for g in inst["SecurityGroups"]] == [f"ray-autoscaler-{cluster}"]
            assert inst["SubnetId"]
        # local-player: no instance role (Ray runs on this host with its credentials); the vm registration's IAM
        # step is tested in tests/providers/aws/test_aws_bootstrap.py
        assert "IamInstanceProfile" not in head
        assert player.nodes.list() == []
    finally:
        ids = [i["InstanceId"] for i in instances() if i["State"]["Name"] not in ("terminated", "shutting-down")]
        if ids:
            ec2.terminate_instances(InstanceIds=ids)
        left = [r.id for r in player.nodes.list()]
        if left:
            player.nodes.stop(left)
        stop_marked_processes(player.runner_marker, force=True)


def test_smoke_script_fails_clearly_on_a_config_plan_refuses(tmp_path: Path) -> None:
    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "aws-gpu-head.yaml").read_text())
    cfg["provider"]["rules"][0]["capacity"] = ["preemptible"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}", PYTHON=sys.executable)
    run = subprocess.run(["bash", str(SMOKE), "aws", str(path)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "ray-nodeless plan refused the config" in run.stdout and "nothing was launched" in run.stdout
    assert "capacity" in run.stdout + run.stderr
    run = subprocess.run(["bash", str(SMOKE), "gcp", str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "provider.cloud 'aws', not 'gcp'" in run.stdout
