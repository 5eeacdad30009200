"""`coda sim`, `coda compare`, `coda systems`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from coda.cli import (
    FormatOpt,
    JsonOpt,
    app,
    fmt_value,
    load_workload_arg,
    out_console,
    out_dir,
    out_file,
    print_json,
    progress_bar,
    require,
    sweep_options,
)
from coda.errors import CodaError
from coda.metrics.requests import OPERATOR_KEYS
from coda.shell import strict_json
from coda.shell.liveness import summary_line

# Options shared by `sim` and `compare`; None means "not given" so config files can supply them.
WorkloadOpt = Annotated[str | None, typer.Option("--workload", "-w", help="workload file or spec, e.g. synth:rate=3,duration=600,seed=0")]
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
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="directory for summary.json and per-request records")]
IngressOpt = Annotated[
    str | None,
    typer.Option("--ingress", help="ingress admission policy, as `coda serve` runs it (e.g. queue_limit, session, overload, a+b)"),
]
RouterOpt = Annotated[str | None, typer.Option("--router", help="router over the system's (e.g. round_robin, smetric, dynamo_kv, coda)")]
StateOpt = Annotated[
    str | None, typer.Option("--state", help="state admission policy over the system's (fifo, fewest_blocks, tiered_aging)")
]
POLICY_FLAGS = ("ingress", "router", "state")
JobsOpt = Annotated[int | None, typer.Option("--jobs", "-j", help="local worker processes running cells at once (default: one per core)")]
RayOpt = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="[ADDRESS]",
        help="run the cells on the Ray cluster at ADDRESS; with none (or `local`), on a Ray instance started here",
    ),
]
ResumeOpt = Annotated[
    bool, typer.Option("--resume/--no-resume", help="with --out, skip cells already finished there (their config unchanged)")
]

#: options of a config file beside SimConfig's fields, with their types
CONFIG_ONLY = {"workload": str, "format": str, "systems": str | list[str | dict[str, Any]], "seeds": int, "baseline": str, "out": Path}
CONFIG_ONLY_KEYS = tuple(CONFIG_ONLY)


def _settings(config: Path | None, cli: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """A config file with CLI values laid over it (CLI wins) as (extra keys, SimConfig)."""
    from coda.config.load import config_options, layered, read_config, validated
    from coda.sim.config import SimConfig

    data = read_config(config) if config else {}
    extra = config_options(data, CONFIG_ONLY, str(config))
    extra.update({k: cli.pop(k) for k in CONFIG_ONLY_KEYS if cli.get(k) is not None})
    slo = {key: cli.pop(flag) for flag, key in (("slo_ttft_s", "ttft_s"), ("slo_tbt_s", "tbt_s")) if cli.get(flag) is not None}
    flags = {kind: {"name": cli.pop(kind)} for kind in POLICY_FLAGS if cli.get(kind) is not None}
    given = {k: v for k, v in cli.items() if v is not None and k not in (*CONFIG_ONLY_KEYS, *POLICY_FLAGS, "slo_ttft_s", "slo_tbt_s")}
    over = {**given, **({"slo": slo} if slo else {}), **({"policies": flags} if flags else {})}
    source = str(config) if config else "command line"
    return extra, validated(SimConfig, layered(data, over), source, show_input=True)


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
    ingress: IngressOpt = None,
    router: RouterOpt = None,
    state: StateOpt = None,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Simulate one system on a workload."""
    from coda.sim.run import run_one, seeded_workload, sim_summary, write_outputs

    cli = dict(
        workload=workload,
        format=fmt,
        system=system,
        workers=workers,
        seed=seed,
        profile=profile,
        warmup_s=warmup_s,
        drain_s=drain_s,
        slo_ttft_s=slo_ttft_s,
        slo_tbt_s=slo_tbt_s,
        dram=dram,
        ssd=ssd,
        cpu_shadow=cpu_shadow,
        hbm_kv_gib=hbm_kv_gib,
        ingress=ingress,
        router=router,
        state=state,
        out=out,
    )
    extra, cfg = _settings(config, cli)
    if extra.get("out"):
        out_dir(extra["out"])
    spec = extra.get("workload") or "synth:rate=3,duration=1800,seed=0"
    wl = seeded_workload(spec, cfg.seed, extra.get("format")) if seed is not None else load_workload_arg(spec, extra.get("format"))
    with progress_bar() as prog:
        task = prog.add_task(f"sim {cfg.system}", total=1.0)
        result = run_one(wl, cfg, lambda f: prog.update(task, completed=f))
    summary = sim_summary(result, cfg.seed)
    summary["workload_spec"] = spec
    if extra.get("out"):
        write_outputs(Path(extra["out"]), result, summary)
    if as_json:
        print_json(summary)
    else:
        _print_sim_table(summary)


