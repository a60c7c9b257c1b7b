"""Timeline figure of replays: nodes up and cumulative cost over time (matplotlib, the `plot` extra)."""
from __future__ import annotations

from ray_nodeless.simulate.results import SimResult
from ray_nodeless.trace.model import MS_PER_HOUR


def plot_results(results: list[SimResult], out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(10, 2.4 * len(results) + 0.6), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        series = r.node_count_series()
        xs = [t / MS_PER_HOUR for t, _ in series]
        ys = [c for _, c in series]
        ax.step(xs, ys, where="post", color="tab:blue", label="nodes up")
        ax.set_ylabel("nodes")
        ax.set_ylim(0, max(ys + [1]) + 1)
        ax.set_title(f"{r.config.label} ({r.config.schedule}): {r.elapsed_hours:.2f} h, ${r.workload_cost:.2f}",
                     fontsize=9)
        # Cumulative cost: piecewise linear between the node-count change points.
        times = sorted({0} | {t for t, _ in series} | {r.elapsed_ms})
        cum, acc = [], 0.0
        for i, t in enumerate(times):
            if i:
                t0 = times[i - 1]
                mid = (t0 + t) / 2
                rate = sum(n.offer.hourly_price for n in r.nodes
                           if n.launch_ms <= mid < (n.end_ms if n.end_ms is not None else r.elapsed_ms))
                acc += rate * (t - t0) / MS_PER_HOUR
            cum.append(acc)
        ax2 = ax.twinx()
        ax2.plot([t / MS_PER_HOUR for t in times], cum, color="tab:red", label="cumulative cost")
        ax2.set_ylabel("USD", color="tab:red")
    axes[-1, 0].set_xlabel("hours")
    fig.tight_layout()
    fig.savefig(out, dpi=100, metadata={"Software": None})
    plt.close(fig)
