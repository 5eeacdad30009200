"""`coda bench`: replay agent sessions against an OpenAI-compatible endpoint and report goodput."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from coda.cli import (
    FormatOpt,
    JsonOpt,
    app,
    err_console,
    fail,
    fmt_value,
    load_workload_arg,
    out_console,
    out_dir,
    print_json,
    progress_bar,
    require,
)
from coda.errors import CodaError, invalid
from coda.shell.liveness import summary_line

#: options beside BenchConfig's fields, with their types
CONFIG_ONLY = {"workload": str, "format": str, "out": Path, "sweep": str | float, "sweep_concurrency": str | int, "repeats": int}


def _config(config: Path | None, cli: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Merge a YAML/TOML file with flags (flags win) into (run options, BenchConfig)."""
    from pydantic import ValidationError

    from coda.bench.replay import BenchConfig
    from coda.config.load import config_options, read_config

    data = read_config(config) if config else {}
    source = str(config) if config else "command line"
    slo = config_options(data, {"slo": dict[str, Any] | None}, source).get("slo") or {}
    for flag, key in (("slo_ttft_s", "ttft_s"), ("slo_tbt_s", "tbt_s")):
        value = cli.pop(flag)
        if value is not None:
            slo[key] = value
    data.update({k: v for k, v in cli.items() if v is not None})
    extra = config_options(data, CONFIG_ONLY, source)
    if slo:
        data["slo"] = slo
    if not data.get("endpoint"):
        raise CodaError(f"{source}: --endpoint is required (the base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000)")
    try:
        return extra, BenchConfig.model_validate(data)
    except ValidationError as err:
        raise invalid(source, err, show_input=True) from None


def _levels(flag: str, text: str, kind: type) -> list[float]:
    """Sweep levels: at least two, > 0, below and above capacity."""
    example = "1,2,4,8"
    what = "request rates" if kind is float else "integer concurrencies"
    try:
        levels = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CodaError(f"{flag} {text!r}: give comma-separated {what}, e.g. {example}") from None
    if len(levels) < 2 or any(v <= 0 for v in levels):
        raise CodaError(f"{flag} {text!r}: give at least two {what} > 0, below and above capacity, e.g. {example}")
    return sorted(levels)


