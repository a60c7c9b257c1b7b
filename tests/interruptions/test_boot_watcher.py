"""The boot script starts the interruption watcher on spot workers only, and the watcher it starts really polls the
metadata server: the script is run by bash with a `ray` and a `curl` stand-in on PATH (they only answer; the
watcher and the fake metadata server are real)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ray_nodeless.core.catalog import embedded
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers.base import LaunchSpec
from ray_nodeless.registrations.vm import BareVM
from ray_nodeless.registrations.vm_boot import WATCHER_MODULE, worker_boot_script
from ray_nodeless.testing.fake_metadata import FakeMetadataServer
from ray_nodeless.testing.ray_processes import free_port, wait_for

PROVIDER = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws", "region": "us-east-1",
            "disable_node_updaters": True, "head_ip": "10.0.0.9", "gcs_address": "10.0.0.9:6390"}


def _spec(cloud: str, capacity: str) -> LaunchSpec:
    region = "us-central1" if cloud == "gcp" else "us-east-1"
    name = "n1-standard-4" if cloud == "gcp" else "m5.xlarge"
    rc = embedded().region(cloud, region)
    o = rc.find(name, sorted(rc.zones)[0], capacity)
    return LaunchSpec(cluster_name="c", node_type="cpu", offering=o, count=1, tags={}, node_config={},
                      request_token="t", resources={"CPU": 4.0})


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_spot_workers_start_the_watcher_before_ray(cloud):
    script = worker_boot_script(cloud, _spec(cloud, "spot"), "10.1.2.3", 6380, {"setup": ["echo setup"]})
    start = f"-m {WATCHER_MODULE} --cloud {cloud} --gcs-address \"$RAY_HEAD_IP:6380\""
    assert start in script
    assert script.index("echo setup") < script.index(start) < script.index("ray start --address")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_on_demand_workers_and_the_switched_off_key_start_no_watcher(cloud):
    assert WATCHER_MODULE not in worker_boot_script(cloud, _spec(cloud, "on-demand"), "h", 1, None)
    assert WATCHER_MODULE not in worker_boot_script(cloud, _spec(cloud, "spot"), "h", 1, None,
                                                    interruption_watcher=False)


def test_the_provider_key_reaches_the_boot_script():
    assert WATCHER_MODULE in BareVM.from_provider(dict(PROVIDER), "c").prepare(_spec("aws", "spot")).boot_script
    off = dict(PROVIDER, interruption_watcher=False)
    load_provider(off)                                      # a declared key: accepted
    assert WATCHER_MODULE not in BareVM.from_provider(off, "c").prepare(_spec("aws", "spot")).boot_script


@pytest.mark.parametrize("key,value,match", [
    ("interruption_watchers", False, "did you mean 'interruption_watcher'"),
    ("interruption_watcher", "no", "must be true or false"),
    ("interruption_queue_url", "my-queue", "interruption_queue_url"),
    ("interruption_que_url", "https://sqs.us-east-1.amazonaws.com/1/q", "did you mean 'interruption_queue_url'"),
])
def test_bad_keys_name_the_key(key, value, match):
    with pytest.raises(ConfigError, match=match):
        load_provider(dict(PROVIDER, **{key: value}))


def test_the_queue_is_aws_only():
    gcp = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "gcp", "region": "us-central1",
           "project_id": "p", "interruption_queue_url": "https://sqs.us-east-1.amazonaws.com/1/q"}
    with pytest.raises(ConfigError, match="provider.interruption_queue_url: backend 'gcp' polls no queue"):
        load_provider(gcp)
    local = {"cloud": "local", "region": "us-east-1", "interruption_queue_url": gcp["interruption_queue_url"]}
    with pytest.raises(ConfigError, match="provider.interruption_queue_url: backend 'local' polls no queue"):
        load_provider(local)


def _stand_ins(bin_dir: Path) -> None:
    """`ray`: a script whose shebang is this interpreter (as pip writes it), doing nothing; `curl`: answers the
    instance-id read of the boot script."""
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(f"#!{sys.executable}\nimport sys\nsys.exit(0)\n")
    (bin_dir / "curl").write_text("#!/bin/sh\necho i-0boot00000000000001\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)


def _wait_gone(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_the_boot_script_starts_a_watcher_that_polls_imds(tmp_path):
    _stand_ins(tmp_path / "bin")
    script = worker_boot_script("aws", _spec("aws", "spot"), "127.0.0.1", free_port(), None)
    with FakeMetadataServer() as fake:
        env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:/usr/bin:/bin", RAY_NODELESS_RUN_DIR=str(tmp_path),
                   RAY_NODELESS_METADATA_URL=fake.url)
        subprocess.run(["bash", "-c", script], env=env, check=True, timeout=60)
        pid = int((tmp_path / "ray-nodeless-watch.pid").read_text())
        try:
            wait_for(lambda: ("GET", "/latest/meta-data/spot/instance-action") in fake.requests_seen(), 30,
                     "the watcher's first IMDS poll")
            assert fake.requests_seen()[0] == ("PUT", "/latest/api/token")
            log = (tmp_path / "ray-nodeless-watch.log").read_text()
            assert "instance i-0boot00000000000001" in log      # RAY_CLOUD_INSTANCE_ID reached the watcher
        finally:
            os.kill(pid, signal.SIGTERM)
            gone = _wait_gone(pid, 15)
            if not gone:
                os.kill(pid, signal.SIGKILL)
            assert gone, "the watcher did not stop on SIGTERM"
