"""LocalBackend (fault injection, contract), LocalCommandRunner, and LocalPlayer.

Real Ray only where it matters (one worker launch, one player); the head comes from test_local_processes'
`ray_head` (our own process group, never `ray stop`). Every node started is stopped by a finalizer.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import click
import pytest
from ray.autoscaler._private.subprocess_output_util import ProcessRunnerError

from ray_nodeless.core.catalog import InstanceType, Offering
from ray_nodeless.errors import CapacityError, ForeignMachineError
from ray_nodeless.providers.base import MACHINE_RUNNING, TAG_CLUSTER, LaunchSpec, Machine
from ray_nodeless.providers.local.backend import LocalBackend
from ray_nodeless.providers.local.pids import proc_info
from ray_nodeless.providers.local.runner import LocalCommandRunner
from ray_nodeless.providers.local.scoped_stop import marked_pids, stop_marked_processes
from ray_nodeless.registrations.local_player import LocalPlayer
from ray_nodeless.testing.ray_processes import (
    alive_nodes_by_instance, free_port, gcs_nodes, ray_head, stop_everything, wait_for,
)

CLUSTER = "t-local"


def offering(name: str = "m5.large", zone: str = "local-a", capacity: str = "on-demand") -> Offering:
    it = InstanceType(cloud="aws", name=name, family=name.split(".")[0], vcpus=2, memory_gib=8)
    return Offering(instance_type=it, region="local", zone=zone, capacity=capacity, hourly_price=0.1)


def spec(*, is_head: bool = False, count: int = 1, token: str = "tok", off: Offering | None = None,
         node_type: str = "cpu") -> LaunchSpec:
    kind = "head" if is_head else "worker"
    return LaunchSpec(
        cluster_name=CLUSTER, node_type=node_type, offering=off or offering(), count=count,
        tags={TAG_CLUSTER: CLUSTER, "ray-node-type": kind, "ray-user-node-type": node_type,
              "ray-node-name": f"ray-{CLUSTER}-{kind}"},
        node_config={}, request_token=token, resources={"CPU": 1, "memory": 2**30}, labels={"shape": "small"},
        is_head=is_head)


@pytest.fixture(scope="module")
def gcs_address() -> Iterator[str]:
    with ray_head() as address:
        yield address


@pytest.fixture
def backend_config(tmp_path: Path) -> dict:
    return {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "local",
            "state_dir": str(tmp_path / "state"), "gcs_address": "127.0.0.1:1"}


@contextlib.contextmanager
def _backend(config: dict) -> Iterator[LocalBackend]:
    be = LocalBackend.from_provider(config, CLUSTER)
    try:
        yield be
    finally:
        stop_everything(be.nodes)


# ------------------------------------------------------------------ LocalBackend without Ray processes

def test_head_is_a_record_without_process_and_launch_is_idempotent(backend_config: dict) -> None:
    with _backend(backend_config) as be:
        ids = be.launch(spec(is_head=True, token="t1"))
        assert len(ids) == 1 and ids[0].startswith("local-") and len(ids[0]) == len("local-") + 8
        assert be.launch(spec(is_head=True, token="t1")) == ids   # retried call: no second machine
        (m,) = be.list_machines()
        assert m.id == ids[0] and m.state == MACHINE_RUNNING and m.internal_ip == m.external_ip == be.head_ip
        assert m.tags["ray-node-type"] == "head" and m.tags[TAG_CLUSTER] == CLUSTER and m.launched_at > 0
        be.set_tags(m.id, {"ray-node-status": "up-to-date"})
        # Another process on the same state dir (the head's monitor vs the `ray up` CLI) sees the same machine.
        other = LocalBackend.from_provider(backend_config, CLUSTER)
        assert [x.tags["ray-node-status"] for x in other.list_machines()] == ["up-to-date"]
        # Another cluster sharing the state dir neither sees nor terminates it.
        foreign = LocalBackend.from_provider(backend_config, "someone-else")
        assert foreign.list_machines() == []
        with pytest.raises(ForeignMachineError):         # refused, by name
            foreign.terminate(ids)
        be.terminate(ids + ["local-00000000"])   # unknown ids are ignored
        assert be.list_machines() == [] and other.list_machines() == []


def test_faults_file_is_reread_and_spent(backend_config: dict) -> None:
    with _backend(backend_config) as be:
        faults = be.state_dir / "faults.json"
        faults.write_text(json.dumps([
            {"zone": "local-b", "code": "ZONE_RESOURCE_POOL_EXHAUSTED", "times": 1},
            {"instance_type": "p3.2xlarge", "capacity": "spot"},   # no `times`: fails every time
        ]))
        with pytest.raises(CapacityError) as ei:
            be.launch(spec(is_head=True, token="a", off=offering(zone="local-b")))
        assert ei.value.category == "ZONE_RESOURCE_POOL_EXHAUSTED"
        assert json.loads(faults.read_text())[0]["times"] == 0
        assert be.list_machines() == []
        assert len(be.launch(spec(is_head=True, token="b", off=offering(zone="local-b")))) == 1
        for _ in range(2):
            with pytest.raises(CapacityError) as ei:
                be.launch(spec(is_head=True, token="c", off=offering("p3.2xlarge", capacity="spot")))
            assert ei.value.category == "InsufficientInstanceCapacity"
        assert len(be.launch(spec(is_head=True, token="d", off=offering("p3.2xlarge")))) == 1  # on-demand: ok


def test_config_faults_are_spent_in_this_process_and_bad_file_entries_skipped(backend_config: dict) -> None:
    backend_config["local_faults"] = [{"node_type": "cpu", "code": "VcpuLimitExceeded", "message": "quota",
                                       "times": 2}]
    with _backend(backend_config) as be:
        for _ in range(2):
            with pytest.raises(CapacityError, match="quota") as ei:
                be.launch(spec(is_head=True, token="a"))
            assert ei.value.category == "VcpuLimitExceeded"
        # A misspelled match field must not turn into a wildcard that fails every launch: the entry is skipped.
        (be.state_dir / "faults.json").write_text(json.dumps([{"zon": "local-a"}, "junk"]))
        assert len(be.launch(spec(is_head=True, token="a"))) == 1
        assert len(be.launch(spec(is_head=True, token="b", node_type="gpu"))) == 1


# ------------------------------------------------------------------ LocalBackend with a real worker

@pytest.mark.e2e
def test_config_fault_fires_once_then_a_real_worker_launches(backend_config: dict, gcs_address: str) -> None:
    backend_config.update(gcs_address=gcs_address,
                          local_faults=[{"instance_type": "m5.large", "code": "InsufficientInstanceCapacity",
                                         "times": 1}])
    with _backend(backend_config) as be:
        with pytest.raises(CapacityError) as ei:
            be.launch(spec(token="w1"))
        assert ei.value.category == "InsufficientInstanceCapacity"
        t0 = time.monotonic()
        (mid,) = be.launch(spec(token="w1"))
        print(f"\nworker launch took {time.monotonic() - t0:.1f} s")
        (m,) = be.list_machines()
        assert m.id == mid and m.state == MACHINE_RUNNING and m.internal_ip.startswith("127.0.0.")
        assert m.tags["ray-user-node-type"] == "cpu"
        node = wait_for(lambda: alive_nodes_by_instance(gcs_address).get(mid), 30, "worker registered")
        assert node.node_manager_address == m.internal_ip and dict(node.resources_total)["CPU"] == 1
        assert node.instance_type_name == "m5.large" and dict(node.labels)["shape"] == "small"
        be.terminate([mid])
        assert be.list_machines() == []
        wait_for(lambda: mid not in alive_nodes_by_instance(gcs_address), 20, "worker gone from GCS")


# ------------------------------------------------------------------ LocalPlayer

@pytest.mark.e2e
def test_player_plays_cloud_machines(tmp_path: Path, gcs_address: str) -> None:
    player = LocalPlayer.from_provider({"region": "us-west-2", "gcs_address": gcs_address,
                                        "player_state_dir": str(tmp_path / "player")}, CLUSTER)
    try:
        s = spec(token="p1", node_type="gpu")
        s.resources = {"CPU": 1, "GPU": 1}
        player.after_launch(s, ["i-0abc000000000001"])
        player.after_launch(spec(is_head=True), ["i-0abc00000000head"])   # heads get no player
        cloud = Machine(id="i-0abc000000000001", tags=dict(s.tags), internal_ip="10.0.0.5", external_ip="54.1.2.3")
        played = player.describe(cloud)
        assert played.internal_ip == played.external_ip and played.internal_ip.startswith("127.0.0.")
        assert cloud.internal_ip == "10.0.0.5"   # describe returns a copy
        head = Machine(id="i-0abc00000000head", tags={"ray-node-type": "head"}, internal_ip="10.0.0.9")
        assert player.describe(head).internal_ip == player.head_ip
        unknown = Machine(id="i-unknown", tags={}, internal_ip="10.0.0.7")
        assert player.describe(unknown) is unknown
        node = wait_for(lambda: alive_nodes_by_instance(gcs_address).get("i-0abc000000000001"), 30,
                        "player registered under the cloud id")
        assert node.node_manager_address == played.internal_ip and dict(node.resources_total)["GPU"] == 1
        # A fresh player (restarted monitor) maps the id to the same IP.
        again = LocalPlayer.from_provider({"region": "us-west-2", "gcs_address": gcs_address,
                                           "player_state_dir": str(tmp_path / "player")}, CLUSTER)
        assert again.describe(cloud).internal_ip == played.internal_ip
        # The machine vanished from the cloud (preempted out of band): the provider calls after_terminate.
        player.after_terminate(["i-0abc000000000001"])
        assert player.nodes.list() == [] and player.describe(cloud).internal_ip == "10.0.0.5"
        wait_for(lambda: "i-0abc000000000001" not in alive_nodes_by_instance(gcs_address), 20, "player gone")
        player.after_terminate(["i-0abc000000000001"])   # already gone: no error
    finally:
        stop_everything(player.nodes)


# ------------------------------------------------------------------ LocalCommandRunner

@pytest.fixture
def runner(tmp_path: Path) -> LocalCommandRunner:
    return LocalCommandRunner("[test] ", "local-00000001", tmp_path / "home")


def test_runner_env_home_and_path(runner: LocalCommandRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.9.9.9:6379")   # the CLI's address must not leak onto the "node"
    monkeypatch.setenv("PATH", "/usr/bin:/bin")          # the venv's bin must be added back
    out = runner.run('echo "$FOO|$RAY_OVERRIDE_RESOURCES|$HOME|$PWD|${RAY_ADDRESS:-none}"; type -P ray',
                     with_output=True,
                     environment_variables={"FOO": "a b'c", "RAY_OVERRIDE_RESOURCES": {"CPU": 0}})
    first, ray_path = out.decode().splitlines()
    assert first == f'"a b\'c"|{{"CPU":0}}|{runner.home}|{runner.home}|none'   # JSON-encoded like Ray's SSH runner
    assert Path(ray_path).parent == Path(sys.executable).parent
    assert runner.run("true") == "" and runner.run("echo quiet", silent=True) == ""
    assert runner.run_init(as_head=True, file_mounts={}, sync_run_yet=False) is None
    assert str(runner.home) in runner.remote_shell_command_str()


def test_runner_failures(runner: LocalCommandRunner) -> None:
    with pytest.raises(ProcessRunnerError) as ei:
        runner.run("exit 3")
    assert ei.value.code == 3 and ei.value.msg_type == "ssh_command_failed"
    with pytest.raises(click.ClickException):
        runner.run("exit 4", exit_on_fail=True)
    with pytest.raises(ProcessRunnerError):
        runner.run("false", with_output=True)


def test_runner_rsync_maps_home(runner: LocalCommandRunner, tmp_path: Path) -> None:
    src = tmp_path / "x.txt"
    src.write_text("hello")
    runner.run_rsync_up(str(src), "~/x")
    assert (runner.home / "x").read_text() == "hello"
    d = tmp_path / "code"
    (d / "pkg").mkdir(parents=True)
    (d / "pkg" / "m.py").write_text("X = 1")
    (d / "skip.pyc").write_text("")
    runner.run("mkdir -p ~/mounts")   # what the updater runs first
    runner.run_rsync_up(str(d) + "/", "~/mounts/code/", options={"rsync_exclude": ["*.pyc"]})
    assert (runner.home / "mounts/code/pkg/m.py").read_text() == "X = 1"
    assert not (runner.home / "mounts/code/skip.pyc").exists()
    assert runner.run("cat ~/mounts/code/pkg/m.py", with_output=True) == b"X = 1"
    abs_target = tmp_path / "abs" / "y.txt"
    runner.run_rsync_up(str(src), str(abs_target))   # absolute remote paths are used as given
    assert abs_target.read_text() == "hello"
    down = tmp_path / "down.txt"
    runner.run_rsync_down("~/x", str(down))
    assert down.read_text() == "hello"


def test_runner_ray_stop_is_scoped_to_the_cluster(runner: LocalCommandRunner) -> None:
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)   # e.g. another cluster's Ray
    try:
        out = runner.run("nohup sleep 300 >/dev/null 2>&1 & echo $!", with_output=True)
        daemon = int(out.decode().split()[-1])
        assert marked_pids(runner.marker) == [daemon]
        assert proc_info(daemon).pgid != os.getpgrp()   # not in pytest's process group
        assert b"ray, version" in runner.run("ray --version", with_output=True)   # other subcommands untouched
        runner.run("ray stop")
        wait_for(lambda: not marked_pids(runner.marker), 5, "runner-started daemon stopped")
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.e2e
def test_head_started_through_runner_like_ray_up_then_scoped_ray_stop(backend_config: dict) -> None:
    """What `ray up` does with the local backend: launch the head record, run the head start command through the
    runner (with RAY_OVERRIDE_RESOURCES as env var), then `ray down`'s `ray stop`, which must stop only this head."""
    port = free_port()
    backend_config["gcs_address"] = f"127.0.0.1:{port}"
    with _backend(backend_config) as be:
        (head_id,) = be.launch(spec(is_head=True, token="h"))
        runner = be.command_runner("[head] ", head_id, {}, CLUSTER, subprocess, False)
        try:
            t0 = time.monotonic()
            runner.run(
                # `ray up` prefixes these to the head start command itself (environment_variables would JSON-quote
                # string values: RAY_CLOUD_INSTANCE_ID would become "\"local-...\"").
                f"RAY_AUTH_MODE=disabled RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0 RAY_CLOUD_INSTANCE_ID={head_id} "
                f"RAY_NODE_TYPE_NAME=head ray start --head --port={port} --num-cpus=0 --include-dashboard=false "
                f"--disable-usage-stats --dashboard-port={free_port()} --ray-client-server-port={free_port()} "
                f"--object-store-memory=83886080 --temp-dir=/tmp/rnl-h{port}",
                environment_variables={"RAY_OVERRIDE_RESOURCES": {"CPU": 0, "head_only": 1}},
                silent=True)
            print(f"\nhead start via runner: {time.monotonic() - t0:.1f} s")
            (head,) = [n for n in gcs_nodes(be.nodes.gcs_address) if n.state == 0]
            assert head.instance_id == head_id and dict(head.resources_total).get("head_only") == 1
            # v1 keys LoadMetrics by the provider's internal IP: the head record must carry the raylet's address.
            (m,) = be.list_machines()
            assert head.node_manager_address == m.internal_ip
            assert marked_pids(be.runner_marker)
            runner.run("ray stop")   # what `ray down` runs on the head
            wait_for(lambda: not marked_pids(be.runner_marker), 15, "head processes stopped")
            be.terminate([head_id])
            assert be.list_machines() == []
        finally:
            stop_marked_processes(be.runner_marker, timeout=5)
            shutil.rmtree(f"/tmp/rnl-h{port}", ignore_errors=True)
