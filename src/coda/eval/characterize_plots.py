"""Figures of a characterization (PNG, matplotlib): one per group of findings, each titled with the
workload and the replay configuration it was measured under."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

from coda.eval.characterize import PATHS, Characterization  # noqa: E402

TIER_COLORS = {"hbm": "#2b8cbe", "dram": "#fdae61", "ssd": "#d7191c", "not_resident": "#969696", "recompute": "#969696"}
LABELS = {"hbm": "HBM", "dram": "DRAM", "ssd": "SSD", "not_resident": "in no tier", "recompute": "recompute"}


def _provenance(f: dict[str, Any]) -> str:
    cfg = f["config"]["replay_vllm"]
    wl = f["workload"]
    return (f"workload {wl.get('spec')} ({wl.get('format')}, {wl.get('requests')} requests)\n"
            f"{cfg['workers']} workers, SSD tier on, seed {f['config']['seed']}, window {_window(f)} | "
            f"profile {cfg['profile']['name']} ({cfg['profile']['kind']}), cost model {f['config']['cost_model']}")


def _window(f: dict[str, Any]) -> str:
    a, b = f["config"]["window_s"]
    return f"{a:.0f}-{b:.0f} s"


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


CURVE_POINTS = 2000  # distributions are drawn through this many quantiles (millions of steps plot no better)


def _cdf(ax: Axes, values: np.ndarray, label: str, **kw: Any) -> None:
    p = np.linspace(0.0, 1.0, min(values.size, CURVE_POINTS))
    ax.plot(np.quantile(values, p), p, label=label, **kw)


def _pct(x: float | None) -> float:
    return 100.0 * (x or 0.0)


def _save(fig: plt.Figure, out: Path, name: str, title: str, f: dict[str, Any]) -> Path:
    fig.suptitle(f"{title}\n{_provenance(f)}", fontsize=9)
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def state_figure(c: Characterization, out: Path) -> Path:
    """F1-F3: tiers of reusable KV, preparation paths, startup cost per path."""
    f = c.findings
    fig, (a, b, d) = plt.subplots(1, 3, figsize=(15, 5))
    tiers = f["f1_tiers"]
    if tiers["requests"]:
        left = 0.0
        for k, share in tiers["token_share"].items():
            a.barh([0], [_pct(share)], left=left, color=TIER_COLORS[k], label=f"{LABELS[k]} {_pct(share):.1f}%")
            left += _pct(share)
        a.set_xlim(0, 100)
        a.set_yticks([])
        a.set_xlabel("share of reusable prefix tokens (%)")
        a.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize=8)
    else:
        _empty(a, "no resumed request in the window")
    a.set_title(f"F1: where resumed requests' KV sits at admission\n({tiers['requests']} resumed requests)", fontsize=10)

    paths = f["f2_paths"]
    shares = [_pct(paths["share"][p]) for p in PATHS]
    bars = b.bar([LABELS[p] for p in PATHS], shares, color=[TIER_COLORS[p] for p in PATHS])
    for bar, p in zip(bars, PATHS):
        b.annotate(f"{paths['counts'][p]}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    b.set_ylim(0, 105)
    b.set_ylabel("resumed requests (%)")
    b.set_xlabel("preparation path (bar label: requests)")
    b.set_title("F2: share of resumed requests per path", fontsize=10)

    cost = f["f3_startup_cost"]["paths"]
    have = [p for p in PATHS if cost[p]["requests"]]
    if have:
        x = np.arange(len(have))
        d.bar(x - 0.2, [cost[p]["p50_s"] for p in have], 0.4, label="p50", color="#4393c3")
        d.bar(x + 0.2, [cost[p]["p95_s"] for p in have], 0.4, label="p95", color="#d6604d")
        for i, p in enumerate(have):
            d.annotate(f"{_pct(cost[p]['share_of_total']):.1f}% of total", (i, cost[p]["p95_s"]), ha="center", va="bottom", fontsize=8)
        d.set_xticks(x, [LABELS[p] for p in have])
        d.set_yscale("log")
        lo, hi = d.get_ylim()
        d.set_ylim(lo, hi * 3)  # room for the labels
        d.set_ylabel("startup cost (s): admission to first token")
        d.set_xlabel("preparation path (label: share of total startup cost)")
        d.legend(fontsize=8)
    else:
        _empty(d, "no resumed request in the window")
    d.set_title("F3: startup cost per path", fontsize=10)
    return _save(fig, out, "f1_f3_state.png", "Findings 1-3: KV state of resumed requests (policy-neutral vllm replay)", f)


def workload_figure(c: Characterization, out: Path) -> Path:
    """F4: context growth per session; tool-call durations and the longest calls' share of tool time."""
    f, s = c.findings, c.series
    fig, (a, b, d) = plt.subplots(1, 3, figsize=(15, 5))
    g = s["growth"]
    _cdf(a, g, f"sessions (n={g.size})", color="#2b8cbe")
    a.axvline(4, color="0.5", ls="--", label=f"4x ({_pct(f['f4_growth']['ge4_share']):.1f}% of sessions >= 4x)")
    a.set_xscale("log")
    a.set_xlabel("context growth: largest / first prompt per session (x)")
    a.set_ylabel("share of sessions (CDF)")
    a.legend(fontsize=8, loc="best")
    a.set_title(f"F4: context growth (p50 {f['f4_growth']['p50']:.2f}x, p90 {f['f4_growth']['p90']:.2f}x)", fontsize=10)
    tools = s["tools"]
    if tools.size:
        t = f["f4_tools"]
        _cdf(b, tools, f"tool calls (n={tools.size})", color="#1a9850")
        for p, ls in (("p50_s", ":"), ("p90_s", "--"), ("p99_s", "-.")):
            b.axvline(t[p], color="0.5", ls=ls, label=f"{p[:3]} {t[p]:.3g} s")
        b.set_xscale("log")
        b.set_xlabel("tool-call wall latency (s)")
        b.set_ylabel("share of tool calls (CDF)")
        b.legend(fontsize=8, loc="lower right")
        b.set_title("F4: tool-call durations", fontsize=10)
        desc = np.sort(tools)[::-1]
        at = np.unique(np.geomspace(1, desc.size, min(desc.size, CURVE_POINTS)).astype(int)) - 1
        d.plot(100 * (at + 1) / desc.size, 100 * np.cumsum(desc)[at] / desc.sum(), color="#762a83", label="longest calls first")
        d.axvline(1, color="0.5", ls=":", label=f"top 1% of calls: {_pct(t['top_1pct_calls_time_share']):.0f}% of tool time")
        d.set_xscale("log")
        d.set_xlabel("share of tool calls, longest first (%)")
        d.set_ylabel("cumulative share of total tool time (%)")
        d.legend(fontsize=8, loc="lower right")
        d.set_title("F4: tool time is held by the longest calls", fontsize=10)
    else:
        for ax in (b, d):
            _empty(ax, "the workload records no tool calls")
        b.set_title("F4: tool-call durations", fontsize=10)
    return _save(fig, out, "f4_growth_tools.png", "Finding 4: context growth and tool time (from the workload)", f)


