"""`ray-nodeless plan` on a shape-open cluster states its real ceiling (issue 31): max_workers machines at the
dearest offering a demand may get under the rules, plus the head, or `max_hourly_cost` when it is lower; not the
head's price alone."""
from __future__ import annotations

import json
import re

import yaml
from click.testing import CliRunner

from ray_nodeless.cli import main
from ray_nodeless.core.catalog import embedded
from tests import REPO_ROOT

NODELESS = REPO_ROOT / "cluster-configs" / "aws-nodeless.yaml"
LINE = re.compile(r"ceiling: \$([\d.]+)/h \(head \$([\d.]+)/h \+ max_workers (\d+) x the dearest allowed offering, "
                  r"(\S+) (\S+) (\S+) \$([\d.]+)/h\)")


def _plan(path, *extra: str):
    r = CliRunner().invoke(main, ["plan", str(path), *extra])
    assert r.exit_code == 0, r.output
    return r.output


def test_the_ceiling_is_max_workers_times_the_dearest_allowed_offering():
    out = _plan(NODELESS)
    m = LINE.search(out)
    assert m, out
    ceiling, head, n, name, zone, capacity, price = m.groups()
    cfg = yaml.safe_load(NODELESS.read_text())
    assert int(n) == cfg["max_workers"] == 12
    assert abs(float(ceiling) - (float(head) + 12 * float(price))) < 1e-3
    # A real offering of the region at its catalog price, dearer than every fit the menu shows, and far above the
    # head's price (what `plan` reported before).
    o = embedded().region("aws", "us-west-2").find(name, zone, capacity)
    assert o is not None and abs(o.hourly_price - float(price)) < 1e-4
    menu_prices = [float(p) for p in re.findall(r"us-west-2\w\s+(?:spot|on-demand)\s+([\d.]+)\s", out)]
    assert menu_prices and max(menu_prices) <= float(price)
    assert float(ceiling) > 100 * float(head)


def test_a_cost_cap_is_the_ceiling_and_json_says_so(tmp_path):
    cfg = yaml.safe_load(NODELESS.read_text())
    cfg["provider"]["max_hourly_cost"] = 40
    path = tmp_path / "capped.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert "ceiling: $40.0000/h (provider.max_hourly_cost; head $" in _plan(path)
    doc = json.loads(_plan(path, "--json"))
    assert doc["summary"]["ceiling_cost_per_hour"] == 40
    assert doc["summary"]["ceiling"].startswith("provider.max_hourly_cost; head $")
