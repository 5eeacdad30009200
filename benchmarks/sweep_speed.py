"""The sweep executor: speed-up of N local processes over one, and the executor's own cost per cell.

Speed-up: the same `coda compare` sweep (every system on every seed of a synthetic workload) run
with ``--jobs 1`` and ``--jobs N`` in this process, wall time of each, their ratio against the goal
of 0.8 x N on N idle cores. The machine's load average is printed beside it: on a shared machine
the ratio measures what the other jobs left, not the executor.

Overhead: cells that do nothing, run serially, on N local processes and (with Ray installed) on
a Ray instance started here with N CPUs; the wall time per cell is what the executor itself costs
(starting the pool, or Ray's workers, included; over ``--noop-cells`` cells).

    python benchmarks/sweep_speed.py [--jobs N] [--seeds 4] [--workload synth:rate=2,duration=900,seed=0] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from coda.shell import strict_json
from coda.sim.config import SimConfig
from coda.sim.run import compare_cells, variants
from coda.sweep import Cell, SweepOptions, run_cells

SYSTEMS = ("vllm", "cachewise", "coda")


def noop() -> dict[str, Any]:
    return {}


def timed(cells: list[Cell], options: SweepOptions) -> float:
    t0 = time.perf_counter()
    run_cells(cells, options)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="local processes of the parallel run (default: the cores)")
    ap.add_argument("--seeds", type=int, default=4, help="seeds of the sweep (cells = seeds x 3 systems)")
    ap.add_argument("--workload", default="synth:rate=2,duration=900,seed=0")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--noop-cells", type=int, default=200)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    base = SimConfig(workers=args.workers)
    cells = compare_cells(args.workload, variants(list(SYSTEMS)), list(range(args.seeds)), base)
    run_cells(cells[: len(SYSTEMS)], SweepOptions(jobs=1, progress=False))  # warm-up: imports and compiled kernels stay out of both runs
    serial = timed(cells, SweepOptions(jobs=1, progress=False))
    parallel = timed(cells, SweepOptions(jobs=args.jobs, progress=False))
    empty = [Cell(f"noop {i}", {"i": i}, noop) for i in range(args.noop_cells)]
    overhead = {"serial": timed(empty, SweepOptions(jobs=1, progress=False)) / len(empty),
                "local": timed(empty, SweepOptions(jobs=args.jobs, progress=False)) / len(empty)}
    if importlib.util.find_spec("ray") is not None:
        import ray

        ray.init(num_cpus=args.jobs, include_dashboard=False, configure_logging=False, log_to_driver=False)
        try:
            overhead["ray"] = timed(empty, SweepOptions(ray="", progress=False)) / len(empty)
        finally:
            ray.shutdown()
    report = {
        "sweep": {"workload": args.workload, "systems": list(SYSTEMS), "seeds": args.seeds, "workers": args.workers, "cells": len(cells),
                  "profile": base.profile},
        "jobs": args.jobs, "cores": os.cpu_count(), "load_average": os.getloadavg(),
        "serial_s": serial, "parallel_s": parallel, "speedup": serial / parallel, "goal": 0.8 * args.jobs,
        "overhead_s_per_cell": overhead, "noop_cells": len(empty),
    }
    if args.json:
        print(strict_json.dumps(report))
        return
    console = Console()
    table = Table(title=f"{len(cells)} cells: {args.workload}, {', '.join(SYSTEMS)} x {args.seeds} seeds, {args.workers} workers")
    for col in ("run", "wall s", "speed-up"):
        table.add_column(col, justify="right")
    table.add_row("--jobs 1", f"{serial:.1f}", "1.00x")
    table.add_row(f"--jobs {args.jobs}", f"{parallel:.1f}", f"{serial / parallel:.2f}x (goal {0.8 * args.jobs:.1f}x on idle cores)")
    console.print(table)
    console.print("executor overhead per cell (cells that do nothing; starting the pool or Ray's workers included): "
                  + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in overhead.items()))
    load = os.getloadavg()
    console.print(f"{os.cpu_count()} cores, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} during the run "
                  "(above the core count the speed-up measures what other jobs left)")


if __name__ == "__main__":
    main()
