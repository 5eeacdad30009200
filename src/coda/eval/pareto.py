"""The throughput-versus-tail figure of ``coda compare --pareto``: what each system buys in output
tokens/s for what its slowest tasks and requests pay.

Each system of a comparison is one point per panel, at its mean over seeds with the 95% interval
of both axes (``coda.metrics.mean_ci``); the frontier joins the points no other point beats on
both axes at once (more throughput and a shorter tail).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

THROUGHPUT = "output_tps"
TAILS = (("slowdown_p99", "p99 task slowdown (x its time alone)"), ("ttft_p99_s", "p99 TTFT (s)"))


def frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (tail, throughput) points on the frontier, by increasing tail: each has more
    throughput than every point with a tail as short or shorter."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    best = float("-inf")
    out = []
    for i in order:
        if points[i][1] > best:
            out.append(i)
            best = points[i][1]
    return out


def plot_pareto(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Two panels, output tokens/s against p99 slowdown and against p99 TTFT, one point per row of ``coda compare``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TAILS), figsize=(6 * len(TAILS), 4.2))
    for ax, (tail, label) in zip(axes, TAILS):
        shown = [r for r in rows if r.get(tail) is not None and r.get(THROUGHPUT) is not None]
        for r in shown:
            ax.errorbar(r[tail], r[THROUGHPUT], xerr=r.get(f"{tail}_ci95") or 0, yerr=r.get(f"{THROUGHPUT}_ci95") or 0,
                        marker="o", capsize=3, label=r["system"])
        front = frontier([(r[tail], r[THROUGHPUT]) for r in shown])
        if len(front) > 1:
            ax.step([shown[i][tail] for i in front], [shown[i][THROUGHPUT] for i in front], where="post", color="grey",
                    linestyle="--", linewidth=2, zorder=3, label="frontier")
        elif front:
            ax.scatter([shown[front[0]][tail]], [shown[front[0]][THROUGHPUT]], s=160, facecolors="none", edgecolors="grey",
                       label="frontier")
        ax.set_xlabel(label + ("" if shown else ": no values"))
        ax.set_ylabel("output tokens/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("throughput against tail; bars: 95% interval over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
