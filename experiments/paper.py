"""Paper-shaped evaluations: ``python -m experiments.paper paper-single | paper-multi --out DIR``.

paper-single (the Coda paper's Table 1 / Table 3 shape): one worker, workloads M1-M3 (a quarter
of the sessions of the 3 / 5 / 7 req/s synthetic workloads, whole sessions kept), systems
vllm, cachewise, cachewise+ta, coda. Every run evaluates ``fewest_blocks`` in shadow on
the same admission snapshots, so "how often would CacheWise have chosen differently" is a
per-decision comparison, not two diverged runs. SLO throughput is reported at the default SLOs
and at the (TTFT, TBT) pair at which cachewise keeps the paper's published share of its output
within SLO on M1-M3 (Table 1; the paper does not publish its thresholds), with every gain's
ratio over a grid of thresholds beside it. CacheWise's output, mean TBT and useful/output ratio
are printed next to the paper's with their errors (``paper_reference``).

paper-multi (Figures 11, 12, 14, 16 and Table 2): four workers, workloads Q1-Q3 (3 / 5 / 7
req/s), systems vllm, smetric, cachewise, dynamo, coda and the ablations; the coda runs
evaluate ``smetric`` in shadow on every routing snapshot and record the context distance of
both choices.

Sessions arrive for 12,000 s and the first 9,600 s are warm-up: session lifetimes are heavy-tailed
(on M2 p50 646 s, p90 3,089 s, p99 11,885 s measured), so the number of live sessions, and with it
the request rate and the mix of context lengths, reaches its steady state only after about
9,600 s; a window that opens earlier sees younger, shorter sessions at a lower rate. Metrics are
reported over the paper's two windows, the 40 minutes after warm-up (the primary window) and its
first 10 minutes, from the same runs. Gains are ratios of sums over seeds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from coda.metrics.requests import Window, mean_ci, ratio_ci, summarize
from coda.policy.routing import context_distance
from coda.policy.snapshots import RoutingSnapshot
from coda.shell import strict_json
from coda.shell.shadow import Shadowed
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sim.run import versions
from coda.sweep import Cell, SweepOptions, file_digest, profile_digest, run_cells
from coda.sweep.arguments import add_sweep_arguments, sweep_options
from coda.sweep.executor import SERIAL
from coda.workload.schema import Workload
from coda.workload.spec import load_workload
from coda.workload.subsample import subsample
from experiments.paper_reference import CACHEWISE, SOURCE, TOLERANCE
from experiments.slo_fit import SloFit, SloSample, fit_slo, gain_grid

# The 10-minute window of the paper's evaluation, opening where the primary window opens.
SHORT_WINDOW_S = 600.0
# Thresholds of the gain-sign grid: TTFT from interactive to agent-tolerant, TBT around reading speed.
GRID_TTFT_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
GRID_TBT_S = (0.05, 0.075, 0.1, 0.15)


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
    duration_s: float = 12_000.0
    warmup_s: float = 9_600.0
    shadow_state: str | None = None
    shadow_router: str | None = None
    # The SLO is calibrated on this system's runs so that, on each of the preset's workloads, it
    # keeps the share of output within SLO that CacheWise keeps in the paper on the paired paper
    # workload: ((workload label, paper workload label), ...).
    slo_system: str = "cachewise"
    slo_targets: tuple[tuple[str, str], ...] = ()

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
        slo_targets=(("M1", "M1"), ("M2", "M2"), ("M3", "M3")),
    ),
    "paper-multi": PaperPreset(
        name="paper-multi",
        workers=4,
        workloads=(PaperWorkload("Q1", 3), PaperWorkload("Q2", 5), PaperWorkload("Q3", 7)),
        systems=("vllm", "smetric", "cachewise", "dynamo", "coda", "coda-route-only", "coda-admit-only"),
        shadow_router="smetric",
        slo_targets=(("Q1", "M1"), ("Q2", "M2"), ("Q3", "M3")),
    ),
}
# paper-multi at 16 workers: 4 nodes of 4 sharing a DRAM store each (the default profile's node of
# 4 A100s; the paper's 235B runs, two nodes of 8 GPUs, are two TP8 workers in this simulator), with
# Q1-Q3 scaled by 4 so each worker sees paper-multi's load
PRESETS["paper-multi-16"] = replace(PRESETS["paper-multi"], name="paper-multi-16", workers=16,
                                    workloads=tuple(replace(w, rate=4 * w.rate) for w in PRESETS["paper-multi"].workloads))


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


#: what the report and figures read of each request record (the rest stay in the simulation's process)
RECORD_FIELDS = ("ready_s", "first_token_s", "finish_s", "ttft_s", "e2e_s", "tbt_mean_s", "output_tokens", "prompt_tokens",
                 "new_input_tokens", "round", "state", "hbm_hit_tokens", "dram_hit_tokens", "ssd_hit_tokens")


@dataclass
class Run:
    """One system on one workload and seed, as the report reads it: the summary, the request
    records (``RECORD_FIELDS``), the measurement window, the pooled inter-token gaps and the
    routing distances (coda runs of a preset with a shadow router)."""

    system: str
    workload: str
    seed: int
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    window: Window
    gaps: tuple[np.ndarray, np.ndarray]
    routes: dict[str, Any] | None
    profile: dict[str, str]

    @classmethod
    def of(cls, cell: dict[str, Any]) -> Run:
        """A run from its cell's JSON value (``paper_cell``)."""
        return cls(cell["system"], cell["workload"], cell["seed"], cell["summary"], cell["records"], Window(*cell["window"]),
                   (np.array(cell["gaps"][0], dtype=float), np.array(cell["gaps"][1], dtype=float)), cell["routes"], cell["profile"])


