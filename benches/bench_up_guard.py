"""What the `ray up` start-up guard (ray_nodeless_up_guard.pth) costs each Python start-up, side by side with no hook
in the same run, and what it costs the `ray up` process it checks.

1. Whole start-ups: `python -c pass` in a scratch venv made for this run (python -m venv --without-pip), with the
   checkout's ray_nodeless_up_guard.pth and .py in its site-packages and without them, alternating per round so
   that machine noise falls on both alike. Median and mean of N rounds each.
2. The .pth line alone, in-process (what site.py exec()s for every start-up of a process that is not `ray up`).
3. The check in a `ray up` process with a valid config (the argument parse, yaml.safe_load of the file, the shape
   checks), the cost before Ray runs: refusal() on each shipped cloud config.

    .venv/bin/python benches/bench_up_guard.py [--rounds 200]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import ray_nodeless_up_guard  # noqa: E402

PTH = REPO / "ray_nodeless_up_guard.pth"


def _start_ups(rounds: int) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory(prefix="bench_up_guard_") as tmp:
        venv = Path(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = venv / "bin" / "python"
        site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True).stdout.strip())
        hooked = [site / PTH.name, site / "ray_nodeless_up_guard.py"]
        with_hook, without = [], []

        def once() -> float:
            t = time.perf_counter()
            subprocess.run([str(python), "-c", "pass"], check=True)
            return time.perf_counter() - t

        for _ in range(5):
            once()                                      # warm the page cache
        for i in range(rounds):
            for hook in ((True, False) if i % 2 == 0 else (False, True)):
                if hook:
                    shutil.copy(PTH, hooked[0])
                    shutil.copy(REPO / "ray_nodeless_up_guard.py", hooked[1])
                else:
                    for p in hooked:
                        p.unlink(missing_ok=True)
                (with_hook if hook else without).append(once())
        return with_hook, without


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    with_hook, without = _start_ups(args.rounds)
    ms = lambda xs: f"median {1e3 * statistics.median(xs):.2f} ms, mean {1e3 * statistics.fmean(xs):.2f} ms"  # noqa: E731
    print(f"python -c pass, {args.rounds} rounds alternating (Python {sys.version.split()[0]}):")
    print(f"  with the hook:    {ms(with_hook)}")
    print(f"  without the hook: {ms(without)}")
    print(f"  difference of medians: {1e6 * (statistics.median(with_hook) - statistics.median(without)):+.0f} us")

    line = PTH.read_text().strip()
    saved = sys.argv
    sys.argv = ["/usr/bin/python3", "-c", "pass"]
    try:
        n = 200_000
        per = min(timeit.repeat(lambda: exec(line, {}), number=n, repeat=5)) / n
        empty = min(timeit.repeat(lambda: exec("pass", {}), number=n, repeat=5)) / n
    finally:
        sys.argv = saved
    print(f"the .pth line in-process (not `ray up`): {1e9 * per:.0f} ns per start-up "
          f"(exec of an empty line: {1e9 * empty:.0f} ns)")

    configs = sorted((REPO / "cluster-configs").glob("*.yaml"))
    t = time.perf_counter()
    reps = 20
    for _ in range(reps):
        for c in configs:
            assert ray_nodeless_up_guard.refusal(["ray", "up", "-y", str(c)]) is None, c
    per_config = (time.perf_counter() - t) / (reps * len(configs))
    print(f"the check in a `ray up` process, valid config: {1e3 * per_config:.2f} ms per config "
          f"(mean of {len(configs)} shipped configs x {reps}; yaml.safe_load dominates)")
    print(f"purelib of this interpreter: {sysconfig.get_paths()['purelib']}")


if __name__ == "__main__":
    main()
