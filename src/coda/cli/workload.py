"""`coda workload synth|stats|subsample`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from coda.cli import FormatOpt, JsonOpt, app, err_console, fmt_value, load_workload_arg, out_console, out_file, print_json
from coda.errors import CodaError

workload_app = typer.Typer(no_args_is_help=True, help="Generate, inspect and subsample workloads.")
app.add_typer(workload_app, name="workload")


@workload_app.command("synth")
def workload_synth(
    rate: Annotated[float, typer.Option("--rate", help="target requests/s (rounds of all sessions)")],
    duration: Annotated[float, typer.Option("--duration", help="session arrival window in seconds")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output JSONL (.gz to compress)")],
    seed: Annotated[int, typer.Option("--seed")] = 0,
    shape: Annotated[str, typer.Option("--shape", help="output lengths: tracelab (agent rounds) or copilot (completions)")] = "tracelab",
) -> None:
    """Generate a synthetic coding-agent workload calibrated to TraceLab's published statistics."""
    from coda.workload.schema import write_workload
    from coda.workload.synth import SynthSpec, synthesize

    try:
        spec = SynthSpec(rate=rate, duration=duration, seed=seed, shape=shape)
    except ValueError as err:
        raise CodaError(f"workload synth: {err}") from None
    out_file(out)
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

    st = workload_stats(load_workload_arg(workload, fmt))
    if as_json:
        print_json(st)
        return
    table = Table(show_header=True)
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for k, v in st.items():
        table.add_row(k, fmt_value(v))
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

    out_file(out, inputs=(workload,))
    wl = subsample(load_workload_arg(workload, fmt), rate=rate, fraction=fraction, seed=seed)
    write_workload(wl, out)
    err_console.print(f"kept {len(wl.sessions)} sessions, {wl.num_requests} requests -> {out}")
