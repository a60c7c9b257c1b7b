"""The cloud schemas the config checks read instead of importing a cloud SDK (scripts/vendor_cloud_schemas.py):
they equal what the installed SDKs say, the GCP fast path never accepts a body the Compute client would refuse,
and every error still comes from the client's own parser (so its message is unchanged)."""
from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys

import pytest
import yaml

from ray_nodeless.core.requirements import split_node_config

from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.aws import images, run_instances_keys
from ray_nodeless.providers.aws import settings as aws_settings
from ray_nodeless.providers.gcp import instance_schema
from ray_nodeless.providers.gcp import node_config as gcp_nc
from ray_nodeless.ray_compat import aws_amis
from tests import REPO_ROOT

KEY = "available_node_types.w.node_config"


def _script():
    spec = importlib.util.spec_from_file_location("vendor_cloud_schemas",
                                                  REPO_ROOT / "scripts" / "vendor_cloud_schemas.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_vendored_files_match_the_installed_sdks():
    r = subprocess.run([sys.executable, "scripts/vendor_cloud_schemas.py", "--check"], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"rerun scripts/vendor_cloud_schemas.py: {r.stdout}{r.stderr}"


def test_the_vendored_versions_are_the_installed_ones_so_the_fast_paths_are_taken():
    import botocore
    from google.cloud.compute_v1 import gapic_version

    assert aws_settings.installed_botocore_version() == botocore.__version__ == run_instances_keys.BOTOCORE_VERSION
    assert gcp_nc.installed_compute_version() == gapic_version.__version__ == instance_schema.COMPUTE_VERSION
    assert gcp_nc.vendored_schema() is instance_schema.SCHEMA


def test_run_instances_members_equal_botocores():
    import botocore.session

    model = botocore.session.get_session().get_service_model("ec2")
    assert aws_settings.run_instances_members() == frozenset(model.operation_model("RunInstances").input_shape.members)


def test_another_botocore_version_reads_botocore_itself(monkeypatch):
    monkeypatch.setattr(aws_settings, "installed_botocore_version", lambda: "0.0.0")
    assert aws_settings.run_instances_members() == run_instances_keys.RUN_INSTANCES_MEMBERS
    assert "botocore.session" in sys.modules


def test_an_ec2_model_in_aws_data_path_reads_botocore_itself(monkeypatch, tmp_path):
    (tmp_path / "ec2").mkdir()
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    assert aws_settings._other_ec2_models()


def test_ray_default_amis_from_source_equal_rays():
    from ray.autoscaler._private.aws.config import DEFAULT_AMI

    assert aws_amis.default_amis_from_source() == DEFAULT_AMI
    assert images.ray_default_amis() == DEFAULT_AMI     # the live module, now that it is imported


def _gcp_node_configs() -> list[dict]:
    out = []
    paths = sorted((REPO_ROOT / "cluster-configs").glob("gcp-*.yaml")) + sorted(
        (REPO_ROOT / "tests" / "data" / "ray-examples").glob("gcp-*.yaml"))
    for p in paths:
        doc = yaml.safe_load(p.read_text())
        template = (doc["provider"].get("open") or {}).get("node_config", doc["provider"].get("open_node_config"))
        templates = [{"node_config": template}] if template is not None else []
        for nt in list((doc.get("available_node_types") or {}).values()) + templates:
            # The backend sees a node_config without ray_nodeless's requirement keys (min_vcpus, ...).
            nc = split_node_config(dict(nt.get("node_config") or {}))[1]
            if "scheduling" in nc:
                nc["scheduling"] = gcp_nc.scheduling_map(nc["scheduling"])
            out.append(nc)
    return out


GOOD = [
    {"machineType": "n1-standard-4", "canIpForward": True, "labels": {"team": "ml"},
     "metadata": {"items": [{"key": "a", "value": "b"}]}, "tags": {"items": ["x", "y"]},
     "disks": [{"boot": True, "autoDelete": True, "initializeParams": {"diskSizeGb": 100, "sourceImage": "i"}}],
     "networkInterfaces": [{"network": "n", "accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}],
     "serviceAccounts": [{"email": "e", "scopes": ["s"]}], "scheduling": {"preemptible": True}},
    {"disks": [{"initialize_params": {"disk_size_gb": 10}}]},          # proto names are accepted too
]
BAD = [
    {"scheduling": {"preemptable": True}}, {"canIpForward": "yes"}, {"disks": [{"foo": 1}]},
    {"disks": [{"initializeParams": {"diskSizeGb": "big"}}]}, {"metadata": {"items": [{"key": "a", "value": 3}]}},
    {"disks": "x"}, {"labels": {"a": 1}}, {"tags": {"items": "a"}}, {"disks": [None]},
    {"disks": [{"diskSizeGb": True}]}, {"disks": [{"diskSizeGb": 2 ** 70}]},
    {"disks": [{"initializeParams": {"diskSizeGb": 1}, "initialize_params": {"diskSizeGb": 1}}]},
]
UNSURE_BUT_VALID = [{"disks": [{"diskSizeGb": 200.0}]}, {"disks": [{"diskSizeGb": "200"}]}, {"description": None}]


def _client_accepts(body: dict) -> bool:
    from google.cloud import compute_v1

    try:
        compute_v1.Instance.from_json(json.dumps(body))
    except Exception:
        return False
    return True


@pytest.mark.parametrize("body", _gcp_node_configs() + GOOD + BAD + UNSURE_BUT_VALID)
def test_the_fast_path_accepts_only_what_the_client_accepts(body):
    if gcp_nc.surely_parses(body):
        assert _client_accepts(body), body


def test_the_fast_path_vouches_for_every_shipped_and_ray_example_node_config():
    for body in _gcp_node_configs() + GOOD:
        assert gcp_nc.surely_parses(body), body


def _old_error(body: dict) -> tuple[str, str] | None:
    """What check_node_config's parse step raised before the fast path: the client's error as a ConfigError."""
    from google.cloud import compute_v1
    from google.protobuf import json_format
    import re

    try:
        compute_v1.Instance.from_json(json.dumps(body))
    except (json_format.ParseError, TypeError, ValueError) as e:
        m = re.search(r'at "?Instance\.?([\w.\[\]]*)', str(e))
        sub = f".{m.group(1)}" if m and m.group(1) else ""
        return f"{KEY}{sub}", str(e).splitlines()[0]
    return None


@pytest.mark.parametrize("body", BAD)
def test_errors_are_the_clients_own_unchanged(body):
    with pytest.raises(ConfigError) as ei:
        gcp_nc.check_node_config("w", copy.deepcopy(body), KEY)
    key, message = _old_error(body)
    assert str(ei.value).split(": ", 1)[1] == message
    # Where the client's message names no path, the key names the field at fault (the first top-level field the
    # vendored schema cannot vouch for), not just the node_config.
    assert ei.value.key == key or (key == KEY and ei.value.key.split(".")[-1] in body), ei.value.key


def test_another_compute_version_always_asks_the_client(monkeypatch):
    monkeypatch.setattr(gcp_nc, "installed_compute_version", lambda: "0.0.0")
    gcp_nc.vendored_schema.cache_clear()
    try:
        assert not gcp_nc.surely_parses({"machineType": "n1-standard-4"})
    finally:
        gcp_nc.vendored_schema.cache_clear()