def decode_figure(c: Characterization, out: Path) -> Path:
    """F5-F7: context heterogeneity of decode batches, decode dominance, cost vs a uniform batch."""
    f, s = c.findings, c.series
    fig, (a, b, d) = plt.subplots(1, 3, figsize=(15, 5))
    ratios = s["ratios"]
    if ratios.size:
        _cdf(a, ratios, f"iterations with >= 2 decoders (n={ratios.size})", color="#2b8cbe")
        f5 = f["f5_heterogeneity"]
        for k, ls in ((2, ":"), (4, "--"), (8, "-.")):
            a.axvline(k, color="0.5", ls=ls, label=f">= {k}x: {_pct(f5[f'ge{k}x_share']):.1f}%")
        a.set_xscale("log")
        a.legend(fontsize=8, loc="best")
    else:
        _empty(a, "no iteration with >= 2 decoders in the window")
    a.set_xlabel("max / min decode context in an iteration (x)")
    a.set_ylabel("share of multi-request decode iterations (CDF)")
    a.set_title("F5: context heterogeneity of decode batches", fontsize=10)

    f6 = f["f6_decode_dominance"]
    x = np.arange(2)
    b.bar(x - 0.2, [_pct(f6["pure_decode_iteration_share"]), _pct(f6["pure_decode_time_share"])], 0.4, label="pure decode", color="#4393c3")
    b.bar(x + 0.2, [_pct(f6["multi_request_pure_decode_iteration_share"]), _pct(f6["multi_request_pure_decode_time_share"])], 0.4,
          label="pure decode, >= 2 requests", color="#92c5de")
    b.set_xticks(x, ["iterations", "execution time"])
    b.set_ylim(0, 119)
    b.set_ylabel("share of all engine iterations / time (%)")
    b.legend(fontsize=8, loc="upper center", ncol=2)
    b.set_title(f"F6: decode dominance ({f6['iterations']} iterations)", fontsize=10)

    f7 = f["f7_uniform_gap"]
    if f7["iterations"]:
        bars = d.bar(
            ["observed contexts", "near-uniform\n(same count, same total)"],
            [f7["attention_observed_s"], f7["attention_uniform_s"]],
            color=["#d6604d", "#4393c3"],
        )
        d.bar_label(bars, fmt="%.4g s", fontsize=8)
        d.set_ylabel("decode attention time, summed (s)")
        d.set_xlabel(f"{f7['iterations']} multi-request pure-decode iterations")
        d.set_title(
            f"F7: observed composition vs near-uniform: {100 * (f7['attention_gap'] or 0):+.2f}% attention\n"
            f"(cost model {f7['cost_model']})",
            fontsize=10,
        )
    else:
        _empty(d, "no multi-request pure-decode iteration in the window")
        d.set_title("F7: cost vs a near-uniform batch", fontsize=10)
    return _save(fig, out, "f5_f7_decode.png", "Findings 5-7: decode-batch composition (policy-neutral vllm replay)", f)


