"""benches/bench_metrics.py runs and reports both sides (figures themselves go in BENCHMARKS.md, not asserted)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests import REPO_ROOT


def test_bench_metrics_reports_both_sides():
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    r = subprocess.run([sys.executable, str(REPO_ROOT / "benches" / "bench_metrics.py"), "--machines", "50",
                        "--updates", "5", "--json"], capture_output=True, text=True, cwd=REPO_ROOT, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert (doc["machines"], doc["updates"]) == (50, 5)
    assert doc["update_ms_off"] > 0 and doc["update_ms_on"] > 0 and doc["scrape_ms"] > 0
    assert abs(doc["metrics_ms_per_update"] - (doc["update_ms_on"] - doc["update_ms_off"])) <= 0.002   # rounding
