"""Paper-shaped evaluations: ``coda compare --preset paper-single | paper-multi``.

paper-single (the Coda paper's Table 1 / Table 3 shape): one worker, workloads M1-M3 (a quarter
of the sessions of the 3 / 5 / 7 req/s synthetic workloads, whole sessions kept), systems
vllm, cachewise, cachewise+ta, coda-single. Every run evaluates ``fewest_blocks`` in shadow on
the same admission snapshots, so "how often would CacheWise have chosen differently" is a
per-decision comparison, not two diverged runs. SLO throughput is reported at the default SLOs
and at an SLO pair whose TTFT bound is set so that cachewise keeps about 7% of its output within
SLO on M2 (the regime of the paper's Table 1, whose thresholds are not published).

paper-multi (Figures 11, 12, 14, 16 and Table 2): four workers, workloads Q1-Q3 (3 / 5 / 7
req/s), systems vllm, smetric, cachewise, dynamo, coda and the ablations; the coda runs
evaluate ``smetric`` in shadow on every routing snapshot and record the context distance of
both choices.

Warm-up is 1,200 s of a 3,600 s arrival window, longer than the median session lifetime
(about 750 s measured on these workloads). Gains are ratios of sums over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coda import strict_json
from coda.metrics import mean_ci, summarize
from coda.policy.routing import context_distance
from coda.policy.shadow import Shadowed
from coda.sim.cluster import SimResult, Simulation
from coda.sim.config import SimConfig
from coda.sim.run import versions
from coda.types import RoutingSnapshot
from coda.workload.schema import Workload
from coda.workload.spec import load_workload
from coda.workload.subsample import subsample

TARGET_SLO_SHARE = 0.07


@dataclass(frozen=True)
class PaperWorkload:
    label: str
    rate: float
    fraction: float | None = None

    def build(self, seed: int, duration: float, shape: str = "tracelab") -> Workload:
        wl = load_workload(f"synth:rate={self.rate},duration={duration},seed={seed},shape={shape}")
        return subsample(wl, fraction=self.fraction, seed=seed) if self.fraction else wl

    def describe(self, duration: float) -> str:
        base = f"synth:rate={self.rate},duration={duration:g}"
        return f"{base} keeping {self.fraction:.0%} of sessions" if self.fraction else base


@dataclass(frozen=True)
class PaperPreset:
    name: str
    workers: int
    workloads: tuple[PaperWorkload, ...]
    systems: tuple[str, ...]
    duration_s: float = 3600.0
    warmup_s: float = 1200.0
    shadow_state: str | None = None
    shadow_router: str | None = None
    calibrate_on: tuple[str, str] | None = None  # (system, workload label)

    def shadows(self) -> dict[str, Any]:
        """The preset's shadow policies as a ``policies`` override."""
        out: dict[str, Any] = {}
        if self.shadow_state:
            out["state"] = {"shadow": self.shadow_state}
        if self.shadow_router:
            out["router"] = {"shadow": self.shadow_router}
        return out


PRESETS = {
    "paper-single": PaperPreset(
        name="paper-single",
        workers=1,
        workloads=(PaperWorkload("M1", 3, 0.25), PaperWorkload("M2", 5, 0.25), PaperWorkload("M3", 7, 0.25)),
        systems=("vllm", "cachewise", "cachewise+ta", "coda"),
        shadow_state="fewest_blocks",
        calibrate_on=("cachewise", "M2"),
    ),
    "paper-multi": PaperPreset(
        name="paper-multi",
        workers=4,
        workloads=(PaperWorkload("Q1", 3), PaperWorkload("Q2", 5), PaperWorkload("Q3", 7)),
        systems=("vllm", "smetric", "cachewise", "dynamo", "coda", "coda-route-only", "coda-admit-only"),
        shadow_router="smetric",
    ),
    # paper-multi at 16 workers: 4 nodes of 4 sharing a DRAM store each (the default profile's
    # node of 4 A100s; the paper's 235B runs, two nodes of 8 GPUs, are two TP8 workers in this
    # simulator), with Q1-Q3 scaled by 4 so each worker sees paper-multi's load
    "paper-multi-16": PaperPreset(
        name="paper-multi-16",
        workers=16,
        workloads=(PaperWorkload("Q1", 12), PaperWorkload("Q2", 20), PaperWorkload("Q3", 28)),
        systems=("vllm", "smetric", "cachewise", "dynamo", "coda", "coda-route-only", "coda-admit-only"),
        shadow_router="smetric",
    ),
}


