"""What moves the HBM-ready share of the policy-neutral replay, one factor at a time.

The base is ``coda characterize``'s neutral replay (the ``vllm`` system: round-robin routing, FCFS,
LRU reclaim, the CPU shadow, the SSD tier on) of the synthetic agent workload on the calibrated
A100 profile. Each row changes one thing: the load (arrival rate), routing (session affinity, the
``smetric`` router, instead of round robin), shadow eagerness (no CPU shadow: blocks are copied
out when evicted), session interleaving (tool pauses scaled, so more or fewer other admissions
run between a session's rounds), and the number of workers; then lower loads, with and without
affinity, to find where the paper's shares (about three in four resumed requests HBM-ready)
could hold. Shares are of resumed requests
ready in the measurement window (``coda.eval.characterize``'s F2).

    nice -n 19 python benchmarks/residency_factors.py [--duration 9000 --warmup 1800] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from coda.eval.characterize import path_findings, resumed_records
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.spec import load_workload

BASE = {"rate": 5.0, "tools": 1.0, "workers": 4, "router": None, "cpu_shadow": None}
#: one factor changed per row: (factor, setting label, overrides of BASE)
ROWS: list[tuple[str, str, dict[str, Any]]] = [
    ("base", "rate 5, 4 workers, round robin, shadow on, tools x1", {}),
    ("load", "rate 1", {"rate": 1.0}),
    ("load", "rate 3", {"rate": 3.0}),
    ("routing", "session affinity (smetric router)", {"router": "smetric"}),
    ("shadow", "no CPU shadow (copy out on eviction)", {"cpu_shadow": False}),
    ("interleaving", "tool pauses x0.25", {"tools": 0.25}),
    ("interleaving", "tool pauses x4", {"tools": 4.0}),
    ("workers", "1 worker at rate 1.25 (the same load per worker)", {"workers": 1, "rate": 1.25}),
    ("workers", "1 worker at rate 1.75 (the single-GPU comparisons' load)", {"workers": 1, "rate": 1.75}),
    # the load at which the paper's shares could hold, with and without session affinity
    ("low load", "rate 0.5", {"rate": 0.5}),
    ("low load", "rate 0.25", {"rate": 0.25}),
    ("low load", "rate 1, session affinity", {"rate": 1.0, "router": "smetric"}),
    ("low load", "rate 0.5, session affinity", {"rate": 0.5, "router": "smetric"}),
    ("low load", "rate 0.25, session affinity", {"rate": 0.25, "router": "smetric"}),
    ("low load", "1 worker at rate 0.5", {"workers": 1, "rate": 0.5}),
    ("low load", "1 worker at rate 0.25", {"workers": 1, "rate": 0.25}),
    # between rate 1 and rate 5 with affinity: where the HBM-ready share crosses three in four
    ("affinity load", "rate 2, session affinity", {"rate": 2.0, "router": "smetric"}),
    ("affinity load", "rate 3, session affinity", {"rate": 3.0, "router": "smetric"}),
    ("affinity load", "rate 4, session affinity", {"rate": 4.0, "router": "smetric"}),
    ("affinity load", "1 worker at rate 0.75", {"workers": 1, "rate": 0.75}),
    ("affinity load", "1 worker at rate 1", {"workers": 1, "rate": 1.0}),
]


def replay(setting: dict[str, Any], duration: float, warmup: float, seed: int, profile: str) -> dict[str, Any]:
    spec = f"synth:rate={setting['rate']:g},duration={duration:g},seed={seed}" + (
        f",tools={setting['tools']:g}" if setting["tools"] != 1 else ""
    )
    policies = {"router": {"name": setting["router"]}} if setting["router"] else {}
    cfg = SimConfig(
        system="vllm",
        ssd=True,
        workers=setting["workers"],
        warmup_s=warmup,
        seed=seed,
        profile=profile,
        policies=policies,
        cpu_shadow=setting["cpu_shadow"],
    )
    t0 = time.perf_counter()
    result = Simulation(load_workload(spec), cfg).run()
    paths = path_findings(resumed_records(result))
    return {
        "workload": spec,
        "resumed": paths["requests"],
        "share": paths["share"],
        "wall_s": time.perf_counter() - t0,
        "reuse_hbm": result.summary().get("reuse_hbm"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=9000.0, help="seconds of arrivals (the paper's replay: 9,000 with a 1,800 s warm-up)")
    ap.add_argument("--warmup", type=float, default=1800.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="a100-qwen3coder30b-fp8-calibrated")
    ap.add_argument("--only", help="comma-separated factors to run (default: all)")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    console = Console(stderr=True)
    wanted = set(args.only.split(",")) if args.only else None
    rows = []
    for factor, label, over in ROWS:
        if wanted and factor not in wanted:
            continue
        out = replay({**BASE, **over}, args.duration, args.warmup, args.seed, args.profile)
        rows.append({"factor": factor, "setting": label, **out})
        s = out["share"]
        console.print(
            f"{factor:13s} {label:50s} HBM {s['hbm']:.3f} DRAM {s['dram']:.3f} SSD {s['ssd']:.3f} recompute {s['recompute']:.3f} "
            f"({out['resumed']} resumed, {out['wall_s']:.0f} s)",
            highlight=False,
        )
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(
                    {"duration_s": args.duration, "warmup_s": args.warmup, "seed": args.seed, "profile": args.profile, "rows": rows},
                    fh,
                    indent=2,
                )
    table = Table(
        title=f"HBM-ready share, one factor at a time ({args.duration:g} s, warm-up {args.warmup:g} s, seed {args.seed}, {args.profile})"
    )
    for col in ("factor", "setting", "HBM-ready", "DRAM", "SSD", "recompute", "resumed"):
        table.add_column(col, justify="right" if col not in ("factor", "setting") else "left")
    for r in rows:
        s = r["share"]
        table.add_row(r["factor"], r["setting"], *(f"{s[p]:.1%}" for p in ("hbm", "dram", "ssd", "recompute")), str(r["resumed"]))
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
