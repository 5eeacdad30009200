"""One factor at a time: which of the paper-faithful changes moves Tiered-Aging against CacheWise.

From the faithful configuration (the paper-single preset on the calibrated profile and the
tracelab-shaped workload, with the feasible progress guard and promote-one integration), each
variant reverts one change and reruns ``cachewise`` and ``cachewise+ta`` on the same seeds:

  faithful     every change in place
  hold_queue   Tiered-Aging's guard holds the queue for an oldest request that does not fit
  every_slot   Tiered-Aging is asked again for every admission slot of a step
  copilot      the copilot-shaped workload (mean output 527) instead of tracelab's
  roofline     the analytic roofline profile instead of the calibrated one

    python -m experiments.faithful_factors [--workloads M2,M3] [--seeds 0,1,2] [--jobs N | --ray [ADDRESS]]

Prints, per workload and variant, Tiered-Aging's output and SLO-throughput ratios over CacheWise
(ratios of sums over seeds) at the default SLO and at the SLO pair given by ``--slo TTFT,TBT``
(default: the calibrated pair of ``python -m experiments.paper paper-single``, passed by hand).
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any

from coda.metrics.requests import summarize
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sweep import Cell, run_cells
from coda.sweep.arguments import add_sweep_arguments, sweep_options
from experiments.paper import PRESETS

PRESET = PRESETS["paper-single"]
ROOFLINE = "a100-qwen3coder30b-fp8-roofline"

# variant -> (workload shape, profile or None for the default, Tiered-Aging's parameter overrides)
VARIANTS: dict[str, tuple[str, str | None, dict[str, Any]]] = {
    "faithful": ("tracelab", None, {}),
    "hold_queue": ("tracelab", None, {"hold_queue": True}),
    "every_slot": ("tracelab", None, {"admission": "every_slot"}),
    "copilot": ("copilot", None, {}),
    "roofline": ("tracelab", ROOFLINE, {}),
}


def run(label: str, seed: int, system: str, variant: str, slo: tuple[float, float]) -> dict[str, float]:
    shape, profile, ta_params = VARIANTS[variant]
    wl = next(w for w in PRESET.workloads if w.label == label).build(seed, PRESET.duration_s, shape)
    over: dict[str, Any] = {"system": system, "workers": 1, "seed": seed, "warmup_s": PRESET.warmup_s}
    if profile:
        over["profile"] = profile
    if ta_params and system == "cachewise+ta":
        over["policies"] = {"state": {"params": ta_params}}
    result = Simulation(wl, SimConfig(system="vllm").with_overrides(**over)).run()
    s = result.summary()
    cal = summarize(result.records, result.sim.window, ttft_slo_s=slo[0], tbt_slo_s=slo[1], gaps=result.sim.recorder.gaps())
    return {"output_tps": s["output_tps"], "slo_tps": s["slo_tps"], "slo_tps_calibrated": cal["slo_tps"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="M2,M3")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--slo", required=True, help="calibrated TTFT,TBT in seconds, from the paper-single report")
    add_sweep_arguments(ap)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    slo = tuple(float(x) for x in args.slo.split(","))
    print(
        f"paper-single workloads, seeds {seeds}, window {PRESET.warmup_s:g}-{PRESET.duration_s:g} s, calibrated SLO TTFT <= {slo[0]:g} s, "
        f"TBT <= {slo[1] * 1e3:g} ms; Tiered-Aging (cachewise+ta) over CacheWise, ratios of sums over seeds\n"
    )
    print("| workload | variant | output | SLO (default) | SLO (calibrated) |\n|---|---|---|---|---|")
    systems = ("cachewise", "cachewise+ta")
    grid = [
        (label, variant, seed, system)
        for label in args.workloads.split(",")
        for variant in args.variants.split(",")
        for seed in seeds
        for system in systems
    ]
    cells = [
        Cell(
            f"{label} {variant} {system} seed {seed}",
            {"workload": label, "variant": variant, "seed": seed, "system": system, "slo": slo},
            partial(run, label, seed, system, variant, slo),
            weight=PRESET.duration_s,
        )
        for label, variant, seed, system in grid
    ]
    by = dict(zip(grid, run_cells(cells, sweep_options(args, None), title="faithful factors")))
    for label in args.workloads.split(","):
        for variant in args.variants.split(","):
            sums = {
                system: {
                    k: sum(by[(label, variant, seed, system)][k] for seed in seeds) for k in ("output_tps", "slo_tps", "slo_tps_calibrated")
                }
                for system in systems
            }
            ta, cw = sums["cachewise+ta"], sums["cachewise"]
            cols = [f"{ta[k] / cw[k] - 1:+.1%}" if cw[k] else "-" for k in ("output_tps", "slo_tps", "slo_tps_calibrated")]
            print(f"| {label} | {variant} | " + " | ".join(cols) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
