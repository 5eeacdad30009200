"""The ``coda`` command line (typer + rich). User errors print one line and exit 2.

Commands live in the modules of this package; each registers itself on ``app`` (or adds a
sub-app) when imported, and every module here is imported by ``main``.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from coda.errors import CodaError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Coda: admission and routing for LLM coding agents.")

out_console = Console()
err_console = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")]
FormatOpt = Annotated[str | None, typer.Option("--format", help="workload file format: tracelab, mooncake, azure or coda (detected when omitted)")]


def fmt_value(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")


def progress_bar(unit: str = "of sim time") -> Progress:
    """A transient progress bar on stderr (rich renders it only on a terminal)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}% " + unit),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )


def load_workload_arg(spec: str, fmt: str | None) -> Any:
    from coda.workload.spec import load_workload

    return load_workload(spec, fmt)


def _register_commands() -> None:
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")


def main() -> None:
    _register_commands()
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

