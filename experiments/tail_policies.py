"""Throughput against the tail: which engine-admission order keeps the GPU busy without starving a task.

Every candidate runs on the calibrated profile and the paper presets' workloads (M1-M3 on one
worker, Q1-Q3 on four, 12,000 s of arrivals with the first 9,600 s warm-up) and, on four
workers, on the public Mooncake and Azure traces. Each candidate is a system preset with its
state-admission policy replaced:

  vllm, cachewise, coda    the shipped presets (coda: the paper's Tiered-Aging, tau 5 s, W_max 20 s)
  fb_guard                 fewest-blocks with a feasible-only age bound (W_max 600 s)
  aged_blocks              extra blocks aged by wait (tau 600 s), no bound
  aged_seconds             the paper's state cost aged by wait with tau 60 s, asked for every slot, no bound
  aged_seconds_guard       the same with the feasible-only bound at W_max 1,800 s: the coda-tail preset
  aged_seconds_guard_900   ... and at W_max 900 s

tau and W_max were chosen on M3 seed 0 (tau 20 / 60 s, W_max 600 / 900 / 1,800 s / none); the
evaluation runs seeds 1-5, which the choice did not see.

    python -m experiments.tail_policies --workloads M1,M2,M3 --seeds 1,2,3,4,5 --out runs/tail
    python -m experiments.tail_policies --report-only --out runs/tail

The runs are the cells of one sweep (``--jobs N`` local processes, or ``--ray [ADDRESS]``), each kept
under ``<out>/cells`` as it finishes, keyed by its whole configuration, so an interrupted sweep
resumes where it stopped and a changed candidate runs again. The report (``<out>/report.md``) gives, per workload and candidate,
output, SLO tok/s, goodput, p99 task slowdown, p99 and max TTFT and starved requests (waited
over 60 s or never finished), each as a mean with its 95% interval over the seeds the candidate
ran, the output ratio over cachewise on the same seeds with its jackknife interval, and the
target check (on five seeds or more): that ratio's interval reaching 1.0 and p99 slowdown at
most vllm's on the same seeds. ``<out>/pareto-<workload>.png`` draws every
candidate against the frontier.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

from coda.errors import CodaError
from coda.eval.pareto import plot_pareto
from coda.metrics.requests import mean_ci, ratio_ci
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sweep import Cell, CellStore, file_digest, profile_digest, run_cells, workload_identity
from coda.sweep.arguments import add_sweep_arguments, sweep_options
from coda.workload.spec import load_workload
from experiments.common import fmt_ci
from experiments.paper import PRESETS

DATA_ENV = "CODA_DATA_DIR"  # the folder of public traces, never part of the repository
TRACES = {"mooncake": "conversation_trace.jsonl", "azure": "AzureLLMInferenceTrace_code.csv"}
BASELINES = ("vllm", "cachewise")
TARGET_SEEDS = 5  # the target is judged on five seeds or more
METRICS = ("output_tps", "slo_tps", "goodput", "slowdown_p99", "ttft_p99_s", "ttft_max_s", "stalled", "tasks", "tasks_censored")


def _ta(**params: Any) -> dict[str, Any]:
    return {"state": {"name": "tiered_aging", "params": {"admission": "every_slot", **params}}}


#: candidate -> (system preset, policies override); tau 1e12 s stands for no aging
CANDIDATES: dict[str, tuple[str, dict[str, Any]]] = {
    "vllm": ("vllm", {}),
    "cachewise": ("cachewise", {}),
    "coda": ("coda", {}),
    "fb_guard": ("coda", _ta(cost_unit="blocks", tau_s=1e12, w_max_s=600.0)),
    "aged_blocks": ("coda", _ta(cost_unit="blocks", tau_s=600.0, w_max_s=1e12)),
    "aged_seconds": ("coda", _ta(cost_unit="seconds", tau_s=60.0, w_max_s=1e12)),
    "aged_seconds_guard": ("coda-tail", {}),
    "aged_seconds_guard_900": ("coda", _ta(cost_unit="seconds", tau_s=60.0, w_max_s=900.0)),
}


def workload_setup(label: str, seed: int, data_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The identity of a label's workload (what ``build_workload`` reads) and the run settings:
    a paper preset's workload, or a public trace on four workers."""
    for preset in (PRESETS["paper-single"], PRESETS["paper-multi"]):
        for w in preset.workloads:
            if w.label == label:
                return ({"paper": label, "rate": w.rate, "fraction": w.fraction, "duration_s": preset.duration_s, "seed": seed},
                        {"workers": preset.workers, "warmup_s": preset.warmup_s})
    if label in TRACES:
        return {"trace": str(data_dir / "traces" / TRACES[label]), "format": label}, {"workers": 4}
    raise SystemExit(f"unknown workload {label!r}; valid: M1-M3, Q1-Q3, {', '.join(TRACES)}")