def routing_figure(c: Characterization, out: Path) -> Path | None:
    """F8: decisions where SMetric leaves several equally good workers, and where compatibility would choose otherwise."""
    f = c.findings
    f8 = f["f8_routing_opportunity"]
    if "skipped" in f8:
        return None
    fig, a = plt.subplots(figsize=(11, 5))
    kinds = [k for k in ("affinity", "load") if k in f8["by_decision"]]
    groups = ["all", *kinds]
    rows = {
        "all": {
            "decisions": f8["decisions"],
            **{k: sum(v[k] for v in f8["by_decision"].values()) for k in ("multi_eligible", "comparable", "differs")},
        }
    }
    rows.update(f8["by_decision"])
    x = np.arange(len(groups))
    for i, (key, label, color) in enumerate(
        (
            ("multi_eligible", ">= 2 workers equally eligible", "#92c5de"),
            ("comparable", "... all with active decoders", "#4393c3"),
            ("differs", "most compatible != chosen", "#d6604d"),
        )
    ):
        vals = [100 * rows[g][key] / max(rows[g]["decisions"], 1) for g in groups]
        a.bar_label(a.bar(x + (i - 1) * 0.27, vals, 0.27, label=label, color=color), fmt="%.1f", fontsize=8)
    a.set_xticks(x, [f"{g} decisions\n(n={rows[g]['decisions']})" for g in groups])
    a.set_ylim(0, 105)
    a.set_ylabel("share of routing decisions (%)")
    a.legend(fontsize=8)
    a.set_title("F8: routing opportunity under SMetric's affinity and load constraints", fontsize=10)
    return _save(fig, out, "f8_routing.png", "Finding 8: routing opportunity (smetric replay)", f)


def write_figures(c: Characterization, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    made = [state_figure(c, out), workload_figure(c, out), decode_figure(c, out), routing_figure(c, out)]
    return [p for p in made if p is not None]
