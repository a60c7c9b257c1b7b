"""A real Prometheus (Debian's 2.42, scripts/prometheus/install.sh) scrapes the monitor of a running local cluster
(`ray up` of cluster-configs/local-cpu-head.yaml). Injected: a capacity error on the first GPU candidate (the local
backend's faults.json), hence a fallback, and a cost-cap refusal (`max_hourly_cost` room for the head and one GPU
worker while `request_resources` asks for two). Checked: Prometheus's query API shows the cost, machines and launch
series with the values `ray-nodeless status` shows at the same moment (same machines, same hourly cost to the
cent); each injected fault is its counter; each is an event in Ray's autoscaler event channel, in `ray-nodeless status
--events` run here (the head's log read through its command runner) and on the head (`ray exec`), and a line of the
provider's block in `ray status`, whose recent failures also list the refused launch."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ray_nodeless.core.cluster_plan import plan_cluster
from ray_nodeless.metrics.ray_status import HEADER as RAY_STATUS_HEADER
from ray_nodeless.providers.local.backend import LocalBackend
from ray_nodeless.testing.clock import wait_for
from ray_nodeless.testing.ray_processes import free_port
from tests.e2e import clusters
from tests.e2e.clusters import BIN, RAY_ENV, cluster_copy, end_local_cluster, write_config
from tests.metrics.prometheus import Prometheus

pytestmark = pytest.mark.e2e


def _status(path: Path, *extra: str) -> dict:
    out = subprocess.run([str(BIN / "ray-nodeless"), "status", str(path), "--json", *extra], env=RAY_ENV,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def _machines(status: dict) -> list[tuple]:
    """A status's machines and prices (not their uptime and cost so far, which move every second)."""
    return sorted((n["node_id"], n["instance_type"], n["capacity"], n["zone"], n["hourly_price"])
                  for n in status["nodes"])


def _scalar(prom: Prometheus, expr: str) -> float:
    result = prom.query(expr)
    return float(result[0]["value"][1]) if result else 0.0


# `ray up` starts autoscaler v2 (Ray 2.60's default for it); v1 is the same head with RAY_enable_autoscaler_v2=0.
# Each lists the refused launch under "Recent failures" its own way: v2 as its node type's LaunchFailed (it keeps
# NodeLaunchException's category out of `ray status`), v1 with the category.
AUTOSCALERS = {"v2": ("", "gpu_worker: LaunchFailed"),
               "v1": ("RAY_enable_autoscaler_v2=0", "gpu_worker: MaxHourlyCostExceeded")}


