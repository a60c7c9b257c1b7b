"""Every command group through `ray-nodeless` itself: exit status and output, for good input and bad.

The commands of README.md and docs/ are run as written (against the repo's cluster configs and trace), so a change
that breaks one of them fails here (tests/docs/test_docs_commands.py runs every one of them).
"""
from __future__ import annotations

import json
import time
from importlib.metadata import entry_points

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli import main
from ray_nodeless.core.cluster_plan import load_catalog, load_cluster_yaml, plan_cluster
from ray_nodeless.providers.base import TAG_CAPACITY, TAG_CLUSTER, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_RULE, TAG_ZONE
from ray_nodeless.providers.base import Machine
from ray_nodeless.testing import fake_backend
from tests import REPO_ROOT

ROOT = REPO_ROOT


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_entry_point_is_the_group():
    """pyproject's `ray-nodeless = ray_nodeless.cli:main` must resolve to the group with every command on it."""
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "ray-nodeless"]
    assert ep.value == "ray_nodeless.cli:main"
    assert ep.load() is main
    r = run("--help")
    assert r.exit_code == 0, r.output
    commands = r.output.split("Commands:")[1].split()
    assert [c for c in commands if c in main.commands] == ["catalog", "convert", "kuberay-autoscaler", "plan",
                                                           "simulate", "status", "sweep", "trace"]


# -- plan --------------------------------------------------------------------------------------------------------

def test_plan_cluster_text_matches_the_planner():
    r = run("plan", str(ROOT / "cluster-configs" / "aws-gpu-head.yaml"))
    assert r.exit_code == 0, r.output
    cp = plan_cluster(load_cluster_yaml(ROOT / "cluster-configs" / "aws-gpu-head.yaml"))
    lines = r.output.splitlines()
    name = load_cluster_yaml(ROOT / 'cluster-configs' / 'aws-gpu-head.yaml')['cluster_name']
    assert lines[0] == f"cluster {name}: " \
                       f"aws us-west-2, catalog {cp.catalog_id}"
    head = cp.plans[cp.head_node_type].chosen
    # The head comes first, tagged with its role, then the workers with their bounds.
    assert lines[1].startswith(f"[head] {cp.head_node_type}: ") and f"-> {head.instance_type.name} " in lines[1]
    assert any(line.startswith("[workers 0..") and "gpu_worker: " in line for line in lines)
    assert lines[-1] == (f"idle cost: ${cp.cost.idle_cost_per_hour:.4f}/h (head + min_workers); "
                         f"ceiling: ${cp.cost.ceiling_cost_per_hour:.4f}/h (at max_workers)")


def test_plan_cluster_and_adhoc_shape_together_is_bad_input():
    r = run("plan", str(ROOT / "cluster-configs" / "aws-gpu-head.yaml"), "--cloud", "aws")
    assert r.exit_code == 2
    assert r.output == "ray-nodeless: error: --cloud/--region: give either CLUSTER_YAML or an ad-hoc shape, not both\n"


# -- catalog -----------------------------------------------------------------------------------------------------

def test_catalog_info():
    cat = load_catalog("embedded")
    r = run("catalog", "info")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == f"{cat.catalog_id} (sha256 {cat.sha256}), data of {cat.built}"
    assert lines[1:] == [f"  {c}: {', '.join(cat.regions(c))}" for c in cat.clouds]
    j = run("catalog", "info", "--json")
    assert j.exit_code == 0, j.output
    assert json.loads(j.output) == {"catalog_id": cat.catalog_id, "sha256": cat.sha256, "built": cat.built,
                                    "regions": {c: cat.regions(c) for c in cat.clouds}}


def test_catalog_list_text():
    rc = load_catalog("embedded").region("aws", "us-east-1")
    r = run("catalog", "list", "--cloud", "aws", "--region", "us-east-1")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].endswith(f": aws us-east-1, {len(rc)} offerings")
    assert lines[1].split() == ["instance_type", "vcpus", "mem_gib", "gpu", "arch", "zone", "capacity", "usd_per_hour"]
    assert len(lines) == 2 + len(rc)
    first = next(iter(rc.offerings()))
    assert lines[2].split()[0] == first.instance_type.name and lines[2].split()[5] == first.zone
    # Unknown prices print as such, never as a number.
    assert any(line.split()[-1] == "unknown" for line in lines[2:])


