"""dashboards/ray-nodeless.json: a valid Grafana dashboard whose every query names metrics the provider exports,
and whose queries Prometheus's own parser accepts (`promtool check rules`, from scripts/prometheus/install.sh)."""
from __future__ import annotations

import json
import re
import subprocess

import yaml

from ray_nodeless.metrics.registry import Metrics
from tests import REPO_ROOT
from tests.metrics.prometheus import prometheus_bin

DASHBOARD = REPO_ROOT / "dashboards" / "ray-nodeless.json"
METRIC = re.compile(r"\bray_nodeless_[a-z_]+\b")
# What issue 20 asks the dashboard to show, by the metric that shows it.
SHOWN = ["ray_nodeless_hourly_cost_dollars", "ray_nodeless_cost_dollars_total", "ray_nodeless_launches_total",
         "ray_nodeless_launch_fallbacks_total", "ray_nodeless_capacity_errors_total", "ray_nodeless_machines",
         "ray_nodeless_interruptions_total", "ray_nodeless_cost_cap_refusals_total"]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(d: dict) -> list[str]:
    return [t["expr"] for p in d["panels"] for t in p["targets"]]


def test_it_is_a_grafana_dashboard():
    d = dashboard()
    assert d["title"] and d["uid"] and isinstance(d["schemaVersion"], int)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and len(ids) >= len(SHOWN)
    for p in d["panels"]:
        assert p["type"] in ("stat", "timeseries"), p["title"]
        assert p["datasource"]["type"] == "prometheus" and p["targets"], p["title"]
        assert set(p["gridPos"]) == {"x", "y", "w", "h"} and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
    names = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "job"} <= names
    # Every panel's datasource is the dashboard's variable (imports into any Grafana with a Prometheus).
    assert {p["datasource"]["uid"] for p in d["panels"]} == {"${datasource}"}


def test_every_query_names_only_exported_metrics_and_every_topic_is_shown():
    exported = set(Metrics().metric_names())
    used = set()
    for expr in queries(dashboard()):
        names = set(METRIC.findall(expr))
        assert names, expr
        assert names <= exported, (expr, sorted(names - exported))
        used |= names
    assert set(SHOWN) <= used


def test_prometheus_parses_every_query(tmp_path):
    promtool = prometheus_bin("promtool")
    exprs = [e.replace("$job", ".*") for e in queries(dashboard())]      # Grafana's variable, as "All" sets it
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": e}
                                                        for i, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    out = subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in out.stdout + out.stderr
