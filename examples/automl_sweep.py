#!/usr/bin/env python3
"""A small hyper-parameter search in the shape of the published Ludwig AutoML experiment.

Every trial needs one GPU (`num_gpus=1`), and trials are stopped early by successive halving: all trials run the
first rung, the better half goes on, and so on. So GPU demand rises to the number of trials and falls as they are
stopped, which is what makes a right-sizing provisioner pay off.

    python examples/automl_sweep.py --address 127.0.0.1:6391 [--trials 6] [--rung-seconds 4]

The "training" fits a small ridge regression on synthetic data with numpy for the trial's learning rate and
regularisation, and sleeps to stand in for GPU time (this machine has no GPU; the GPU is a logical resource).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time

import ray


@ray.remote(num_gpus=1, num_cpus=1, max_retries=3)
def train(trial: int, lr: float, l2: float, epochs: int, seconds: float) -> dict:
    import os

    import numpy as np

    rng = np.random.default_rng(trial)
    x = rng.normal(size=(512, 16))
    w_true = np.linspace(-1, 1, 16)
    y = x @ w_true + rng.normal(scale=0.1, size=512)
    w = np.zeros(16)
    for _ in range(epochs * 20):
        grad = x.T @ (x @ w - y) / len(y) + l2 * w
        w -= lr * grad
    time.sleep(seconds)   # stands in for GPU training time
    loss = float(np.mean((x @ w - y) ** 2))
    return {"trial": trial, "loss": loss if math.isfinite(loss) else float("inf"),
            "instance": os.environ.get("RAY_CLOUD_INSTANCE_ID", "?")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", default="auto")
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--rung-seconds", type=float, default=4.0)
    ap.add_argument("--reduction", type=int, default=2, help="keep 1/reduction of the trials at each rung")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    rng = random.Random(args.seed)
    configs = {t: {"lr": 10 ** rng.uniform(-3, -0.5), "l2": 10 ** rng.uniform(-4, -1)} for t in range(args.trials)}
    alive = sorted(configs)
    rung = 0
    history = []
    while alive:
        epochs = 2 ** rung
        seconds = args.rung_seconds * (rung + 1)
        print(f"[sweep] rung {rung}: {len(alive)} trial(s) x {{GPU: 1}} for {seconds:.0f} s each", flush=True)
        t0 = time.time()
        results = ray.get([train.remote(t, configs[t]["lr"], configs[t]["l2"], epochs, seconds) for t in alive])
        results.sort(key=lambda r: (r["loss"], r["trial"]))
        for r in results:
            print(f"[sweep]   trial {r['trial']}: loss {r['loss']:.4f} on {r['instance']}", flush=True)
        history.append({"rung": rung, "trials": len(alive), "seconds": round(time.time() - t0, 1)})
        if len(alive) == 1:
            best = results[0]
            print(f"[sweep] best trial {best['trial']}: lr={configs[best['trial']]['lr']:.4g} "
                  f"l2={configs[best['trial']]['l2']:.4g} loss={best['loss']:.4f}", flush=True)
            break
        alive = sorted(r["trial"] for r in results[:max(1, len(alive) // args.reduction)])
        rung += 1
    print("[sweep] " + json.dumps({"rungs": history}), flush=True)


if __name__ == "__main__":
    main()
