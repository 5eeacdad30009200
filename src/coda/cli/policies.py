"""`coda systems` and `coda policies`: what a configuration can name."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer
from rich.table import Table

from coda.cli import JsonOpt, app, out_console, print_json


@app.command()
def systems() -> None:
    """List the system presets with their policies and tiers."""
    from coda.policy.presets import DEFAULT_SYSTEM, SYSTEMS

    table = Table(show_header=True)
    for c in ("system", "router", "state", "execution", "eviction", "tiers", "description"):
        table.add_column(c)
    for p in SYSTEMS.values():
        b = p.policies
        name = f"{p.name} (default)" if p.name == DEFAULT_SYSTEM else p.name
        table.add_row(name, b.router.name, b.state.name, b.execution.name, b.eviction.name, p.tiers_text(), p.description)
    out_console.print(table)


@app.command()
def policies(
    kind: Annotated[str | None, typer.Argument(help="ingress, router, state, execution or eviction (default: all)")] = None,
    as_json: JsonOpt = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="print the table docs/policies.md carries")] = False,
) -> None:
    """List every registered policy (entry points included) with its parameters, their defaults,
    and what it does."""
    from coda.policy.registry import catalogue

    rows = catalogue(kind)
    if as_json:
        print_json({"policies": [dataclasses.asdict(r) for r in rows]})
    elif markdown:
        print(markdown_table(rows))
    else:
        table = Table(show_header=True, show_lines=True)
        for c in ("kind", "name", "parameters (default)", "what it does"):
            table.add_column(c)
        for r in rows:
            table.add_row(
                r.kind, _name(r), "\n".join(f"{p.name}: {p.type} = {_default(p.default)}" for p in r.parameters) or "-", r.summary
            )
        out_console.print(table)


def _name(r: Any) -> str:
    return r.name + (f" (alias {', '.join(r.aliases)})" if r.aliases else "")


def _default(value: Any) -> str:
    if dataclasses.is_dataclass(value):
        return "{" + ", ".join(f"{k}: {v!r}" for k, v in _params(value).items()) + "}"
    return repr(value)


def _params(value: Any) -> dict[str, Any]:
    from coda.policy.params import parameters

    return {n: getattr(value, n) for n in parameters(type(value))}


def markdown_table(rows: list[Any]) -> str:
    """The policy table of docs/policies.md (a test holds the docs to it)."""
    lines = ["| kind | name | parameters (default) | what it does |", "|---|---|---|---|"]
    for r in rows:
        params = "<br>".join(f"`{p.name}: {p.type} = {_default(p.default)}`" for p in r.parameters) or "-"
        lines.append(f"| {r.kind} | `{_name(r)}` | {params} | {r.summary} |")
    return "\n".join(lines)