def paper_cell(preset: PaperPreset, wl_def: PaperWorkload, cfg: SimConfig) -> dict[str, Any]:
    """One simulation of a preset as a JSON value (what ``Run.of`` reads)."""
    sim = Simulation(wl_def.build(cfg.seed, preset.duration_s), cfg)
    obs = RouteDistance() if preset.shadow_router and cfg.system == "coda" else None
    if obs is not None:
        obs.attach(sim)
    result = sim.run()
    vals, weights = result.sim.recorder.gaps()
    w = result.sim.window
    profile = result.sim.profile
    return {
        "system": cfg.system,
        "workload": wl_def.label,
        "seed": cfg.seed,
        "summary": result.summary(),
        "records": [{k: r.get(k) for k in RECORD_FIELDS} for r in result.records],
        "window": [w.start_s, w.end_s],
        "gaps": [vals, weights],
        "routes": None
        if obs is None
        else {"decisions": obs.decisions, "differs": obs.differs, "chosen_d": obs.chosen_d, "shadow_d": obs.shadow_d},
        "profile": {"name": profile.name, "kind": profile.kind, "description": profile.description},
    }


def short_window(run: Run) -> Window:
    """The paper's 10-minute window: the first ``SHORT_WINDOW_S`` of the run's primary window."""
    w = run.window
    return Window(w.start_s, min(w.start_s + SHORT_WINDOW_S, w.end_s))


def window_metrics(run: Run, window: Window, ttft_s: float, tbt_s: float) -> dict[str, Any]:
    """``summarize`` over ``window`` at the given SLO. Its mean TBT pools every inter-token gap of
    the requests in the window, as the simulator's recorder does: a request's mean gap is its ITL,
    so the pooled mean weights each ITL by the request's ``output_tokens - 1`` gaps."""
    records = run.records
    if window == run.window:
        return summarize(records, window, ttft_slo_s=ttft_s, tbt_slo_s=tbt_s, gaps=run.gaps)
    inside = [
        r for r in records if r["tbt_mean_s"] is not None and r["output_tokens"] > 1 and window.start_s <= r["ready_s"] <= window.end_s
    ]
    gaps = (np.array([r["tbt_mean_s"] for r in inside], dtype=float), np.array([r["output_tokens"] - 1 for r in inside], dtype=float))
    return summarize(records, window, ttft_slo_s=ttft_s, tbt_slo_s=tbt_s, gaps=gaps)


