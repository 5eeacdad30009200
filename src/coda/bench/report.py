"""Summaries, output files (JSON, CSV) and plots of bench runs; the metric definitions are ``coda.metrics.requests``'s.

The client cannot tell which tier served a prefix hit, so the engine-reported cached tokens
(``usage.prompt_tokens_details.cached_tokens``) are the hits behind ``reuse_rate`` and the per-tier
split is left out. Every summary carries the configuration, the SLOs, the workload's provenance
and the versions.
"""

from __future__ import annotations

import csv
import io
import platform
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from coda import __version__
from coda.metrics.requests import OPERATOR_KEYS, Window, mean_ci, summarize
from coda.shell import strict_json

# Keys `coda bench --json` always prints (docs/bench.md), in the order tables print them.
JSON_KEYS = ("offered", "completed", "rejected", "failed", "goodput", "output_tps", "slo_tps", "ttft_p50_s", "ttft_p95_s", "tbt_p50_s",
             "e2e_p50_s", "config")
TABLE_KEYS = (
    "offered",
    "admitted",
    "deferred",
    "completed",
    "rejected",
    "failed",
    "retries",
    "goodput",
    "output_tps",
    "slo_tps",
    "useful_tps",
    "request_tps",
    "ttft_p50_s",
    "ttft_p95_s",
    "itl_p50_s",
    "itl_p95_s",
    "tbt_p50_s",
    "tbt_p95_s",
    "e2e_p50_s",
    "e2e_p95_s",
    "reuse_rate",
    *OPERATOR_KEYS,
)


def versions() -> dict[str, str]:
    import httpx

    return {"coda": __version__, "python": platform.python_version(), "numpy": np.__version__, "httpx": httpx.__version__}


def _reason(r: dict[str, Any]) -> str:
    return str(r["reason"]).split(":", 1)[0]


def bench_summary(
    records: Sequence[dict[str, Any]],
    window: Window,
    *,
    ttft_slo_s: float,
    tbt_slo_s: float,
    run_end_s: float,
    alone_s: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, Any]:
    """``coda.metrics.summarize`` plus the ingress counts: every offered request is exactly one of
    completed, rejected or failed; admitted = got a 200; deferred = got at least one 503. The task
    metrics end at ``run_end_s``; slowdowns need ``alone_s`` (each session's time alone)."""
    s = summarize(records, window, ttft_slo_s=ttft_slo_s, tbt_slo_s=tbt_slo_s, run_end_s=run_end_s, alone_s=alone_s)
    s.pop("reuse_hbm"), s.pop("reuse_store"), s.pop("unfinished")
    offered = [r for r in records if window.start_s <= r["ready_s"] <= window.end_s]
    states = Counter(r["state"] for r in offered)
    s.update(
        rejected=states["rejected"],
        failed=states["failed"],
        admitted=sum(r["admitted"] for r in offered),
        deferred=sum(r["deferred"] for r in offered),
        retries=sum(max(r["attempts"] - 1, 0) for r in offered),
        rejected_by_reason=dict(Counter(_reason(r) for r in offered if r["state"] == "rejected")),
        failed_by_reason=dict(Counter(_reason(r) for r in offered if r["state"] == "failed")),
        window_s=[window.start_s, window.end_s],
    )
    assert s["offered"] == s["completed"] + s["rejected"] + s["failed"], "a request ended in two states or none"
    return s


