"""`ray-nodeless sweep` on the in-memory backend (`provider.cloud: fake`): what it lists, what it ends and in what
order, what it never touches, confirmation, --dry-run, --workers-only, --json, and a failing terminate that exits 1
and is finished by a rerun. The provider code runs unchanged; only the cloud is in memory."""
from __future__ import annotations

import json
import time

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli import main
from ray_nodeless.errors import BackendError
from ray_nodeless.providers.base import (
    TAG_CAPACITY, TAG_CLUSTER, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_RULE, TAG_TERMINATING, TAG_ZONE, Machine,
)
from ray_nodeless.testing import fake_backend
from tests.helpers import cluster_config, write_cluster_yaml


def run(*args: str):
    return CliRunner().invoke(main, ["sweep", *args])


@pytest.fixture
def cloud():
    c = fake_backend.reset()
    yield c
    fake_backend.reset()


def machine(cloud, mid: str, cluster: str | None, kind: str, itype: str = "g6.xlarge", cap: str = "spot",
            price: str = "0.5", age_s: float = 3600) -> None:
    tags = {"ray-node-type": kind, "ray-user-node-type": "gpu_worker" if kind == "worker" else "head",
            TAG_INSTANCE_TYPE: itype, TAG_ZONE: "us-west-2a", TAG_CAPACITY: cap, TAG_PRICE: price, TAG_RULE: "r"}
    if cluster is not None:
        tags[TAG_CLUSTER] = cluster
    cloud.machines[mid] = Machine(id=mid, tags=tags, launched_at=time.time() - age_s)


@pytest.fixture
def cluster(cloud, tmp_path):
    """Cluster c1 (a head and two spot workers), a machine of cluster `other`, and an untagged one. The YAML's
    rules were tightened since launch so that nothing can be planned any more: a sweep must not care."""
    machine(cloud, "fake-h", "c1", "head", "m5.large", "on-demand", "0.1")
    machine(cloud, "fake-w1", "c1", "worker")
    machine(cloud, "fake-w2", "c1", "worker", age_s=60)
    machine(cloud, "fake-x", "other", "worker")
    machine(cloud, "fake-u", None, "worker")
    return write_cluster_yaml(tmp_path / "c1.yaml", cluster_config(
        {"cloud": "fake", "simulate_cloud": "aws", "region": "us-west-2",
         "rules": [{"name": "tightened", "match": {}, "instance_types": ["no-such-type.*"]}]}))


def ended(cloud) -> list[tuple]:
    return [(name, arg) for name, arg in cloud.call_log if name == "terminate"]


def test_planning_is_impossible_but_the_sweep_ends_everything_of_the_cluster_only(cloud, cluster):
    plan = CliRunner().invoke(main, ["plan", cluster])
    # the rules cannot plan any more (a pattern that matches no instance type, named before planning)
    assert plan.exit_code == 2 and "provider.rules[0].instance_types[0]" in plan.output
    r = run(cluster, "-y")
    assert r.exit_code == 0, r.output
    # Workers in one batched call, then the head; each marked as ended by us first.
    assert ended(cloud) == [("terminate", ("fake-w1", "fake-w2")), ("terminate", ("fake-h",))]
    marks = [arg for name, arg in cloud.call_log if name == "set_tags"]
    assert marks == ["fake-w1", "fake-w2", "fake-h"]
    first_terminate = [n for n, _ in cloud.call_log].index("terminate")
    assert [n for n, _ in cloud.call_log][:first_terminate].count("set_tags") == 2
    # The other cluster's machine and the untagged one are still there.
    assert sorted(cloud.machines) == ["fake-u", "fake-x"]
    assert TAG_TERMINATING not in cloud.machines["fake-x"].tags
    assert "ended 3: machine fake-w1, machine fake-w2, machine fake-h" in r.output
    # A second sweep finds nothing.
    r = run(cluster, "-y")
    assert r.exit_code == 0 and "cluster c1: nothing to end" in r.output
    assert len(ended(cloud)) == 2


def test_dry_run_lists_every_column_and_ends_nothing(cloud, cluster):
    r = run(cluster, "--dry-run")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "cluster c1: would end: 3 machine(s) ($1.1000/h), 0 other resource(s)"
    # Workers first, then the head: id, node kind, node type, instance type, zone, capacity, state, uptime, price.
    rows = [line.split() for line in lines[1:4]]
    assert [r[1] for r in rows] == ["fake-w1", "fake-w2", "fake-h"]
    assert rows[0][:8] == ["machine", "fake-w1", "worker", "gpu_worker", "g6.xlarge", "us-west-2a", "spot",
                           "running"]
    assert rows[0][8] == "up" and 3590 <= float(rows[0][9].rstrip("s")) <= 3700 and rows[0][10] == "$0.5000/h"
    assert rows[2][:8] == ["machine", "fake-h", "head", "head", "m5.large", "us-west-2a", "on-demand", "running"]
    assert lines[-1] == "dry run: nothing ended"
    assert ended(cloud) == [] and not [c for c in cloud.call_log if c[0] == "set_tags"]
    assert len(cloud.machines) == 5
    j = run(cluster, "--dry-run", "--json")
    assert j.exit_code == 0, j.output
    doc = json.loads(j.output)
    assert doc["dry_run"] is True and doc["ok"] is True and doc["ended"] == [] and doc["kept"] == []
    assert doc["hourly_cost"] == 1.1
    assert [t["id"] for t in doc["targets"]] == ["fake-w1", "fake-w2", "fake-h"]
    assert {k: doc["targets"][2][k] for k in ("kind", "node_kind", "instance_type", "zone", "capacity", "state",
                                               "hourly_price")} == {
        "kind": "machine", "node_kind": "head", "instance_type": "m5.large", "zone": "us-west-2a",
        "capacity": "on-demand", "state": "running", "hourly_price": 0.1}
    assert ended(cloud) == [] and len(cloud.machines) == 5