def calibrate_slo(preset: PaperPreset, runs: list[Run]) -> SloFit | None:
    """The SLO pair at which ``preset.slo_system`` keeps the paper's CacheWise share of output
    within SLO on each workload (pooled over seeds), in the primary window."""
    if not preset.slo_targets:
        return None
    samples = {
        label: [SloSample.of(r.records, r.window) for r in runs if r.system == preset.slo_system and r.workload == label]
        for label, _ in preset.slo_targets
    }
    targets = {label: CACHEWISE[paper].slo_share for label, paper in preset.slo_targets if CACHEWISE[paper].slo_share is not None}
    return fit_slo(samples, targets)


def preset_cells(preset: PaperPreset, seeds: list[int], base: SimConfig) -> list[Cell]:
    """Every system on every workload and seed of ``preset``, workload-major; each keyed by its
    simulator config, its workload's definition and its cost profile's content."""
    profile = profile_digest(base.profile)
    harness = file_digest(__file__)
    out = []
    for wl_def in preset.workloads:
        for seed in seeds:
            for system in preset.systems:
                cfg = base.with_overrides(
                    system=system, workers=preset.workers, seed=seed, warmup_s=preset.warmup_s, policies=preset.shadows()
                )
                config = {
                    "cell": "paper",
                    "sim": cfg.model_dump(mode="json"),
                    "profile": profile,
                    "harness": harness,
                    "workload": {**asdict(wl_def), "duration_s": preset.duration_s, "seed": seed},
                    "route_distance": bool(preset.shadow_router and system == "coda"),
                }
                out.append(
                    Cell(f"{wl_def.label} {system} seed {seed}", config, partial(paper_cell, preset, wl_def, cfg), weight=preset.duration_s)
                )
    return out


def run_preset(preset: PaperPreset, seeds: list[int], base: SimConfig, sweep: SweepOptions = SERIAL) -> list[Run]:
    return [Run.of(cell) for cell in run_cells(preset_cells(preset, seeds, base), sweep, title=preset.name)]


TABLE_METRICS = (
    "output_tps",
    "useful_tps",
    "slo_tps",
    "request_tps",
    "goodput",
    "ttft_p50_s",
    "ttft_p95_s",
    "tbt_p50_s",
    "tbt_p95_s",
    "e2e_p50_s",
    "e2e_p95_s",
    "tbt_mean_s",
    "reuse_hbm",
    "reuse_store",
    "decode_concurrency",
)


def _aggregate(runs: list[Run], key: Callable[[Run], dict[str, Any]]) -> dict[str, Any]:
    rows = [key(r) for r in runs]
    return {m: mean_ci(row.get(m) for row in rows) for m in TABLE_METRICS if m in rows[0]}