def build_workload(identity: dict[str, Any]) -> Any:
    if "trace" in identity:
        return load_workload(identity["trace"], fmt=identity["format"])
    preset = next(p for p in (PRESETS["paper-single"], PRESETS["paper-multi"]) if any(w.label == identity["paper"] for w in p.workloads))
    return next(w for w in preset.workloads if w.label == identity["paper"]).build(identity["seed"], identity["duration_s"])


def run_one(identity: dict[str, Any], cfg: SimConfig, label: str, candidate: str) -> dict[str, Any]:
    s = Simulation(build_workload(identity), cfg).run().summary()
    return {"workload": label, "seed": cfg.seed, "candidate": candidate, "profile": cfg.profile, **{k: s.get(k) for k in METRICS}}


def cells(workloads: list[str], seeds: list[int], candidates: list[str], data_dir: Path) -> list[Cell]:
    """One cell per workload, seed and candidate, keyed by its simulator config, its workload
    (a paper workload's definition, a trace's bytes) and its cost profile's content."""
    out = []
    for label in workloads:
        for seed in seeds:
            identity, settings = workload_setup(label, seed, data_dir)
            key_wl = identity if "paper" in identity else workload_identity(identity["trace"], identity["format"])
            for c in candidates:
                system, policies = CANDIDATES[c]
                cfg = SimConfig(system="vllm").with_overrides(system=system, seed=seed, policies=policies or None, **settings)
                config = {"cell": "tail_policies", "candidate": c, "sim": cfg.model_dump(mode="json"), "workload": key_wl,
                          "profile": profile_digest(cfg.profile), "harness": file_digest(__file__)}
                out.append(Cell(f"{label} seed {seed} {c}", config, partial(run_one, identity, cfg, label, c),
                                weight=identity.get("duration_s", 1.0)))
    return out


