"""Scaffolding the end-to-end tests share: a private copy of one of our ready cluster YAMLs (own cluster name, GCS
port and head start command, so tests never meet each other's Ray or Ray's bootstrap cache), the AWS-on-moto
variant and the `registration: kubernetes` one against a test's control plane, `ray up`/`ray down` and the
environment they run in, a private Ray head with worker nodes of given instance ids, and the processes a local
"machine" left behind."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ray_nodeless.interruptions.drain import RayDrainer
from ray_nodeless.providers.local.backend import LocalBackend
from ray_nodeless.providers.local.processes import LocalNodeProcesses
from ray_nodeless.providers.local.records import NodeRecord
from ray_nodeless.providers.local.scoped_stop import stop_marked_processes
from ray_nodeless.testing.moto_server import MotoServer
from ray_nodeless.testing.ray_processes import free_port, ray_head, stop_everything, wait_for
from tests import REPO_ROOT

BIN = Path(sys.executable).parent
CONFIGS = REPO_ROOT / "cluster-configs"
# Where `ray up`/`ray down` run: the venv's `ray` first on PATH, token auth off (Ray 2.60 turns it on when
# ~/.ray/auth_token exists on the machine), and no RAY_ADDRESS of the developer's own cluster.
RAY_ENV = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
    "RAY_AUTH_MODE": "disabled", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
MOTO_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def head_start(port: int, env: str = "") -> list[str]:
    """head_start_ray_commands: a head on 127.0.0.1:`port` without dashboard, a small object store, and the
    autoscaler polling every second (tests wait on it). `env` is prepended (`NAME=value ...`)."""
    return [f"RAY_AUTH_MODE=disabled {env + ' ' if env else ''}AUTOSCALER_UPDATE_INTERVAL_S=1 ray start --head "
            f"--port={port} --node-ip-address=127.0.0.1 --include-dashboard=false --object-store-memory=100000000 "
            f"--autoscaling-config=~/ray_bootstrap_config.yaml"]


def cluster_copy(config: str, prefix: str, *, head_env: str = "", **provider: Any) -> dict:
    """cluster-configs/`config` with a unique cluster name `<prefix>-xxxxxx`, its own GCS port, idle removal after
    12 s, `provider` keys merged into the provider block and a head start command for that port."""
    cfg = yaml.safe_load((CONFIGS / config).read_text())
    port = free_port()
    cfg["cluster_name"] = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cfg["idle_timeout_minutes"] = 0.2
    cfg["provider"].update(gcs_address=f"127.0.0.1:{port}", **provider)
    cfg["head_start_ray_commands"] = head_start(port, head_env)
    return cfg


def on_moto(cfg: dict, moto: MotoServer, *, head_env: str = "", **provider: Any) -> dict:
    """Point a local config's provider at AWS on moto (real boto3 and our AWS backend; Ray nodes played locally);
    the head reaches moto with the fake credentials (`head_env` is added to its environment)."""
    p = cfg["provider"]
    p.pop("simulate_cloud", None)
    p.update(cloud="aws", region="us-east-1", endpoint_url=moto.url, image_id=moto.ami(),
             aws_credentials=dict(MOTO_CREDENTIALS), **provider)
    port = int(p["gcs_address"].rsplit(":", 1)[1])
    cfg["head_start_ray_commands"] = head_start(
        port, " ".join(filter(None, ["AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing", head_env])))
    return cfg


def k8s_cluster_copy(prefix: str, plane: Any, join: dict, *, moto: MotoServer | None = None,
                     **provider: Any) -> dict:
    """cluster_copy of local-k8s-cpu-head.yaml (`registration: kubernetes`) against the test's control plane
    `plane`: the provider acts as its ServiceAccount (plane.sa_kubeconfig), the played or real kubelets register
    their Nodes as its admin (the head's RAY_NODELESS_PLAYER_KUBECONFIG), `join` is the join block, a pod's grace is
    5 s; with `moto`, the machines are EC2 instances on it (on_moto)."""
    player = f"RAY_NODELESS_PLAYER_KUBECONFIG={plane.admin_kubeconfig}"
    cfg = cluster_copy("local-k8s-cpu-head.yaml", prefix, head_env=player, **provider)
    if moto is not None:
        cfg = on_moto(cfg, moto, head_env=player)
    cfg["provider"]["kubernetes"].update(kubeconfig=str(plane.sa_kubeconfig), pod_grace_s=5, join=join)
    return cfg


def ray_up(path: Path, env: dict[str, str] = RAY_ENV, timeout: float = 300) -> None:
    """`ray up -y path` with the venv's ray; fails the test with the end of its output unless it exits 0."""
    up = subprocess.run([str(BIN / "ray"), "up", "-y", str(path)], env=env, capture_output=True, text=True,
                        timeout=timeout)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]


