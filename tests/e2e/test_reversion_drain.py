"""The drain step of on-demand -> spot reversion against a real Ray: a private head plus two local worker nodes (the
on-demand fallback and its spot replacement, each a `ray start --address` with its cloud instance id). Ray refuses
the idle drain (`RayDrainer.drain_idle`, reason IDLE_TERMINATION) while the fallback runs a task, the task finishes
there with its result, and once the node is idle Ray accepts the drain.

And the whole loop in Ray's monitor (`ray up` of a local cluster, autoscaler v2): the provider there reverts the
idle on-demand fallback to spot and leaves the busy one running until its task is done.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ray_nodeless.interruptions.drain import NODE_ALIVE
from ray_nodeless.testing.ray_processes import wait_for
from tests.e2e.clusters import ray_head_with_workers, ray_monitor

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
    with ray_head_with_workers(tmp_path / "nodes", (OD, "gpu_worker", {"CPU": 1}),
                               (SPOT, "gpu_worker", {"CPU": 1})) as ray_nodes:
        gcs, drainer = ray_nodes.gcs, ray_nodes.drainer
        driver = None
        try:
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


# ----- the whole loop in Ray's monitor ------------------------------------------------------------------------------

WORK = textwrap.dedent("""
    import os, sys, time
    import ray
    gcs, d = sys.argv[1:3]
    ray.init(address=gcs, logging_level="ERROR", log_to_driver=False)

    @ray.remote(num_gpus=1, num_cpus=1, max_retries=0)    # no retry: a task killed with its node fails the driver
    def work():
        me = os.environ["RAY_CLOUD_INSTANCE_ID"]
        open(os.path.join(d, "started"), "w").write(me)
        while not os.path.exists(os.path.join(d, "go")):
            time.sleep(0.05)
        return me

    print("RAN_ON", ray.get(work.remote(), timeout=300))
