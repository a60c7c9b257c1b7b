"""The monitor's learned idle release (launch/idle_release.py) under the real Ray autoscaler (v2, `ray up`) on the
local backend: once a worker type's gap was longer than a launch, its next idle worker is drained through Ray's
idle drain and ended at once, not after the type's break-even timeout Ray itself applies.

The break-even here is `provider.idle.expected_launch_s` = 25 s (Ray v2's per-type idle_timeout_s, written by
bootstrap_config), the release "at once" `learn_min_gap_s` = 2 s after the machine went idle.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ray_nodeless.metrics.events import events_path, read_log
from tests.e2e.clusters import cluster_copy, end_local_cluster, ray_up, write_config
from tests.e2e.test_e2e_local import _driver, _machines, _wait

pytestmark = pytest.mark.e2e

BREAK_EVEN_S = 25
GPU_TASK = """
@ray.remote(num_gpus=1)
def work():
    time.sleep(4)               # long enough for the idle lane (every second) to see the node busy
    return node_of()
m = ray.get(work.remote())
print("RESULT " + json.dumps({"machine": m, "ended_at": time.time()}))
"""


def test_after_a_long_gap_the_next_idle_worker_is_ended_at_once_not_after_the_break_even(tmp_path: Path):
    events = tmp_path / "events"
    cfg = cluster_copy("local-cpu-head.yaml", "learn", state_dir=str(tmp_path / "state"),
                       idle={"expected_launch_s": BREAK_EVEN_S, "learn_min_gap_s": 2},
                       metrics={"events_dir": str(events), "port": None})
    cfg["idle_timeout_minutes"] = 5              # Ray's cluster-wide cap: above the break-even
    cfg["available_node_types"]["head"]["resources"] = {"CPU": 0, "GPU": 0}
    path = write_config(cfg, tmp_path)
    try:
        ray_up(path)
        # 1. A GPU task; its worker then idles, and Ray ends it after the break-even: nothing is known yet.
        first = _driver(cfg, GPU_TASK)
        _wait(lambda: first["machine"] not in _machines(cfg), 90, "Ray's idle termination of the first worker")
        first_life = time.time() - first["ended_at"]
        assert first_life >= BREAK_EVEN_S - 2
        log = events_path(cfg["cluster_name"], str(events))
        assert not [e for e in read_log(log) if e.kind == "idle_release"]
        # 2. Work comes back after more than a launch: that gap was long. The next worker's idle time is cut.
        second = _driver(cfg, GPU_TASK)
        assert second["machine"] != first["machine"]
        _wait(lambda: second["machine"] not in _machines(cfg), 60, "the second worker's end")
        second_life = time.time() - second["ended_at"]
        assert second_life < BREAK_EVEN_S - 10, (first_life, second_life)
        # The event is written once the terminate call returned, a moment after the machine left the listing.
        evs = _wait(lambda: [e for e in read_log(log) if e.kind == "idle_release"], 20, "the idle_release event")
        [ev] = evs
        assert ev.fields["machine"] == second["machine"] and ev.fields["node_type"] == "gpu_worker"
        assert ev.fields["timeout_s"] == 2.0 and "recent idle gaps were longer than a launch" in ev.message
        print(json.dumps({"first_idle_s": round(first_life, 1), "second_idle_s": round(second_life, 1)}))
    finally:
        end_local_cluster(cfg)