def build_report(preset: PaperPreset, runs: list[Run], base: SimConfig) -> dict[str, Any]:
    """Aggregate runs into the paper's tables: means with 95% intervals, gains as ratios of sums,
    over the primary window and the 10-minute one, and the baseline next to the paper's."""
    fit = calibrate_slo(preset, runs)
    cal = (fit.ttft_s, fit.tbt_s) if fit else None
    cells: dict[str, dict[str, Any]] = {}
    sums: dict[str, dict[str, float]] = {}
    for wl in preset.workloads:
        for system in preset.systems:
            key = f"{wl.label}/{system}"
            sel = sorted((r for r in runs if r.workload == wl.label and r.system == system), key=lambda r: r.seed)
            cell: dict[str, Any] = {"default": _aggregate(sel, lambda r: r.summary)}
            short = [window_metrics(r, short_window(r), base.slo.ttft_s, base.slo.tbt_s) for r in sel]
            cell["window_10min"] = {m: mean_ci(x[m] for x in short) for m in ("output_tps", "useful_tps", "slo_tps", "tbt_mean_s")}
            sums[key] = {m: [r.summary[m] for r in sel] for m in ("output_tps", "useful_tps", "slo_tps", "request_tps")}
            sums[key]["output_tps_10min"] = [x["output_tps"] for x in short]
            if cal:
                long_cal = [window_metrics(r, r.window, *cal) for r in sel]
                short_cal = [window_metrics(r, short_window(r), *cal) for r in sel]
                cell["calibrated"] = {
                    "slo_tps": mean_ci(c["slo_tps"] for c in long_cal),
                    "goodput": mean_ci(c["goodput"] for c in long_cal),
                }
                cell["window_10min"]["slo_tps_calibrated"] = mean_ci(c["slo_tps"] for c in short_cal)
                sums[key]["slo_tps_calibrated"] = [c["slo_tps"] for c in long_cal]
                sums[key]["slo_tps_calibrated_10min"] = [c["slo_tps"] for c in short_cal]
            shadow = [r.summary["shadow"].get("state") for r in sel if r.summary["shadow"].get("state")]
            if shadow:
                n = sum(s["decisions"] for s in shadow)
                cell["differs_from_fewest_blocks"] = sum(s["differs"] for s in shadow) / n if n else None
            routes = [r.routes for r in sel if r.routes is not None]
            if routes:
                cell["routing_vs_smetric"] = _route_summary(routes)
            cells[key] = cell
    gains: dict[str, dict[str, Any]] = {}
    for wl in preset.workloads:
        for system in preset.systems:
            c = sums[f"{wl.label}/{system}"]
            gains[f"{wl.label}/{system}"] = {
                ref: _gains(c, sums[f"{wl.label}/{ref}"])
                for ref in ("vllm", "cachewise", "smetric")
                if ref in preset.systems and ref != system
            }
    profile = runs[0].profile
    return {
        "preset": preset.name,
        "workers": preset.workers,
        "workloads": {w.label: w.describe(preset.duration_s) for w in preset.workloads},
        "systems": list(preset.systems),
        "seeds": sorted({r.seed for r in runs}),
        "warmup_s": preset.warmup_s,
        "windows_s": {
            "primary": [preset.warmup_s, preset.duration_s],
            "10min": [preset.warmup_s, min(preset.warmup_s + SHORT_WINDOW_S, preset.duration_s)],
        },
        "slo_default": {"ttft_s": base.slo.ttft_s, "tbt_s": base.slo.tbt_s},
        "slo_calibrated": {
            "ttft_s": fit.ttft_s,
            "tbt_s": fit.tbt_s,
            "calibrated_on": preset.slo_system,
            "target_shares": fit.targets,
            "shares": fit.shares,
            "source": SOURCE,
        }
        if fit
        else None,
        "slo_gain_grid": _gain_grid(preset, runs),
        "paper_baseline": _paper_baseline(preset, cells),
        "profile": profile,
        "cells": cells,
        "gains": gains,
        "versions": versions(),
    }


def _gains(system: dict[str, list[float]], ref: dict[str, list[float]]) -> dict[str, Any]:
    """Per metric: the ratio of sums over seeds and, as ``<metric>_ci95``, its jackknife interval."""
    out: dict[str, Any] = {}
    for m, values in system.items():
        ci = ratio_ci(values, ref[m])
        out[m] = ci.ratio
        out[f"{m}_ci95"] = None if ci.lo is None else [ci.lo, ci.hi]
    return out


def _route_summary(routes: list[dict[str, Any]]) -> dict[str, Any]:
    chosen = np.concatenate([np.array(r["chosen_d"]) for r in routes]) if any(r["chosen_d"] for r in routes) else np.array([])
    shadow_d = np.concatenate([np.array(r["shadow_d"]) for r in routes]) if any(r["shadow_d"] for r in routes) else np.array([])
    n = sum(r["decisions"] for r in routes)
    return {
        "decisions": n,
        "differs_frac": sum(r["differs"] for r in routes) / n if n else None,
        "mean_distance_coda": float(chosen.mean()) if chosen.size else None,
        "mean_distance_smetric": float(shadow_d.mean()) if shadow_d.size else None,
        "distance_reduction": float(1 - chosen.mean() / shadow_d.mean()) if chosen.size and shadow_d.mean() > 0 else None,
    }


def _gain_grid(preset: PaperPreset, runs: list[Run]) -> dict[str, Any]:
    """Every system's SLO-throughput ratio over the SLO-calibration system, per workload, at each
    threshold pair of ``GRID_TTFT_S`` x ``GRID_TBT_S`` (primary window)."""
    ref = preset.slo_system
    if ref not in preset.systems:
        return {}
    samples = {(r.workload, r.system): [] for r in runs}
    for r in runs:
        samples[(r.workload, r.system)].append(SloSample.of(r.records, r.window))
    ratios = {
        f"{wl.label}/{system}": gain_grid(samples[(wl.label, system)], samples[(wl.label, ref)], GRID_TTFT_S, GRID_TBT_S)
        for wl in preset.workloads
        for system in preset.systems
        if system != ref
    }
    return {"vs": ref, "ttft_s": list(GRID_TTFT_S), "tbt_s": list(GRID_TBT_S), "ratios": ratios}


