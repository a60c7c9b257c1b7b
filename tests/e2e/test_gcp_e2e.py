"""End to end: a real Ray head whose autoscaler v2 monitor runs NodelessProvider with the GCP backend against
ray_nodeless/testing/fake_gce (a real HTTP server in this pytest process), with `registration: local-player` so every
instance the fake "boots" is played by a local `ray start` node carrying the instance name as RAY_CLOUD_INSTANCE_ID.

Safety (see test_local_processes): private ports and --temp-dir, the head in its own session and process group,
players stopped through their records/markers; never a global `ray stop`.
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
from typing import Iterator

import pytest
import yaml

from ray_nodeless.testing.fake_gce import DEFAULT_MACHINE_TYPES, FakeGce
from ray_nodeless.operate.config import check_cluster
from ray_nodeless.providers.base import TAG_CLUSTER
from ray_nodeless.providers.gcp.labels import cluster_label_value
from ray_nodeless.providers.local.players import RayNodePlayer
from ray_nodeless.providers.local.ray_start import READY_MARKER, ray_executable
from ray_nodeless.providers.local.scoped_stop import marked_pids, stop_marked_processes

from ray_nodeless.testing.ray_processes import free_port, gcs_nodes, kill_group, stop_everything, wait_for

PROJECT = "p"
CLUSTER = "nodeless-gcp-e2e"
# The embedded catalog's cheapest picks (t2d-standard-1 head, n1-standard-1+T4 worker) are not in the fake's
# default machine-type list; add the small shapes so inserts validate.
MACHINE_TYPES = dict(DEFAULT_MACHINE_TYPES)
MACHINE_TYPES.update({
    "n1-standard-1": (1, 3840, [], False, "X86_64"),
    "n1-highcpu-2": (2, 1843, [], False, "X86_64"),
    "t2d-standard-1": (1, 4096, [], False, "X86_64"),
    "g2-standard-4": (4, 16384, [("nvidia-l4", 1)], False, "X86_64"),
})

DRIVER = textwrap.dedent("""
    import sys, time, ray
    ray.init(address=sys.argv[1], log_to_driver=False)
    @ray.remote(num_gpus=1, num_cpus=1)
    def work():
        time.sleep(3)
        return ray.get_runtime_context().get_node_id()
    print("NODE", ray.get(work.remote(), timeout=150), flush=True)
