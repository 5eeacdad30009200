"""Simulator speed, two tables.

Default: simulated seconds per wall second and decode iterations per wall second for 4 workers at
7 req/s over 30 simulated minutes, next to a null event loop measured in the same run.
Goal: >= 200x real time for the `vllm` system on one core.

``--scale``: wall time per simulated request at 4, 16, 64 and 256 workers in one run, the offered
load scaled with the workers (100/64 req/s per worker, so 100 req/s at 64: 16 nodes of 4 workers
sharing a DRAM store each), over the same simulated window at every size, with the ratio to the
4-worker cost measured in the same run: the median of 3 runs per size, the sizes taking turns.
Goal: at most 1.5x from 4 to 256 workers.

Run: make bench   (or: python benchmarks/sim_speed.py [--systems vllm,...] [--repeats 3])
     python benchmarks/sim_speed.py --scale [--systems coda,vllm] [--workers 4,16,64,256] [--duration-s 300] [--json]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from coda.shell import strict_json
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sim.loop import EventLoop
from coda.workload.spec import load_workload

WORKLOAD = "synth:rate=7,duration=1800,seed=0"
#: offered load per worker in the scaling table: the 64-worker cluster at 100 req/s (assumed target)
RATE_PER_WORKER = 100 / 64


def null_loop(n_events: int) -> float:
    """Events per wall second of the bare heapq loop with no-op callbacks."""
    loop = EventLoop()
    noop = lambda _: None  # noqa: E731
    t0 = time.perf_counter()
    for i in range(n_events):
        loop.at(i * 1e-3, noop)
    loop.run()
    return n_events / (time.perf_counter() - t0)


def speed_table(systems: list[str], workers: int, repeats: int, workload: str) -> Table:
    wl = load_workload(workload)
    table = Table(title=f"simulator speed: {workload}, {workers} workers, median of {repeats}")
    for col in ("system", "sim s / wall s", "decode iters / wall s", "events / wall s", "null loop events / wall s", "sim events vs null"):
        table.add_column(col, justify="right")
    for system in systems:
        speeds, iters, evs, nulls = [], [], [], []
        for _ in range(repeats):
            res = Simulation(wl, SimConfig(system=system, workers=workers)).run()
            s = res.summary()
            speeds.append(s["sim_time_s"] / s["wall_s"])
            iters.append(s["decode_steps"] / s["wall_s"])
            evs.append(s["events"] / s["wall_s"])
            nulls.append(null_loop(max(s["events"], 10_000)))
        ev, nl = statistics.median(evs), statistics.median(nulls)
        table.add_row(
            system, f"{statistics.median(speeds):,.0f}x", f"{statistics.median(iters):,.0f}", f"{ev:,.0f}", f"{nl:,.0f}", f"{ev / nl:.3f}"
        )
    return table


def per_request_ms(system: str, workers: int, duration_s: float, seed: int) -> tuple[float, float, int]:
    """(wall and CPU milliseconds per simulated request, requests) of one run at the scaled load.
    CPU time is reported beside wall time: on a shared machine it moves less with other jobs."""
    wl = load_workload(f"synth:rate={RATE_PER_WORKER * workers:g},duration={duration_s:g},seed={seed}")
    sim = Simulation(wl, SimConfig(system=system, workers=workers, seed=seed))
    gc.collect()  # the previous run's garbage is collected here, not during this run
    cpu = time.process_time()
    sim.run()
    cpu = time.process_time() - cpu
    n = len(sim.requests)
    return 1e3 * sim.wall_s / n, 1e3 * cpu / n, n


def scale_rows(systems: list[str], sizes: list[int], duration_s: float, repeats: int) -> list[dict[str, Any]]:
    """One row per system and size: medians of wall and CPU ms per simulated request, and their
    ratios to the first size's, measured in this run. The sizes take turns (each repeat runs every
    size once), so a change in the machine's load meets every size alike."""
    rows = []
    for system in systems:
        per_request_ms(system, sizes[0], 60.0, seed=1)  # warm-up: imports and compiled kernels stay out of the first row
        by_size: dict[int, list[tuple[float, float, int]]] = {n: [] for n in sizes}
        for _ in range(repeats):
            for n in sizes:
                by_size[n].append(per_request_ms(system, n, duration_s, seed=0))
        base: tuple[float, float] | None = None
        for n in sizes:
            runs = by_size[n]
            wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            base = base or (wall, cpu)
            rows.append(
                {
                    "system": system,
                    "workers": n,
                    "offered_rps": RATE_PER_WORKER * n,
                    "requests": runs[0][2],
                    "wall_ms": wall,
                    "wall_ratio": wall / base[0],
                    "cpu_ms": cpu,
                    "cpu_ratio": cpu / base[1],
                }
            )
    return rows