def write_run(
    out: Path, summary: dict[str, Any], records: Sequence[dict[str, Any]], server: list[dict[str, Any]] | None = None
) -> list[Path]:
    """summary.json and .csv, requests.jsonl, the engines' sampled metrics (``server``) and the
    plots of one run; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(strict_json.dumps(summary, indent=2) + "\n")
    with (out / "requests.jsonl").open("w") as fh:
        for r in records:
            fh.write(strict_json.dumps(r) + "\n")
    window = Window(*summary["window_s"])
    files = [out / "summary.json", write_csv(out / "summary.csv", [summary]), out / "requests.jsonl"]
    if server is not None:
        (out / "server_metrics.json").write_text(strict_json.dumps(server) + "\n")
        files.append(out / "server_metrics.json")
    return [
        *files,
        plot_latency_cdfs(out / "latency_cdf.png", records, window),
        plot_throughput(out / "throughput.png", records, window),
        plot_timeline(out / "timeline.png", records, window, server),
    ]


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_cdfs(path: Path, records: Sequence[dict[str, Any]], window: Window) -> Path:
    plt = _plt()
    done = [r for r in records if r["state"] == "completed" and window.start_s <= r["ready_s"] <= window.end_s]
    series = {
        "TTFT": [r["ttft_s"] for r in done],
        "ITL (per request)": [r["tbt_mean_s"] for r in done if r["tbt_mean_s"] is not None],
        "TBT (every chunk gap)": [g for r in done for g in r["gaps_s"]],
        "E2E": [r["e2e_s"] for r in done],
    }
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, (name, vals) in zip(axes, series.items()):
        v = np.sort(np.asarray(vals, dtype=float))
        if v.size:
            ax.plot(v, np.arange(1, v.size + 1) / v.size)
        ax.set_xlabel(f"{name} (s)")
        ax.set_ylabel("fraction of gaps" if name.startswith("TBT") else "fraction of requests")
        ax.set_title(f"{name}, n={v.size}")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_throughput(path: Path, records: Sequence[dict[str, Any]], window: Window) -> Path:
    """Output tokens/s and completed requests/s over the run (token arrival times rebuilt from the gaps)."""
    plt = _plt()
    done = [r for r in records if r["state"] == "completed"]
    end = max([r["finish_s"] for r in done] + [window.end_s])
    bins = np.linspace(0.0, end, max(10, min(200, int(end) + 1)) + 1)
    width = bins[1] - bins[0]
    token_times = [r["first_token_s"] + np.cumsum([0.0, *r["gaps_s"]]) for r in done]
    tokens = np.histogram(np.concatenate(token_times) if token_times else np.empty(0), bins)[0] / width
    reqs = np.histogram([r["finish_s"] for r in done], bins)[0] / width
    fig, ax = plt.subplots(figsize=(10, 3.6))
    ax.plot(bins[:-1], tokens, label="output tokens/s")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(bins[:-1], reqs, color="tab:orange", label="completed requests/s")
    ax2.set_ylabel("requests/s")
    ax.axvspan(window.start_s, window.end_s, color="grey", alpha=0.1, label="measurement window")
    fig.legend(loc="upper center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timeline(path: Path, records: Sequence[dict[str, Any]], window: Window, server: list[dict[str, Any]] | None) -> Path:
    """Each request's TTFT and ITL at the time it became ready; under them, when the engines were
    sampled, their queue depth, KV usage and prefix-cache hit rate on the same time axis."""
    plt = _plt()
    done = [r for r in records if r["state"] == "completed"]
    panels = 1 + (3 if server else 0)
    fig, axes = plt.subplots(panels, 1, figsize=(11, 2.6 * panels + 0.6), sharex=True, squeeze=False)
    ax = axes[0][0]
    ax.scatter([r["ready_s"] for r in done], [r["ttft_s"] for r in done], s=6, label="TTFT")
    itl = [r for r in done if r["tbt_mean_s"] is not None]
    ax.scatter([r["ready_s"] for r in itl], [r["tbt_mean_s"] for r in itl], s=6, label="ITL (per request)")
    if any(r["ttft_s"] > 0 for r in done):  # a run in which nothing completed has nothing to put on a log axis
        ax.set_yscale("log")
    ax.set_ylabel("latency (s)")
    ax.legend(loc="upper left", fontsize=8)
    for engine in server or ():
        t = engine["t_s"]
        name = engine["url"]
        axes[1][0].step(t, engine["running"], where="post", label=f"running, {name}")
        axes[1][0].step(t, engine["waiting"], where="post", linestyle="--", label=f"waiting, {name}")
        axes[2][0].step(t, engine["kv_usage"], where="post", label=name)
        axes[3][0].step(t, engine["prefix_hit_rate"], where="pre", label=name)  # a rate over the interval ending at each sample
    if server:
        for row, label in ((1, "requests"), (2, "KV-cache usage"), (3, "prefix-cache hit rate\n(per interval)")):
            axes[row][0].set_ylabel(label)
            axes[row][0].legend(loc="upper left", fontsize=7)
        axes[2][0].set_ylim(0, 1.05)
        axes[3][0].set_ylim(0, 1.05)
    for (a,) in axes:
        a.axvspan(window.start_s, window.end_s, color="grey", alpha=0.1)
        a.grid(alpha=0.3)
    axes[-1][0].set_xlabel("time since start (s); shaded: measurement window")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --- sweeps --------------------------------------------------------------------------------
SWEEP_METRICS = (
    "offered_rps",
    "output_tps",
    "slo_tps",
    "request_tps",
    "goodput",
    "ttft_p50_s",
    "ttft_p95_s",
    "itl_p50_s",
    "itl_p95_s",
    "tbt_p50_s",
    "e2e_p50_s",
    "rejected",
    "failed",
    "stalled",
    "task_time_p99_s",
    "slowdown_p99",
)


def sweep_rows(runs: dict[float, list[dict[str, Any]]], axis: str = "rate") -> list[dict[str, Any]]:
    """Per level of ``axis`` (a rate or a concurrency): each metric's mean and 95% interval over the repeats."""
    rows = []
    for level, summaries in sorted(runs.items()):
        row: dict[str, Any] = {axis: level, "repeats": len(summaries)}
        for key in SWEEP_METRICS:
            stats = mean_ci(s.get(key) for s in summaries)
            row[key], row[f"{key}_ci95"] = stats["mean"], stats["ci95"]
        rows.append(row)
    return rows


