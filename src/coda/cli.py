"""The ``coda`` command line (typer + rich). User errors print one line and exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from coda.errors import CodaError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Coda: admission and routing for LLM coding agents.")
workload_app = typer.Typer(no_args_is_help=True, help="Generate, inspect and subsample workloads.")
profile_app = typer.Typer(no_args_is_help=True, help="Inspect cost profiles.")
app.add_typer(workload_app, name="workload")
app.add_typer(profile_app, name="profile")

out_console = Console()
err_console = Console(stderr=True)

# Options shared by `sim` and `compare`; None means "not given" so config files can supply them.
WorkloadOpt = Annotated[str | None, typer.Option("--workload", "-w", help="workload file or spec, e.g. synth:rate=3,duration=600,seed=0")]
FormatOpt = Annotated[str | None, typer.Option("--format", help="workload file format (detected when omitted)")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML or TOML file with any of these options")]
WorkersOpt = Annotated[int | None, typer.Option("--workers", "-n", help="number of workers")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="seed (also substituted into synth specs)")]
ProfileOpt = Annotated[str | None, typer.Option("--profile", help="cost profile name or JSON path")]
WarmupOpt = Annotated[float | None, typer.Option("--warmup-s", help="excluded from metrics (default: a third of the window)")]
DrainOpt = Annotated[float | None, typer.Option("--drain-s", help="time after the window for its requests to finish")]
TtftOpt = Annotated[float | None, typer.Option("--slo-ttft-s", help="TTFT SLO in seconds (default 5)")]
TbtOpt = Annotated[float | None, typer.Option("--slo-tbt-s", help="mean inter-token gap SLO in seconds (default 0.1)")]
DramOpt = Annotated[bool | None, typer.Option("--dram/--no-dram", help="override the preset's DRAM tier")]
SsdOpt = Annotated[bool | None, typer.Option("--ssd/--no-ssd", help="override the preset's SSD tier")]
ShadowOpt = Annotated[bool | None, typer.Option("--cpu-shadow/--no-cpu-shadow", help="override the preset's CPU-shadow publication")]
HbmOpt = Annotated[float | None, typer.Option("--hbm-kv-gib", help="override the profile's HBM KV per worker")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="directory for summary.json and per-request records")]

CONFIG_ONLY_KEYS = ("workload", "format", "systems", "seeds", "baseline", "out")


def _settings(config: Path | None, cli: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Merge a config file with CLI values (CLI wins) into (extra keys, SimConfig)."""
    from coda.sim.config import load_config_file, validate_config

    data = load_config_file(config) if config else {}
    extra = {k: data.pop(k) for k in CONFIG_ONLY_KEYS if k in data}
    slo = dict(data.pop("slo", {}) or {})
    for flag, key in (("slo_ttft_s", "ttft_s"), ("slo_tbt_s", "tbt_s")):
        if cli.get(flag) is not None:
            slo[key] = cli.pop(flag)
        cli.pop(flag, None)
    for key in CONFIG_ONLY_KEYS:
        if cli.get(key) is not None:
            extra[key] = cli.pop(key)
        cli.pop(key, None)
    data.update({k: v for k, v in cli.items() if v is not None})
    if slo:
        data["slo"] = slo
    return extra, validate_config(data, str(config) if config else "command line")


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}% of sim time"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")


