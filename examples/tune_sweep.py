#!/usr/bin/env python3
"""A Ray Tune sweep in the shape of the published Ludwig AutoML experiment: ASHA over trials of one GPU each.

Every trial asks `{CPU: 1, GPU: 1}` (Tune reserves it as a one-bundle placement group, which the autoscaler sees as
a demand), and the ASHA scheduler stops the worse trials at its rungs (iterations 1, 2, 4, ...). So GPU demand rises
to the number of trials that can run and falls as they are stopped: what makes a right-sizing provisioner pay off.

    python examples/tune_sweep.py --address 127.0.0.1:6391 [--trials 6] [--max-iterations 8] [--iteration-seconds 2]

Each iteration trains a small ridge regression on synthetic data with numpy (gradient descent, the trial's learning
rate and regularisation) and then sleeps to stand in for GPU time: this machine has no GPU, the GPUs are the local
backend's logical resources. The last line printed is one JSON document (trials, iterations, best config).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.basic_variant import BasicVariantGenerator


def train_ridge(config: dict) -> None:
    """One Tune trial: `max_iterations` reports of the validation loss, each after `epochs_per_iteration` epochs."""
    import numpy as np

    rng = np.random.default_rng(config["seed"])
    x = rng.normal(size=(512, 16))
    w_true = np.linspace(-1, 1, 16)
    y = x @ w_true + rng.normal(scale=0.1, size=512)
    x_val, y_val = x[384:], y[384:]
    x, y = x[:384], y[:384]
    w = np.zeros(16)
    for _ in range(config["max_iterations"]):
        for _ in range(20):
            grad = x.T @ (x @ w - y) / len(y) + config["l2"] * w
            w -= config["lr"] * grad
        time.sleep(config["iteration_seconds"])    # stands in for GPU training time
        loss = float(np.mean((x_val @ w - y_val) ** 2))
        tune.report({"loss": loss if math.isfinite(loss) else 1e30,
                     "instance": os.environ.get("RAY_CLOUD_INSTANCE_ID", "?")})


def run_sweep(trials: int, max_iterations: int, iteration_seconds: float, seed: int, storage: str) -> dict:
    """Runs the sweep on the connected cluster; returns a summary (JSON-able, sorted keys)."""
    scheduler = ASHAScheduler(time_attr="training_iteration", max_t=max_iterations, grace_period=1,
                              reduction_factor=2)
    param_space = {
        "lr": tune.loguniform(1e-3, 0.3),
        "l2": tune.loguniform(1e-4, 1e-1),
        "seed": tune.randint(0, 1_000_000),
        "max_iterations": max_iterations,
        "iteration_seconds": iteration_seconds,
    }
    tuner = tune.Tuner(
        tune.with_resources(train_ridge, {"cpu": 1, "gpu": 1}),
        param_space=param_space,
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=trials, scheduler=scheduler,
                                    # Seeded: the same trials every run (the search is the demo's subject, not luck).
                                    search_alg=BasicVariantGenerator(random_state=seed)),
        run_config=tune.RunConfig(name="tune_sweep", storage_path=storage, verbose=0),
    )
    t0 = time.time()
    grid = tuner.fit()
    best = grid.get_best_result(metric="loss", mode="min")
    rows = []
    for r in grid:
        rows.append({"trial": str(r.metrics.get("trial_id", "?")),
                     "iterations": int(r.metrics.get("training_iteration", 0)),
                     "loss": round(float(r.metrics.get("loss", float("inf"))), 6),
                     "instance": r.metrics.get("instance", "?"),
                     "error": str(r.error)[:200] if r.error else None})
    rows.sort(key=lambda d: (d["loss"], d["trial"]))
    return {"trials": len(rows), "errors": sum(1 for d in rows if d["error"]),
            "iterations": sum(d["iterations"] for d in rows),
            "stopped_early": sum(1 for d in rows if 0 < d["iterations"] < max_iterations),
            "best": {"lr": round(best.config["lr"], 6), "l2": round(best.config["l2"], 6),
                     "loss": round(float(best.metrics["loss"]), 6)},
            "seconds": round(time.time() - t0, 1), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", default="auto")
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--max-iterations", type=int, default=8, help="ASHA's max_t (rungs at 1, 2, 4, ...)")
    ap.add_argument("--iteration-seconds", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--storage", default=None, help="Tune's storage_path (default: a temporary directory, removed)")
    args = ap.parse_args()

    # Tune's own progress tables are noise in the demo's narration; the summary below says what happened.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    storage = args.storage or tempfile.mkdtemp(prefix="nodeless-tune-")
    try:
        summary = run_sweep(args.trials, args.max_iterations, args.iteration_seconds, args.seed, storage)
    finally:
        if args.storage is None:
            shutil.rmtree(storage, ignore_errors=True)
    for d in summary["rows"]:
        print(f"[sweep]   trial {d['trial']}: {d['iterations']} iteration(s), loss {d['loss']:.4f} on "
              f"{d['instance']}" + (f" ERROR {d['error']}" if d["error"] else ""), flush=True)
    b = summary["best"]
    print(f"[sweep] ASHA: {summary['trials']} trials, {summary['stopped_early']} stopped early, "
          f"{summary['iterations']} iterations in {summary['seconds']:.0f} s; best lr={b['lr']:.4g} "
          f"l2={b['l2']:.4g} loss={b['loss']:.4f}", flush=True)
    print("[sweep] " + json.dumps({k: v for k, v in summary.items() if k != "rows"}, sort_keys=True), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