def _print_sim_table(s: dict[str, Any]) -> None:
    cfg = s["config"]
    out_console.print(
        f"[bold]coda sim[/bold] system={s['system']} workers={cfg['workers']} seed={s['seed']} workload={s.get('workload_spec')}\n"
        f"profile={cfg['profile']['name']} ({cfg['profile']['kind']}) tiers={cfg['tiers']}\n"
        f"SLO: TTFT <= {cfg['slo']['ttft_s']} s, mean TBT <= {cfg['slo']['tbt_s']} s; "
        f"window {s['window_s'][0]:.0f}-{s['window_s'][1]:.0f} s"
    )
    table = Table(show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in (
        "output_tps",
        "slo_tps",
        "useful_tps",
        "request_tps",
        "goodput",
        "ttft_p50_s",
        "ttft_p95_s",
        "tbt_p50_s",
        "tbt_p95_s",
        "e2e_p50_s",
        "e2e_p95_s",
        "reuse_rate",
        "reuse_hbm",
        "reuse_store",
        "decode_concurrency",
        "completed",
        "preemptions",
        *OPERATOR_KEYS,
        "sim_time_s",
        "wall_s",
        "speed_x",
    ):
        table.add_row(key, fmt_value(s.get(key)))
    out_console.print(table)
    ingress = s.get("ingress")
    if ingress and ingress["policy"] != "admit_all":
        out_console.print(f"ingress {ingress['policy']}: {summary_line(ingress['liveness'])}", highlight=False)
        for line in ingress["verdict"]:
            out_console.print(f"[bold]{line}[/bold]", highlight=False)


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
    ingress: IngressOpt = None,
    router: RouterOpt = None,
    state: StateOpt = None,
    as_json: JsonOpt = False,
    out: OutOpt = None,
    pareto: Annotated[
        Path | None, typer.Option("--pareto", help="write a PNG of output tokens/s against p99 slowdown and p99 TTFT here")
    ] = None,
    jobs: JobsOpt = None,
    ray: RayOpt = None,
    resume: ResumeOpt = True,
) -> None:
    """Run several systems on the same workload and seeds; gains are ratios of sums. A system is a
    preset name or, in a config file, a variant ``{name, system, policies}``."""
    from coda.config.load import read_config
    from coda.sim.run import compare as run_compare
    from coda.sim.run import spec_seed, variants

    cli = dict(
        workload=workload,
        format=fmt,
        systems=systems,
        seeds=seeds,
        baseline=baseline,
        workers=workers,
        seed=seed,
        profile=profile,
        warmup_s=warmup_s,
        drain_s=drain_s,
        slo_ttft_s=slo_ttft_s,
        slo_tbt_s=slo_tbt_s,
        dram=dram,
        ssd=ssd,
        cpu_shadow=cpu_shadow,
        hbm_kv_gib=hbm_kv_gib,
        ingress=ingress,
        router=router,
        state=state,
        out=out,
    )
    extra, cfg = _settings(config, cli)
    if pareto is not None:
        require("matplotlib")
        out_file(pareto, "--pareto")
    if extra.get("out"):
        out_dir(extra["out"])
    names = extra.get("systems") or "vllm"
    names = variants([n.strip() for n in names.split(",") if n.strip()] if isinstance(names, str) else names)
    n_seeds = _seeds(extra, 1)
    spec = extra.get("workload") or "synth:rate=3,duration=1800,seed=0"
    base_seed = cfg.seed if seed is not None or "seed" in (read_config(config) if config else {}) else spec_seed(spec, cfg.seed)
    seed_list = [base_seed + i for i in range(n_seeds)]
    out_path = Path(extra["out"]) if extra.get("out") else None
    res = run_compare(
        spec,
        names,
        seed_list,
        cfg,
        fmt=extra.get("format"),
        baseline=extra.get("baseline"),
        out=out_path,
        sweep=sweep_options(jobs, ray, resume, out_path),
    )
    if extra.get("out"):
        (Path(extra["out"]) / "compare.json").write_text(strict_json.dumps(res, indent=2) + "\n")
    if pareto is not None:
        from coda.eval.pareto import plot_pareto

        plot_pareto(pareto, res["rows"])
    if as_json:
        print_json(res)
        return
    out_console.print(
        f"[bold]coda compare[/bold] workload={spec} seeds={seed_list} workers={cfg.workers}\n"
        f"SLO: TTFT <= {cfg.slo.ttft_s} s, mean TBT <= {cfg.slo.tbt_s} s; profile={cfg.profile}; "
        f"gains vs {res['baseline']} are ratios of sums over seeds" + (" [jackknife 95% interval]" if len(seed_list) > 1 else "")
    )
    table = Table(show_header=True)
    table.add_column("metric")
    for row in res["rows"]:
        table.add_column(row["system"], justify="right")
    for c in COMPARE_METRICS:
        cells = []
        for row in res["rows"]:
            ci = row.get(f"{c}_ci95")
            cells.append(fmt_value(row[c]) + (f" ±{fmt_value(ci)}" if ci is not None else ""))
        table.add_row(c, *cells)
    for c in ("output_tps", "slo_tps", "useful_tps"):
        table.add_row(f"{c} vs {res['baseline']}", *(_ratio_cell(res, r["system"], c) for r in res["rows"]))
    out_console.print(table)
    if pareto is not None:
        out_console.print(f"wrote {pareto}", highlight=False)