def _paper_baseline(preset: PaperPreset, cells: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """CacheWise in the simulator (its cells' means over seeds) next to the paper's published
    CacheWise, with relative errors."""
    rows = []
    for wl in preset.workloads:
        paper = CACHEWISE.get(wl.label)
        cell = cells.get(f"{wl.label}/cachewise")
        if paper is None or cell is None:
            continue
        d = cell["default"]
        out = d["output_tps"]["mean"]
        sim = {
            "output_tps": out,
            "tbt_mean_s": d["tbt_mean_s"]["mean"],
            "useful_per_output": d["useful_tps"]["mean"] / out if out else None,  # the same seeds: a ratio of sums
            "slo_tps": cell["calibrated"]["slo_tps"]["mean"] if "calibrated" in cell else None,
        }
        pub = {
            "output_tps": paper.output_tps,
            "tbt_mean_s": paper.tbt_mean_s,
            "useful_per_output": paper.useful_per_output,
            "slo_tps": paper.slo_tps,
        }
        for metric, value in pub.items():
            if value is None or sim[metric] is None:
                continue
            err = sim[metric] / value - 1.0
            rows.append(
                {"workload": wl.label, "metric": metric, "paper": value, "sim": sim[metric], "error": err, "within": abs(err) <= TOLERANCE}
            )
    return rows


def _gain_cell(gains: dict[str, Any], metric: str) -> str:
    """``+4.6% [+1.0, +8.0]``: a gain as a change, with its jackknife interval where there is one."""
    g, ci = gains.get(metric), gains.get(f"{metric}_ci95")
    if g is None:
        return "-"
    return f"{g - 1:+.1%}" + (f" [{(ci[0] - 1) * 100:+.1f}, {(ci[1] - 1) * 100:+.1f}]" if ci else "")


def _ms(ci: dict[str, Any] | None) -> str:
    return f"{ci['mean'] * 1e3:.1f}" if ci and ci.get("mean") is not None else "-"


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
        f"Cost profile: {report['profile']['name']} ({report['profile']['kind']}): {report['profile']['description']}",
        "",
        f"Windows: primary {report['windows_s']['primary'][0]:.0f}-{report['windows_s']['primary'][1]:.0f} s, "
        f"10-minute {report['windows_s']['10min'][0]:.0f}-{report['windows_s']['10min'][1]:.0f} s (warm-up {report['warmup_s']:.0f} s). "
        f"Default SLO: TTFT <= {report['slo_default']['ttft_s']} s, mean TBT <= {report['slo_default']['tbt_s']} s.",
    ]
    cal = report.get("slo_calibrated")
    if cal:
        shares = ", ".join(f"{k} {cal['shares'][k]:.1%} (paper {t:.1%})" for k, t in cal["target_shares"].items())
        lines.append(
            f"Calibrated SLO: TTFT <= {cal['ttft_s']:.3g} s, mean TBT <= {cal['tbt_s'] * 1e3:.0f} ms, the pair at which "
            f"{cal['calibrated_on']} keeps the paper's share of its output within SLO: {shares}."
        )
    if report.get("paper_baseline"):
        lines += [
            "",
            f"CacheWise against the paper ({SOURCE}); errors over {TOLERANCE:.0%} are marked:",
            "",
            "| workload | metric | paper | simulated | error |",
            "|---|---|---|---|---|",
        ]
        for row in report["paper_baseline"]:
            scale, unit = (1e3, " ms") if row["metric"] == "tbt_mean_s" else (1.0, "")
            lines.append(
                f"| {row['workload']} | {row['metric']} | {row['paper'] * scale:.1f}{unit} | {row['sim'] * scale:.1f}{unit} | "
                f"{row['error']:+.1%}{'' if row['within'] else ' (miss)'} |"
            )
    lines += ["", "Workloads: " + "; ".join(f"{k} = {v}" for k, v in report["workloads"].items()), ""]
    head = (
        "| workload | system | output tok/s | useful tok/s | SLO tok/s | "
        + ("SLO tok/s (calibrated) | " if cal else "")
        + "goodput | TTFT p95 s | mean TBT ms | 10-min output tok/s | 10-min mean TBT ms |"
    )
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for key, cell in report["cells"].items():
        wl, system = key.split("/", 1)
        d = cell["default"]
        row = f"| {wl} | {system} | {_fmt(d['output_tps'])} | {_fmt(d['useful_tps'])} | {_fmt(d['slo_tps'])} | "
        if cal:
            row += f"{_fmt(cell['calibrated']['slo_tps'])} | "
        tbt = d.get("tbt_mean_s")
        short = cell["window_10min"]
        row += (
            f"{_fmt(d['goodput'], 3)} | {_fmt(d['ttft_p95_s'], 2)} | {_ms(tbt)} | {_fmt(short['output_tps'])} | "
            f"{_ms(short['tbt_mean_s'])} |"
        )
        lines.append(row)
    lines += [
        "",
        "Gains (ratios of sums over seeds, as changes, with jackknife 95% intervals over seeds):",
        "",
        "| workload | system | vs | output | useful | SLO | "
        + ("SLO (calibrated) | 10-min SLO (calibrated) | " if cal else "")
        + "10-min output |",
        "|---|---|---|---|---|---|---|" + ("---|---|" if cal else ""),
    ]
    for key, refs in report["gains"].items():
        wl, system = key.split("/", 1)
        for ref, g in refs.items():
            cols = (
                ["output_tps", "useful_tps", "slo_tps"]
                + (["slo_tps_calibrated", "slo_tps_calibrated_10min"] if cal else [])
                + ["output_tps_10min"]
            )
            lines.append(f"| {wl} | {system} | {ref} | " + " | ".join(_gain_cell(g, m) for m in cols) + " |")
    grid = report.get("slo_gain_grid")
    if grid:
        lines += ["", f"SLO tok/s over {grid['vs']} across SLO thresholds (rows: mean TBT bound; columns: TTFT bound):"]
        for key, rows in grid["ratios"].items():
            lines += [
                "",
                f"{key} vs {grid['vs']}:",
                "",
                "| TBT \\ TTFT | " + " | ".join(f"{t:g} s" for t in grid["ttft_s"]) + " |",
                "|---|" + "---|" * len(grid["ttft_s"]),
            ]
            for tbt, row in zip(grid["tbt_s"], rows):
                lines.append(f"| {tbt * 1e3:.0f} ms | " + " | ".join("-" if x is None else f"{x - 1:+.1%}" for x in row) + " |")
    shadow_rows = [
        (k, c["differs_from_fewest_blocks"]) for k, c in report["cells"].items() if c.get("differs_from_fewest_blocks") is not None
    ]
    if shadow_rows:
        lines += [
            "",
            "Admission choices (in the window) where `fewest_blocks` (CacheWise), evaluated in shadow on the same snapshot, "
            "would have admitted another request or none:",
            "",
            "| workload/system | differs |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v:.1%} |" for k, v in shadow_rows]
    route_rows = [(k, c["routing_vs_smetric"]) for k, c in report["cells"].items() if c.get("routing_vs_smetric")]
    if route_rows:
        lines += [
            "",
            "Routing decisions where `coda` differs from `smetric` evaluated in shadow on the same snapshot:",
            "",
            "| workload/system | decisions | differs | mean distance coda | mean distance smetric | reduction |",
            "|---|---|---|---|---|---|",
        ]
        for k, v in route_rows:

            def f(x: float | None, pct: bool = False) -> str:
                return "-" if x is None else (f"{x:.1%}" if pct else f"{x:.3f}")

            lines.append(
                f"| {k} | {v['decisions']} | {f(v['differs_frac'], True)} | {f(v['mean_distance_coda'])} | "
                f"{f(v['mean_distance_smetric'])} | {f(v['distance_reduction'], True)} |"
            )
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
        for j, (field, label) in enumerate(
            (("ttft_s", "TTFT (s)"), ("tbt_mean_s", "mean TBT per request (s)"), ("e2e_s", "E2E latency (s)"))
        ):
            ax = axes[i][j]
            for r in runs:
                if r.workload != wl.label or r.seed != first_seed:
                    continue
                w = r.window
                vals = np.sort([x[field] for x in r.records if x[field] is not None and w.start_s <= x["ready_s"] <= w.end_s])
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
    bars(
        [("output_tps", "output tokens/s"), ("useful_tps", "useful tokens/s"), ("slo_tps", "SLO-compliant output tokens/s")],
        systems,
        "throughput.png",
        "Throughput (95% intervals over seeds)",
    )
    if preset.workers > 1:
        main = [s for s in systems if not s.startswith("coda-")]
        bars(
            [("output_tps", "output tokens/s"), ("request_tps", "completed requests/s"), ("slo_tps", "SLO-compliant output tokens/s")],
            main,
            "fig11_throughput.png",
            "Figure 11 shape: throughput per system",
        )
        bars(
            [
                ("ttft_p50_s", "TTFT p50 (s)"),
                ("ttft_p95_s", "TTFT p95 (s)"),
                ("tbt_p50_s", "TBT p50 (s)"),
                ("tbt_p95_s", "TBT p95 (s)"),
                ("e2e_p50_s", "E2E p50 (s)"),
                ("e2e_p95_s", "E2E p95 (s)"),
            ],
            main,
            "fig12_latency.png",
            "Figure 12 shape: latency percentiles",
        )
        abl = [s for s in ("smetric", "coda-route-only", "coda-admit-only", "coda") if s in systems]
        bars(
            [("output_tps", "output tokens/s"), ("slo_tps", "SLO-compliant output tokens/s")],
            abl,
            "fig14_ablation.png",
            "Figure 14 shape: ablation",
        )
        bars(
            [
                ("reuse_hbm", "prefix reuse from HBM (share of prompt tokens)"),
                ("reuse_store", "prefix reuse from the KV store"),
                ("decode_concurrency", "mean decoding requests per worker"),
            ],
            main,
            "fig16_hits.png",
            "Figure 16 shape: hit rates and decode concurrency",
        )
    return written


