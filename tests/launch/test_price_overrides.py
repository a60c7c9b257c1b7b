"""`provider.price_overrides` in the launch layer and the commands: the launcher reserves and tags effective prices
(the list price beside them), `ray-nodeless plan` prints both."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from ray_nodeless.cli.main import main as cli
from ray_nodeless.operate.status import list_price_of, price_of
from ray_nodeless.providers.base import TAG_CLUSTER
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from tests.ray_adapter.test_provider import PROVIDER as FAKE, WORKER_TAGS


def test_launched_machines_are_tagged_and_capped_at_effective_prices(tmp_path):
    cloud = fake_backend.reset()
    od = copy.deepcopy(FAKE)
    od["rules"][0]["capacity"] = ["on-demand"]
    listed = 0.526                                            # g4dn.xlarge on demand, us-west-2
    # At the list price a $1.10 cap holds two workers; at the fixed price of $0.35 it holds three.
    prov = dict(od, max_hourly_cost=1.10, launch_retry_backoff_s=0, price_overrides=[
        {"instance_types": ["g4dn.xlarge"], "capacity": ["on-demand"], "hourly_price": 0.35}])
    p = NodelessProvider(copy.deepcopy(prov), "c1")
    for i in range(4):
        try:
            p.create_node_with_resources_and_labels({}, dict(WORKER_TAGS, **{"ray-launch-request": f"r{i}"}), 1,
                                                    {"CPU": 4, "GPU": 1}, {})
        except Exception:   # noqa: BLE001 - the fourth is refused by the cap
            pass
    with cloud.lock:
        machines = [m for m in cloud.machines.values() if m.tags.get(TAG_CLUSTER) == "c1"]
    assert len(machines) == 3
    for m in machines:
        assert price_of(m.tags) == 0.35 and list_price_of(m.tags) == listed
    # `ray-nodeless status` shows both, per machine and for the cluster.
    doc = {"cluster_name": "c1", "provider": prov,
           "available_node_types": {"head": {"resources": {"CPU": 2}, "node_config": {}}}, "head_node_type": "head"}
    path = tmp_path / "c1.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = CliRunner().invoke(cli, ["status", str(path)])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].startswith("cluster c1: 3 machine(s), $1.0500/h (list $1.5780/h)")
    assert all("$0.3500/h (list $0.5260/h)" in x for x in lines[1:4])
    j = json.loads(CliRunner().invoke(cli, ["status", str(path), "--json"]).output)
    assert (j["hourly_cost"], j["list_hourly_cost"]) == (1.05, 1.578)
    assert {(n["hourly_price"], n["list_price"]) for n in j["nodes"]} == {(0.35, 0.526)}
    fake_backend.reset()


def test_plan_prints_the_effective_and_the_list_price(tmp_path):
    cfg = yaml.safe_load(open(Path(__file__).parents[2] / "cluster-configs" / "aws-cpu-head.yaml"))
    cfg["provider"]["rules"][1]["capacity"] = ["on-demand"]
    cfg["provider"]["price_overrides"] = [{"instance_types": ["g4dn.xlarge"], "hourly_price": 0.35}]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = CliRunner().invoke(cli, ["plan", str(path)])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith("[workers"))
    assert "g4dn.xlarge" in line and "$0.3500/h (list $0.5260/h)" in line
    assert "+prices@" in out.output.splitlines()[0]
    assert "[list prices: idle $0.3440/h" in out.output.splitlines()[-1]