def ray_down(path: Path, env: dict[str, str] = RAY_ENV, timeout: float = 180) -> None:
    """`ray down -y path`; fails the test with the end of its stderr unless it exits 0."""
    down = subprocess.run([str(BIN / "ray"), "down", "-y", str(path)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert down.returncode == 0, down.stderr[-2000:]


def write_config(cfg: dict, tmp_path: Path, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def processes_of(machine_id: str, name: str | None = None) -> list[int]:
    """PIDs whose environment says RAY_CLOUD_INSTANCE_ID=<machine_id> (optionally: whose command is `name`)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = open(f"/proc/{pid}/environ", "rb").read()
            if f"RAY_CLOUD_INSTANCE_ID={machine_id}\0".encode() not in env + b"\0":
                continue
            if name is not None and Path(open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0].decode()
                                         ).name != name:
                continue
        except OSError:
            continue
        out.append(int(pid))
    return out


def cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def end_local_cluster(cfg: dict) -> None:
    """A test's finally: end whatever a local-backend cluster still has (machines, then the head's processes)."""
    backend = LocalBackend.from_provider(dict(cfg["provider"]), cfg["cluster_name"])
    try:
        ids = [m.id for m in backend.list_machines()]
        if ids:
            backend.terminate(ids)
    finally:
        stop_marked_processes(backend.runner_marker, force=True)


@dataclass
class RayNodes:
    gcs: str                        # the private head's GCS address
    nodes: LocalNodeProcesses
    workers: list[NodeRecord]       # in the order asked for
    drainer: RayDrainer


@contextmanager
def ray_head_with_workers(nodes_dir: Path, *workers: tuple[str, str, dict[str, float]],
                          timeout: float = 60) -> Iterator[RayNodes]:
    """A private Ray head (ray_processes.ray_head) and one `ray start --address` worker per (instance id, node
    type, resources), each carrying its instance id as RAY_CLOUD_INSTANCE_ID; yields once every worker is in the
    GCS node table. RAY_AUTH_MODE=disabled in this process meanwhile (the workers' `ray start` inherits it; see
    ray_head); everything started is stopped after."""
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        with ray_head() as gcs:
            nodes = LocalNodeProcesses(nodes_dir, gcs, prewarm=True)
            try:
                records = [nodes.start(iid, node_type, resources, {}) for iid, node_type, resources in workers]
                drainer = RayDrainer(gcs)
                wait_for(lambda: all(drainer.find(instance_id=iid) for iid, _t, _r in workers), timeout,
                         "the workers in the GCS node table")
                yield RayNodes(gcs, nodes, records, drainer)
            finally:
                stop_everything(nodes)
    finally:
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


def ray_monitor(gcs_port: int) -> tuple[Path, str]:
    """The session logs dir of this cluster's Ray monitor (its --logs-dir) and its script, from its command line."""
    for pid in Path("/proc").iterdir():
        if not pid.name.isdigit():
            continue
        try:
            argv = (pid / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a.endswith("monitor.py") for a in argv) and any(a.endswith(f":{gcs_port}") for a in argv):
            script = next(a for a in argv if a.endswith("monitor.py"))
            for a in argv:
                if a.startswith("--logs-dir="):
                    return Path(a.split("=", 1)[1]), script
    raise AssertionError(f"no Ray monitor for GCS port {gcs_port}")