def run_and_report(name: str, seeds: list[int], base: SimConfig, out: Path | None, sweep: SweepOptions = SERIAL) -> dict[str, Any]:
    preset = PRESETS[name]
    runs = run_preset(preset, seeds, base, sweep)
    report = build_report(preset, runs, base)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(strict_json.dumps(report, indent=2) + "\n")
        (out / "report.md").write_text(markdown(report))
        report["figures"] = [str(p) for p in plots(preset, runs, report, out)]
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.paper NAME [--seeds N] [--seed K] [--config FILE] [--out DIR] [--json] [--jobs N | --ray [ADDRESS]]``."""
    import argparse
    import sys

    from coda.config.load import read_config, validated
    from coda.errors import CodaError

    ap = argparse.ArgumentParser(
        prog="python -m experiments.paper",
        description="A paper-shaped evaluation: every system of the "
        "preset on its workloads and seeds; report.md, report.json and figures in --out.",
    )
    ap.add_argument("name", choices=sorted(PRESETS), help="the preset")
    ap.add_argument("--seeds", type=int, default=5, help="how many seeds (default 5)")
    ap.add_argument("--seed", type=int, default=0, help="the first seed")
    ap.add_argument("--config", help="a simulator config file laid under the presets (a profile, an SLO, ...)")
    ap.add_argument("--out", type=Path, help="folder for report.md, report.json and the figures")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object")
    add_sweep_arguments(ap)
    args = ap.parse_args(argv)
    try:
        if args.seeds < 1:
            raise CodaError(f"--seeds must be at least 1, got {args.seeds}")
        base = validated(SimConfig, read_config(args.config) if args.config else {}, args.config or "defaults", show_input=True)
        sweep = sweep_options(args, args.out / "cells" if args.out is not None else None)
        report = run_and_report(args.name, [args.seed + i for i in range(args.seeds)], base, args.out, sweep)
    except CodaError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    print(strict_json.dumps(report) if args.json else markdown(report))
    if args.out is not None:
        print(f"report, tables and figures written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
