"""Ordered rules, narrowing by node_config, config errors that name the key, and the CLI's stable interfaces."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from ray_nodeless.cli import main
from ray_nodeless.core.cluster_plan import load_catalog
from ray_nodeless.core.settings import Resolver, parse_provider
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import load_provider
from tests import REPO_ROOT

ROOT = REPO_ROOT
BASE = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws", "region": "us-west-2"}


def resolver(**provider):
    return Resolver(parse_provider(dict(BASE, **provider)))


def test_first_matching_rule_wins():
    r = resolver(rules=[
        {"name": "big-gpu", "match": {"GPU": ">=2"}, "families": ["p4d"]},
        {"name": "gpu", "match": {"GPU": ">=1", "node_type": "gpu*"}, "capacity": ["spot"]},
        {"name": "rest", "match": {}},
    ])
    assert r.request("gpu_a", {"CPU": 4, "GPU": 1}, {}, False).rule == "gpu"
    assert r.request("gpu_b", {"GPU": 4}, {}, False).rule == "big-gpu"
    assert r.request("other", {"GPU": 1}, {}, False).rule == "rest"     # node_type glob fails
    assert r.request("cpu", {"CPU": 2}, {}, False).rule == "rest"


def test_no_rule_matches_gives_defaults():
    req = resolver(rules=[{"name": "heads", "match": {"node_kind": "head"}, "capacity": ["on-demand"]}]).request(
        "w", {"CPU": 1}, {}, False)
    assert req.rule == "default" and req.capacity == ("on-demand",) and req.arch == ("x86_64",)


def test_predicates():
    r = resolver(rules=[{"name": "mem", "match": {"memory_gib": ">=64", "CPU": "<= 16", "custom": "!=0"}}])
    assert r.request("a", {"CPU": 16, "memory": 64 * 2 ** 30, "custom": 1}, {}, False).rule == "mem"
    assert r.request("a", {"CPU": 17, "memory": 64 * 2 ** 30, "custom": 1}, {}, False).rule == "default"
    assert r.request("a", {"CPU": 16, "memory": 64 * 2 ** 30}, {}, False).rule == "default"


def test_node_config_narrows_the_rule():
    r = resolver(rules=[{"name": "gpu", "match": {}, "families": ["g4dn", "g5"], "capacity": ["spot", "on-demand"],
                         "max_hourly_price": 2.0, "exclude_gpus": ["M60"]}],
                 exclude={"gpus": ["K80"], "families": ["p2"]})
    req = r.request("w", {"GPU": 1}, {"families": ["g5", "g6"], "capacity": ["on-demand"], "max_hourly_price": 5,
                                      "exclude_gpus": ["V100"], "ImageId": "ami-1"}, False).requirements
    assert req.families == {"g5"}
    assert req.capacity == ("on-demand",)
    assert req.max_hourly_price == 2.0
    assert req.exclude_gpus == {"M60", "V100", "K80"}
    assert "p2" in req.exclude_families


@pytest.mark.parametrize("node_config,key", [
    ({"families": ["m5"]}, "available_node_types.w.node_config.families"),
    ({"capacity": ["spot", "on-demand", "reserved"]}, "available_node_types.w.node_config.capacity"),
    ({"arch": "arm64"}, "available_node_types.w.node_config.arch"),
    ({"min_memory_gib": -1}, "available_node_types.w.node_config.min_memory_gib"),
])
def test_narrowing_errors_name_the_key(node_config, key):
    r = resolver(rules=[{"name": "r", "match": {}, "families": ["g4dn"], "capacity": ["spot"], "arch": "x86_64"}])
    with pytest.raises(ConfigError) as e:
        r.request("w", {"GPU": 1}, node_config, False)
    assert e.value.key == key


@pytest.mark.parametrize("provider,key", [
    ({"cloud": "azure"}, "provider.cloud"),
    ({"rules": [{"match": {}}]}, "provider.rules[0].name"),
    ({"rules": [{"name": "a"}, {"name": "a"}]}, "provider.rules[1].name"),
    ({"rules": [{"name": "a", "match": {"memory": ">=1"}}]}, "provider.rules[0].match.memory"),
    ({"rules": [{"name": "a", "match": {"node_kind": "master"}}]}, "provider.rules[0].match.node_kind"),
    ({"rules": [{"name": "a", "familes": ["m5"]}]}, "provider.rules[0].familes"),
    ({"unavailable_ttl_s": "3m"}, "provider.unavailable_ttl_s"),
    ({"exclud": {}}, "provider.exclud"),
])
def test_provider_errors_name_the_key(provider, key):
    with pytest.raises(ConfigError) as e:
        load_provider(dict(BASE, **provider))
    assert e.value.key == key


def test_gpu_names_are_one_vocabulary():
    req = resolver(exclude={"gpus": ["nvidia-tesla-k80", "tesla m60"]}).request("w", {"GPU": 1}, {}, False)
    assert req.requirements.exclude_gpus == {"K80", "M60"}


# ----- CLI ---------------------------------------------------------------------------------------------------

def test_must_show_command_picks_the_published_instance():
    out = CliRunner().invoke(main, ["plan", "--cloud", "aws", "--region", "us-west-2", "--cpu", "16", "--gpu", "1",
                                    "--memory", "64", "--family", "g4dn", "--capacity", "on-demand"])
    assert out.exit_code == 0, out.output
    assert "g4dn.4xlarge" in out.output.splitlines()[0] and "$1.2040/h" in out.output.splitlines()[0]


def test_plan_json_keys():
    out = CliRunner().invoke(main, ["plan", "--cloud", "gcp", "--region", "us-central1", "--cpu", "4", "--gpu", "1",
                                    "--capacity", "spot", "--capacity", "on-demand", "--exclude-gpu", "K80", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    for k in ("instance_type", "zone", "capacity", "hourly_price", "rule", "catalog_id", "alternatives", "rejected"):
        assert k in doc
    assert doc["capacity"] == "spot" and doc["alternatives"][0].keys() >= {"instance_type", "zone", "hourly_price"}
    assert doc["rule"] == "command-line" and doc["gpu_model"] != "K80" and doc["gpu_count"] >= 1
    assert doc["catalog_id"] == load_catalog("embedded").catalog_id


@pytest.mark.parametrize("name", ["aws-gpu-head.yaml", "aws-cpu-head.yaml", "gcp-gpu-head.yaml", "gcp-cpu-head.yaml",
                                  "local-gpu-head.yaml", "local-cpu-head.yaml"])
def test_plan_cluster_configs(name):
    out = CliRunner().invoke(main, ["plan", str(ROOT / "cluster-configs" / name), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    head = doc["node_types"][doc["head_node_type"]]
    worker = doc["node_types"]["gpu_worker"]
    assert head["capacity"] == "on-demand" and worker["capacity"] == "spot"
    assert worker["gpu_model"] not in ("M60", "K80")
    assert doc["summary"]["idle_cost_per_hour"] == pytest.approx(head["hourly_price"])
    if name in ("aws-gpu-head.yaml", "local-gpu-head.yaml"):
        assert head["instance_type"] == "g4dn.4xlarge" and head["hourly_price"] == 1.204
    elif name == "gcp-gpu-head.yaml":
        assert (head["gpu_model"], head["gpu_count"], head["vcpus"]) == ("T4", 1, 16)
    else:
        assert head["gpu_count"] == 0 and head["hourly_price"] <= 0.452   # no worse than the published m5d.2xlarge
    assert worker["memory_gib"] >= 15
    # byte-identical output on a second run in a fresh interpreter
    again = subprocess.run([sys.executable, "-m", "ray_nodeless.cli.main", "plan", str(ROOT / "cluster-configs" / name),
                            "--json"], capture_output=True, text=True, check=True)
    assert again.stdout.strip() == out.output.strip()


def test_bad_input_exits_2_with_the_key():
    out = CliRunner().invoke(main, ["plan", "--cloud", "aws", "--region", "us-west-2", "--gpu", "1",
                                    "--gpu-model", "K80"])
    assert out.exit_code == 2 and "Nearest offerings" in out.output
    out = CliRunner().invoke(main, ["plan", "--cloud", "aws", "--region", "mars-1", "--cpu", "1"])
    assert out.exit_code == 2 and "mars-1" in out.output
    out = CliRunner().invoke(main, ["plan", "--cpu", "1"])
    assert out.exit_code == 2 and "--cloud" in out.output


def test_catalog_list_json():
    out = CliRunner().invoke(main, ["catalog", "list", "--cloud", "aws", "--region", "us-east-1", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    o = doc["offerings"][0]
    assert set(o) >= {"instance_type", "family", "vcpus", "memory_gib", "gpu_model", "gpu_count", "arch", "burstable",
                      "region", "zone", "capacity", "hourly_price"}
    assert any(x["hourly_price"] is None for x in doc["offerings"])
    # Every offering of the region, from the catalog, in its ranking order.
    cat = load_catalog("embedded")
    assert (doc["catalog_id"], doc["cloud"], doc["region"]) == (cat.catalog_id, "aws", "us-east-1")
    assert doc["offerings"] == [o.to_dict() for o in cat.region("aws", "us-east-1").offerings()]
    assert {x["region"] for x in doc["offerings"]} == {"us-east-1"}