class RouteDistance:
    """On every routing decision in the measurement window where the router and its shadow
    (``smetric``) disagree: the context distance of both choices (both must have active decoders).
    A listener of the shadowed router (``Shadowed.listeners``), so it reads the decisions the run
    made, not decisions taken again."""

    def __init__(self) -> None:
        self.decisions = 0
        self.differs = 0
        self.chosen_d: list[float] = []
        self.shadow_d: list[float] = []

    def attach(self, sim: Simulation) -> None:
        router = sim.router
        if not isinstance(router, Shadowed):
            raise ValueError("RouteDistance needs a shadowed router (policies.router.shadow)")
        router.listeners.append(self.on_compare)

    def on_compare(self, snap: RoutingSnapshot, chosen: int, other: int) -> None:
        self.decisions += 1
        if other == chosen:
            return
        self.differs += 1
        L = snap.request.prompt_tokens
        by_id = {w.worker_id: w for w in snap.workers}
        a, b = by_id[chosen].decode_contexts, by_id[other].decode_contexts
        if a and b:
            self.chosen_d.append(context_distance(a, L))
            self.shadow_d.append(context_distance(b, L))


@dataclass
class Run:
    system: str
    workload: str
    seed: int
    result: SimResult
    summary: dict[str, Any]
    routes: RouteDistance | None


def _slo_metrics(run: Run, ttft: float, tbt: float) -> dict[str, Any]:
    sim = run.result.sim
    return summarize(run.result.records, sim.window, ttft_slo_s=ttft, tbt_slo_s=tbt, gaps=sim.recorder.gaps())


def calibrate_ttft(runs: list[Run], tbt_slo_s: float, target: float = TARGET_SLO_SHARE) -> float:
    """The TTFT SLO at which the runs keep ``target`` of their output within SLO (TBT SLO fixed).

    Only the TTFT side is calibrated: admission policies act on queueing and state preparation,
    which is what TTFT measures, while the decode step time barely depends on them.
    """

    def share(ttft: float) -> float:
        slo = sum(_slo_metrics(r, ttft, tbt_slo_s)["slo_tps"] for r in runs)
        out = sum(r.summary["output_tps"] for r in runs)
        return slo / out if out else 0.0

    lo, hi = math.log(1e-4), math.log(1e4)
    for _ in range(50):
        mid = (lo + hi) / 2
        if share(math.exp(mid)) < target:
            lo = mid
        else:
            hi = mid
    return math.exp(hi)


def run_preset(preset: PaperPreset, seeds: list[int], base: SimConfig, progress: Callable[[str, float], None] | None = None) -> list[Run]:
    runs: list[Run] = []
    total = len(seeds) * len(preset.workloads) * len(preset.systems)
    done = 0
    for wl_def in preset.workloads:
        for seed in seeds:
            wl = wl_def.build(seed, preset.duration_s)
            for system in preset.systems:
                cfg = base.with_overrides(system=system, workers=preset.workers, seed=seed, warmup_s=preset.warmup_s, policies=preset.shadows())
                sim = Simulation(wl, cfg)
                obs = RouteDistance() if preset.shadow_router and system == "coda" else None
                if obs is not None:
                    obs.attach(sim)
                result = sim.run()
                summary = result.summary()
                runs.append(Run(system, wl_def.label, seed, result, summary, obs))
                done += 1
                if progress:
                    progress(f"{wl_def.label} {system} seed {seed}", done / total)
    return runs


TABLE_METRICS = ("output_tps", "useful_tps", "slo_tps", "request_tps", "goodput", "ttft_p50_s", "ttft_p95_s", "tbt_p50_s", "tbt_p95_s",
                 "e2e_p50_s", "e2e_p95_s", "tbt_mean_s", "reuse_hbm", "reuse_store", "decode_concurrency")


def _aggregate(runs: list[Run], key: Callable[[Run], dict[str, Any]]) -> dict[str, Any]:
    rows = [key(r) for r in runs]
    return {m: mean_ci(row.get(m) for row in rows) for m in TABLE_METRICS if m in rows[0]}


