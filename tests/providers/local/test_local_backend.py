"""LocalBackend (fault injection, contract), LocalCommandRunner, and PlayedBackend (registration: local-player).

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
from ray_nodeless.errors import BackendError, CapacityError, ForeignMachineError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers.base import MACHINE_PENDING, MACHINE_RUNNING, TAG_CLUSTER, LaunchSpec
from ray_nodeless.providers.local.backend import LocalBackend
from ray_nodeless.providers.local.pids import proc_info
from ray_nodeless.providers.local.played import PlayedBackend
from ray_nodeless.providers.local.runner import LocalCommandRunner
from ray_nodeless.providers.local.scoped_stop import marked_pids, stop_marked_processes
from ray_nodeless.testing import fake_backend
from ray_nodeless.testing.fake_backend import FakeBackend
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


def test_a_worker_is_shown_pending_before_its_ray_is_up(backend_config: dict, gcs_address: str) -> None:
    """The local launch call returns once the node's Ray is up; the machine is handed to `on_created` (the view's
    `launched` in the provider) as soon as its record exists, pending, before Ray knows the node: Ray v2 would
    otherwise see the Ray node before any listing shows its instance, take it for an unmanaged one, and keep its own
    launch request pending for 10 min (found by the Prometheus e2e under CI load)."""
    backend_config.update(gcs_address=gcs_address)
    seen: list[tuple[list[str], list[str], bool]] = []
    with _backend(backend_config) as be:
        be.on_created = lambda ms: seen.append(([m.id for m in ms], [m.state for m in ms],
                                                 any(m.id in alive_nodes_by_instance(gcs_address) for m in ms)))
        (mid,) = be.launch(spec(token="early"))
        assert seen == [([mid], [MACHINE_PENDING], False)]     # once, pending, before its Ray node registered
        assert [m.state for m in be.list_machines()] == [MACHINE_RUNNING]
        be.terminate([mid])
        (head,) = be.launch(spec(is_head=True, token="h"))      # a head (no process of ours): nothing to hand early
        assert len(seen) == 1
        be.terminate([head])


# ------------------------------------------------------------------ PlayedBackend (registration: local-player)

def played(tmp_path: Path, gcs_address: str, **extra) -> PlayedBackend:
    """The in-memory cloud's backend, its machines played by local Ray nodes (as the registry builds it)."""
    provider = {"cloud": "fake", "simulate_cloud": "aws", "region": "us-west-2", "registration": "local-player",
                "gcs_address": gcs_address, "player_state_dir": str(tmp_path / "player"), "local_prewarm": False,
                **extra}
    backend = load_provider(provider).make_backend(CLUSTER)
    assert isinstance(backend, PlayedBackend) and isinstance(backend.inner, FakeBackend)
    return backend


@pytest.mark.e2e
def test_played_backend_plays_cloud_machines(tmp_path: Path, gcs_address: str) -> None:
    cloud = fake_backend.reset()
    be = played(tmp_path, gcs_address)
    player = be.player
    try:
        s = spec(token="p1", node_type="gpu")
        s.resources = {"CPU": 1, "GPU": 1}
        [mid] = be.launch(s)
        assert be.launch(s) == [mid] and len(player.nodes.list()) == 1   # a retried launch: no second player
        [head] = be.launch(spec(is_head=True, token="h1"))                  # heads get no player
        listed = {m.id: m for m in be.list_machines()}
        assert listed[mid].internal_ip == listed[mid].external_ip and listed[mid].internal_ip.startswith("127.0.0.")
        assert cloud.machines[mid].internal_ip.startswith("10.0.0.")       # the cloud's own record is untouched
        assert listed[head].internal_ip == player.head_ip                   # the head's Ray runs on this host
        node = wait_for(lambda: alive_nodes_by_instance(gcs_address).get(mid), 30,
                        "player registered under the cloud id")
        assert node.node_manager_address == listed[mid].internal_ip and dict(node.resources_total)["GPU"] == 1
        # A fresh decorator (restarted monitor) maps the id to the same IP.
        again = played(tmp_path, gcs_address)
        assert {m.id: m.internal_ip for m in again.list_machines()}[mid] == listed[mid].internal_ip
        # The machine vanished from the cloud (preempted): the provider tells the backend to forget it.
        be.inner.reclaim(mid)
        assert [m.id for m in be.list_machines()] == [head]
        be.forget([mid])
        assert player.nodes.list() == []
        wait_for(lambda: mid not in alive_nodes_by_instance(gcs_address), 20, "player gone")
        be.forget([mid])                              # already gone: no error
        be.terminate([head])
        assert be.list_machines() == []
    finally:
        stop_everything(player.nodes)


def test_a_machine_that_cannot_be_played_is_terminated_and_the_launch_raises(tmp_path: Path) -> None:
    # A host without memory for one more node: the player refuses before starting anything (a real check of
    # LocalNodeProcesses, no Ray started), and the contract holds: no machine of the failed launch is left.
    cloud = fake_backend.reset()
    be = played(tmp_path, "127.0.0.1:1", local_min_free_memory_mb=10**9)
    with pytest.raises(BackendError) as ei:
        be.launch(spec(token="p2", count=2))
    assert ei.value.category == "LocalPlayerStartFailed" and "min_free_memory_mb" in str(ei.value)
    assert be.list_machines() == [] and sorted(cloud.gone.values()) == ["terminated", "terminated"]
    assert be.player.nodes.list() == []


def test_played_backend_keeps_the_inner_contract_and_runs_the_head_locally(tmp_path: Path) -> None:
    fake_backend.reset()
    be = played(tmp_path, "127.0.0.1:1")
    [head] = be.launch(spec(is_head=True, token="h2"))
    be.set_tags(head, {"ray-node-status": "up-to-date"})
    assert be.list_machines()[0].tags["ray-node-status"] == "up-to-date"
    be.terminate([head])
    assert be.vanished_reasons([head]) == {head: "terminated"}
    # The cloud's machines are this host: `ray up` runs the head's commands with a local runner, whose processes
    # are the decorator's leftovers until ended.
    runner = be.command_runner("x", head, {}, CLUSTER, subprocess, False)
    assert isinstance(runner, LocalCommandRunner)
    try:
        out = runner.run("nohup sleep 300 >/dev/null 2>&1 & echo $!", with_output=True)
        daemon = out.decode().split()[-1]
        left = be.leftovers()
        assert [(d["kind"], d["name"], d["node_kind"]) for d in left] == [("process", daemon, "head")]
        be.end_leftovers(left)
        assert marked_pids(be.runner_marker) == [] and be.leftovers() == []
    finally:
        stop_marked_processes(be.runner_marker, timeout=5)


def test_only_played_provider_blocks_are_wrapped(tmp_path: Path) -> None:
    base = {"cloud": "fake", "simulate_cloud": "aws", "region": "us-west-2"}
    assert type(load_provider({**base, "registration": "vm"}).make_backend(CLUSTER)) is FakeBackend
    join = {"method": "kubeadm", "endpoint": "https://127.0.0.1:6443", "token": "abcdef.0123456789abcdef",
            "ca_cert_hash": "sha256:" + "0" * 64}
    k8s = load_provider({**base, "registration": "kubernetes", "kubernetes": {"join": join, "played": False}})
    assert k8s.player_settings is None and type(k8s.make_backend(CLUSTER)) is FakeBackend


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