@pytest.mark.parametrize("autoscaler", sorted(AUTOSCALERS, reverse=True))
def test_prometheus_sees_what_status_shows_and_each_injected_fault(tmp_path, autoscaler):
    metrics_port = free_port()
    head_env, refused_line = AUTOSCALERS[autoscaler]
    cfg = cluster_copy("local-cpu-head.yaml", "prom", state_dir=str(tmp_path / "state"), metrics_port=metrics_port,
                       head_env=head_env, ray_status_events=10)     # the `ray status` block is opt-in
    cfg["available_node_types"]["head"]["resources"] = {"CPU": 0, "GPU": 0}
    cfg["available_node_types"]["gpu_worker"]["max_workers"] = 2
    plans = plan_cluster(cfg).plans
    first, second = plans["gpu_worker"].top(2)
    head_price = plans["head"].chosen.hourly_price
    # Room for the head and one GPU worker (on the fallback's offering), not for a second one.
    cfg["provider"]["max_hourly_cost"] = round(head_price + 1.5 * max(first.hourly_price, second.hourly_price), 4)
    path = write_config(cfg, tmp_path)
    (tmp_path / "state").mkdir(parents=True, exist_ok=True)
    (tmp_path / "state" / "faults.json").write_text(json.dumps([
        {"instance_type": first.instance_type.name, "zone": first.zone, "capacity": first.capacity,
         "code": "InsufficientInstanceCapacity", "times": 1}]))
    gcs_port = int(cfg["provider"]["gcs_address"].rsplit(":", 1)[1])
    prom = None
    try:
        up = subprocess.run([str(BIN / "ray"), "up", "-y", str(path)], env=RAY_ENV, capture_output=True, text=True,
                            timeout=240)
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        prom = Prometheus(tmp_path / "prometheus", [f"127.0.0.1:{metrics_port}"], interval_s=1)
        wait_for(prom.targets_up, 60, "Prometheus to scrape the monitor's endpoint", interval=1.0)

        # One GPU node asked for: it lands after the injected capacity error; then two: the second is over the cap.
        # (In two steps: v1 asks for both machines in one launch call, which the cap refuses whole.)
        def request(n: int) -> None:
            driver = textwrap.dedent(f"""
                import ray
                from ray.autoscaler.sdk import request_resources
                ray.init(address="{cfg['provider']['gcs_address']}", logging_level="ERROR")
                request_resources(bundles=[{{"GPU": 1}}] * {n})
            """)
            out = subprocess.run([sys.executable, "-c", driver], env=RAY_ENV, capture_output=True, text=True,
                                 timeout=120)
            assert out.returncode == 0, out.stderr[-2000:]

        request(1)
        launched = 'sum(ray_nodeless_launches_total{node_type="gpu_worker",result="launched"})'
        wait_for(lambda: _scalar(prom, launched) >= 1, 300, "a GPU launch in Prometheus", interval=1.0)
        request(2)
        try:
            wait_for(lambda: _scalar(prom, 'sum(ray_nodeless_cost_cap_refusals_total{node_type="gpu_worker"})') >= 1,
                     300, "a cost-cap refusal in Prometheus", interval=1.0)
        except AssertionError as e:     # say what the monitor did meanwhile (a slow CI machine's only witness)
            logs, _ = clusters.ray_monitor(gcs_port)
            tail = "".join((logs / n).read_text(errors="replace")[-6000:] for n in ("monitor.log", "monitor.out")
                           if (logs / n).exists())
            raise AssertionError(f"{e}\nlaunches: {prom.query('ray_nodeless_launches_total')}\n"
                                 f"monitor log tail:\n{tail}") from None

        # The same moment: a status, a scrape after it, and the same status again (nothing changed in between).
        def same_moment():
            before = _status(path)
            at = float(subprocess.run(["date", "+%s.%N"], capture_output=True, text=True).stdout)
            wait_for(lambda: _scalar(prom, "max(timestamp(ray_nodeless_hourly_cost_dollars))") > at + 0.5, 30,
                     "a scrape after the status", interval=0.5)
            got = {"cost": _scalar(prom, "sum(ray_nodeless_hourly_cost_dollars)"),
                   "machines": {(r["metric"]["instance_type"], r["metric"]["capacity"], r["metric"]["zone"]):
                                int(float(r["value"][1])) for r in prom.query("ray_nodeless_machines")}}
            return (before, got) if _machines(_status(path)) == _machines(before) else None

        status, got = wait_for(same_moment, 120, "a steady cluster", interval=1.0)
        listed: dict[tuple[str, str, str], int] = {}
        for n in status["nodes"]:
            key = (n["instance_type"], n["capacity"], n["zone"])
            listed[key] = listed.get(key, 0) + 1
        assert got["machines"] == listed
        assert sum(listed.values()) == 2         # the head and the one GPU worker the cap has room for
        assert round(got["cost"], 2) == round(status["hourly_cost"], 2)
        assert got["cost"] == pytest.approx(status["hourly_cost"], abs=1e-6)
        workers = [n for n in status["nodes"] if n["node_type"] == "gpu_worker"]
        assert [(w["instance_type"], w["zone"], w["capacity"]) for w in workers] == [
            (second.instance_type.name, second.zone, second.capacity)]
        assert _scalar(prom, f'sum(ray_nodeless_launches_total{{node_type="gpu_worker",result="launched",'
                             f'capacity="{second.capacity}"}})') == 1
        assert _scalar(prom, f'ray_nodeless_capacity_errors_total{{instance_type="{first.instance_type.name}",'
                             f'zone="{first.zone}",capacity="{first.capacity}",'
                             f'code="InsufficientInstanceCapacity"}}') == 1
        assert _scalar(prom, 'ray_nodeless_launch_fallbacks_total{node_type="gpu_worker"}') == 1
        assert _scalar(prom, "sum(ray_nodeless_unavailable_offerings)") >= 1
        assert _scalar(prom, "ray_nodeless_cost_dollars_total") > 0

        # Events: Ray's autoscaler event channel (what drivers print as `(autoscaler +Ns)`; v2's event file and
        # the monitor log's event-summary lines), `ray-nodeless status --events`, and the refusal in `ray status`.
        logs, script = clusters.ray_monitor(gcs_port)
        assert script.endswith("autoscaler/v2/monitor.py" if autoscaler == "v2" else "autoscaler/_private/monitor.py")
        channel = "\n".join(p.read_text(errors="replace") for p in
                            [logs / "monitor.log", *sorted((logs / "events").glob("event_AUTOSCALER*.log"))]
                            if p.exists())
        assert re.search(r"ray_nodeless: gpu_worker: capacity error InsufficientInstanceCapacity on "
                         + re.escape(f"{first.instance_type.name}/{first.zone}/{first.capacity}"), channel)
        assert "ray_nodeless: gpu_worker: fell back to " + \
            f"{second.instance_type.name}/{second.zone}/{second.capacity}" in channel
        assert "ray_nodeless: gpu_worker: refused:" in channel
        # Away from the head (this process's home has no log): the head's log, read through the head's command
        # runner as `ray exec` does, merged with the machines' decision tags.
        away = _status(path, "--events", "--since", "10m")
        assert away["log_source"] == "head", away
        kinds = [e["kind"] for e in away["events"]]
        for kind in ("capacity_error", "fallback", "launch", "cost_cap_refusal"):
            assert kind in kinds, (kind, kinds)
        # On the head (as for a cloud cluster; a local head's home is the backend's state_dir/home): its log too.
        on_head = subprocess.run([str(BIN / "ray"), "exec", str(path),
                                  "ray-nodeless status ~/ray_bootstrap_config.yaml --events --since 10m"],
                                 env=RAY_ENV, capture_output=True, text=True, timeout=120)
        assert on_head.returncode == 0, on_head.stdout[-2000:] + on_head.stderr[-2000:]
        lines = on_head.stdout.splitlines()
        for kind in ("capacity_error", "fallback", "launch", "cost_cap_refusal"):
            assert any(f" {kind} " in line for line in lines), (kind, on_head.stdout[-3000:])
        ray_status = subprocess.run([str(BIN / "ray"), "status", "--address", cfg["provider"]["gcs_address"]],
                                    env=RAY_ENV, capture_output=True, text=True, timeout=60)
        assert ray_status.returncode == 0, ray_status.stderr[-2000:]
        print(ray_status.stdout)
        recent = ray_status.stdout.split("Recent failures:", 1)
        assert len(recent) == 2 and refused_line in recent[1], ray_status.stdout
        # Our recent decisions, after Ray's report: the capacity error, the fallback and the refusal each a line.
        block = ray_status.stdout.split(RAY_STATUS_HEADER, 1)
        assert len(block) == 2, ray_status.stdout
        shown = {line.split()[1]: line for line in block[1].splitlines() if len(line.split()) > 2}
        assert f"{first.instance_type.name}/{first.zone}/{first.capacity}" in shown["capacity_error"], block[1]
        assert f"fell back to {second.instance_type.name}/{second.zone}/{second.capacity}" in shown["fallback"]
        assert "max_hourly_cost" in shown["cost_cap_refusal"], block[1]

        down = subprocess.run([str(BIN / "ray"), "down", "-y", str(path)], env=RAY_ENV, capture_output=True,
                              text=True, timeout=180)
        assert down.returncode == 0, down.stderr[-2000:]
        assert LocalBackend.from_provider(dict(cfg["provider"]), cfg["cluster_name"]).list_machines() == []
    finally:
        if prom is not None:
            prom.stop()
        end_local_cluster(cfg)
