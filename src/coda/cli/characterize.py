"""`coda characterize WORKLOAD --out DIR [--json]`: the Coda paper's Findings 1-8 measured on a workload."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from coda.cli import FormatOpt, JsonOpt, app, err_console, fmt_value, load_workload_arg, out_console, out_dir, print_json, progress_bar
from coda.cli.sim import ConfigOpt, HbmOpt, ProfileOpt, SeedOpt, WarmupOpt, WorkersOpt, _settings
from coda.errors import CodaError
from coda.shell import strict_json

DEFAULT_WORKERS = 4  # the Coda paper's node: 4 GPUs sharing a DRAM/SSD KV store


@app.command()
def characterize(
    workload: Annotated[str | None, typer.Argument(help="workload file or spec, e.g. synth:rate=3,duration=1800,seed=0")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="directory for findings.json and the PNG figures")] = None,
    engine_log: Annotated[Path | None, typer.Option("--engine-log", help="instead of a workload: a real engine's per-request JSONL "
                                                    "(session_id, round, prompt_tokens, output_tokens, cached_tokens), whose "
                                                    "resumed requests' paths (F1, F2) are measured")] = None,
    block_tokens: Annotated[int | None, typer.Option("--block-tokens", help="with --engine-log: the engine's KV block size in tokens "
                                                     "(vLLM's --block-size; default 16, vLLM's)")] = None,
    fmt: FormatOpt = None,
    workers: WorkersOpt = None,
    config: ConfigOpt = None,
    seed: SeedOpt = None,
    profile: ProfileOpt = None,
    warmup_s: WarmupOpt = None,
    hbm_kv_gib: HbmOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure Findings 1-8 on a workload: KV tiers, paths and startup cost (F1-F3), growth and tool
    time (F4), decode-batch composition (F5-F7) and routing opportunity (F8). With --engine-log,
    measure where a real engine's resumed requests found their KV (F1, F2) from its per-request log."""
    if out is None:
        raise CodaError("--out is required (a directory for findings.json)")
    if (workload is None) == (engine_log is None):
        raise CodaError(
            "pass a workload or --engine-log FILE (one of them): a workload is replayed in the simulator, a log is read as it is"
        )
    if engine_log is not None:
        _engine_log(engine_log, out, block_tokens if block_tokens is not None else 16, as_json)
        return
    if block_tokens is not None:
        raise CodaError("--block-tokens goes with --engine-log; a workload's replay takes the block size from chunk_tokens (--config)")
    assert workload is not None
    from coda.eval.characterize import characterize as run
    from coda.eval.characterize_plots import write_figures
    from coda.sim.run import seeded_workload, versions

    cli = dict(format=fmt, workers=workers, seed=seed, profile=profile, warmup_s=warmup_s, hbm_kv_gib=hbm_kv_gib)
    extra, cfg = _settings(config, cli)
    out_dir(out)
    if "workers" not in cfg.model_fields_set:
        cfg = cfg.with_overrides(workers=DEFAULT_WORKERS)
    t0 = time.perf_counter()
    wl = seeded_workload(workload, cfg.seed, extra.get("format")) if seed is not None else load_workload_arg(workload, extra.get("format"))
    load_s = time.perf_counter() - t0
    dropped = (wl.meta.get("load") or {}).get("dropped")
    if dropped:
        err_console.print(f"dropped rows: {json.dumps(dropped)}", highlight=False, soft_wrap=True)
    info = {
        "spec": workload,
        "format": extra.get("format") or wl.meta.get("source") or "coda",
        "sessions": len(wl.sessions),
        "requests": wl.num_requests,
    }
    with progress_bar() as prog:
        task = prog.add_task("characterize", total=1.0)
        result = run(wl, cfg, workload_info=info, progress=lambda label, f: prog.update(task, completed=f, description=label))
        prog.update(task, description="figures", completed=1.0)
        t1 = time.perf_counter()
        figures = write_figures(result, out)
        fig_s = time.perf_counter() - t1
    findings = result.findings
    findings["config"]["timing_s"].update({"load_s": load_s, "figures_s": fig_s})
    findings["config"]["versions"] = versions()
    findings["figures"] = [p.name for p in figures]
    (out / "findings.json").write_text(strict_json.dumps(findings, indent=2) + "\n")
    err_console.print(f"wrote {out / 'findings.json'} and {len(figures)} figures: {', '.join(p.name for p in figures)}")
    if as_json:
        print_json(findings)
    else:
        _print_table(findings)