@app.command()
def bench(
    endpoint: Annotated[str | None, typer.Option("--endpoint", "-e", help="base URL of an OpenAI-compatible server")] = None,
    workload: Annotated[
        str | None, typer.Option("--workload", "-w", help="workload file or spec, e.g. synth:rate=1,duration=120,seed=0")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="directory for summary.json, requests.jsonl and plots")] = None,
    model: Annotated[str | None, typer.Option("--model", help="model name (default: the first one /v1/models lists)")] = None,
    duration: Annotated[
        float | None, typer.Option("--duration", help="arrival window in seconds (default: the workload's, scaled)")
    ] = None,
    time_scale: Annotated[
        float | None, typer.Option("--time-scale", help="wall seconds per trace second for starts and tool times")
    ] = None,
    max_sessions: Annotated[int | None, typer.Option("--max-sessions", help="start at most this many sessions")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="comma-separated request rates to sweep (synth specs or files)")] = None,
    repeats: Annotated[int | None, typer.Option("--repeats", help="runs per sweep rate (>= 3, seeds seed, seed+1, ...)")] = None,
    api: Annotated[str | None, typer.Option("--api", help="chat (default) or completions")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="tenant of sessions that name none (x-tenant-id)")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", help="bearer token (default: $OPENAI_API_KEY)")] = None,
    warmup_s: Annotated[float | None, typer.Option("--warmup-s", help="start of the measurement window (default 0)")] = None,
    drain_s: Annotated[
        float | None, typer.Option("--drain-s", help="time after the window for its requests to finish (default 60)")
    ] = None,
    max_attempts: Annotated[int | None, typer.Option("--max-attempts", help="attempts per request on 429/503/529 (default 4)")] = None,
    retry_rate: Annotated[float | None, typer.Option("--retry-rate", help="retry budget refill, retries/s (default 5)")] = None,
    retry_burst: Annotated[float | None, typer.Option("--retry-burst", help="retry budget size (default 20)")] = None,
    max_concurrency: Annotated[
        int | None, typer.Option("--max-concurrency", help="closed loop: N sessions at a time, start times ignored")
    ] = None,
    sweep_concurrency: Annotated[
        str | None, typer.Option("--sweep-concurrency", help="comma-separated concurrencies to sweep, e.g. 1,2,4,8")
    ] = None,
    tenant_concurrency: Annotated[
        int | None, typer.Option("--tenant-concurrency", help="per-tenant in-flight limit, halved by a 429 (default none)")
    ] = None,
    scrape_metrics: Annotated[
        bool | None, typer.Option("--scrape-metrics", help="sample the engines' /metrics (vLLM's names) during the run")
    ] = None,
    metrics_endpoint: Annotated[
        list[str] | None, typer.Option("--metrics-endpoint", help="an engine to sample (repeatable; default: --endpoint)")
    ] = None,
    scrape_interval_s: Annotated[float | None, typer.Option("--scrape-interval-s", help="seconds between samples (default 1)")] = None,
    ignore_eos: Annotated[bool | None, typer.Option("--ignore-eos/--no-ignore-eos", help="send ignore_eos (default on)")] = None,
    tool_calls: Annotated[bool | None, typer.Option("--tool-calls", help="a round followed by tool calls has the engine write them "
                                                     "(structured output), so an engine reading its output sees them")] = None,
    tokenizer: Annotated[
        str | None, typer.Option("--tokenizer", help="the endpoint's tokenizer.json (or its directory) to size prompts")
    ] = None,
    timeout_s: Annotated[float | None, typer.Option("--timeout-s", help="per-attempt timeout (default 600)")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="seed of the retry jitter (and of synth specs in a sweep)")] = None,
    slo_ttft_s: Annotated[float | None, typer.Option("--slo-ttft-s", help="TTFT SLO in seconds (default 5)")] = None,
    slo_tbt_s: Annotated[float | None, typer.Option("--slo-tbt-s", help="mean inter-token gap SLO in seconds (default 0.1)")] = None,
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="cost profile of the engine (name or JSON path): each session's time alone, for slowdown"),
    ] = None,
    fmt: FormatOpt = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML or TOML file with any of these options")] = None,
    as_json: JsonOpt = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="print the summary (or the sweep's rows) as CSV on stdout")] = False,
) -> None:
    """Closed-loop replay of agent sessions: growing prompts, streamed responses, good-client retries, goodput."""
    cli = dict(
        endpoint=endpoint,
        workload=workload,
        out=out,
        model=model,
        duration_s=duration,
        time_scale=time_scale,
        max_sessions=max_sessions,
        sweep=sweep,
        sweep_concurrency=sweep_concurrency,
        repeats=repeats,
        api=api,
        tenant=tenant,
        api_key=api_key or os.environ.get("OPENAI_API_KEY"),
        warmup_s=warmup_s,
        drain_s=drain_s,
        max_attempts=max_attempts,
        retry_rate=retry_rate,
        retry_burst=retry_burst,
        max_concurrency=max_concurrency,
        tenant_concurrency=tenant_concurrency,
        scrape_metrics=scrape_metrics,
        metrics_endpoints=tuple(metrics_endpoint) if metrics_endpoint else None,
        scrape_interval_s=scrape_interval_s,
        ignore_eos=ignore_eos,
        tool_calls=tool_calls,
        tokenizer=tokenizer,
        timeout_s=timeout_s,
        seed=seed,
        slo_ttft_s=slo_ttft_s,
        slo_tbt_s=slo_tbt_s,
        profile=profile,
        format=fmt,
    )
    extra, cfg = _config(config, cli)
    require("matplotlib")  # for the figures every run writes
    if not extra.get("workload"):
        raise CodaError("--workload is required (a workload file or a spec such as synth:rate=1,duration=120,seed=0)")
    if not extra.get("out"):
        raise CodaError("--out is required (a directory for summary.json, requests.jsonl and the plots)")
    if as_json and as_csv:
        raise CodaError("--json and --csv both print on stdout; choose one (the files in --out hold both)")
    out = out_dir(extra["out"])
    spec = str(extra["workload"])
    printer = "json" if as_json else "csv" if as_csv else "table"
    repeats = int(extra["repeats"]) if extra.get("repeats") is not None else 3
    if extra.get("sweep") and extra.get("sweep_concurrency"):
        raise CodaError("--sweep and --sweep-concurrency are two sweeps; run one at a time")
    if extra.get("sweep"):
        _run_sweep(spec, "rate", _levels("--sweep", str(extra["sweep"]), float), repeats, cfg, out, extra.get("format"), printer)
    elif extra.get("sweep_concurrency"):
        if cfg.max_concurrency is not None:
            raise CodaError("--sweep-concurrency sets the concurrency of each run; drop --max-concurrency")
        levels = _levels("--sweep-concurrency", str(extra["sweep_concurrency"]), int)
        _run_sweep(spec, "concurrency", levels, repeats, cfg, out, extra.get("format"), printer)
    else:
        _run_single(spec, cfg, out, extra.get("format"), printer)


