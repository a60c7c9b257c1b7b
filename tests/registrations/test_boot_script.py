"""The worker boot script (disable_node_updaters on a cloud): what Ray's installer would have exported."""
from __future__ import annotations

import subprocess

import pytest

from ray_nodeless.core.catalog import embedded
from ray_nodeless.providers.base import LaunchSpec
from ray_nodeless.registrations.vm_boot import worker_boot_script


def _spec(cloud: str, name: str) -> LaunchSpec:
    rc = embedded().region(cloud, "us-central1" if cloud == "gcp" else "us-east-1")
    o = rc.find(name, sorted(rc.zones)[0], "spot")
    return LaunchSpec(cluster_name="c", node_type="gpu worker", offering=o, count=1, tags={}, node_config={},
                      request_token="t", resources={"CPU": 4.0, "GPU": 1.0}, labels={"team": "ml"})


@pytest.mark.parametrize("cloud,name,metadata", [
    ("aws", "g4dn.xlarge", "169.254.169.254/latest/meta-data/instance-id"),
    ("gcp", "n1-standard-4+1xT4", "metadata.google.internal/computeMetadata/v1/instance/name"),
])
def test_script_exports_what_ray_needs_and_is_valid_bash(cloud, name, metadata):
    script = worker_boot_script(cloud, _spec(cloud, name), "10.1.2.3", 6380, {"setup": ["echo setup"], "start": []})
    assert metadata in script
    assert "export RAY_NODE_TYPE_NAME='gpu worker'" in script        # quoted: node type names may hold spaces
    assert f"export RAY_CLOUD_INSTANCE_TYPE_NAME={name}\n" in script    # both names are shell-safe: unquoted
    assert "export RAY_HEAD_IP=10.1.2.3" in script
    assert """export RAY_OVERRIDE_LABELS='{"team": "ml"}'""" in script
    assert script.rstrip().endswith("ray start --address=$RAY_HEAD_IP:6380")   # default start command, our port
    assert script.index("echo setup") < script.index("ray start")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)      # parses as bash


def test_unknown_cloud_is_refused():
    with pytest.raises(ValueError):
        worker_boot_script("azure", _spec("aws", "g4dn.xlarge"), "h", 1, None)


def test_vm_registration_adds_the_boot_script_to_workers_only():
    """`registration: vm` with node updaters disabled on a cloud: workers boot Ray themselves, the head does not
    (ray up's updater starts it)."""
    from ray_nodeless.registrations.vm import BareVM

    provider = {"cloud": "aws", "region": "us-east-1", "disable_node_updaters": True, "head_ip": "10.0.0.9",
                "gcs_address": "10.0.0.9:6390"}
    vm = BareVM.from_provider(provider, "c")
    worker = vm.prepare(_spec("aws", "g4dn.xlarge"))
    assert "ray start --address=$RAY_HEAD_IP:6390" in worker.boot_script
    assert "export RAY_HEAD_IP=10.0.0.9" in worker.boot_script
    head = _spec("aws", "g4dn.xlarge")
    head.is_head = True
    assert vm.prepare(head).boot_script == ""
    updaters_on = BareVM.from_provider(dict(provider, disable_node_updaters=False), "c")
    assert updaters_on.prepare(_spec("aws", "g4dn.xlarge")).boot_script == ""
