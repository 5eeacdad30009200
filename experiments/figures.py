"""Figures for docs/evaluation.md from the saved experiment results (runs/experiments/*.json)
and the presets' own figures (runs/paper-single, runs/paper-multi).

    python -m experiments.figures        # after the presets, experiments/ablations.py and experiments/routing.py

Writes small PNGs to docs/figures/. Every figure names its workloads, seeds, profile and SLO.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib
import numpy as np

from coda.metrics.requests import mean_ci, ratio_ci
from experiments.common import OUT, ROOT, col

matplotlib.use("Agg")
import matplotlib.pyplot as plt

FIG = ROOT / "docs" / "figures"
FOOT = (
    "seeds 0-4, one A100 worker (profile a100-qwen3coder30b-fp8-roofline), warm-up 1,200 s of 3,600 s; "
    "default SLO TTFT <= 5 s, mean TBT <= 100 ms"
)


def load(name: str) -> dict:
    return json.loads((OUT / f"{name}.json").read_text())


def mci(vals: list[float]) -> tuple[float, float]:
    ci = mean_ci(vals)
    return ci["mean"], ci["ci95"]


def gain(a: list[dict], b: list[dict], key: str) -> tuple[float, float, float]:
    r, lo, hi = ratio_ci(col(a, key), col(b, key))
    return (r - 1) * 100, (r - lo) * 100, (hi - r) * 100


def fig_load() -> Path:
    """Tiered-Aging (shipped and without its guard) vs fewest-blocks across offered load."""
    load_res = load("load")
    wls = ["M1", "M2", "M3", "m9", "m11"]
    rates = [0.75, 1.25, 1.75, 2.25, 2.75]  # a quarter of 3, 5, 7, 9, 11 req/s
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, key, label in ((axes[0], "output_tps", "output tokens/s"), (axes[1], "slo_tps", "SLO-compliant output tokens/s")):
        for system, name, mk in (("cachewise", "cachewise (fewest blocks)", "o-"), ("cachewise+ta", "cachewise+ta (Tiered-Aging)", "s-")):
            m = [mci(col(load_res[f"{w}/default/{system}"], key)) for w in wls]
            ax.errorbar(rates, [x[0] for x in m], yerr=[x[1] for x in m], fmt=mk, capsize=3, label=name)
        ax.set_xlabel("offered load (nominal requests/s on the worker)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[2]
    for key, name, mk in (("output_tps", "output", "o-"), ("slo_tps", "SLO", "s-")):
        g = [gain(load_res[f"{w}/default/cachewise+ta"], load_res[f"{w}/default/cachewise"], key) for w in wls]
        ax.errorbar(rates, [x[0] for x in g], yerr=[[x[1] for x in g], [x[2] for x in g]], fmt=mk, capsize=3, label=f"{name} gain")
    ax.axhline(0, color="k", lw=0.8)
    ax.axhline(6.9, color="tab:blue", ls="--", lw=1, label="paper: +6.9% output")
    ax.axhline(36.6, color="tab:orange", ls="--", lw=1, label="paper: +36.6% SLO")
    ax.set_xlabel("offered load (nominal requests/s on the worker)")
    ax.set_ylabel("Tiered-Aging vs fewest-blocks (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(
        "Tiered-Aging vs CacheWise's fewest-blocks by load (M1, M2, M3, m9, m11; gains = ratio of sums, jackknife 95% CI)", fontsize=10
    )
    fig.text(0.5, 0.005, FOOT, ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    p = FIG / "ta_vs_cw_load.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    return p


def fig_mechanism() -> Path:
    """The 2 x 2 (cost unit x guard) at M3: gains vs cachewise, and the starvation they trade."""
    res = load("mechanism")
    names = [
        ("cachewise (fewest blocks, no aging, no guard)", "fewest blocks\n(cachewise)"),
        ("fewest blocks + guard (W_max 20 s)", "fewest blocks\n+ guard"),
        ("blocks/(1+w/tau), no guard", "blocks aged,\nno guard"),
        ("blocks/(1+w/tau) + guard", "blocks aged\n+ guard"),
        ("Tiered-Aging, no guard, W_max inf", "TA, no guard,\nW_max inf"),
        ("Tiered-Aging, no guard", "TA,\nno guard"),
        ("Tiered-Aging: seconds/(1+w/tau) + guard (shipped)", "TA + guard\n(shipped)"),
        ("vllm (FCFS)", "FCFS\n(vllm)"),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(15, 4.4))
    x = np.arange(len(names))
    ref = res["M3/cachewise (fewest blocks, no aging, no guard)"]
    for k, (key, lab) in enumerate((("output_tps", "output"), ("slo_tps", "SLO tok/s"))):
        g = [gain(res[f"M3/{n}"], ref, key) for n, _ in names]
        axes[0].bar(x + (k - 0.5) * 0.38, [v[0] for v in g], 0.38, yerr=[[v[1] for v in g], [v[2] for v in g]], capsize=2, label=lab)
    axes[0].axhline(0, color="k", lw=0.8)
    axes[0].set_xticks(x, [lab for _, lab in names], fontsize=7)
    axes[0].set_ylabel("gain vs cachewise on M3 (%)")
    axes[0].legend(fontsize=8)
    axes[0].grid(axis="y", alpha=0.3)
    axes[0].set_title("throughput (ratio of sums, jackknife 95% CI)", fontsize=9)
    for k, (key, lab) in enumerate((("ttft_max_s", "largest TTFT (s)"), ("ttft_p95_s", "TTFT p95 (s)"))):
        m = [mci(col(res[f"M3/{n}"], key)) for n, _ in names]
        axes[1].bar(x + (k - 0.5) * 0.38, [v[0] for v in m], 0.38, yerr=[v[1] for v in m], capsize=2, label=lab)
    axes[1].set_yscale("log")
    axes[1].set_xticks(x, [lab for _, lab in names], fontsize=7)
    axes[1].set_ylabel("seconds (log scale)")
    axes[1].legend(fontsize=8)
    axes[1].grid(axis="y", alpha=0.3)
    axes[1].set_title("what the throughput costs: waiting of the worst-served request", fontsize=9)
    fig.suptitle(
        "M3 (a quarter of the 7 req/s sessions): the starvation guard, then aging, not the cost unit, "
        "separate Tiered-Aging from fewest-blocks",
        fontsize=10,
    )
    fig.text(0.5, 0.005, FOOT + "; 'guard' = W_max 20 s starvation guard, 'aged' = cost/(1 + wait/5 s)", ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    p = FIG / "ta_mechanism_m3.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    return p


def fig_slo_regime() -> Path:
    res = load("paper_single")
    ttfts = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for w, mk in (("M1", "o-"), ("M2", "s-"), ("M3", "^-")):
        g = [gain(res[f"{w}/cachewise+ta"], res[f"{w}/cachewise"], f"slo_tps@{t:g}/0.1") for t in ttfts]
        ax.errorbar(ttfts, [v[0] for v in g], yerr=[[v[1] for v in g], [v[2] for v in g]], fmt=mk, capsize=3, label=w)
    ax.axhline(0, color="k", lw=0.8)
    ax.axhline(36.6, color="tab:green", ls="--", lw=1, label="paper: +36.6%")
    ax.axvline(0.0507, color="gray", ls=":", lw=1, label="calibrated TTFT SLO (0.051 s)")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT SLO (s), mean-TBT SLO fixed at 100 ms")
    ax.set_ylabel("SLO tok/s, Tiered-Aging vs fewest-blocks (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("SLO regime: the gain at every TTFT threshold (same runs)", fontsize=9)
    fig.text(0.5, 0.005, "seeds 0-4, one A100 worker (analytic profile); ratio of sums, jackknife 95% CI", ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    p = FIG / "ta_vs_cw_slo_regime.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    return p


CLI_FIGURES = {
    "paper-single/latency_cdfs.png": "paper_single_latency_cdfs.png",
    "paper-single/throughput.png": "paper_single_throughput.png",
    "paper-multi/fig11_throughput.png": "paper_multi_fig11_throughput.png",
    "paper-multi/fig12_latency.png": "paper_multi_fig12_latency.png",
    "paper-multi/fig14_ablation.png": "paper_multi_fig14_ablation.png",
    "paper-multi/fig16_hits.png": "paper_multi_fig16_hits.png",
}


def copy_cli_figures() -> list[Path]:
    """The figures `python -m experiments.paper paper-single|paper-multi --out runs/<preset>` wrote,
    quantized to 64 colours so they stay small in the repository."""
    from PIL import Image

    out = []
    for src, dst in CLI_FIGURES.items():
        path = ROOT / "runs" / src
        if not path.exists():
            print(f"skipped {src}: run the preset first", file=sys.stderr)
            continue
        Image.open(path).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(FIG / dst, optimize=True)
        out.append(FIG / dst)
    return out


def main() -> None:
    FIG.mkdir(parents=True, exist_ok=True)
    for p in copy_cli_figures():
        print(p.relative_to(ROOT), f"{p.stat().st_size / 1024:.0f} KiB")
    for fn in (fig_load, fig_mechanism, fig_slo_regime):
        try:
            p = fn()
            print(p.relative_to(ROOT), f"{p.stat().st_size / 1024:.0f} KiB")
        except FileNotFoundError as err:
            print(f"skipped {fn.__name__}: {err}", file=sys.stderr)


if __name__ == "__main__":
    main()