def _engine_log(path: Path, out: Path, block_tokens: int, as_json: bool) -> None:
    """F1 and F2 of a real engine's per-request log (``coda.eval.residency``)."""
    from coda.eval.residency import path_shares, read_engine_log

    if block_tokens < 1:
        raise CodaError(f"--block-tokens must be at least 1, got {block_tokens}")
    out_dir(out)
    records = read_engine_log(path)
    paths = path_shares(records, block_tokens)
    findings = {
        "engine_log": {"path": str(path), "requests": len(records), "sessions": len({r.session for r in records})},
        "f1_tiers": {k: paths[k] for k in ("requests", "tokens", "token_share", "block_tokens", "definition")},
        "f2_paths": {k: paths[k] for k in ("requests", "counts", "share")},
    }
    (out / "findings.json").write_text(strict_json.dumps(findings, indent=2) + "\n")
    err_console.print(f"wrote {out / 'findings.json'}")
    if as_json:
        print_json(findings)
        return
    out_console.print(
        f"[bold]coda characterize[/bold] engine log {path}: {len(records)} completed requests, "
        f"{paths['requests']} resumed, blocks of {block_tokens} tokens",
        highlight=False,
    )
    table = Table(show_header=True)
    table.add_column("finding")
    table.add_column("value", justify="right")
    for k, v in [
        *((f"F1 reusable KV in {k}", v) for k, v in paths["token_share"].items()),
        *((f"F2 resumed via {k}", v) for k, v in paths["share"].items()),
    ]:
        table.add_row(k, fmt_value(v))
    out_console.print(table)


def _headline(f: dict[str, Any]) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    rows += [(f"F1 reusable KV in {k}", v) for k, v in f["f1_tiers"]["token_share"].items()]
    rows += [(f"F2 resumed via {k}", v) for k, v in f["f2_paths"]["share"].items()]
    for p, c in f["f3_startup_cost"]["paths"].items():
        if c["requests"]:
            rows += [
                (f"F3 {p} startup p50 / p95 s", f"{fmt_value(c['p50_s'])} / {fmt_value(c['p95_s'])}"),
                (f"F3 {p} share of startup cost", c["share_of_total"]),
            ]
    g, t = f["f4_growth"], f["f4_tools"]
    rows += [("F4 growth p50 / p90 (x)", f"{fmt_value(g['p50'])} / {fmt_value(g['p90'])}"), ("F4 sessions growing >= 4x", g["ge4_share"])]
    if t["calls"]:
        rows += [
            ("F4 tool p50 / p90 / p99 s", f"{fmt_value(t['p50_s'])} / {fmt_value(t['p90_s'])} / {fmt_value(t['p99_s'])}"),
            ("F4 tool time in the top 1% calls", t["top_1pct_calls_time_share"]),
        ]
    h, d, u = f["f5_heterogeneity"], f["f6_decode_dominance"], f["f7_uniform_gap"]
    rows += [
        ("F5 max/min >= 2x / 4x / 8x", " / ".join(fmt_value(h[f"ge{k}x_share"]) for k in (2, 4, 8))),
        ("F5 max/min p50 / p95 (x)", f"{fmt_value(h['ratio_p50'])} / {fmt_value(h['ratio_p95'])}"),
        ("F5 context CV p50", h["cv_p50"]),
        ("F6 pure-decode iterations", d["pure_decode_iteration_share"]),
        ("F6 pure-decode execution time", d["pure_decode_time_share"]),
        ("F7 attention vs near-uniform", u["attention_gap"]),
    ]
    r = f["f8_routing_opportunity"]
    if "skipped" not in r:
        rows += [("F8 decisions with >= 2 eligible", r["multi_eligible_share"]), ("F8 most compatible != chosen", r["differs_share"])]
    return rows


def _print_table(f: dict[str, Any]) -> None:
    cfg = f["config"]["replay_vllm"]
    wl = f["workload"]
    out_console.print(
        f"[bold]coda characterize[/bold] workload={wl['spec']} format={wl['format']} sessions={wl['sessions']} requests={wl['requests']}\n"
        f"replays: vllm (F1-F7) and smetric (F8), workers={cfg['workers']}, SSD tier on, seed={f['config']['seed']}, "
        f"measured window {f['config']['window_s'][0]:.0f}-{f['config']['window_s'][1]:.0f} s\n"
        f"profile={cfg['profile']['name']} ({cfg['profile']['kind']}), cost model {f['config']['cost_model']}",
        highlight=False,
    )
    table = Table(show_header=True)
    table.add_column("finding")
    table.add_column("value", justify="right")
    for k, v in _headline(f):
        table.add_row(k, fmt_value(v))
    out_console.print(table)
