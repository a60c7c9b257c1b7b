"""`ray up` / `ray down` for real with the AWS backend against moto, through `scripts/smoke.sh aws` (what a user
runs against a real account), pointed at moto by endpoint: `ray up` with the AWS bootstrap a local-player cluster
gets (Ray's security group, subnets of the allowed zones, default AMI check), a {GPU: 1} task through `ray exec` on
the EC2 instance the provider launched, the cost report, `ray down`, and the script's own proof that nothing is
left; then no instance, played node or head process of the cluster is left. Instances are EC2 instances in moto,
each played by a local Ray node (`registration: local-player`)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ray_nodeless.providers.local.players import RayNodePlayer
from ray_nodeless.providers.local.scoped_stop import stop_marked_processes
from ray_nodeless.testing.moto_server import MotoServer
from tests import REPO_ROOT
from tests.e2e.clusters import BIN, RAY_ENV, cluster_copy, on_moto, write_config

pytestmark = pytest.mark.e2e
SMOKE = REPO_ROOT / "scripts" / "smoke.sh"


def _config(moto: MotoServer, player_dir: Path) -> dict:
    cfg = on_moto(cluster_copy("local-cpu-head.yaml", "smoke"), moto, registration="local-player",
                  player_state_dir=str(player_dir))
    # What Ray's prepare_config would need anyway; the keys Ray reads after the head launches are left out on
    # purpose: bootstrap_config fills them from Ray's AWS defaults...
    for key in ("file_mounts", "initialization_commands", "worker_start_ray_commands"):
        cfg.pop(key)
    return cfg


def test_smoke_script_against_moto(moto: MotoServer, tmp_path: Path) -> None:
    cfg = _config(moto, tmp_path / "player")
    cluster = cfg["cluster_name"]
    path = write_config(cfg, tmp_path)
    env = dict(RAY_ENV, RAY=str(BIN / "ray"), RAY_NODELESS=str(BIN / "ray-nodeless"), PYTHON=sys.executable,
               SMOKE_UP_TIMEOUT="300", SMOKE_TASK_TIMEOUT="240", SMOKE_DOWN_TIMEOUT="180",
               SMOKE_RAY_ADDRESS=cfg["provider"]["gcs_address"], AWS_ACCESS_KEY_ID="testing",
               AWS_SECRET_ACCESS_KEY="testing")
    player = RayNodePlayer.from_provider(dict(cfg["provider"]), cluster)
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
        tags = {t["Key"]: t["Value"] for t in head["Tags"]}
        assert tags["nodeless-rule"] == "head-on-demand"
        assert {t["Key"]: t["Value"] for t in worker["Tags"]}["ray-node-type"] == "worker"
        # `ray down` left no played node and none of the head's processes (its command runner's marked ones)
        assert player.nodes.list() == []
        assert stop_marked_processes(player.runner_marker) == 0, "ray down left the head's processes behind"
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