def build_report(preset: PaperPreset, runs: list[Run], base: SimConfig) -> dict[str, Any]:
    """Aggregate runs into the paper's tables: means with 95% intervals, gains as ratios of sums."""
    calibrated = None
    if preset.calibrate_on:
        sys_name, wl_label = preset.calibrate_on
        ttft = calibrate_ttft([r for r in runs if r.system == sys_name and r.workload == wl_label], base.slo.tbt_s)
        calibrated = (ttft, base.slo.tbt_s)
    cells: dict[str, dict[str, Any]] = {}
    for wl in preset.workloads:
        for system in preset.systems:
            sel = [r for r in runs if r.workload == wl.label and r.system == system]
            cell = {"default": _aggregate(sel, lambda r: r.summary)}
            if calibrated:
                cal = [_slo_metrics(r, *calibrated) for r in sel]
                cell["calibrated"] = {"slo_tps": mean_ci(c["slo_tps"] for c in cal), "goodput": mean_ci(c["goodput"] for c in cal)}
                cell["_cal_slo_sum"] = sum(c["slo_tps"] for c in cal)
            cell["_sums"] = {m: sum(r.summary[m] for r in sel) for m in ("output_tps", "useful_tps", "slo_tps", "request_tps")}
            shadow = [r.summary["shadow"].get("state") for r in sel if r.summary["shadow"].get("state")]
            if shadow:
                n = sum(s["decisions"] for s in shadow)
                cell["differs_from_fewest_blocks"] = sum(s["differs"] for s in shadow) / n if n else None
            routes = [r.routes for r in sel if r.routes is not None]
            if routes:
                chosen = np.concatenate([np.array(r.chosen_d) for r in routes]) if any(r.chosen_d for r in routes) else np.array([])
                shadow_d = np.concatenate([np.array(r.shadow_d) for r in routes]) if any(r.shadow_d for r in routes) else np.array([])
                n = sum(r.decisions for r in routes)
                cell["routing_vs_smetric"] = {
                    "decisions": n,
                    "differs_frac": sum(r.differs for r in routes) / n if n else None,
                    "mean_distance_coda": float(chosen.mean()) if chosen.size else None,
                    "mean_distance_smetric": float(shadow_d.mean()) if shadow_d.size else None,
                    "distance_reduction": float(1 - chosen.mean() / shadow_d.mean()) if chosen.size and shadow_d.mean() > 0 else None,
                }
            cells[f"{wl.label}/{system}"] = cell
    gains: dict[str, dict[str, Any]] = {}
    for wl in preset.workloads:
        for system in preset.systems:
            c = cells[f"{wl.label}/{system}"]
            g = {}
            for ref in ("vllm", "cachewise", "smetric"):
                if ref in preset.systems and ref != system:
                    r = cells[f"{wl.label}/{ref}"]
                    g[ref] = {m: (c["_sums"][m] / r["_sums"][m] if r["_sums"][m] else None) for m in c["_sums"]}
                    if calibrated:
                        g[ref]["slo_tps_calibrated"] = c["_cal_slo_sum"] / r["_cal_slo_sum"] if r["_cal_slo_sum"] else None
            gains[f"{wl.label}/{system}"] = g
    for c in cells.values():
        c.pop("_sums")
        c.pop("_cal_slo_sum", None)
    profile = runs[0].result.sim.profile
    return {
        "preset": preset.name,
        "workers": preset.workers,
        "workloads": {w.label: w.describe(preset.duration_s) for w in preset.workloads},
        "systems": list(preset.systems),
        "seeds": sorted({r.seed for r in runs}),
        "warmup_s": preset.warmup_s,
        "slo_default": {"ttft_s": base.slo.ttft_s, "tbt_s": base.slo.tbt_s},
        "slo_calibrated": {"ttft_s": calibrated[0], "tbt_s": calibrated[1], "target_share": TARGET_SLO_SHARE,
                           "calibrated_on": list(preset.calibrate_on or ())} if calibrated else None,
        "profile": {"name": profile.name, "kind": profile.kind, "description": profile.description},
        "cells": cells,
        "gains": gains,
        "versions": versions(),
    }


