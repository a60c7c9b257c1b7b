"""`ray-nodeless plan` of a cluster YAML validates and plans without any cloud SDK or Ray (issue 10: a cold plan
must be fast, and the SDK imports were most of its time). Each command runs in a fresh interpreter, whose
`sys.modules` is inspected after it finished: a behaviour test, not a timing test."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import REPO_ROOT

# Top-level packages (and dotted prefixes) a plan must not import.
FORBIDDEN = ("boto3", "botocore", "googleapiclient", "google.cloud.compute", "google.cloud.compute_v1",
             "google.auth", "google.api_core", "ray", "kubernetes", "moto")

_CODE = """
import json, sys
from ray_nodeless.cli import main
try:
    main({argv!r})
except SystemExit as e:
    code = e.code
else:
    code = 0
print("MODULES " + json.dumps(sorted(sys.modules)))
sys.exit(code)
"""


def plan_modules(*argv: str) -> tuple[int, str, set[str]]:
    r = subprocess.run([sys.executable, "-c", _CODE.format(argv=["plan", *argv])], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=120)
    out, _, modules = r.stdout.rpartition("MODULES ")
    return r.returncode, out + r.stderr, set(json.loads(modules))


def forbidden(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))


@pytest.mark.parametrize("config", ["aws-gpu-head.yaml", "aws-cpu-head.yaml", "gcp-gpu-head.yaml",
                                    "gcp-cpu-head.yaml", "local-cpu-head.yaml"])
def test_plan_of_a_cluster_yaml_imports_no_cloud_sdk_and_no_ray(config):
    code, out, modules = plan_modules(f"cluster-configs/{config}")
    assert code == 0, out
    assert "idle cost:" in out
    assert forbidden(modules) == []
    # Nor numpy: the planner's plain-Python path (proven equal in tests/core/test_planner_pure.py) runs instead.
    assert "numpy" not in modules
    # Only the command that ran was imported.
    assert not {"ray_nodeless.cli.simulate", "ray_nodeless.cli.convert", "ray_nodeless.cli.sweep"} & modules


def test_plan_json_and_a_node_type_without_image_import_no_sdk_either(tmp_path):
    """Ray's default AMI (a node type without ImageId) is read from Ray's source, not by importing Ray."""
    import yaml

    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "aws-gpu-head.yaml").read_text())
    for nt in cfg["available_node_types"].values():
        nt["node_config"].pop("ImageId", None)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code, out, modules = plan_modules(str(path), "--json")
    assert code == 0, out
    assert forbidden(modules) == []


def test_a_gcp_node_config_the_vendored_schema_cannot_vouch_for_is_parsed_by_the_client(tmp_path):
    """The fallback: a value the vendored schema is unsure of (an integral float) goes to the Compute client's
    own parser, which accepts it: same answer as before, at the SDK's import cost."""
    import yaml

    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "gcp-gpu-head.yaml").read_text())
    cfg["available_node_types"]["head"]["node_config"]["disks"][0]["initializeParams"]["diskSizeGb"] = 200.0
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code, out, modules = plan_modules(str(path))
    assert code == 0, out
    assert "google.cloud.compute_v1" in modules