def test_without_yes_and_no_terminal_it_refuses_and_ends_nothing(cloud, cluster):
    r = run(cluster)
    assert r.exit_code == 2
    assert ("ray-nodeless: error: --yes: refusing to end 3 thing(s) of cluster c1 without confirmation: stdin is "
            "not a terminal (pass -y, or --dry-run to list only)") in r.output
    assert ended(cloud) == [] and len(cloud.machines) == 5


def test_workers_only_keeps_the_head(cloud, cluster):
    r = run(cluster, "--workers-only", "-y", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["workers_only"] is True
    assert doc["ended"] == ["machine fake-w1", "machine fake-w2"]
    assert [t["id"] for t in doc["kept"]] == ["fake-h"]
    assert sorted(cloud.machines) == ["fake-h", "fake-u", "fake-x"]
    assert "sweep: terminating 2 machine(s): fake-w1, fake-w2" in r.stderr     # progress, off stdout
    assert run(cluster, "--keep-head", "-y").exit_code == 0 and "fake-h" in cloud.machines


def test_a_failing_terminate_exits_1_naming_the_machines_and_a_rerun_finishes(cloud, cluster):
    cloud.next_errors["terminate"] = [BackendError("UnauthorizedOperation: not allowed", category="Unauthorized")]
    r = run(cluster, "-y")
    assert r.exit_code == 1, r.output
    assert "NOT ENDED machine fake-w1: terminate failed: UnauthorizedOperation: not allowed" in r.output
    assert "NOT ENDED machine fake-w2: terminate failed" in r.output
    assert "sweep of cluster c1 incomplete (2 not ended)" in r.output
    assert "ended 1: machine fake-h" in r.output          # the rest went on
    assert sorted(cloud.machines) == ["fake-u", "fake-w1", "fake-w2", "fake-x"]
    r = run(cluster, "-y", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["ended"] == ["machine fake-w1", "machine fake-w2"] and doc["failures"] == []
    assert sorted(cloud.machines) == ["fake-u", "fake-x"]


def test_a_terminate_the_cloud_accepted_but_did_not_do_is_reported(cloud, cluster, monkeypatch):
    """The cloud still shows fake-w1 after its terminate returned (to the listing and to the lookup by id the
    verify step asks): not claimed as ended, exit 1."""
    from ray_nodeless.core import ttls
    monkeypatch.setattr(ttls, "SWEEP_VERIFY_S", 0.0)
    monkeypatch.setattr(ttls, "TEARDOWN_WATCH_S", 0.0)   # no watch for late machines: the verify step alone
    w1 = cloud.machines["fake-w1"]

    def comes_back() -> None:
        if any(name == "terminate" for name, _ in cloud.call_log):
            cloud.machines.setdefault("fake-w1", w1)
            cloud.gone.pop("fake-w1", None)
    cloud.hooks["list"] = cloud.hooks["recheck"] = comes_back
    r = run(cluster, "-y", "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["failures"] == [{"kind": "machine", "id": "fake-w1", "error": "still listed after terminate"}]
    assert doc["ended"] == ["machine fake-w2", "machine fake-h"] and doc["ok"] is False


def test_a_failed_listing_ends_nothing_and_says_so(cloud, cluster):
    cloud.list_failures = 1
    r = run(cluster, "-y")
    assert r.exit_code == 1
    assert r.output.startswith("ray-nodeless: error: RequestLimitExceeded")
    assert ended(cloud) == [] and len(cloud.machines) == 5


def test_bad_input_is_exit_2(tmp_path):
    r = run(str(tmp_path / "missing.yaml"))
    assert r.exit_code == 2 and "cannot read cluster YAML" in r.output
    nameless = tmp_path / "nameless.yaml"
    nameless.write_text(yaml.safe_dump({"provider": {"cloud": "fake", "simulate_cloud": "aws", "region": "us-west-2"}}))
    r = run(str(nameless), "--dry-run")
    assert r.exit_code == 2
    assert r.output == ("ray-nodeless: error: cluster_name: missing: a sweep ends only what is tagged with the "
                        "cluster's name\n")
