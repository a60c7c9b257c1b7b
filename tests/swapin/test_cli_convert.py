"""`ray-nodeless convert`: output, JSON document, and the error convention (one line naming the key, exit 2)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from ray_nodeless.cli.convert import convert_command
from tests.swapin.helpers import PROJECT, example


def run(*args: str):
    return CliRunner().invoke(convert_command, list(args))


def test_writes_the_yaml_and_prints_before_and_after(tmp_path: Path) -> None:
    out = tmp_path / "cluster.yaml"
    r = run(str(example("aws-example-full.yaml")), "-o", str(out))
    assert r.exit_code == 0, r.output
    converted = yaml.safe_load(out.read_text())
    assert converted["provider"]["type"] == "external" and converted["provider"]["cloud"] == "aws"
    lines = r.output.splitlines()
    assert lines[0].startswith("converted aws-example-full.yaml (Ray type: aws, us-west-2) -> ")
    head = next(line for line in lines if line.startswith("ray.head.default"))
    assert head.count("m5.large on-demand $0.0960/h") == 2
    worker = next(line for line in lines if line.startswith("ray.worker.default"))
    assert "workers 0..2" in worker and worker.count("m5.large spot $0.0333/h") == 2
    assert "idle cost:    $0.0960/h -> $0.0960/h (head + min_workers)" in lines
    assert "ceiling cost: $0.1626/h -> $0.1626/h (at max_workers)" in lines
    assert any("cache_stopped_nodes" in line for line in lines)
    assert (out.stat().st_mode & 0o777) == 0o644


def test_without_output_the_yaml_goes_to_stdout() -> None:
    r = CliRunner().invoke(convert_command, [str(example("aws-example-minimal.yaml"))])
    assert r.exit_code == 0, r.stderr
    assert yaml.safe_load(r.stdout)["provider"]["module"] == "ray_nodeless.NodelessProvider"
    assert "before (Ray's provider)" in r.stderr


def test_json_document_has_exactly_the_documented_keys(tmp_path: Path) -> None:
    r = CliRunner().invoke(convert_command, [
        str(example("gcp-example-minimal.yaml")), "--free-instance-types", "--json", "--project-id", PROJECT,
        "-o", str(tmp_path / "out.yaml")])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"node_types", "summary"}
    assert set(doc["node_types"]) == {"ray_head_default", "ray_worker_small"}
    for rec in doc["node_types"].values():
        assert set(rec) == {"before", "after"}
        assert set(rec["before"]) == set(rec["after"]) == {"instance_type", "capacity", "hourly_price"}
    w = doc["node_types"]["ray_worker_small"]
    assert w["before"]["instance_type"] == "n1-standard-2" and w["before"]["capacity"] == "spot"
    assert w["after"]["capacity"] == "spot" and w["after"]["hourly_price"] <= w["before"]["hourly_price"]
    assert set(doc["summary"]) == {"idle_cost_per_hour_before", "idle_cost_per_hour_after",
                                   "ceiling_cost_per_hour_before", "ceiling_cost_per_hour_after"}
    assert (tmp_path / "out.yaml").exists()


def test_errors_name_the_key_and_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "x.yaml"
    r = CliRunner().invoke(convert_command, [str(example("aws-example-gpu-docker.yaml")),
                                                             "-o", str(out)])
    assert r.exit_code == 2
    assert r.stderr.startswith("ray-nodeless: error: available_node_types.ray.head.gpu.node_config.InstanceType: "
                               "'p2.xlarge' is not in the catalog")
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    r = CliRunner().invoke(convert_command, [str(example("gcp-example-minimal.yaml"))])
    assert r.exit_code == 2 and "provider.project_id" in r.stderr
    bad = tmp_path / "k8s.yaml"
    bad.write_text("cluster_name: x\nprovider: {type: kuberay}\n")
    r = CliRunner().invoke(convert_command, [str(bad)])
    assert r.exit_code == 2 and r.stderr.startswith("ray-nodeless: error: provider.type: 'kuberay'")
    r = CliRunner().invoke(convert_command, [str(tmp_path / "missing.yaml")])
    assert r.exit_code == 2 and "cannot read cluster YAML" in r.stderr