def _with_interrupt(main: Any) -> Any:
    """Run ``main(on_replay)``; Ctrl-C stops the current replay, which then reports what it measured."""
    current: list[Any] = []
    interrupted = False

    async def runner() -> Any:
        nonlocal interrupted
        loop = asyncio.get_running_loop()

        def on_sigint() -> None:
            nonlocal interrupted
            interrupted = True
            for r in current:
                r.stop()

        loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            return await main(current.append)
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    result = asyncio.run(runner())
    return result, interrupted


def _status(replay: Any) -> str:
    c = replay.counts
    return f"offered {c['offered']} completed {c['completed']} rejected {c['rejected']} failed {c['failed']} in flight {c['inflight']}"


def _run_single(spec: str, cfg: Any, out: Path, fmt: str | None, printer: str) -> None:
    from coda.bench.report import JSON_KEYS, csv_text, write_run
    from coda.bench.run import run_once, server_series

    wl = load_workload_arg(spec, fmt)
    with progress_bar("of the arrival window") as prog:
        task = prog.add_task("bench", total=1.0)

        def tick(replay: Any) -> None:
            prog.update(task, completed=min(replay.now() / replay.duration_s, 1.0), description=_status(replay))

        (replay, summary), interrupted = _with_interrupt(lambda on_replay: run_once(wl, cfg, spec, progress=tick, on_replay=on_replay))
    files = write_run(out, summary, replay.records, server_series(replay))
    ordered = {k: summary.get(k) for k in JSON_KEYS} | {k: v for k, v in summary.items() if k not in JSON_KEYS}
    if printer == "json":
        print_json(ordered)
    elif printer == "csv":
        sys.stdout.write(csv_text([ordered]))
    else:
        _print_table(summary, files)
    if interrupted:
        err_console.print(f"interrupted: wrote what was measured to {out}")
        sys.exit(130)
    _fail_if_nothing_completed(
        summary["completed"], Counter(summary.get("failed_by_reason")) + Counter(summary.get("rejected_by_reason")), out
    )


def _fail_if_nothing_completed(completed: float, reasons: Counter[str], out: Path) -> None:
    """A run in which no request completed measured nothing: one line with the commonest reason, exit 1."""
    if completed:
        return
    why = f"; commonest reason: {reasons.most_common(1)[0][0]}" if reasons else ""
    fail(f"no request completed{why}; every request's outcome is in {out}", 1)


