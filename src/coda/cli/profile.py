"""`coda profile ...`: cost profiles."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from coda.cli import JsonOpt, app, fmt_value, out_console, print_json

profile_app = typer.Typer(no_args_is_help=True, help="Inspect, fit and check cost profiles.")
app.add_typer(profile_app, name="profile")


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
        print_json({"profile": p.model_dump(), "sizing": sizing})
        return
    out_console.print(f"[bold]{p.name}[/bold] ({p.kind}): {p.description}")
    table = Table(show_header=True)
    table.add_column("constant")
    table.add_column("value", justify="right")
    table.add_column("provenance")
    dump = p.model_dump()
    for section in ("gpu", "model", "tiers", "overheads"):
        for k, v in dump[section].items():
            table.add_row(f"{section}.{k}", fmt_value(v), p.provenance.get(f"{section}.{k}", ""))
    for link in ("h2d", "d2h", "ssd_read"):
        pts = ", ".join(f"{b / 2**20:.3g} MiB:{s * 1e3:.3g} ms" for b, s in dump[link]["points"])
        table.add_row(link, pts, p.provenance.get(link, ""))
    out_console.print(table)
    sz = Table(show_header=True, title="sizing check")
    sz.add_column("quantity")
    sz.add_column("value", justify="right")
    for k, v in sizing.items():
        sz.add_row(k, fmt_value(v))
    out_console.print(sz)