""")


def _workers(cfg: dict) -> dict[str, dict]:
    from ray_nodeless.providers.local.backend import LocalBackend
    backend = LocalBackend.from_provider(dict(cfg["provider"]), cfg["cluster_name"])
    return {m.id: dict(m.tags) for m in backend.list_machines() if m.tags.get("ray-node-type") == "worker"}


def _reversion_log(gcs_port: int) -> str:
    try:
        log = (ray_monitor(gcs_port)[0] / "monitor.log").read_text(errors="replace")
    except (AssertionError, OSError) as e:
        return f"(no monitor.log: {e})"
    return "\n".join(ln for ln in log.splitlines() if "reversion" in ln or "fallback" in ln)[-4000:]


@pytest.mark.timeout(420)
def test_ray_monitor_reverts_the_idle_fallback_to_spot_and_waits_for_the_busy_one(tmp_path: Path):
    """`ray up` of a local cluster (autoscaler v2) whose spot launches all fail: Ray's monitor brings up its two
    min_workers on demand (fallbacks). A task runs on one of them. Spot comes back: the provider in the monitor
    launches a spot machine per fallback, drains the idle fallback through Ray (accepted) and terminates it; Ray
    refuses the drain of the busy one, which keeps running until its task finished there; then it goes too. The
    worker count never drops under min_workers, and `ray down` leaves nothing."""
    from ray_nodeless.providers.local.scoped_stop import stop_marked_processes
    from ray_nodeless.providers.local.backend import LocalBackend
    from tests.e2e.clusters import BIN, RAY_ENV, cluster_copy, end_local_cluster, write_config

    cfg = cluster_copy("local-cpu-head.yaml", "revert", state_dir=str(tmp_path / "state"), unavailable_ttl_s=2,
                       unavailable_backoff_cap_s=2,     # a fixed 2 s: this test is about reversion, not the backoff
                       reversion={"min_age_s": 0, "interval_s": 1, "max_in_flight": 2})
    cfg["idle_timeout_minutes"] = 5          # nothing here is scaled down by Ray while the test runs
    cfg["max_workers"] = 4
    cfg["available_node_types"]["head"]["resources"] = {"CPU": 0, "GPU": 0}
    cfg["available_node_types"]["gpu_worker"].update(min_workers=2, max_workers=4)
    path = write_config(cfg, tmp_path)
    state = tmp_path / "state"
    state.mkdir(parents=True)
    (state / "faults.json").write_text(json.dumps([{"capacity": "spot", "code": "InsufficientInstanceCapacity"}]))
    gcs, port = cfg["provider"]["gcs_address"], int(cfg["provider"]["gcs_address"].rsplit(":", 1)[1])
    d = tmp_path / "d"
    d.mkdir()
    driver = None
    try:
        up = subprocess.run([str(BIN / "ray"), "up", "-y", str(path)], env=RAY_ENV, capture_output=True, text=True,
                            timeout=240)
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        fallbacks = wait_for(lambda: len(_workers(cfg)) == 2 and sorted(_workers(cfg)), 180,
                             "the two min_workers, launched on demand")
        for mid in fallbacks:
            tags = _workers(cfg)[mid]
            assert (tags["nodeless-capacity"], tags.get("nodeless-fallback-from")) == ("on-demand", "spot"), tags
        driver = subprocess.Popen([sys.executable, "-c", WORK, gcs, str(d)], env=RAY_ENV, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        wait_for(lambda: (d / "started").exists() and (d / "started").read_text(), 120, "the task on a fallback")
        busy = (d / "started").read_text()
        [idle] = [m for m in fallbacks if m != busy]

        (state / "faults.json").write_text("[]")             # spot is back
        counts: list[int] = []

        def idle_replaced() -> bool:
            w = _workers(cfg)
            counts.append(len(w))
            return idle not in w and any(t["nodeless-capacity"] == "spot" for t in w.values())

        wait_for(idle_replaced, 180, "the idle fallback replaced by spot", interval=1.0)
        # Ray refused the idle drain of the busy one, which still runs its task. (Refused, the provider either
        # waits with that spot machine or retires the idle fallback with it, whichever flight got there first.)
        wait_for(lambda: (f"Ray refused to drain {busy}" in _reversion_log(port)
                          or f"in place of busy {busy}" in _reversion_log(port)), 120,
                 "Ray refusing to drain the busy fallback", interval=1.0)
        assert busy in _workers(cfg), _reversion_log(port)
        assert driver.poll() is None and not (d / "go").exists()
        (d / "go").touch()                                   # the task finishes, on the busy fallback
        out, err = driver.communicate(timeout=120)
        assert driver.returncode == 0, err[-2000:]
        assert f"RAN_ON {busy}" in out                       # its work done where it ran, never lost
        def busy_replaced() -> bool:
            w = _workers(cfg)
            counts.append(len(w))
            return busy not in w

        wait_for(busy_replaced, 120, "the busy fallback, idle now, replaced too", interval=1.0)
        final = _workers(cfg)
        assert sorted(t["nodeless-capacity"] for t in final.values()) == ["spot", "spot"], final
        counts.append(len(final))
        assert min(counts) >= 2                              # never below min_workers (sampled each second)
        # The provider terminates a fallback, then logs the replacement (terminating a local machine stops its
        # processes, so the listing can show it gone seconds before the line is written).
        def both_logged() -> bool:
            log = _reversion_log(port)
            return f"on-demand {idle} replaced by spot" in log and f"on-demand {busy} replaced by spot" in log

        wait_for(both_logged, 60, "both replacements in the monitor log", interval=1.0)
        log = _reversion_log(port)
        assert not [ln for ln in log.splitlines() if "never joined Ray" in ln or "reversion tick failed" in ln], log

        backend = LocalBackend.from_provider(dict(cfg["provider"]), cfg["cluster_name"])
        down = subprocess.run([str(BIN / "ray"), "down", "-y", str(path)], env=RAY_ENV, capture_output=True,
                              text=True, timeout=180)
        assert down.returncode == 0, down.stderr[-2000:]
        assert not [m for m in backend.list_machines()]
        assert stop_marked_processes(backend.runner_marker) == 0, "ray down left processes behind"
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        end_local_cluster(cfg)