def _print_table(s: dict[str, Any], files: list[Path]) -> None:
    from coda.bench.report import TABLE_KEYS

    cfg = s["config"]
    wl = cfg["workload"]
    load = f"max_concurrency={cfg['max_concurrency']} (closed loop)" if cfg["max_concurrency"] else "arrivals as in the workload"
    out_console.print(
        f"[bold]coda bench[/bold] endpoint={cfg['endpoint']} model={cfg['model']} api={cfg['api']} workload={wl['spec']} "
        f"({wl['sessions']} sessions, {cfg['sessions_started']} started) {load} time_scale={cfg['time_scale']} seed={s['seed']}\n"
        f"SLO: TTFT <= {cfg['slo']['ttft_s']} s, mean TBT <= {cfg['slo']['tbt_s']} s; "
        f"window {s['window_s'][0]:.1f}-{s['window_s'][1]:.1f} s; "
        f"retries: at most {cfg['max_attempts']} attempts, budget {cfg['retry_rate']}/s burst {cfg['retry_burst']}\n{cfg['tokenizer']}",
        highlight=False,
        soft_wrap=True,
    )
    table = Table(show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in TABLE_KEYS:
        table.add_row(key, fmt_value(s.get(key)))
    for key in ("rejected_by_reason", "failed_by_reason"):
        if s.get(key):
            table.add_row(key, ", ".join(f"{k}: {v}" for k, v in s[key].items()))
    out_console.print(table)
    out_console.print(f"slowdown: {s['slowdown_basis']}", highlight=False, soft_wrap=True)
    for url, eng in (s.get("server") or {}).items():
        out_console.print(
            f"engine {url}: waiting mean {fmt_value(eng['waiting_mean'])} max {fmt_value(eng['waiting_max'])}, "
            f"running mean {fmt_value(eng['running_mean'])}, KV usage mean {fmt_value(eng['kv_usage_mean'])} "
            f"max {fmt_value(eng['kv_usage_max'])}, prefix-cache hit rate {fmt_value(eng['prefix_hit_rate'])} "
            f"({eng['samples']} samples, {eng['errors']} failed)",
            highlight=False,
            soft_wrap=True,
        )
    if s.get("ingress"):
        out_console.print(f"gateway ingress gates over the run: {summary_line(s['ingress']['liveness'])}", highlight=False, soft_wrap=True)
        for line in s["ingress"]["verdict"]:
            out_console.print(f"[bold]{line}[/bold]", highlight=False, soft_wrap=True)
    out_console.print("wrote " + ", ".join(str(f) for f in files), highlight=False, soft_wrap=True)


def _run_sweep(spec: str, axis: str, levels: list[float], repeats: int, cfg: Any, out: Path, fmt: str | None, printer: str) -> None:
    from coda.bench.report import csv_text
    from coda.bench.run import check_repeats, sweep

    check_repeats(repeats)
    with progress_bar("of the arrival window") as prog:
        task = prog.add_task("sweep", total=1.0)

        def tick(label: str, replay: Any) -> None:
            prog.update(task, completed=min(replay.now() / replay.duration_s, 1.0), description=f"{label}: {_status(replay)}")

        result, interrupted = _with_interrupt(
            lambda on_replay: sweep(spec, axis, levels, repeats, cfg, out, fmt=fmt, progress=tick, on_replay=on_replay)
        )
    if printer == "json":
        print_json(result)
    elif printer == "csv":
        sys.stdout.write(csv_text(result["rows"]))
    else:
        flag = "--sweep" if axis == "rate" else "--sweep-concurrency"
        out_console.print(
            f"[bold]coda bench {flag}[/bold] workload={spec} repeats={repeats} endpoint={cfg.endpoint} "
            f"SLO: TTFT <= {cfg.slo.ttft_s} s, mean TBT <= {cfg.slo.tbt_s} s; knee = {result['knee_rule']}",
            highlight=False,
        )
        table = Table(show_header=True)
        cols = (axis, "offered_rps", "output_tps", "slo_tps", "goodput", "ttft_p50_s", "itl_p50_s", "tbt_p50_s", "rejected", "failed")
        for c in cols:
            table.add_column(c, justify="right")
        for row in result["rows"]:
            table.add_row(*(fmt_value(row[c]) + (f" ±{fmt_value(row[c + '_ci95'])}" if row.get(c + "_ci95") else "") for c in cols))
        out_console.print(table)
        out_console.print(
            f"knee: {axis} {fmt_value(result[f'knee_{axis}'])}; wrote {out / 'sweep.json'}, {out / 'sweep.csv'}, {out / 'load.png'}",
            highlight=False,
        )
    if interrupted:
        err_console.print(f"interrupted: wrote what was measured to {out}")
        sys.exit(130)
    _fail_if_nothing_completed(sum(row["request_tps"] or 0 for row in result["rows"]), Counter(), out)  # completions in the windows