def _ratio_cell(res: dict[str, Any], system: str, key: str) -> str:
    """A ratio of sums with its jackknife 95% interval over seeds, e.g. ``1.046 [1.01, 1.08]``."""
    ci = res["ratios_vs_baseline_ci95"][system][key]
    text = fmt_value(res["ratios_vs_baseline"][system][key])
    return text if ci is None or system == res["baseline"] else f"{text} [{ci[0]:.4g}, {ci[1]:.4g}]"


COMPARE_METRICS = (
    "output_tps",
    "slo_tps",
    "useful_tps",
    "request_tps",
    "goodput",
    "ttft_p50_s",
    "ttft_p95_s",
    "tbt_p50_s",
    "tbt_p95_s",
    "e2e_p50_s",
    "e2e_p95_s",
    "reuse_rate",
    "reuse_hbm",
    "reuse_store",
    "decode_concurrency",
    "completed",
    *OPERATOR_KEYS,
)


#: more seeds than any interval needs; a larger count is a typo that would only look like a hang (assumed)
MAX_SEEDS = 10_000


def _seeds(extra: dict[str, Any], default: int) -> int:
    """How many seeds: ``--seeds`` (or the config file's ``seeds``), which must be at least 1."""
    n = extra.get("seeds")
    if n is None:
        return default
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SEEDS:
        raise CodaError(f"--seeds must be an integer from 1 to {MAX_SEEDS:,} (the number of seeds to run), got {n!r}")
    return n
