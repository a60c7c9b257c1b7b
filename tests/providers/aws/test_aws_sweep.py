"""`ray-nodeless sweep` against EC2 (moto, through real boto3): the cluster's instances end, workers then head; an
instance of another cluster and an untagged one survive; --dry-run ends nothing; a refused TerminateInstances
exits 1 naming the instances, and a rerun finishes. The cluster YAML's rules cannot plan any more (a rule tightened
since launch): the sweep does not care."""
from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli.sweep import sweep_command
from ray_nodeless.operate.sweep import Sweep
from ray_nodeless.providers.base import TAG_CLUSTER, TAG_TERMINATING
from ray_nodeless.testing.moto_server import REGION, MotoServer, ec2_error, install
from tests.helpers import cluster_config, write_cluster_yaml
from tests.providers.aws.helpers import (
    CLUSTER, G4, all_instances, live, make_backend, make_spec, offering, tags_of,
)


@pytest.fixture
def fleet(moto: MotoServer, tmp_path):
    """c1: a head (m5.large on-demand) and two g4dn spot workers; `other`: one worker; one untagged instance."""
    b = make_backend(moto)
    head_spec = make_spec()
    head_spec.tags.update({"ray-node-type": "head", "ray-user-node-type": "head"})
    [head] = b.launch(head_spec)
    workers = b.launch(make_spec(offering(G4, capacity="spot"), count=2))
    [foreign] = make_backend(moto, cluster="other").launch(make_spec(cluster="other"))
    untagged = moto.client().run_instances(ImageId=moto.ami(), InstanceType="t3.micro", MinCount=1,
                                           MaxCount=1)["Instances"][0]["InstanceId"]
    b.close()
    doc = cluster_config({"cloud": "aws", "region": REGION, "endpoint_url": moto.url, "image_id": moto.ami(),
                          "aws_credentials": {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"},
                          "rules": [{"name": "tightened", "match": {}, "instance_types": ["no-such-type.*"]}]},
                         name=CLUSTER)
    return {"yaml": write_cluster_yaml(tmp_path / "c1.yaml", doc), "config": doc, "head": head,
            "workers": sorted(workers), "foreign": foreign, "untagged": untagged}


def run(*args: str):
    return CliRunner().invoke(sweep_command, list(args))


def live_ids(moto: MotoServer) -> set[str]:
    return {i["InstanceId"] for i in live(moto)}


def test_dry_run_lists_the_clusters_instances_and_ends_nothing(moto: MotoServer, fleet):
    before = live_ids(moto)
    r = run(fleet["yaml"], "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [t["id"] for t in doc["targets"]] == fleet["workers"] + [fleet["head"]]
    w = doc["targets"][0]
    assert (w["node_kind"], w["instance_type"], w["zone"], w["capacity"], w["hourly_price"]) == \
        ("worker", "g4dn.xlarge", "us-east-1a", "spot", 0.096)
    assert w["state"] in ("pending", "running") and w["uptime_s"] is not None
    assert doc["targets"][2]["node_kind"] == "head" and doc["dry_run"] is True and doc["ended"] == []
    assert live_ids(moto) == before
    assert not any(TAG_TERMINATING in tags_of(i) for i in live(moto))


def test_sweep_ends_the_cluster_only(moto: MotoServer, fleet):
    r = run(fleet["yaml"], "-y")
    assert r.exit_code == 0, r.output
    assert live_ids(moto) == {fleet["foreign"], fleet["untagged"]}
    ended = ", ".join(f"machine {i}" for i in fleet["workers"] + [fleet["head"]])
    assert f"ended 3: {ended}" in r.output
    survivors = {i["InstanceId"]: tags_of(i) for i in live(moto)}
    assert survivors[fleet["foreign"]][TAG_CLUSTER] == "other" and TAG_TERMINATING not in survivors[fleet["foreign"]]
    assert TAG_CLUSTER not in survivors[fleet["untagged"]]
    r = run(fleet["yaml"], "-y")
    assert r.exit_code == 0 and f"cluster {CLUSTER}: nothing to end" in r.output


def test_a_refused_terminate_exits_1_and_a_rerun_finishes(moto: MotoServer, fleet):
    sweep = Sweep(yaml.safe_load(open(fleet["yaml"])))
    try:
        refused = install(sweep.backend.ec2, "TerminateInstances",
                          lambda req, n: ec2_error(req, "UnauthorizedOperation", "not allowed", 403))
        result = sweep.run()
    finally:
        sweep.close()
    assert refused.calls >= 1 and not result.ok
    assert {f["id"] for f in result.failures} == set(fleet["workers"] + [fleet["head"]])
    assert all("UnauthorizedOperation" in f["error"] for f in result.failures)
    assert live_ids(moto) == set(fleet["workers"]) | {fleet["head"], fleet["foreign"], fleet["untagged"]}
    r = run(fleet["yaml"], "-y", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["ok"] is True
    assert live_ids(moto) == {fleet["foreign"], fleet["untagged"]}


def test_the_cli_exits_1_naming_the_instances_when_terminate_is_refused(moto: MotoServer, fleet, monkeypatch):
    """Through the command: every TerminateInstances refused (botocore's event system, for every client)."""
    import botocore.session

    real = botocore.session.Session.create_client

    def create_client(self, *a, **kw):
        c = real(self, *a, **kw)
        if c.meta.service_model.service_name == "ec2":
            install(c, "TerminateInstances", lambda req, n: ec2_error(req, "UnauthorizedOperation", "no", 403))
        return c
    monkeypatch.setattr(botocore.session.Session, "create_client", create_client)
    r = run(fleet["yaml"], "-y")
    assert r.exit_code == 1
    for i in fleet["workers"] + [fleet["head"]]:
        assert f"NOT ENDED machine {i}: terminate failed" in r.output
    assert f"sweep of cluster {CLUSTER} incomplete (3 not ended)" in r.output
    assert len(live_ids(moto)) == 5


def test_sweep_ends_a_stopped_instance_of_the_cluster(moto: MotoServer, fleet):
    """Issue 16.10: a stopped instance is not a Ray node (not listed) but is tagged with the cluster and costs EBS
    money: sweep ends it too (a backend leftover), and a --workers-only sweep keeps a stopped head."""
    b = make_backend(moto)
    [stopped] = b.launch(make_spec())
    head_spec = make_spec()
    head_spec.tags.update({"ray-node-type": "head", "ray-user-node-type": "head"})
    [stopped_head] = b.launch(head_spec)
    b.close()
    moto.client().stop_instances(InstanceIds=[stopped, stopped_head])
    r = run(fleet["yaml"], "-y", "--workers-only")
    assert r.exit_code == 0, r.output
    assert f"stopped-instance {stopped}" in r.output
    states = {i["InstanceId"]: i["State"]["Name"] for i in all_instances(moto)}
    assert states[stopped] == "terminated" and states[stopped_head] == "stopped"
    r = run(fleet["yaml"], "-y")
    assert r.exit_code == 0, r.output
    states = {i["InstanceId"]: i["State"]["Name"] for i in all_instances(moto)}
    assert states[stopped_head] == "terminated"
    assert live_ids(moto) == {fleet["foreign"], fleet["untagged"]}
