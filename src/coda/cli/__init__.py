"""The ``coda`` command line (typer + rich). User errors print one line and exit 2.

Commands live in the modules of this package; each registers itself on ``app`` (or adds a
sub-app) when imported, and every module here is imported by ``main``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

from coda import __version__
from coda.errors import CodaError, missing_dependency
from coda.shell import strict_json
from coda.sweep.arguments import LOCAL_RAY

try:
    import typer
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
except ModuleNotFoundError as _err:  # the base install (vLLM's scheduler plugin) has no command line
    sys.stderr.write(f"error: {missing_dependency(_err) or _err}\n")
    sys.exit(2)

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Coda: admission and routing for LLM coding agents.")

from coda.console import err_console, out_console  # noqa: E402 - after the check that rich is installed

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")]
FormatOpt = Annotated[
    str | None, typer.Option("--format", help="workload file format: tracelab, mooncake, azure or coda (detected when omitted)")
]


def fmt_value(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_json(obj: Any) -> None:
    sys.stdout.write(strict_json.dumps(obj) + "\n")


def progress_bar(unit: str = "of sim time") -> Progress:
    """A transient progress bar on stderr (rich renders it only on a terminal)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}% " + unit),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,  # off a terminal it would only leave a blank line before an error
    )


def sweep_options(jobs: int | None, ray: str | None, resume: bool, out: Path | None) -> Any:
    """How a sweep command's cells run: ``--jobs``, ``--ray``, and finished cells kept under ``out/cells``."""
    from coda.sweep import SweepOptions

    if ray is not None and jobs is not None:
        raise CodaError("--jobs and --ray: give one (Ray runs one cell per CPU of its cluster)")
    if ray is not None:
        require("ray")
    address = None if ray is None else "" if ray == LOCAL_RAY else ray
    return SweepOptions(jobs=jobs, ray=address, store=out / "cells" if out is not None else None, resume=resume)


def require(module: str) -> None:
    """Fail now, not at the end of a long run, when a module the command will need is not installed."""
    if importlib.util.find_spec(module) is None:
        raise missing_dependency(ModuleNotFoundError(name=module)) or CodaError(f"{module} is not installed")


def out_dir(path: str | Path, option: str = "--out") -> Path:
    """``path`` as a directory the command can write into, made now, before any long run; else one line naming ``option``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CodaError(f"{option} {path}: is a file, not a directory; pass a directory path")
    _writable_dir(path, option)
    return path


def out_file(path: str | Path, option: str = "--out", inputs: tuple[str | Path, ...] = ()) -> Path:
    """``path`` as a file the command can write (its folder made now), that is none of ``inputs``; else one line naming ``option``."""
    path = Path(path)
    if path.is_dir():
        raise CodaError(f"{option} {path}: is a directory; pass a file path")
    if any(path.exists() and Path(i).exists() and path.samefile(i) for i in inputs):
        raise CodaError(f"{option} {path}: is the input file too, and writing would overwrite it; pass another path")
    _writable_dir(path.parent, option, path)
    return path


def _writable_dir(folder: Path, option: str, given: Path | None = None) -> None:
    shown = given or folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CodaError(f"{option} {shown}: cannot create {folder} ({err.strerror or err}); pass a path in a writable folder") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CodaError(f"{option} {shown}: {folder} is not writable; pass a path in a writable folder")


def load_workload_arg(spec: str, fmt: str | None) -> Any:
    from coda.workload.spec import load_workload

    return load_workload(spec, fmt)


def _register_commands() -> None:
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")


def _version(value: bool) -> None:
    if value:
        out_console.print(f"coda {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")] = False,
) -> None:
    """Coda: admission and routing for LLM coding agents."""


def _usage_error(err: typer.TyperException) -> str:
    """One line for a usage error (unknown command or option, bad value, missing option), with the fix."""
    ctx = getattr(err, "ctx", None)
    where = ctx.command_path if ctx is not None else "coda"
    return f"{err.format_message().rstrip('.')}; see `{where} --help`"


def fail(message: str, code: int) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(code)


#: options whose value may be left out (typer has no optional values), with the value that stands for none
OPTIONAL_VALUES = {"--ray": LOCAL_RAY}


def with_optional_values(argv: list[str]) -> list[str]:
    """``argv`` with the stand-in value after each option of ``OPTIONAL_VALUES`` given without one
    (last, or followed by another option): ``--ray --json`` reads as ``--ray local --json``."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg in OPTIONAL_VALUES and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out.append(OPTIONAL_VALUES[arg])
    return out


def main() -> None:
    """The ``coda`` entry point: usage and input errors print one ``error:`` line and exit 2."""
    from typer._click.exceptions import NoArgsIsHelpError, UsageError  # typer raises its vendored click's

    try:
        _register_commands()
        code = app(args=with_optional_values(sys.argv[1:]), standalone_mode=False)
    except CodaError as err:
        fail(str(err), err.exit_code)
    except NoArgsIsHelpError as err:  # `coda` or `coda workload` alone: the help, as click shows it
        err.show()
        sys.exit(err.exit_code)
    except UsageError as err:
        fail(_usage_error(err), 2)
    except typer.TyperException as err:
        fail(err.format_message(), 2)
    except ModuleNotFoundError as err:
        if (missing := missing_dependency(err)) is None:
            raise
        fail(str(missing), missing.exit_code)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