""")


def cluster_config(fake_url: str, gcs_port: int, player_dir: Path) -> dict:
    return {
        "cluster_name": CLUSTER,
        "max_workers": 2,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 0.2,
        "provider": {
            "type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "gcp", "region": "us-central1",
            "project_id": PROJECT, "api_endpoint": fake_url, "credentials": "anonymous",
            "registration": "local-player", "player_state_dir": str(player_dir),
            "gcs_address": f"127.0.0.1:{gcs_port}",
            "disable_node_updaters": True, "disable_launch_config_check": True,
            "exclude": {"gpus": ["K80", "M60"]},
            "rules": [
                {"name": "head-on-demand", "match": {"node_kind": "head"}, "capacity": ["on-demand"]},
                {"name": "gpu-spot-first", "match": {"GPU": ">=1"}, "capacity": ["spot", "on-demand"]},
                {"name": "cpu-on-demand", "match": {}, "capacity": ["on-demand"]},
            ],
        },
        "auth": {"ssh_user": "root"},
        "available_node_types": {
            "head": {"resources": {"CPU": 0}, "node_config": {}},
            "gpu_worker": {"min_workers": 0, "max_workers": 2, "resources": {"CPU": 1, "GPU": 1}, "node_config": {}},
        },
        "head_node_type": "head",
        "file_mounts": {}, "cluster_synced_files": [], "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def ours(fake: FakeGce) -> dict[str, dict]:
    label = cluster_label_value(CLUSTER)
    with fake.lock:
        return {n: dict(i) for n, i in fake.instances.items() if (i.get("labels") or {}).get(TAG_CLUSTER) == label}


def workers(fake: FakeGce) -> dict[str, dict]:
    return {n: i for n, i in ours(fake).items() if (i.get("labels") or {}).get("ray-node-type") != "head"}


@contextlib.contextmanager
def fake_gce() -> Iterator[FakeGce]:
    with FakeGce(project=PROJECT, machine_types=MACHINE_TYPES) as f:
        yield f


@pytest.mark.e2e
def test_gpu_task_launches_cheapest_spot_t4_falls_back_a_zone_and_scales_down() -> None:
    from ray_nodeless.ray_adapter.provider import NodelessProvider

    t_start = time.monotonic()
    temp_dir = Path(tempfile.mkdtemp(prefix="rnl-g", dir="/tmp"))   # short: raylet socket path limit
    player_dir = temp_dir / "player"
    gcs_port = free_port()
    head_marker = f"rnl-gcp-e2e-head@{temp_dir}"
    head_proc: subprocess.Popen | None = None
    driver: subprocess.Popen | None = None
    timings: dict[str, float] = {}
    with fake_gce() as fake:
        cfg = cluster_config(fake.url, gcs_port, player_dir)
        boot = NodelessProvider.bootstrap_config(cfg)
        plan = check_cluster(cfg).plans["gpu_worker"]   # priced by the gcp catalog (the loader asks the registry)
        chosen = plan.chosen
        assert chosen.capacity == "spot" and chosen.instance_type.gpu_count == 1
        provider = NodelessProvider(boot["provider"], CLUSTER)
        try:
            # ---- the head, through the provider (what `ray up` does), then its Ray locally
            provider.create_node({}, {"ray-node-type": "head", "ray-user-node-type": "head",
                                      "ray-node-name": f"ray-{CLUSTER}-head", "ray-node-status": "up-to-date",
                                      "ray-launch-config": "x"}, 1)
            (head_id,) = provider.non_terminated_nodes({"ray-node-type": "head"})
            assert head_id in ours(fake)
            cfg_path = temp_dir / "cluster.yaml"
            cfg_path.write_text(yaml.safe_dump(boot))
            # The next zone after the cheapest one is out of T4 spot capacity (once).
            exhausted = fake.fail_insert(zone=chosen.zone, machine_type=chosen.instance_type.machine_type,
                             code="ZONE_RESOURCE_POOL_EXHAUSTED", times=1)
            env = dict(os.environ)
            env.pop("RAY_ADDRESS", None)
            env.update(RAY_AUTH_MODE="disabled", RAY_enable_autoscaler_v2="1", RAY_CLOUD_INSTANCE_ID=head_id,
                       RAY_NODE_TYPE_NAME="head", AUTOSCALER_UPDATE_INTERVAL_S="1",
                       RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0", NODELESS_LOCAL_NODE=head_marker)
            head_log = temp_dir / "head.log"
            t0 = time.monotonic()
            with open(head_log, "wb") as log:
                head_proc = subprocess.Popen(
                    [ray_executable(), "start", "--head", "--block", "--disable-usage-stats", f"--port={gcs_port}",
                     "--node-ip-address=127.0.0.1", "--num-cpus=0", "--include-dashboard=false",
                     f"--dashboard-port={free_port()}", f"--ray-client-server-port={free_port()}",
                     f"--temp-dir={temp_dir}", "--object-store-memory=83886080",
                     f"--autoscaling-config={cfg_path}"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
            wait_for(lambda: READY_MARKER in head_log.read_text(errors="replace") or head_proc.poll() is not None,
                     90, "head started")
            assert head_proc.poll() is None, head_log.read_text(errors="replace")[-3000:]
            timings["head_start"] = time.monotonic() - t0

            # ---- a GPU task: the monitor launches a T4 spot worker in the next zone; the player runs it
            t0 = time.monotonic()
            denv = dict(env)
            denv.pop("RAY_CLOUD_INSTANCE_ID")
            denv.pop("NODELESS_LOCAL_NODE")
            driver = subprocess.Popen([sys.executable, "-c", DRIVER, f"127.0.0.1:{gcs_port}"], env=denv,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                out, _ = driver.communicate(timeout=160)
            except subprocess.TimeoutExpired:
                kill_group(driver)
                out, _ = driver.communicate()
                pytest.fail("driver timed out:\n" + out.decode(errors="replace")[-3000:]
                            + "\n--- monitor:\n" + _monitor_tail(temp_dir))
            text = out.decode(errors="replace")
            assert driver.returncode == 0 and "NODE " in text, (
                text[-3000:] + "\n--- monitor:\n" + _monitor_tail(temp_dir))
            timings["task_done"] = time.monotonic() - t0
            node_id = text.split("NODE ", 1)[1].split()[0]

            ws = workers(fake)
            assert 1 <= len(ws) <= 2, ws
            by_node = {n.node_id.hex(): n for n in gcs_nodes(f"127.0.0.1:{gcs_port}")}
            ran_on = by_node[node_id].instance_id
            assert ran_on in ws, (ran_on, list(ws))
            inst = ws[ran_on]
            zone = inst["zone"].rsplit("/", 1)[-1]
            assert zone != chosen.zone, zone   # fell back from the exhausted zone ...
            assert zone == next(o.zone for o in plan.top(len(plan)) if o.zone != chosen.zone), zone   # ... to the next
            assert inst["machineType"].rsplit("/", 1)[-1] == chosen.instance_type.machine_type
            accel = inst.get("guestAccelerators") or []
            if chosen.instance_type.attached_gpu:
                assert [(a["acceleratorType"].rsplit("/", 1)[-1], a["acceleratorCount"]) for a in accel] == \
                    [(chosen.instance_type.attached_gpu, 1)]
            assert inst["scheduling"]["provisioningModel"] == "SPOT"
            print(f"\nworker {ran_on}: {inst['machineType'].rsplit('/', 1)[-1]} {accel} in {zone} (spot); "
                  f"{len(ws)} worker instance(s)")
            assert exhausted.times == 0, "the exhausted zone was never tried"

            # The provider ran inside the head's v2 monitor and logged the fallback there.
            monitor_log = "\n".join(p.read_text(errors="replace") for p in temp_dir.glob("session_*/logs/monitor.log"))
            assert "autoscaler/v2/monitor.py" in _proc_cmdlines(head_proc.pid)
            assert "REQUESTED->ALLOCATED" in monitor_log and "ZONE_RESOURCE_POOL_EXHAUSTED" in monitor_log
            print("\nmonitor.log lines on the launch:\n" + "\n".join(
                ln for ln in monitor_log.splitlines() if "ZONE_RESOURCE" in ln or "provider.py" in ln)[-3000:])

            # ---- idle: the worker is drained and deleted from the fake
            t0 = time.monotonic()
            wait_for(lambda: not workers(fake), 75, "idle worker deleted from the fake GCE")
            timings["scale_down"] = time.monotonic() - t0
            player = RayNodePlayer.from_provider(boot["provider"], CLUSTER)
            wait_for(lambda: not player.nodes.list(), 30, "player stopped")
        finally:
            # ---- teardown: every instance, every player, the head's process group
            if driver is not None and driver.poll() is None:
                kill_group(driver)
            if head_proc is not None:
                kill_group(head_proc)   # the monitor first, so nothing relaunches behind our back
            stop_marked_processes(head_marker, timeout=5)
            with contextlib.suppress(Exception):
                provider.terminate_nodes(provider.non_terminated_nodes({}))
            player = RayNodePlayer.from_provider(boot["provider"], CLUSTER)
            player_ids = [r.id for r in player.nodes._all_records()]
            stop_everything(player.nodes)
            for mid in player_ids:
                stop_marked_processes(player.nodes._marker(mid), timeout=5)
            shutil.rmtree(temp_dir, ignore_errors=True)
            print(f"\ntimings: { {k: round(v, 1) for k, v in timings.items()} }, "
                  f"total {time.monotonic() - t_start:.1f} s")
        assert ours(fake) == {}
        assert not marked_pids(head_marker)
        assert all(not marked_pids(player.nodes._marker(mid)) for mid in player_ids)


def _monitor_tail(temp_dir: Path) -> str:
    out = []
    for p in sorted(temp_dir.glob("session_*/logs/monitor*")):
        if p.is_file() and p.suffix in (".log", ".err", ".out"):
            out.append(f"== {p.name}\n" + p.read_text(errors="replace")[-2500:])
    return "\n".join(out)


def _proc_cmdlines(pgid: int) -> str:
    """Command lines of the processes in process group `pgid` (the head's)."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry.name)) == pgid:
                    out.append(Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return "\n".join(out)