def knee(rows: Sequence[dict[str, Any]], axis: str = "rate", tolerance: float = 0.05) -> float | None:
    """The highest level of ``axis`` whose mean goodput is within ``tolerance`` of the best level's."""
    good = [r for r in rows if r["goodput"] is not None]
    if not good:
        return None
    best = max(r["goodput"] for r in good)
    return max(r[axis] for r in good if r["goodput"] >= (1 - tolerance) * best)


# --- CSV -----------------------------------------------------------------------------------
def flat(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The JSON's keys as CSV columns: nested objects as dotted names, lists as JSON text."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat(value, name + "."))
        elif isinstance(value, list | tuple | dict):
            out[name] = strict_json.dumps(value)
        else:
            out[name] = value
    return out


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as CSV with the JSON's keys for columns (in first-seen order; a missing value is empty)."""
    flats = [flat(r) for r in rows]
    columns = list(dict.fromkeys(k for f in flats for k in f))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(flats)
    return buf.getvalue()


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.write_text(csv_text(rows))
    return path


def plot_load(path: Path, rows: Sequence[dict[str, Any]], axis: str, knee_level: float | None) -> Path:
    """Throughput and goodput against the offered load (a rate sweep) or the concurrency, with 95% intervals and the knee."""
    plt = _plt()
    x_key, x_label = ("offered_rps", "offered load (requests/s)") if axis == "rate" else (axis, "concurrency (sessions at a time)")
    x = [r[x_key] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    for key, label in (("output_tps", "output tokens/s"), ("slo_tps", "SLO-meeting output tokens/s")):
        ax1.errorbar(x, [r[key] for r in rows], yerr=[r[f"{key}_ci95"] or 0 for r in rows], marker="o", capsize=3, label=label)
    ax2.errorbar(x, [r["goodput"] for r in rows], yerr=[r["goodput_ci95"] or 0 for r in rows], marker="o", capsize=3, color="tab:green")
    if knee_level is not None:
        kx = next(r[x_key] for r in rows if r[axis] == knee_level)
        for ax in (ax1, ax2):
            ax.axvline(kx, color="grey", linestyle="--", label=f"knee ({axis} {knee_level:g})")
    for ax in (ax1, ax2):
        ax.set_xlabel(x_label)
    ax1.set_ylabel("tokens/s")
    ax2.set_ylabel("goodput (SLO-meeting / offered)")
    ax2.set_ylim(0, 1.05)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
