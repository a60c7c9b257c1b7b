#!/usr/bin/env python3
"""Planning memory against the number of node types: `ray-nodeless plan` and what `ray up` runs before the head.

    .venv/bin/python benches/bench_plan_memory.py                                  # 10, 100, 1000 node types
    .venv/bin/python benches/bench_plan_memory.py --sizes 100,1000 --baseline-rev 0790a7a

Each figure is a fresh interpreter planning one generated cluster YAML (`cloud: local`, priced from the AWS
us-west-2 catalog; a 2-CPU head and N-1 workers), measured with tracemalloc (peak of Python allocations, numpy's
included) from just before the call to its end; imports and a first plan of a one-worker YAML (which loads the
catalog) come before, so the figure is what the node types cost. Two paths:
- `plan`: `ray-nodeless plan YAML` (the CLI, in a process without numpy: the planner's plain-Python path);
- `bootstrap`: what `ray up` runs before anything launches: Ray's `prepare_config` + `validate_config`, then the
  provider's `fillout_available_node_types_resources` and `bootstrap_config` (numpy imported, as under Ray).
Three mixes of shapes: every worker the same shape (`one`), 40 shapes repeated (`40`), every worker its own shape
(`distinct`: CPU 1..32 x memory 1..32 GiB). `--baseline-rev` runs the same in a temporary git worktree of an earlier
commit (removed afterwards), interleaved with this tree.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
MIXES = ("one", "40", "distinct")

CHILD = r'''
import io, json, sys, time, tracemalloc, contextlib
mode, small, big = sys.argv[1:4]
if mode == "plan":
    from ray_nodeless.cli import main
    def run(path):
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                main(["plan", path])
            except SystemExit as e:
                assert not e.code, e.code
else:
    import copy, yaml
    from ray.autoscaler._private.util import prepare_config, validate_config
    from ray_nodeless.ray_adapter.provider import NodelessProvider
    def run(path):
        config = prepare_config(yaml.safe_load(open(path)))
        validate_config(config)
        config = NodelessProvider.fillout_available_node_types_resources(config)
        NodelessProvider.bootstrap_config(config)
run(small)
tracemalloc.start()
t = time.perf_counter()
run(big)
wall = time.perf_counter() - t
_, peak = tracemalloc.get_traced_memory()
print("RESULT", json.dumps({"peak": peak, "wall": wall, "numpy": "numpy" in sys.modules}))
'''


def shape(i: int, mix: str) -> dict:
    if mix == "one":
        return {"CPU": 4}
    if mix == "40":
        return {"CPU": 1 + i % 40 % 32, "memory": (1 + i % 40 // 32) * 2 ** 30}
    return {"CPU": 1 + i % 32, "memory": (1 + i // 32 % 32) * 2 ** 30}


def cluster_yaml(path: Path, workers: int, mix: str) -> str:
    types = {"head": {"resources": {"CPU": 2}, "node_config": {}, "max_workers": 0}}
    for i in range(workers):
        types[f"w{i}"] = {"resources": shape(i, mix), "node_config": {}, "max_workers": 1}
    doc = {"cluster_name": "mem", "max_workers": workers, "head_node_type": "head",
           "provider": {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "local",
                        "region": "us-west-2"},
           "auth": {"ssh_user": "ray"}, "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
           "file_mounts": {}, "cluster_synced_files": [], "initialization_commands": [],
           "head_start_ray_commands": [], "worker_start_ray_commands": [], "idle_timeout_minutes": 5,
           "available_node_types": types}
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def measure(tree: Path, mode: str, small: str, big: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    r = subprocess.run([sys.executable, "-c", CHILD, mode, small, big], cwd=tree, env=env, capture_output=True,
                       text=True)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (r.stderr.strip().splitlines() or ["?"])[-1]
    return {"error": tail[:160]}


def cell(m: dict) -> str:
    if "error" in m:
        return f"error: {m['error']}"
    return f"{m['peak'] / 2 ** 20:,.1f} MiB, {m['wall']:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,100,1000", help="node types per YAML (head included)")
    ap.add_argument("--modes", default="plan,bootstrap")
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--baseline-rev", default=None, help="also run an earlier commit, in a temporary worktree")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    trees = [("this tree", ROOT)]
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        if args.baseline_rev:
            base = tmpd / "baseline"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline_rev],
                           check=True, capture_output=True)
            trees.append((f"baseline {args.baseline_rev}", base))
        try:
            small = cluster_yaml(tmpd / "small.yaml", 1, "one")
            print("| path | shapes | node types | " + " | ".join(name for name, _ in trees) + " |")
            print("|---|---|---|" + "---|" * len(trees))
            for mode in args.modes.split(","):
                for mix in args.mixes.split(","):
                    for n in sizes:
                        big = cluster_yaml(tmpd / f"{mix}-{n}.yaml", n - 1, mix)
                        cells = [cell(measure(tree, mode, small, big)) for _, tree in trees]
                        print(f"| {mode} | {mix} | {n:,} | " + " | ".join(cells) + " |", flush=True)
        finally:
            if args.baseline_rev:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmpd / "baseline")],
                               capture_output=True)


if __name__ == "__main__":
    main()
