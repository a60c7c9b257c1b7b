"""Provider objects of one cluster in several processes of one machine, launching at the same moment (two monitors
on one head: an old one not yet stopped and a new one), on the real AWS backend against moto: what the cloud runs
afterwards against `max_hourly_cost`. Used by tests/launch/test_cost_reservation.py and
benches/bench_several_objects.py.

`shared=True`: the processes share one events dir, so one cost-cap ledger (launch/shared_holds.py), as objects on
one machine do; `shared=False`: each its own, as objects on different machines (no ledger between them).

Run as a module, it is one of those processes: `python -m ray_nodeless.testing.several_objects CONFIG GO NAME`
builds the provider, prints `ready`, waits for the file GO, launches COUNT x the GPU shape and prints its answer
as JSON (`{"ids": [...]}` or `{"refused": category}`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray_nodeless.providers.base import TAG_CLUSTER, TAG_PRICE

CLUSTER = "c1"
GPU: dict[str, float] = {"CPU": 4, "GPU": 1}
COUNT = 6
TAGS = {"ray-node-type": "worker", "ray-node-status": "uninitialized", "ray-node-name": "ray-c1-worker",
        "ray-launch-config": "abc", "ray-user-node-type": "gpu"}


@dataclass(frozen=True)
class Outcome:
    answers: list[dict[str, Any]]       # each process's answer, in process order
    prices: list[float]                 # of every machine the cloud runs for the cluster afterwards

    @property
    def cost(self) -> float:
        return sum(self.prices)


def launch_at_once(config: dict[str, Any], processes: int, work: Path, *, shared: bool, ec2: Any,
                   quiet: bool = False) -> Outcome:
    """`processes` provider objects in as many processes launch COUNT GPU machines each at the same moment.
    `config`: an aws provider block against moto (with `max_hourly_cost`); `ec2`: a boto3 client of that moto;
    `quiet`: the processes' logs are dropped (a bench's table stays readable)."""
    go = work / "go"
    go.unlink(missing_ok=True)
    procs = []
    for i in range(processes):
        events = work / ("events" if shared else f"events-{i}")
        cfg = dict(config, events_dir=str(events))
        procs.append(subprocess.Popen([sys.executable, "-m", __name__, json.dumps(cfg), str(go), str(i)],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if quiet else None,
                                      text=True, env=dict(os.environ)))
    try:
        for p in procs:
            line = p.stdout.readline().strip() if p.stdout is not None else ""
            if line != "ready":
                raise RuntimeError(f"a launcher process did not start: {line!r}")
        go.touch()
        answers = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    running = [i for r in ec2.describe_instances(Filters=[
        {"Name": f"tag:{TAG_CLUSTER}", "Values": [CLUSTER]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"] for i in r["Instances"]]
    return Outcome(answers=answers, prices=[float({t["Key"]: t["Value"] for t in i.get("Tags", [])}[TAG_PRICE])
                                            for i in running])


def main(argv: list[str]) -> None:
    from ray.autoscaler.node_launch_exception import NodeLaunchException

    from ray_nodeless.ray_adapter.provider import NodelessProvider

    config, go, name = json.loads(argv[0]), Path(argv[1]), argv[2]
    p = NodelessProvider(config, CLUSTER)
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.002)
    try:
        made = p.create_node_with_resources_and_labels({}, dict(TAGS, **{"ray-launch-request": f"proc-{name}"}),
                                                       COUNT, GPU, {})
        print(json.dumps({"ids": sorted(made or ())}), flush=True)     # a dict (id -> tags) or a list of ids
    except NodeLaunchException as e:
        print(json.dumps({"refused": e.category}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