def test_catalog_list_unknown_region_is_bad_input():
    r = run("catalog", "list", "--cloud", "aws", "--region", "mars-1")
    assert r.exit_code == 2
    assert r.output.startswith("ray-nodeless: error: ") and "no aws region 'mars-1'" in r.output


def test_catalog_refresh_gcp_needs_a_project():
    r = run("catalog", "refresh", "--cloud", "gcp", "--region", "us-central1")
    assert r.exit_code == 2
    assert r.output == "ray-nodeless: error: --project-id: is required\n"


# -- status ------------------------------------------------------------------------------------------------------

@pytest.fixture
def fake_cluster(tmp_path):
    """A cluster on the in-memory backend (`provider.cloud: fake`) with a head and one spot worker, launched an
    hour ago, and one machine of another cluster that status must not show."""
    cloud = fake_backend.reset()
    now = time.time()

    def machine(mid: str, cluster: str, kind: str, node_type: str, itype: str, cap: str, price: str) -> None:
        cloud.machines[mid] = Machine(id=mid, tags={
            TAG_CLUSTER: cluster, "ray-node-type": kind, "ray-user-node-type": node_type, TAG_INSTANCE_TYPE: itype,
            TAG_ZONE: "us-west-2a", TAG_CAPACITY: cap, TAG_PRICE: price, TAG_RULE: "r"}, launched_at=now - 3600)

    machine("fake-w", "c1", "worker", "gpu_worker", "g6.xlarge", "spot", "0.5")
    machine("fake-h", "c1", "head", "head", "m5.large", "on-demand", "0.1")
    machine("fake-x", "other", "worker", "gpu_worker", "g6.xlarge", "spot", "0.5")
    doc = {"cluster_name": "c1", "provider": {"type": "external", "module": "ray_nodeless.NodelessProvider",
                                              "cloud": "fake", "simulate_cloud": "aws", "region": "us-west-2"},
           "available_node_types": {"head": {"resources": {"CPU": 2}, "node_config": {}}},
           "head_node_type": "head"}
    path = tmp_path / "c1.yaml"
    path.write_text(yaml.safe_dump(doc))
    yield str(path)
    fake_backend.reset()


def test_status_lists_the_clusters_machines(fake_cluster):
    r = run("status", fake_cluster)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("cluster c1: 2 machine(s), $0.6000/h, $0.6")
    # The head first; every row names the instance, capacity, price and rule.
    assert lines[1].split()[:7] == ["fake-h", "head", "head", "m5.large", "us-west-2a", "on-demand", "$0.1000/h"]
    assert lines[2].split()[:7] == ["fake-w", "worker", "gpu_worker", "g6.xlarge", "us-west-2a", "spot", "$0.5000/h"]
    assert lines[2].split()[-2:] == ["rule", "r"] and len(lines) == 3
    j = run("status", fake_cluster, "--json")
    assert j.exit_code == 0, j.output
    doc = json.loads(j.output)
    assert [n["node_id"] for n in doc["nodes"]] == ["fake-h", "fake-w"]
    assert doc["hourly_cost"] == 0.6 and doc["accumulated_cost"] == pytest.approx(0.6, abs=0.01)


def test_status_errors_name_the_key(tmp_path):
    r = run("status", str(tmp_path / "missing.yaml"))
    assert r.exit_code == 2
    assert r.output.startswith(f"ray-nodeless: error: {tmp_path / 'missing.yaml'}: cannot read cluster YAML")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"cluster_name": "c", "provider": {"cloud": "azure", "region": "x"}}))
    r = run("status", str(bad))
    assert r.exit_code == 2
    assert r.output.startswith("ray-nodeless: error: provider.cloud: 'azure' is not one of")


# -- simulate and trace, as docs/cost.md runs them --------------------------------------------------------------------

def test_docs_simulate_json_command():
    r = run("simulate", str(ROOT / "examples" / "traces" / "automl-published.yaml"),
            "--config", str(ROOT / "cluster-configs" / "aws-cpu-head.yaml"), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert list(doc["configurations"]) == ["aws-cpu-head"]
    c = doc["configurations"]["aws-cpu-head"]
    assert c["kind"] == "autoscaled" and c["schedule"] == "parallel" and c["workload_cost"] > c["lower_bound_cost"] > 0


def test_trace_record_needs_out():
    r = run("trace", "record")
    assert r.exit_code == 2      # click's own usage error
    assert "Missing option '--out'" in r.output