def scale_table(rows: list[dict[str, Any]], duration_s: float, repeats: int) -> Table:
    table = Table(
        title=f"wall time per simulated request: synth at {RATE_PER_WORKER:g} req/s per worker, {duration_s:g} s window, "
        f"median of {repeats}"
    )
    first = rows[0]["workers"]
    for col in (
        "system",
        "workers",
        "offered req/s",
        "requests",
        "wall ms / request",
        f"vs {first} workers",
        "CPU ms / request",
        f"vs {first} workers ",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["system"],
            str(r["workers"]),
            f"{r['offered_rps']:g}",
            f"{r['requests']:,}",
            f"{r['wall_ms']:.2f}",
            f"{r['wall_ratio']:.2f}x",
            f"{r['cpu_ms']:.2f}",
            f"{r['cpu_ratio']:.2f}x",
        )
    return table


def cost_ratios(rows: list[dict[str, Any]], small: int, large: int) -> dict[str, float]:
    """Per system: CPU time per simulated request at ``large`` workers over that at ``small``
    (CPU rather than wall time: on a shared machine it moves less with other jobs)."""
    cpu = {(r["system"], r["workers"]): r["cpu_ms"] for r in rows}
    return {system: cpu[(system, large)] / cpu[(system, small)] for system in dict.fromkeys(r["system"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--systems", default=None, help="comma-separated presets (default: vllm; coda,vllm with --scale)")
    ap.add_argument("--workers", default=None, help="workers (default 4); with --scale a comma-separated list (default 4,16,64,256)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per row, the median reported (default 3)")
    ap.add_argument("--workload", default=WORKLOAD)
    ap.add_argument("--scale", action="store_true", help="the per-request cost table over cluster sizes")
    ap.add_argument("--duration-s", type=float, default=300.0, help="arrival window of each --scale run")
    ap.add_argument(
        "--json", action="store_true", help="with --scale: one JSON object, cost_ratio_<largest>_vs_<smallest> per system and the rows"
    )
    args = ap.parse_args()
    console = Console()
    if args.scale:
        sizes = [int(x) for x in (args.workers or "4,16,64,256").split(",")]
        repeats = args.repeats or 3
        rows = scale_rows((args.systems or "coda,vllm").split(","), sizes, args.duration_s, repeats)
        ratios = cost_ratios(rows, sizes[0], sizes[-1])
        if args.json:
            print(
                strict_json.dumps(
                    {
                        f"cost_ratio_{sizes[-1]}_vs_{sizes[0]}": ratios,
                        "rows": rows,
                        "duration_s": args.duration_s,
                        "rate_per_worker": RATE_PER_WORKER,
                        "repeats": repeats,
                        "profile": SimConfig().profile,
                        "seed": 0,
                    }
                )
            )
            return
        console.print(scale_table(rows, args.duration_s, repeats))
        console.print(
            f"CPU cost per request at {sizes[-1]} workers over {sizes[0]}: "
            + ", ".join(f"{system} {r:.2f}x" for system, r in ratios.items())
            + " (goal: at most 1.5x)"
        )
        console.print(
            "ratios are against the first size, measured in this run; requests counts every round offered "
            "(the window's arrivals, then the drain that lets them finish)."
        )
        return
    console.print(speed_table((args.systems or "vllm").split(","), int(args.workers or 4), args.repeats or 3, args.workload))
    console.print(
        "decode iterations are advanced in coalesced runs between batch-membership changes; "
        "the null loop is the same heapq loop with no-op callbacks, measured in this run."
    )


if __name__ == "__main__":
    main()
