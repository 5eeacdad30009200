"""What ``coda bench`` runs: one replay, or a sweep of rates with repeats, and their outputs."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from coda.bench.client import EndpointDown
from coda.bench.replay import BenchConfig, Replay
from coda.bench.report import bench_summary, knee, plot_load, sweep_rows, versions, write_csv, write_run
from coda.bench.scrape import ScrapeError, gateway_liveness
from coda.errors import CodaError
from coda.shell import strict_json
from coda.shell.liveness import from_metrics, verdict
from coda.workload.schema import Workload
from coda.workload.spec import load_workload
from coda.workload.subsample import subsample

Progress = Callable[[Replay], None]


def summary_of(replay: Replay, workload_spec: str, alone: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """Every metric of one run with its configuration, SLOs, seed, workload provenance and versions;
    slowdowns with ``alone`` (``alone_s``)."""
    cfg = replay.config
    window = replay.window()
    s = bench_summary(replay.records, window, ttft_slo_s=cfg.slo.ttft_s, tbt_slo_s=cfg.slo.tbt_s, run_end_s=replay.wall_s, alone_s=alone)
    s["slowdown_basis"] = (f"time alone under cost profile {cfg.profile}" if alone is not None
                           else "none: pass --profile (a cost profile of the engine) for slowdown; task completion times only")
    s["offered_rps"] = s["offered"] / window.length_s
    wl = replay.workload
    s.update(
        wall_s=replay.wall_s,
        client_lag_p99_s=float(np.percentile(replay.loop_lag, 99)) if replay.loop_lag else None,
        client_lag_max_s=max(replay.loop_lag, default=None),
        ended_early=replay.ended_early,
        seed=cfg.seed,
        retry_budget={"spent": replay.budget.spent, "denied": replay.budget.denied},
        tenants={
            t: {"limit": lim.limit if lim.limit != float("inf") else None, "peak_inflight": lim.peak} for t, lim in replay.limiters.items()
        },
        versions=versions(),
        server=replay.scraper.summary(window) if replay.scraper is not None else None,
        config={
            **cfg.model_dump(),
            "model": replay.model,
            "duration_s": replay.duration_s,
            "sessions_started": len(replay.sessions),
            "tokenizer": replay.vocab.name,
            "workload": {
                "spec": workload_spec,
                **{k: v for k, v in wl.meta.items() if k != "choices"},
                "sessions": len(wl.sessions),
                "requests": wl.num_requests,
            },
        },
    )
    return s


def alone_s(workload: Workload, cfg: BenchConfig) -> dict[str, list[float]] | None:
    """Each session's time alone on an idle engine under ``cfg.profile`` (None without one): the
    simulator's engine defaults (chunk size, prefill budget, decode runs) stand in for the real
    engine's, and tool and think times are scaled by ``time_scale`` as the replay scales them. A
    closed-loop run (``max_concurrency``) shifts each session, so open-loop round timestamps then
    only approximate its schedule."""
    if cfg.profile is None:
        return None
    from coda.cost.model import build_cost_model
    from coda.cost.profile import load_profile
    from coda.metrics.tasks import alone_times_s
    from coda.sim.config import SimConfig

    engine = SimConfig()
    cost = build_cost_model(load_profile(cfg.profile))
    return {
        s.session_id: alone_times_s(
            s,
            cost,
            chunk_tokens=engine.chunk_tokens,
            max_num_batched_tokens=engine.max_num_batched_tokens,
            decode_run_max=engine.decode_run_max,
            time_scale=cfg.time_scale,
        )
        for s in workload.sessions
    }


def server_series(replay: Replay) -> list[dict[str, Any]] | None:
    return replay.scraper.series() if replay.scraper is not None else None


async def run_once(
    workload: Workload, cfg: BenchConfig, spec: str, *, progress: Progress | None = None, on_replay: Callable[[Replay], None] | None = None
) -> tuple[Replay, dict[str, Any]]:
    alone = alone_s(workload, cfg)  # before the run: a bad --profile fails now, not after it
    try:
        replay = Replay(workload, cfg)
    except ValueError as err:
        raise CodaError(f"bench: {err}") from None
    if on_replay is not None:
        on_replay(replay)
    ticker = asyncio.create_task(_tick(replay, progress)) if progress else None
    before = await gateway_liveness(cfg.endpoint)
    try:
        await replay.run()
    except EndpointDown as err:
        raise CodaError(f"--endpoint {cfg.endpoint} does not answer ({err}); start the server or fix the URL") from None
    except ScrapeError as err:
        raise CodaError(f"--scrape-metrics: {err}; point --metrics-endpoint at the engines themselves, or drop --scrape-metrics") from None
    finally:
        if ticker is not None:
            ticker.cancel()
    summary = summary_of(replay, spec, alone)
    after = await gateway_liveness(cfg.endpoint) if before is not None else None
    if after is not None:
        live = from_metrics(after, from_metrics(before or []))
        summary["ingress"] = {"liveness": live, "verdict": verdict(live)}
    return replay, summary


async def _tick(replay: Replay, progress: Progress) -> None:
    while True:
        progress(replay)
        await asyncio.sleep(0.25)


def workload_at(spec: str, rate: float | None, seed: int, fmt: str | None = None) -> Workload:
    """The workload drawn with ``seed``: a synth spec regenerated (seed, and ``rate`` when given,
    substituted); a file subsampled to ``rate`` (whole sessions), or as it is without one."""
    if spec.startswith("synth"):
        body = spec.split(":", 1)[1] if ":" in spec else ""
        drop = r"\s*(rate|seed)\s*=" if rate is not None else r"\s*seed\s*="
        parts = [p for p in body.split(",") if p.strip() and not re.match(drop, p)]
        return load_workload("synth:" + ",".join([*parts, *([f"rate={rate:g}"] if rate is not None else []), f"seed={seed}"]))
    workload = load_workload(spec, fmt)
    return subsample(workload, rate=rate, seed=seed) if rate is not None else workload


def check_repeats(repeats: int) -> None:
    if repeats < 3:
        raise CodaError(f"--repeats must be >= 3 for a sweep (95% intervals need them), got {repeats}")


Axis = Literal["rate", "concurrency"]


async def sweep(
    spec: str,
    axis: Axis,
    levels: Sequence[float],
    repeats: int,
    cfg: BenchConfig,
    out: Path,
    *,
    fmt: str | None = None,
    progress: Callable[[str, Replay], None] | None = None,
    on_replay: Callable[[Replay], None] | None = None,
) -> dict[str, Any]:
    """Every level of ``axis`` (request rates, or closed-loop concurrencies) ``repeats`` times, each
    on another draw of the workload (a synth spec's seed, else ``cfg.seed``, then +1, +2, ...);
    rows of means with 95% intervals, the knee, load.png and sweep.csv."""
    check_repeats(repeats)
    found = re.search(r"seed=(\d+)", spec) if spec.startswith("synth") else None
    base = int(found.group(1)) if found else cfg.seed
    runs: dict[float, list[dict[str, Any]]] = {}
    for level in levels:
        for i in range(repeats):
            seed = base + i
            label = f"{axis} {level:g} repeat {i + 1}/{repeats}"
            if axis == "rate":
                wl, run_cfg = workload_at(spec, level, seed, fmt), cfg.model_copy(update={"seed": seed})
            else:
                wl, run_cfg = workload_at(spec, None, seed, fmt), cfg.model_copy(update={"seed": seed, "max_concurrency": int(level)})
            replay, summary = await run_once(
                wl, run_cfg, spec, on_replay=on_replay, progress=(lambda r, label=label: progress(label, r)) if progress else None
            )
            summary[axis] = level
            write_run(out / f"{axis}-{level:g}" / f"repeat-{i}", summary, replay.records, server_series(replay))
            runs.setdefault(level, []).append(summary)
            if replay.ended_early:
                break
        if any(s["ended_early"] for s in runs[level]):
            break
    rows = sweep_rows(runs, axis)
    k = knee(rows, axis)
    result = {
        "axis": axis,
        "rows": rows,
        f"knee_{axis}": k,
        "repeats": repeats,
        "workload": spec,
        "slo": cfg.slo.model_dump(),
        "config": cfg.model_dump(),
        "versions": versions(),
        "knee_rule": f"highest {axis} whose mean goodput is within 5% of the best",
    }
    out.mkdir(parents=True, exist_ok=True)
    plot_load(out / "load.png", rows, axis, k)
    write_csv(out / "sweep.csv", rows)
    (out / "sweep.json").write_text(strict_json.dumps(result, indent=2) + "\n")
    return result
