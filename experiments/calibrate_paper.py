"""Calibrate the paper's operating point on its baseline (CacheWise), never on Coda's numbers.

For a cost profile and a synthetic workload shape, runs CacheWise (least-loaded routing,
fewest-blocks admission, tool-aware reclaim) on the paper's single-worker workloads M1-M3 and
prints, next to the Coda paper's published CacheWise numbers (Table 1), its output tokens/s, mean
TBT, useful/output ratio and decode concurrency, with the relative error of each.

    python experiments/calibrate_paper.py --profile a100-qwen3coder30b-fp8-calibrated [--seeds 0,1] [--shape tracelab]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from coda.eval.paper import PRESETS
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig

# The Coda paper, Table 1 (CacheWise, one A100-80GB, M1-M3): output tok/s, useful/output, mean TBT (ms)
PAPER = {"M1": (130.8, 11.7, 69.3), "M2": (132.6, 13.5, 81.8), "M3": (146.6, 13.9, 84.0)}


def run(profile: str, label: str, seed: int, shape: str, duration: float, warmup: float) -> dict:
    preset = PRESETS["paper-single"]
    wl_def = next(w for w in preset.workloads if w.label == label)
    wl = wl_def.build(seed, duration, shape)
    sim = Simulation(wl, SimConfig(system="cachewise", workers=1, seed=seed, profile=profile, warmup_s=warmup))
    s = sim.run().summary()
    return {
        "output_tps": s["output_tps"],
        "useful_ratio": s["useful_tps"] / s["output_tps"] if s["output_tps"] else float("nan"),
        "tbt_ms": (s["tbt_mean_s"] or float("nan")) * 1e3,
        "concurrency": s["decode_concurrency"],
        "wall_s": s["wall_s"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--shape", default="tracelab")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--warmup", type=float, default=1200.0)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"CacheWise, profile {args.profile}, synth shape {args.shape}, seeds {seeds}, window {args.warmup:g}-{args.duration:g} s")
    print(f"{'':4} {'output tok/s':>24} {'useful/output':>22} {'mean TBT ms':>22} {'decoders':>9}")
    for label, (out_p, ratio_p, tbt_p) in PAPER.items():
        t0 = time.perf_counter()
        rows = [run(args.profile, label, s, args.shape, args.duration, args.warmup) for s in seeds]
        m = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
        print(
            f"{label:4} {m['output_tps']:8.1f} vs {out_p:6.1f} ({m['output_tps'] / out_p - 1:+6.1%}) "
            f"{m['useful_ratio']:7.2f} vs {ratio_p:5.1f} ({m['useful_ratio'] / ratio_p - 1:+6.1%}) "
            f"{m['tbt_ms']:7.1f} vs {tbt_p:5.1f} ({m['tbt_ms'] / tbt_p - 1:+6.1%}) {m['concurrency']:9.2f}   [{time.perf_counter() - t0:.0f} s]"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
