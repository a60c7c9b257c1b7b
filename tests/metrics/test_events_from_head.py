"""`ray-nodeless status CLUSTER_YAML --events` away from the head: the head's log is read on the head through the path
`ray exec` takes (Ray's exec_cluster, our provider's command runner). A local cluster's head is this machine with its
own home (`<state_dir>/home`, what the monitor's `~` is), so reading it needs that runner, not this process's HOME.
No Ray is started: the head is a machine record, and only its log is read."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli.main import main as cli
from ray_nodeless.metrics.events import (
    EVENTS_DIR_ENV, EventLog, head_events_path, head_read_command, head_read_output,
)
from ray_nodeless.operate.status import events_document
from ray_nodeless.providers.base import TAG_CLUSTER
from ray_nodeless.providers.local.backend import LocalBackend
from tests import REPO_ROOT

CLUSTER = "ev-head"
HEAD_TAGS = {TAG_CLUSTER: CLUSTER, "ray-node-type": "head", "ray-user-node-type": "head",
             "ray-node-status": "up-to-date", "ray-node-name": f"ray-{CLUSTER}-head",
             "nodeless-instance-type": "m5.large", "nodeless-zone": "us-west-2a", "nodeless-capacity": "on-demand",
             "nodeless-hourly-price": "0.096", "nodeless-rule": "head-on-demand"}


@pytest.fixture
def local(tmp_path: Path, monkeypatch):
    # This process's home and events dir are empty: the log exists only in the head's home.
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    monkeypatch.delenv(EVENTS_DIR_ENV, raising=False)
    doc = yaml.safe_load((REPO_ROOT / "cluster-configs" / "local-cpu-head.yaml").read_text())
    doc["cluster_name"] = CLUSTER
    doc["provider"].update(state_dir=str(tmp_path / "state"), gcs_address="127.0.0.1:6399", local_prewarm=False)
    backend = LocalBackend.from_provider(dict(doc["provider"]), CLUSTER)
    backend.nodes.add_placeholder("local-head1", "head", "127.0.0.1", dict(HEAD_TAGS))
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    head_log = EventLog(backend.home / ".ray-nodeless" / "events" / f"{CLUSTER}.jsonl")
    yield {"yaml": str(path), "doc": doc, "backend": backend, "log": head_log}
    backend.close()


def test_events_away_from_the_head_read_the_heads_log(local, tmp_path):
    local["log"].append("capacity_error", "gpu_worker: capacity error InsufficientInstanceCapacity on x/y/spot")
    local["log"].append("cost_cap_refusal", "gpu_worker: refused: over provider.max_hourly_cost")
    out = CliRunner().invoke(cli, ["status", local["yaml"], "--events", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["log_source"] == "head" and doc["log_error"] is None, doc
    assert [(e["kind"], e["source"]) for e in doc["events"]] == [
        ("launch", "tags"), ("capacity_error", "log"), ("cost_cap_refusal", "log")]
    text = CliRunner().invoke(cli, ["status", local["yaml"], "--events"]).output
    assert "on the head" in text and " cost_cap_refusal " in text
    assert not (tmp_path / "user-home" / ".ray-nodeless").exists()


def test_a_head_without_a_log_and_a_head_that_cannot_be_reached(local):
    doc = json.loads(CliRunner().invoke(cli, ["status", local["yaml"], "--events", "--json"]).output)
    assert doc["log_found"] is False and doc["log_error"] is None
    assert [e["kind"] for e in doc["events"]] == ["launch"]

    def unreachable(command: str) -> str:
        raise RuntimeError("ssh: connect to host 10.0.0.1 port 22: Connection refused")

    doc = events_document(local["doc"], read_head=unreachable)
    assert "Connection refused" in doc["log_error"] and [e["kind"] for e in doc["events"]] == ["launch"]


def test_the_head_command_and_its_output():
    assert head_events_path("a b") == '"${RAY_NODELESS_EVENTS_DIR:-$HOME/.ray-nodeless/events}"/a_b.jsonl'
    assert head_events_path("c", "~/logs") == '"$HOME"/logs/c.jsonl'
    assert head_events_path("c", "/var/log/rn") == "/var/log/rn/c.jsonl"
    assert "tail -n 2000" in head_read_command("c")
    assert head_read_output("Warning: banner\n--- ray-nodeless events log ---\n{}\n") == "{}"
    assert head_read_output("--- ray-nodeless events log: none ---\n") is None
    with pytest.raises(ValueError):
        head_read_output("bash: no such file\n")