@app.command()
def sim(
    workload: WorkloadOpt = None,
    fmt: FormatOpt = None,
    system: Annotated[str | None, typer.Option("--system", "-s", help="system preset (see `coda systems`)")] = None,
    workers: WorkersOpt = None,
    config: ConfigOpt = None,
    seed: SeedOpt = None,
    profile: ProfileOpt = None,
    warmup_s: WarmupOpt = None,
    drain_s: DrainOpt = None,
    slo_ttft_s: TtftOpt = None,
    slo_tbt_s: TbtOpt = None,
    dram: DramOpt = None,
    ssd: SsdOpt = None,
    cpu_shadow: ShadowOpt = None,
    hbm_kv_gib: HbmOpt = None,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Simulate one system on a workload."""
    from coda.sim.run import run_one, seeded_workload, sim_summary, write_outputs

    cli = dict(workload=workload, format=fmt, system=system, workers=workers, seed=seed, profile=profile, warmup_s=warmup_s,
               drain_s=drain_s, slo_ttft_s=slo_ttft_s, slo_tbt_s=slo_tbt_s, dram=dram, ssd=ssd, cpu_shadow=cpu_shadow,
               hbm_kv_gib=hbm_kv_gib, out=out)
    extra, cfg = _settings(config, cli)
    spec = extra.get("workload") or "synth:rate=3,duration=1800,seed=0"
    wl = seeded_workload(spec, cfg.seed, extra.get("format")) if seed is not None else _load(spec, extra.get("format"))
    with _progress() as prog:
        task = prog.add_task(f"sim {cfg.system}", total=1.0)
        result = run_one(wl, cfg, lambda f: prog.update(task, completed=f))
    summary = sim_summary(result, cfg.seed)
    summary["workload_spec"] = spec
    if extra.get("out"):
        write_outputs(Path(extra["out"]), result, summary)
    if as_json:
        _print_json(summary)
    else:
        _print_sim_table(summary)


def _load(spec: str, fmt: str | None) -> Any:
    from coda.workload.spec import load_workload

    return load_workload(spec, fmt)


def _print_sim_table(s: dict[str, Any]) -> None:
    cfg = s["config"]
    out_console.print(
        f"[bold]coda sim[/bold] system={s['system']} workers={cfg['workers']} seed={s['seed']} workload={s.get('workload_spec')}\n"
        f"profile={cfg['profile']['name']} ({cfg['profile']['kind']}) tiers={cfg['tiers']}\n"
        f"SLO: TTFT <= {cfg['slo']['ttft_s']} s, mean TBT <= {cfg['slo']['tbt_s']} s; window {s['window_s'][0]:.0f}-{s['window_s'][1]:.0f} s"
    )
    table = Table(show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("output_tps", "slo_tps", "useful_tps", "request_tps", "goodput", "ttft_p50_s", "ttft_p95_s", "tbt_p50_s", "tbt_p95_s",
                "e2e_p50_s", "e2e_p95_s", "reuse_rate", "reuse_hbm", "reuse_store", "decode_concurrency", "completed", "preemptions",
                "sim_time_s", "wall_s", "speed_x"):
        table.add_row(key, _fmt(s.get(key)))
    out_console.print(table)


@app.command()
def compare(
    workload: WorkloadOpt = None,
    fmt: FormatOpt = None,
    systems: Annotated[str | None, typer.Option("--systems", help="comma-separated system presets")] = None,
    seeds: Annotated[int | None, typer.Option("--seeds", help="number of seeds (seed, seed+1, ...)")] = None,
    baseline: Annotated[str | None, typer.Option("--baseline", help="system the ratios are against (default: the first)")] = None,
    workers: WorkersOpt = None,
    config: ConfigOpt = None,
    seed: SeedOpt = None,
    profile: ProfileOpt = None,
    warmup_s: WarmupOpt = None,
    drain_s: DrainOpt = None,
    slo_ttft_s: TtftOpt = None,
    slo_tbt_s: TbtOpt = None,
    dram: DramOpt = None,
    ssd: SsdOpt = None,
    cpu_shadow: ShadowOpt = None,
    hbm_kv_gib: HbmOpt = None,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Run several systems on the same workload and seeds; gains are ratios of sums."""
    from coda.policy.registry import system_preset
    from coda.sim.run import compare as run_compare

    cli = dict(workload=workload, format=fmt, systems=systems, seeds=seeds, baseline=baseline, workers=workers, seed=seed,
               profile=profile, warmup_s=warmup_s, drain_s=drain_s, slo_ttft_s=slo_ttft_s, slo_tbt_s=slo_tbt_s, dram=dram,
               ssd=ssd, cpu_shadow=cpu_shadow, hbm_kv_gib=hbm_kv_gib, out=out)
    extra, cfg = _settings(config, cli)
    names = extra.get("systems") or "vllm"
    names = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    for n in names:
        system_preset(n)
    n_seeds = int(extra.get("seeds") or 1)
    if n_seeds < 1:
        raise CodaError(f"--seeds must be >= 1, got {n_seeds}")
    seed_list = [cfg.seed + i for i in range(n_seeds)]
    spec = extra.get("workload") or "synth:rate=3,duration=1800,seed=0"
    with _progress() as prog:
        task = prog.add_task("compare", total=1.0)
        total = len(names) * n_seeds
        done = {"n": 0, "last": None}

        def tick(label: str, f: float) -> None:
            if done["last"] != label:
                done["n"] += done["last"] is not None
                done["last"] = label
            prog.update(task, completed=(done["n"] + f) / total, description=label)

        res = run_compare(spec, names, seed_list, cfg, fmt=extra.get("format"), baseline=extra.get("baseline"),
                          progress=tick, out=Path(extra["out"]) if extra.get("out") else None)
    if extra.get("out"):
        Path(extra["out"]).mkdir(parents=True, exist_ok=True)
        (Path(extra["out"]) / "compare.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    if as_json:
        _print_json(res)
        return
    out_console.print(f"[bold]coda compare[/bold] workload={spec} seeds={seed_list} workers={cfg.workers}\n"
                      f"SLO: TTFT <= {cfg.slo.ttft_s} s, mean TBT <= {cfg.slo.tbt_s} s; profile={cfg.profile}; "
                      f"gains vs {res['baseline']} are ratios of sums over seeds")
    table = Table(show_header=True)
    table.add_column("metric")
    for row in res["rows"]:
        table.add_column(row["system"], justify="right")
    for c in COMPARE_METRICS:
        cells = []
        for row in res["rows"]:
            ci = row.get(f"{c}_ci95")
            cells.append(_fmt(row[c]) + (f" ±{_fmt(ci)}" if ci is not None else ""))
        table.add_row(c, *cells)
    for c in ("output_tps", "slo_tps", "useful_tps"):
        table.add_row(f"{c} vs {res['baseline']}", *(_fmt(res["ratios_vs_baseline"][r["system"]][c]) for r in res["rows"]))
    out_console.print(table)


COMPARE_METRICS = ("output_tps", "slo_tps", "useful_tps", "request_tps", "goodput", "ttft_p50_s", "ttft_p95_s", "tbt_p50_s",
                   "tbt_p95_s", "e2e_p50_s", "e2e_p95_s", "reuse_rate", "reuse_hbm", "reuse_store", "decode_concurrency", "completed")


@app.command()
def systems() -> None:
    """List the system presets with their policies and tiers."""
    from coda.policy.registry import SYSTEMS

    table = Table(show_header=True)
    for c in ("system", "router", "state", "execution", "tiers", "description"):
        table.add_column(c)
    for p in SYSTEMS.values():
        table.add_row(p.name, p.router, p.state, p.execution, p.tiers_text(), p.description)
    out_console.print(table)


@workload_app.command("synth")
def workload_synth(
    rate: Annotated[float, typer.Option("--rate", help="target requests/s (rounds of all sessions)")],
    duration: Annotated[float, typer.Option("--duration", help="session arrival window in seconds")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output JSONL (.gz to compress)")],
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """Generate a synthetic coding-agent workload calibrated to TraceLab's published statistics."""
    from coda.workload.schema import write_workload
    from coda.workload.synth import SynthSpec, synthesize

    try:
        spec = SynthSpec(rate=rate, duration=duration, seed=seed)
    except ValueError as err:
        raise CodaError(f"workload synth: {err}") from None
    wl = synthesize(spec)
    write_workload(wl, out)
    err_console.print(f"wrote {len(wl.sessions)} sessions, {wl.num_requests} requests to {out}")


@workload_app.command("stats")
def workload_stats_cmd(
    workload: Annotated[str, typer.Argument(help="workload file or spec")],
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Summary statistics comparable with the published TraceLab statistics."""
    from coda.workload.stats import workload_stats

    st = workload_stats(_load(workload, fmt))
    if as_json:
        _print_json(st)
        return
    table = Table(show_header=True)
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for k, v in st.items():
        table.add_row(k, _fmt(v))
    out_console.print(table)


@workload_app.command("subsample")
def workload_subsample(
    workload: Annotated[str, typer.Argument(help="workload file or spec")],
    out: Annotated[Path, typer.Option("--out", "-o")],
    rate: Annotated[float | None, typer.Option("--rate", help="target requests/s")] = None,
    fraction: Annotated[float | None, typer.Option("--fraction", help="share of sessions to keep")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    fmt: FormatOpt = None,
) -> None:
    """Keep whole sessions (and their tool intervals) to reach a target request rate."""
    from coda.workload.schema import write_workload
    from coda.workload.subsample import subsample

    wl = subsample(_load(workload, fmt), rate=rate, fraction=fraction, seed=seed)
    write_workload(wl, out)
    err_console.print(f"kept {len(wl.sessions)} sessions, {wl.num_requests} requests -> {out}")


@profile_app.command("show")
def profile_show(
    profile: Annotated[str, typer.Option("--profile", "-p", help="profile name or JSON path")] = "a100-qwen3coder30b-fp8",
    as_json: JsonOpt = False,
) -> None:
    """Print a profile, the provenance of each constant and the KV sizing check."""
    from coda.cost.profile import GiB, load_profile

    p = load_profile(profile)
    kv = p.model.kv_bytes_per_token
    sizing = {
        "kv_bytes_per_token": kv,
        "kv_kib_per_token": kv / 1024,
        "hbm_kv_gib_per_worker": p.tiers.hbm_kv_bytes / GiB,
        "hbm_tokens_per_worker": int(p.tiers.hbm_kv_bytes // kv),
        "gib_per_67k_session": 67_000 * kv / GiB,
        "67k_sessions_per_worker": p.tiers.hbm_kv_bytes / (67_000 * kv),
        "dram_tokens_per_node": int(p.tiers.dram_kv_bytes // kv),
    }
    if as_json:
        _print_json({"profile": p.model_dump(), "sizing": sizing})
        return
    out_console.print(f"[bold]{p.name}[/bold] ({p.kind}): {p.description}")
    table = Table(show_header=True)
    table.add_column("constant")
    table.add_column("value", justify="right")
    table.add_column("provenance")
    dump = p.model_dump()
    for section in ("gpu", "model", "tiers", "overheads"):
        for k, v in dump[section].items():
            table.add_row(f"{section}.{k}", _fmt(v), p.provenance.get(f"{section}.{k}", ""))
    for link in ("h2d", "d2h", "ssd_read"):
        pts = ", ".join(f"{b / 2**20:.3g} MiB:{s * 1e3:.3g} ms" for b, s in dump[link]["points"])
        table.add_row(link, pts, p.provenance.get(link, ""))
    out_console.print(table)
    sz = Table(show_header=True, title="sizing check")
    sz.add_column("quantity")
    sz.add_column("value", justify="right")
    for k, v in sizing.items():
        sz.add_row(k, _fmt(v))
    out_console.print(sz)


def main() -> None:
    try:
        app(standalone_mode=False)
    except CodaError as err:
        err_console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
        sys.exit(err.exit_code)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as err:  # click usage errors and the like
        import click

        if isinstance(err, click.ClickException):
            err.show()
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
