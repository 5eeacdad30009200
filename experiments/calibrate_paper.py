"""Calibrate the paper's operating point on its baseline (CacheWise), never on Coda's numbers.

Runs CacheWise (least-loaded routing, fewest-blocks admission, tool-aware reclaim) on the
paper-single workloads M1-M3, in the preset's steady-state window, and prints its output tok/s,
mean TBT, useful/output ratio and decode concurrency next to the Coda paper's published CacheWise
numbers (Table 1), with the relative error of each. ``--grid`` evaluates variants of the profile's
three calibrated terms (weight-read efficiency, KV-read efficiency, fixed step time):

    python -m experiments.calibrate_paper --seeds 0,1,2
    python -m experiments.calibrate_paper --profile a100-qwen3coder30b-fp8-fa2 --grid 0.4,0.5,0.005 0.5,0.55,0.005
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

from coda.cost.profile import BUILTIN_DEFAULT, load_profile
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sweep import Cell, SweepOptions, profile_digest, run_cells
from coda.sweep.arguments import add_sweep_arguments, sweep_options
from experiments.paper import PRESETS
from experiments.paper_reference import CACHEWISE

PRESET = PRESETS["paper-single"]


def run(profile: str, label: str, seed: int) -> dict[str, float]:
    wl = next(w for w in PRESET.workloads if w.label == label).build(seed, PRESET.duration_s)
    s = Simulation(wl, SimConfig(system="cachewise", workers=1, seed=seed, profile=profile, warmup_s=PRESET.warmup_s)).run().summary()
    return {"output_tps": s["output_tps"], "useful_ratio": s["useful_tps"] / s["output_tps"] if s["output_tps"] else float("nan"),
            "tbt_ms": (s["tbt_mean_s"] or float("nan")) * 1e3, "concurrency": s["decode_concurrency"]}


def variant(base: str, terms: str, folder: Path) -> str:
    """The base profile with ``gpu.mem_efficiency,attention.mem_efficiency,overheads.step_s`` replaced."""
    mw, mkv, step = (float(x) for x in terms.split(","))
    data = json.loads(load_profile(base).model_dump_json())
    data["name"] = f"{data['name']}-grid"
    data["gpu"]["mem_efficiency"], data["attention"]["mem_efficiency"], data["overheads"]["step_s"] = mw, mkv, step
    path = folder / f"{terms}.json"
    path.write_text(json.dumps(data))
    return str(path)


def report(profile: str, label: str, seeds: list[int], sweep: SweepOptions) -> None:
    print(f"CacheWise, profile {label}, seeds {seeds}, window {PRESET.warmup_s:g}-{PRESET.duration_s:g} s")
    print(f"{'':4} {'output tok/s':>24} {'useful/output':>22} {'mean TBT ms':>22} {'decoders':>9}")
    cells = [
        Cell(
            f"{wl.label} seed {s}",
            {"profile": profile_digest(profile), "workload": wl.label, "seed": s},
            partial(run, profile, wl.label, s),
            weight=PRESET.duration_s,
        )
        for wl in PRESET.workloads
        for s in seeds
    ]
    results = run_cells(cells, sweep, title=f"calibrate {label}")
    for i, wl in enumerate(PRESET.workloads):
        paper = CACHEWISE[wl.label]
        rows = results[i * len(seeds) : (i + 1) * len(seeds)]
        m = {k: statistics.mean(float("nan") if r[k] is None else r[k] for r in rows) for k in rows[0]}
        tbt_p = (paper.tbt_mean_s or float("nan")) * 1e3
        ratio_p = paper.useful_per_output or float("nan")
        print(
            f"{wl.label:4} {m['output_tps']:8.1f} vs {paper.output_tps:6.1f} ({m['output_tps'] / paper.output_tps - 1:+6.1%}) "
            f"{m['useful_ratio']:7.2f} vs {ratio_p:5.1f} ({m['useful_ratio'] / ratio_p - 1:+6.1%}) "
            f"{m['tbt_ms']:7.1f} vs {tbt_p:5.1f} ({m['tbt_ms'] / tbt_p - 1:+6.1%}) {m['concurrency']:9.2f}",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=BUILTIN_DEFAULT)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--grid", nargs="*", default=[], help="variants 'weight_eff,kv_eff,step_s' of --profile")
    add_sweep_arguments(ap)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    sweep = sweep_options(args, None)
    if not args.grid:
        report(args.profile, args.profile, seeds, sweep)
        return 0
    with tempfile.TemporaryDirectory() as folder:
        for terms in args.grid:
            report(variant(args.profile, terms, Path(folder)), f"{args.profile} with (weight, KV, step) = ({terms})", seeds, sweep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