def report(runs: dict[tuple[str, int, str], dict[str, Any]], out: Path) -> str:
    """The per-workload tables, the target check and the Pareto figures."""
    lines = ["# Throughput against the tail", "",
             f"Profile: {next(iter(runs.values()))['profile'] if runs else '-'}; candidates: "
             + "; ".join(f"{k} = {v[0]} {json.dumps(v[1]['state']['params']) if v[1] else ''}".strip() for k, v in CANDIDATES.items())
             + "; every number a mean over seeds with its 95% interval", ""]
    for label in dict.fromkeys(k[0] for k in runs):
        seeds = sorted({k[1] for k in runs if k[0] == label})
        rows = {c: [runs[(label, s, c)] for s in seeds if (label, s, c) in runs] for c in CANDIDATES}
        rows = {c: rs for c, rs in rows.items() if rs}
        lines += [
            f"## {label} (seeds {', '.join(map(str, seeds))})",
            "",
            "| candidate | seeds | output tok/s | vs cachewise | SLO tok/s | goodput | "
            "p99 slowdown | p99 TTFT s | max TTFT s | starved | target |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        pareto_rows = []
        for c, rs in rows.items():
            col = {m: [r[m] for r in rs] for m in METRICS}
            gain, check = "-", "-"
            mine = {r["seed"] for r in rs}
            if "cachewise" in rows and mine <= {x["seed"] for x in rows["cachewise"]}:  # paired seeds
                r, lo, hi = ratio_ci(col["output_tps"], [x["output_tps"] for x in rows["cachewise"] if x["seed"] in mine])
                gain = f"{r:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None else "")
            if gain != "-" and c not in BASELINES and len(rs) < TARGET_SEEDS:
                check = f"not judged on {len(rs)} seeds"
            elif gain != "-" and c not in BASELINES:
                if "vllm" in rows:
                    vllm_tail = mean_ci([x["slowdown_p99"] for x in rows["vllm"] if x["seed"] in mine])["mean"]
                    ok_out = (hi if hi is not None else r) >= 1.0
                    ok_tail = vllm_tail is not None and (mean_ci(col["slowdown_p99"])["mean"] or 0) <= vllm_tail
                    check = "met" if ok_out and ok_tail else ("output" if ok_tail else "tail" if ok_out else "both") + " missed"
            lines.append(
                f"| {c} | {len(rs)} | {fmt_ci(col['output_tps'], 1)} | {gain} | {fmt_ci(col['slo_tps'], 1)} | "
                f"{fmt_ci(col['goodput'], 3)} | "
                f"{fmt_ci(col['slowdown_p99'], 1)} | {fmt_ci(col['ttft_p99_s'], 0)} | {fmt_ci(col['ttft_max_s'], 0)} | "
                f"{fmt_ci(col['stalled'], 0)} | {check} |"
            )
            point: dict[str, Any] = {"system": c}
            for m in ("output_tps", "slowdown_p99", "ttft_p99_s"):
                ci = mean_ci(col[m])
                point[m], point[f"{m}_ci95"] = ci["mean"], ci["ci95"]
            pareto_rows.append(point)
        try:
            plot_pareto(out / f"pareto-{label}.png", pareto_rows)
            lines += ["", f"Figure: pareto-{label}.png"]
        except ImportError:
            lines += ["", "(matplotlib is not installed: no figure)"]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="M1,M2,M3")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--out", type=Path, default=Path("runs/tail"))
    ap.add_argument(
        "--data-dir", default=os.environ.get(DATA_ENV), help=f"folder holding traces/, for {' and '.join(TRACES)} (default: ${DATA_ENV})"
    )
    ap.add_argument("--report-only", action="store_true", help="report the cells already finished under --out, running none")
    add_sweep_arguments(ap)
    args = ap.parse_args()
    unknown = [c for c in args.candidates.split(",") if c not in CANDIDATES]
    if unknown:
        print(f"error: unknown candidate(s) {', '.join(unknown)}; valid: {', '.join(CANDIDATES)}", file=sys.stderr)
        return 2
    traces = [w for w in args.workloads.split(",") if w in TRACES]
    if traces and not args.data_dir:
        print(
            f"error: --workloads {','.join(traces)} read public traces: set {DATA_ENV} (or --data-dir) to the folder holding traces/",
            file=sys.stderr,
        )
        return 2
    sweep = cells(args.workloads.split(","), [int(s) for s in args.seeds.split(",")], args.candidates.split(","), Path(args.data_dir or ""))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        store = CellStore(args.out / "cells")
        results = [r for r in (store.get(c.key) for c in sweep) if r is not None]
    else:
        try:
            results = run_cells(sweep, sweep_options(args, args.out / "cells"), title="tail policies")
        except CodaError as err:
            print(f"error: {err}", file=sys.stderr)
            return err.exit_code
    runs = {(r["workload"], r["seed"], r["candidate"]): r for r in results}
    text = report(runs, args.out)
    (args.out / "report.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
