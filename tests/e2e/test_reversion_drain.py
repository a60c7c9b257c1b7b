"""The drain step of on-demand -> spot reversion against a real Ray: a private head plus two local worker nodes (the
on-demand fallback and its spot replacement, each a `ray start --address` with its cloud instance id). Ray refuses
the idle drain (`RayDrainer.drain_idle`, reason IDLE_TERMINATION) while the fallback runs a task, the task finishes
there with its result, and once the node is idle Ray accepts the drain.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ray_nodeless.interruptions.drain import NODE_ALIVE, RayDrainer
from ray_nodeless.providers.local.processes import LocalNodeProcesses
from ray_nodeless.testing.ray_processes import ray_head, stop_everything, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

OD, SPOT = "i-0000000000000od01", "i-000000000000spot1"
DRIVER = textwrap.dedent("""
    import json, os, sys, time
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    gcs, target, d = sys.argv[1:4]
    ray.init(address=gcs, logging_level="ERROR", log_to_driver=False)

    @ray.remote(num_cpus=1, max_retries=0)
    def work():
        open(os.path.join(d, "started"), "w").close()
        while not os.path.exists(os.path.join(d, "go")):
            time.sleep(0.05)
        return ray.get_runtime_context().get_node_id()

    ref = work.options(scheduling_strategy=NodeAffinitySchedulingStrategy(target, soft=False)).remote()
    json.dump({"ran_on": ray.get(ref, timeout=180)}, open(os.path.join(d, "result.json"), "w"))
""")


def test_ray_refuses_the_idle_drain_of_a_busy_fallback_and_accepts_it_when_idle(tmp_path: Path):
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        with ray_head() as gcs:
            nodes = LocalNodeProcesses(tmp_path / "nodes", gcs, prewarm=True)
            driver = None
            try:
                nodes.start(OD, "gpu_worker", {"CPU": 1}, {})
                nodes.start(SPOT, "gpu_worker", {"CPU": 1}, {})
                drainer = RayDrainer(gcs)
                wait_for(lambda: drainer.find(instance_id=OD) and drainer.find(instance_id=SPOT), 60,
                         "both workers in the GCS node table")
                od = drainer.find(instance_id=OD)
                (tmp_path / "d").mkdir()
                driver = subprocess.Popen([sys.executable, "-c", DRIVER, gcs, od.node_id, str(tmp_path / "d")],
                                          env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                wait_for(lambda: (tmp_path / "d" / "started").exists(), 90, "the task running on the fallback")
                accepted, why = drainer.drain_idle(od, "replaced by spot machine " + SPOT)
                assert not accepted and why                                   # busy: Ray says no
                assert drainer.find(instance_id=OD).state == NODE_ALIVE       # and nothing changed
                (tmp_path / "d" / "go").touch()
                driver.wait(timeout=120)
                result = json.loads((tmp_path / "d" / "result.json").read_text())
                assert result["ran_on"] == od.node_id                         # the work finished where it ran
                # Idle now (Ray may take a moment to see the worker lease returned): the drain is accepted.
                wait_for(lambda: drainer.drain_idle(drainer.find(instance_id=OD), "replaced")[0], 60,
                         "Ray accepting the idle drain")
                wait_for(lambda: (drainer.find(instance_id=OD) is None
                                  or drainer.find(instance_id=OD).state != NODE_ALIVE), 60,
                         "the fallback's node draining or gone")
                assert drainer.find(instance_id=SPOT).state == NODE_ALIVE     # the replacement untouched
            finally:
                if driver is not None and driver.poll() is None:
                    driver.kill()
                stop_everything(nodes)
    finally:
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved
