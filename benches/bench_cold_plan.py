#!/usr/bin/env python3
"""Cold `ray-nodeless plan CLUSTER_YAML`: this tree against an earlier commit, in the same run, interleaved.

    .venv/bin/python benches/bench_cold_plan.py                          # vs acde165 (before the numpy-free plan)
    .venv/bin/python benches/bench_cold_plan.py --runs 9 --baseline-rev HEAD~3 \
        --config cluster-configs/aws-cpu-head.yaml

Each figure is a fresh interpreter running the whole command (`ray-nodeless plan <config>`, interpreter start-up and
every import included), as a user types it. The baseline commit is checked out into a temporary git worktree
(removed afterwards) and run with the same interpreter and venv; runs alternate baseline / this tree, so a load
change on a shared machine hits both. Reported per config: min and median wall time and median CPU time (user +
system; the steadier figure on a loaded machine), and which cloud SDKs / Ray each imported. Next to them:
- the floor: a bare interpreter, and one that imports only the libraries `plan` needs (pydantic, click, yaml;
  numpy is not imported: the planner's plain-Python path runs in a process without it);
- the peer: what Ray itself pays for the same YAML before `ray up` could launch anything: import Ray's autoscaler
  config path and run its `prepare_config` + `validate_config` on the YAML (no cloud call, no launch).
Target (issue 10): cold plan <= 300 ms on this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ["cluster-configs/aws-gpu-head.yaml", "cluster-configs/gcp-gpu-head.yaml"]
DEFAULT_BASELINE = "acde165"     # the last commit whose plan imported numpy (98463c4: the last that imported boto3)
SDKS = ("boto3", "botocore", "google.cloud.compute_v1", "googleapiclient", "google.auth", "ray", "numpy", "pydantic")

PLAN = ("import json, sys\nfrom ray_nodeless.cli import main\nsys.argv[0] = 'ray-nodeless'\n"
        "try:\n    main({argv!r})\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print('MODULES', json.dumps(sorted(set(m.split('.')[0] if not m.startswith('google.') else m "
        "for m in sys.modules))), file=sys.stderr)\n")
FLOOR = "import click, yaml\nfrom pydantic import BaseModel, Field"   # numpy: not on the plan path any more
PEER = ("import copy, sys, yaml\nfrom ray.autoscaler._private.util import prepare_config, validate_config\n"
        "c = yaml.safe_load(open(sys.argv[1]))\nvalidate_config(prepare_config(copy.deepcopy(c)))")


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s, stderr) of one fresh subprocess."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise SystemExit(f"{argv} in {cwd} failed:\n{r.stderr[-2000:]}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, r.stderr


PYCACHE = Path(tempfile.gettempdir()) / "bench-cold-plan-pycache"


def env_for(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)          # ahead of the venv's editable install of /work/main
    # Bytecode is cached, as in any installed package: with PYTHONDONTWRITEBYTECODE set (as in some shells and
    # CI images) every run would compile all of ray_nodeless from source, about 0.1 s that no user pays twice.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    walls = [w for w, _ in samples]
    return {"wall_min_ms": round(min(walls) * 1000), "wall_median_ms": round(statistics.median(walls) * 1000),
            "cpu_median_ms": round(statistics.median(c for _, c in samples) * 1000),
            "wall_runs_ms": [round(w * 1000) for w in walls]}


def imported(stderr: str) -> list[str]:
    line = [ln for ln in stderr.splitlines() if ln.startswith("MODULES ")][-1]
    mods = set(json.loads(line.split(" ", 1)[1]))
    return sorted(s for s in SDKS if s in mods or any(m.startswith(s + ".") for m in mods))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline-rev", default=DEFAULT_BASELINE)
    ap.add_argument("--config", action="append", help="repeatable; default: the AWS and GCP GPU-head configs")
    args = ap.parse_args()
    configs = args.config or CONFIGS
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-cold-plan-") as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.baseline_rev], cwd=ROOT,
                       check=True)
        try:
            trees = {f"baseline {args.baseline_rev}": base, "this tree": ROOT}
            for tree in trees.values():       # compile each tree's .pyc once, outside the timed runs
                run([py, "-c", PLAN.format(argv=["plan", configs[0]])], tree, env_for(tree))
            result: dict = {"runs": args.runs, "configs": {}}
            for cfg in configs:
                samples: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
                mods: dict[str, list[str]] = {}
                for _ in range(args.runs):
                    for name, tree in trees.items():
                        wall, cpu, err = run([py, "-c", PLAN.format(argv=["plan", cfg])], tree, env_for(tree))
                        samples[name].append((wall, cpu))
                        mods[name] = imported(err)
                result["configs"][cfg] = {name: {**summary(s), "imports": mods[name]} for name, s in samples.items()}
                peer = [run([py, "-c", PEER, cfg], ROOT, env_for(ROOT))[:2] for _ in range(args.runs)]
                result["configs"][cfg]["peer: Ray's own prepare_config + validate_config"] = summary(peer)
            result["floor: python -c pass"] = summary([run([py, "-c", "pass"], ROOT, env_for(ROOT))[:2]
                                                       for _ in range(args.runs)])
            result["floor: import pydantic, click, yaml"] = summary(
                [run([py, "-c", FLOOR], ROOT, env_for(ROOT))[:2] for _ in range(args.runs)])
            result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
