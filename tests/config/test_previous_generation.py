"""Previous-generation families are left out of open searches by default (core/family_names.py, issue 30): a 1-CPU
demand gets a current-generation type, not m1.small (2006, 1.7 GiB); `provider.allow_previous_generation: true`
brings them back; a node type or rule that names an instance type or family keeps what it names; `plan` says when
the default removed a cheaper offering."""
from __future__ import annotations

import json

from click.testing import CliRunner

from ray_nodeless.cli.main import main as cli
from ray_nodeless.core.family_names import AWS_PREVIOUS_GENERATION, GCP_PREVIOUS_GENERATION
from ray_nodeless.operate.config import check_cluster
from tests.helpers import cluster_config, write_cluster_yaml

AWS = {"cloud": "aws", "region": "us-west-2", "image_id": "ami-0123456789abcdef0"}
SMALL = {"small": {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 0, "max_workers": 2}}


def _fit(provider: dict, workers: dict = SMALL, name: str = "small") -> str:
    return check_cluster(cluster_config(provider, workers=workers)).plans[name].chosen.instance_type.name


def test_the_default_one_cpu_fit_is_a_current_generation_type():
    chosen = _fit(AWS)
    assert chosen.split(".")[0] not in AWS_PREVIOUS_GENERATION, chosen
    assert _fit(dict(AWS, allow_previous_generation=True)) == "m1.small"      # what it was before


def test_a_pinned_instance_type_or_named_family_keeps_what_it_names():
    pinned = {"small": {"resources": {"CPU": 1}, "node_config": {"InstanceType": "m3.medium"}}}
    assert _fit(AWS, pinned) == "m3.medium"
    by_rule = dict(AWS, rules=[{"name": "old", "match": {}, "families": ["m3"]}])
    assert _fit(by_rule).startswith("m3.")


def test_gcp_leaves_out_the_first_generation_shared_core_types():
    gcp = {"cloud": "gcp", "region": "us-central1", "project_id": "p"}
    chosen = _fit(gcp)
    assert chosen.split("-")[0] not in GCP_PREVIOUS_GENERATION, chosen
    allowed = _fit(dict(gcp, allow_previous_generation=True))
    assert allowed.split("-")[0] in GCP_PREVIOUS_GENERATION | {chosen.split("-")[0]}


def test_plan_says_when_the_default_left_out_a_cheaper_offering(tmp_path):
    path = write_cluster_yaml(tmp_path / "c.yaml", cluster_config(AWS, workers=SMALL))
    out = CliRunner().invoke(cli, ["plan", path])
    assert out.exit_code == 0, out.output
    [line] = [ln for ln in out.output.splitlines() if "previous generation left out" in ln and "m1.small" in ln][:1]
    assert "provider.allow_previous_generation: true" in line
    doc = json.loads(CliRunner().invoke(cli, ["plan", path, "--json"]).output)
    assert doc["node_types"]["small"]["previous_generation_left_out"]["instance_type"] == "m1.small"
    allowed = write_cluster_yaml(tmp_path / "a.yaml",
                                 cluster_config(dict(AWS, allow_previous_generation=True), workers=SMALL))
    assert "previous generation left out" not in CliRunner().invoke(cli, ["plan", allowed]).output
