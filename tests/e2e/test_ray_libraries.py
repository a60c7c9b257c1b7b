"""Ray's libraries on a shape-open cluster (cluster-configs/local-nodeless.yaml: no worker node type), through
`ray up` and Ray's v2 autoscaler: they ask for capacity in their own ways, and each must get its cheapest fit.

- Ray Data: a GPU actor pool (`map_batches` of a callable class with `num_gpus=1`): Data's own autoscaler starts
  the pool's actor, whose demand is {GPU: 1} (plus Data's CPU share).
- Ray Tune: two trials of {cpu: 1, gpu: 1} (`tune.with_resources`): a placement group per trial.
- Ray Train: a DataParallelTrainer of two GPU workers (`ScalingConfig(num_workers=2, use_gpu=True)`: a placement
  group of {CPU: 1, GPU: 1} bundles; no framework backend, so no torch).
- Ray Serve: a deployment of two GPU replicas (`ray_actor_options` {num_cpus: 1, num_gpus: 1}), called through its
  handle (no HTTP proxy).
Each machine that served them is the catalog's brute-force cheapest fit for {CPU: 1, GPU: 1} (tests/e2e/cheapest.py),
on the rule the config gives GPU work (a machine the autoscaler launched for one library may serve the next one
while it is not idle long enough to go).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ray_nodeless.providers.base import TAG_INSTANCE_TYPE
from ray_nodeless.providers.local.backend import LocalBackend
from tests.e2e.cheapest import cheapest_fit
from tests.e2e.clusters import BIN, RAY_ENV, cluster_copy, end_local_cluster, write_config

pytestmark = pytest.mark.e2e

DRIVER = """
import json, os, tempfile, ray
from ray import tune
ray.init(address="{gcs}", logging_level="ERROR", log_to_driver=False)

class Where:
    def __call__(self, batch):
        batch["machine"] = [os.environ.get("RAY_CLOUD_INSTANCE_ID", "")] * len(batch["id"])
        return batch

ctx = ray.data.DataContext.get_current()
ctx.enable_progress_bars = False
rows = ray.data.range(8).map_batches(Where, num_gpus=1, concurrency=1, batch_size=4).take_all()
data = sorted({{r["machine"] for r in rows}})

def trial(config):
    tune.report({{"machine": os.environ.get("RAY_CLOUD_INSTANCE_ID", ""), "x": config["x"]}})

tuner = tune.Tuner(tune.with_resources(trial, {{"cpu": 1, "gpu": 1}}),
                   param_space={{"x": tune.grid_search([1, 2])}},
                   run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(), verbose=0))
results = tuner.fit()
assert not results.errors, results.errors
tuned = sorted(r.metrics["machine"] for r in results)

# Ray Train: a data-parallel trainer of two GPU workers (its worker group is a placement group of {{CPU: 1, GPU: 1}}
# bundles); no framework backend, so no torch
from ray.train import RunConfig, ScalingConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer   # Train v2, the default in 2.60
seen = tempfile.mkdtemp()

def loop(config):
    open(os.path.join(config["seen"], str(ray.train.get_context().get_world_rank())), "w").write(
        os.environ.get("RAY_CLOUD_INSTANCE_ID", ""))

DataParallelTrainer(loop, train_loop_config={{"seen": seen}},
                    scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
                    run_config=RunConfig(storage_path=tempfile.mkdtemp())).fit()
trained = sorted(open(os.path.join(seen, f)).read() for f in os.listdir(seen))

# Ray Serve: a deployment of two GPU replicas (replica actors of {{CPU: 1, GPU: 1}}), called through its handle
from ray import serve
serve.start(proxy_location="Disabled")

@serve.deployment(num_replicas=2, ray_actor_options={{"num_cpus": 1, "num_gpus": 1}})
class Replica:
    def __call__(self):
        return os.environ.get("RAY_CLOUD_INSTANCE_ID", "")

handle = serve.run(Replica.bind(), name="gpu", route_prefix=None)
served = sorted({{handle.remote().result(timeout_s=60) for _ in range(40)}})
serve.shutdown()
print("RESULT", json.dumps({{"data": data, "tune": tuned, "train": trained, "serve": served}}))
"""


def test_ray_data_tune_train_and_serve_get_cheapest_fit_machines_on_a_shape_open_cluster(tmp_path: Path):
    cfg = cluster_copy("local-nodeless.yaml", "lib", head_env="RAY_enable_autoscaler_v2=1",
                       state_dir=str(tmp_path / "state"))
    cfg["idle_timeout_minutes"] = 5        # every machine launched is still listed when the test looks
    cfg["provider"]["cost_aware_idle"] = False
    path = write_config(cfg, tmp_path)
    try:
        up = subprocess.run([str(BIN / "ray"), "up", "-y", str(path)], env=RAY_ENV, capture_output=True, text=True,
                            timeout=300)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        run = subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVER.format(gcs=cfg["provider"]["gcs_address"]))],
                             env=RAY_ENV, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-4000:]
        [line] = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
        got = json.loads(line[len("RESULT "):])
        machines = {m.id: m.tags for m in LocalBackend.from_provider(dict(cfg["provider"]),
                                                                     cfg["cluster_name"]).list_machines()}
        _, cheapest = cheapest_fit(cfg, {"CPU": 1, "GPU": 1}, None)
        assert got["data"] and all(m in machines for m in got["data"]), (got, machines)
        for lib in ("tune", "train", "serve"):
            assert got[lib] and all(m in machines for m in got[lib]), (lib, got, machines)
        assert len(got["tune"]) == len(got["train"]) == 2, got
        used = {m for lib in ("data", "tune", "train", "serve") for m in got[lib]}
        for m in used:
            assert machines[m][TAG_INSTANCE_TYPE] in cheapest, (m, machines[m], sorted(cheapest))
        print("\nFIGURES ray libraries: " + "; ".join(f"{lib} on {got[lib]}" for lib in ("data", "tune", "train",
                                                                                          "serve"))
              + ": " + ", ".join(f"{m}={machines[m][TAG_INSTANCE_TYPE]}" for m in sorted(used)))
        down = subprocess.run([str(BIN / "ray"), "down", "-y", str(path)], env=RAY_ENV, capture_output=True,
                              text=True, timeout=240)
        assert down.returncode == 0, down.stderr[-2000:]
    finally:
        end_local_cluster(cfg)