def _fmt(ci: dict[str, Any] | None, digits: int = 1) -> str:
    if not ci or ci.get("mean") is None:
        return "-"
    s = f"{ci['mean']:.{digits}f}"
    return s + (f" ± {ci['ci95']:.{digits}f}" if ci.get("ci95") is not None else "")


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown tables."""
    lines = [
        f"# {report['preset']}: {report['workers']} worker(s), seeds {report['seeds']}",
        "",
        f"Cost profile: {report['profile']['name']} ({report['profile']['kind']}). Warm-up {report['warmup_s']:.0f} s. "
        f"Default SLO: TTFT <= {report['slo_default']['ttft_s']} s, mean TBT <= {report['slo_default']['tbt_s']} s.",
    ]
    cal = report.get("slo_calibrated")
    if cal:
        lines.append(
            f"Calibrated SLO: TTFT <= {cal['ttft_s']:.3g} s, mean TBT <= {cal['tbt_s']:.3g} s "
            f"(TTFT chosen so that {cal['calibrated_on'][0]} keeps {cal['target_share']:.0%} of its output within SLO on {cal['calibrated_on'][1]})."
        )
    lines += ["", "Workloads: " + "; ".join(f"{k} = {v}" for k, v in report["workloads"].items()), ""]
    head = "| workload | system | output tok/s | useful tok/s | SLO tok/s | " + ("SLO tok/s (calibrated) | " if cal else "") + "goodput | TTFT p95 s | mean TBT ms |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for key, cell in report["cells"].items():
        wl, system = key.split("/", 1)
        d = cell["default"]
        row = f"| {wl} | {system} | {_fmt(d['output_tps'])} | {_fmt(d['useful_tps'])} | {_fmt(d['slo_tps'])} | "
        if cal:
            row += f"{_fmt(cell['calibrated']['slo_tps'])} | "
        tbt = d.get("tbt_mean_s")
        row += f"{_fmt(d['goodput'], 3)} | {_fmt(d['ttft_p95_s'], 2)} | {(tbt['mean'] * 1e3 if tbt and tbt['mean'] else float('nan')):.1f} |"
        lines.append(row)
    lines += ["", "Gains (ratios of sums over seeds):", "", "| workload | system | vs | output | useful | SLO | " + ("SLO (calibrated) |" if cal else ""), "|---|---|---|---|---|---|" + ("---|" if cal else "")]
    for key, refs in report["gains"].items():
        wl, system = key.split("/", 1)
        for ref, g in refs.items():
            row = f"| {wl} | {system} | {ref} | {g['output_tps']:.3f} | {g['useful_tps']:.3f} | {g['slo_tps']:.3f} |" if g["output_tps"] else ""
            if row and cal:
                row += f" {g['slo_tps_calibrated']:.3f} |" if g.get("slo_tps_calibrated") else " - |"
            if row:
                lines.append(row)
    shadow_rows = [(k, c["differs_from_fewest_blocks"]) for k, c in report["cells"].items() if c.get("differs_from_fewest_blocks") is not None]
    if shadow_rows:
        lines += ["", "Admission choices (in the window) where `fewest_blocks` (CacheWise), evaluated in shadow on the same snapshot, "
                  "would have admitted another request or none:", "",
                  "| workload/system | differs |", "|---|---|"]
        lines += [f"| {k} | {v:.1%} |" for k, v in shadow_rows]
    route_rows = [(k, c["routing_vs_smetric"]) for k, c in report["cells"].items() if c.get("routing_vs_smetric")]
    if route_rows:
        lines += ["", "Routing decisions where `coda` differs from `smetric` evaluated in shadow on the same snapshot:", "",
                  "| workload/system | decisions | differs | mean distance coda | mean distance smetric | reduction |", "|---|---|---|---|---|---|"]
        for k, v in route_rows:
            def f(x: float | None, pct: bool = False) -> str:
                return "-" if x is None else (f"{x:.1%}" if pct else f"{x:.3f}")
            lines.append(f"| {k} | {v['decisions']} | {f(v['differs_frac'], True)} | {f(v['mean_distance_coda'])} | {f(v['mean_distance_smetric'])} | {f(v['distance_reduction'], True)} |")
    return "\n".join(lines) + "\n"


def plots(preset: PaperPreset, runs: list[Run], report: dict[str, Any], out: Path) -> list[Path]:
    """Latency CDFs (single) or the multi-worker panels, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    first_seed = min(r.seed for r in runs)
    fig, axes = plt.subplots(len(preset.workloads), 3, figsize=(13, 3.6 * len(preset.workloads)), squeeze=False)
    for i, wl in enumerate(preset.workloads):
        for j, (field, label) in enumerate((("ttft_s", "TTFT (s)"), ("tbt_mean_s", "mean TBT per request (s)"), ("e2e_s", "E2E latency (s)"))):
            ax = axes[i][j]
            for r in runs:
                if r.workload != wl.label or r.seed != first_seed:
                    continue
                w = r.result.sim.window
                vals = np.sort([x[field] for x in r.result.records if x[field] is not None and w.start_s <= x["ready_s"] <= w.end_s])
                if vals.size:
                    ax.plot(vals, np.arange(1, vals.size + 1) / vals.size, label=r.system)
            ax.set_xscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel("fraction of requests")
            ax.set_title(f"{wl.label}: {label.split(' (')[0]} CDF (seed {first_seed})")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "latency_cdfs.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    def bars(metrics: list[tuple[str, str]], systems: list[str], name: str, title: str) -> None:
        fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.8), squeeze=False)
        x = np.arange(len(preset.workloads))
        width = 0.8 / len(systems)
        for ax, (metric, label) in zip(axes[0], metrics):
            for k, system in enumerate(systems):
                means = [report["cells"][f"{wl.label}/{system}"]["default"][metric]["mean"] or 0 for wl in preset.workloads]
                cis = [report["cells"][f"{wl.label}/{system}"]["default"][metric]["ci95"] or 0 for wl in preset.workloads]
                ax.bar(x + k * width, means, width, yerr=cis, label=system, capsize=2)
            ax.set_xticks(x + width * (len(systems) - 1) / 2, [wl.label for wl in preset.workloads])
            ax.set_ylabel(label)
            ax.set_xlabel("workload")
            ax.grid(axis="y", alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.suptitle(title)
        fig.tight_layout()
        p = out / name
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)

    systems = list(preset.systems)
    bars([("output_tps", "output tokens/s"), ("useful_tps", "useful tokens/s"), ("slo_tps", "SLO-compliant output tokens/s")], systems,
         "throughput.png", "Throughput (95% intervals over seeds)")
    if preset.workers > 1:
        main = [s for s in systems if not s.startswith("coda-")]
        bars([("output_tps", "output tokens/s"), ("request_tps", "completed requests/s"), ("slo_tps", "SLO-compliant output tokens/s")], main,
             "fig11_throughput.png", "Figure 11 shape: throughput per system")
        bars([("ttft_p50_s", "TTFT p50 (s)"), ("ttft_p95_s", "TTFT p95 (s)"), ("tbt_p50_s", "TBT p50 (s)"), ("tbt_p95_s", "TBT p95 (s)"),
              ("e2e_p50_s", "E2E p50 (s)"), ("e2e_p95_s", "E2E p95 (s)")], main, "fig12_latency.png", "Figure 12 shape: latency percentiles")
        abl = [s for s in ("smetric", "coda-route-only", "coda-admit-only", "coda") if s in systems]
        bars([("output_tps", "output tokens/s"), ("slo_tps", "SLO-compliant output tokens/s")], abl, "fig14_ablation.png", "Figure 14 shape: ablation")
        bars([("reuse_hbm", "prefix reuse from HBM (share of prompt tokens)"), ("reuse_store", "prefix reuse from the KV store"),
              ("decode_concurrency", "mean decoding requests per worker")], main, "fig16_hits.png", "Figure 16 shape: hit rates and decode concurrency")
    return written


def run_and_report(name: str, seeds: list[int], base: SimConfig, out: Path | None, progress: Callable[[str, float], None] | None = None) -> dict[str, Any]:
    preset = PRESETS[name]
    runs = run_preset(preset, seeds, base, progress)
    report = build_report(preset, runs, base)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(strict_json.dumps(report, indent=2) + "\n")
        (out / "report.md").write_text(markdown(report))
        report["figures"] = [str(p) for p in plots(preset, runs, report, out)]
    return report
