"""Cost-model speed: the cohort gain sweep runs every decode iteration, step times every step.

Goal: ``cohort_gain_bounds`` for 256 decode contexts over all admissible cuts (each cohort at
least ceil(0.35 n) requests: 77 cuts) in <= 50 us. Every row is reported next to the analytic
roofline model measured in the same run (its sweep is plain prefix sums), as a ratio.

    python benchmarks/bench_cost.py [--profile a100-qwen3coder30b-fp8-fa2] [--reps 2000]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np
from rich.console import Console
from rich.table import Table

from coda.cost.model import AnalyticCost, CohortPlan, build_cost_model
from coda.cost.profile import load_profile

GOAL_US = 50.0


def median_us(fn: Callable[[], object], reps: int) -> float:
    fn()
    samples = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(reps // 7 + 1):
            fn()
        samples.append((time.perf_counter() - t0) / (reps // 7 + 1))
    return float(np.median(samples) * 1e6)


def agent_contexts(n: int, seed: int) -> np.ndarray:
    """Decode contexts drawn from the synthetic coding-agent workload's prompt sizes."""
    from coda.workload.schema import session_prompts
    from coda.workload.synth import SynthSpec, synthesize

    wl = synthesize(SynthSpec(rate=1.0, duration=600.0, seed=seed))
    pool = np.array([p for s in wl.sessions for _, p in session_prompts(s)], dtype=np.int64)
    return np.random.default_rng(seed).choice(pool, size=n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="a100-qwen3coder30b-fp8-fa2")
    ap.add_argument("--reps", type=int, default=2000)
    args = ap.parse_args()
    profile = load_profile(args.profile)
    cost = build_cost_model(profile)
    base = AnalyticCost(profile)
    n = 256
    m = max(2, math.ceil(0.35 * n))
    admissible = np.arange(m, n - m + 1)
    rng = np.random.default_rng(0)
    batches = {
        "agent contexts": agent_contexts(n, 0),
        "10% long (50-200K) / 90% short (0.1-5K)": np.where(
            rng.random(n) < 0.1, rng.integers(50_000, 200_000, n), rng.integers(100, 5_000, n)
        ),
        "uniform 2K-150K": rng.integers(2_000, 150_000, n),
    }
    table = Table(title=f"cost model speed, {args.profile} ({type(cost).__name__}), 256 decodes, median of 7 x {args.reps // 7 + 1}")
    for col in ("operation", "contexts", "kernel model us", "analytic us", "ratio", "goal"):
        table.add_column(col, justify="right" if col not in ("operation", "contexts") else "left")
    for label, ctx in batches.items():
        srt = np.sort(ctx)
        rows = [
            ("gain bounds, 77 admissible cuts", lambda c, srt=srt: c.cohort_gain_bounds(srt, admissible, 3e-4), f"<= {GOAL_US:.0f}"),
            ("gain bounds, all 255 cuts", lambda c, srt=srt: c.cohort_gain_bounds(srt), ""),
            ("decode_attention_s", lambda c, ctx=ctx: c.decode_attention_s(ctx), ""),
            ("step_s with a cohort plan", lambda c, ctx=ctx: c.step_s((), ctx, CohortPlan(128)), ""),
        ]
        for name, fn, goal in rows:
            k = median_us(lambda fn=fn: fn(cost), args.reps)
            a = median_us(lambda fn=fn: fn(base), args.reps)
            verdict = ("met" if k <= GOAL_US else "MISSED") if goal else ""
            table.add_row(name, label, f"{k:.1f}", f"{a:.1f}", f"{k / a:.1f}x", f"{goal} {verdict}".strip())
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
