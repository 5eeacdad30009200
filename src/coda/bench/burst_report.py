"""The agent burst's report: its provenance line, the table (the compact one in the simulator
alone), the door's table, the ratios against the baselines, the simulator's errors, and the files
every run writes (``result.json``, ``rows.csv``, ``burst.png``)."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from coda import __version__
from coda.bench.burst import BASELINES, PEER
from coda.bench.doors import PEER_VERSION
from coda.bench.ladder import MECHANISMS, SIM_ERROR_METRICS, Bench
from coda.bench.report import csv_text


def finish(b: Bench, result: dict[str, Any], as_json: bool) -> None:
    """Provenance, result.json, rows.csv, burst.png, and the table (or the JSON) on stdout."""
    sc, rung = b.scenario, b.rung
    simulated = rung.kind == "simulate"
    result["provenance"] = (
        f"agent burst on {rung.describe(sc)}; configs {','.join(sc.configs)}; loads {list(sc.loads)} x the knee; {sc.repeats} "
        f"repeats (seeds {sc.seed}..{sc.seed + sc.repeats - 1}; knee sweep seed {sc.seed + 1000}); scenario "
        f"{asdict(sc.sessions)}; SLO TTFT <= {sc.slo.ttft_s} s, mean TBT <= {sc.slo.tbt_s} s (assumed); coda "
        f"{__version__}{'' if simulated else f', {PEER} {PEER_VERSION}'}; engine settings: {sc.engine.describe()}; {os.cpu_count()} "
        f"CPUs {platform.machine()}; wall {result['wall_s']:.0f} s"
    )
    result["config"] = {"scenario": _plain(asdict(sc)), "rung": _plain(asdict(rung))}
    result["out"] = str(b.out)
    (b.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    (b.out / "rows.csv").write_text(csv_text(result["rows"]))
    plot(b.out / "burst.png", result["rows"])
    if as_json:
        print(json.dumps(result))
    else:
        show(result, sc.engine.max_num_seqs, compact=simulated)


def _plain(obj: Any) -> Any:
    """Paths as text, tuples as lists, schemas as mappings: the configuration as JSON writes it."""
    if isinstance(obj, BaseModel):
        return obj.model_dump()
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return str(obj) if isinstance(obj, Path) else obj


def fmt(v: Any, ci: Any = None) -> str:
    if v is None:
        return "-"
    text = f"{v:.3g}" if isinstance(v, float) else str(v)
    return text + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "")


TABLE = (
    ("goodput", "goodput"),
    ("ttft_p50_continuation_s", "cont TTFT p50 s"),
    ("ttft_p95_continuation_s", "cont TTFT p95 s"),
    ("ttft_p50_cold_s", "cold TTFT p50 s"),
    ("ttft_p95_cold_s", "cold TTFT p95 s"),
    ("max_wait_s", "max wait s"),
    ("session_p50_s", "session p50 s"),
    ("session_p99_s", "session p99 s"),
    ("prefix_hit_rate", "prefix hit"),
    ("preemptions", "preempt"),
    ("shed", "shed"),
    ("deferred", "deferred"),
    ("door_cpu_pct", "door CPU %"),
    ("engine_cpu_pct", "engine CPU %"),
)


#: the door's columns: what admission is for (the symmetric measures) and what says it wasted or overfilled
DOOR_TABLE = (
    ("goodput_symmetric", "goodput (symmetric)"),
    ("session_goodput", "session goodput"),
    ("sessions_completed", "sessions done"),
    ("slo_rps_symmetric", "SLO req/s"),
    ("ttft_p95_s", "admitted TTFT p95 s"),
    ("idle_while_held_s", "idle while held s"),
    ("refused_while_idle", "refused while idle"),
    ("inflight_peak", "peak in flight (one engine)"),
)


COMPACT = (
    ("goodput", "goodput"),
    ("ttft_p95_continuation_s", "cont TTFT p95 s"),
    ("goodput_vs_plain", "goodput vs plain"),
    ("ttft_p95_continuation_s_vs_plain", "cont TTFT p95 vs plain"),
    ("max_wait_s", "max wait s"),
)


def acted(row: dict[str, Any]) -> str:
    """What each of a row's engine mechanisms did over its repeats: the count that says it acted
    (``coda.bench.ladder.MECHANISMS``), ``inert`` where it never did, ``-`` where nothing counts it."""
    lv = row.get("liveness") or {}
    cells = []
    for m in lv.get("mechanisms", []):
        n = lv.get(MECHANISMS[m])
        cells.append(f"{m} {'-' if n is None else f'{n:g}'}" + (" inert" if m in lv.get("inert", []) else ""))
    return ", ".join(cells) or "-"


def show(result: dict[str, Any], seats: int, compact: bool = False) -> None:
    """The table (``compact``: goodput and continuation TTFT p95 with their ratios to plain), the ratios and the simulator's errors."""
    con = Console(width=None if sys.stdout.isatty() else 240)
    con.print(result["provenance"], highlight=False, soft_wrap=True)
    k = result["knee"]
    if k.get("levels"):
        con.print(
            "knee sweep (plain): "
            + "; ".join(
                (f"{lv['concurrency']} at a time: " if "concurrency" in lv else "")
                + f"{fmt(lv['sessions_per_s'])} sessions/s: goodput {fmt(lv['goodput'])}"
                for lv in k["levels"]
            ),
            highlight=False,
        )
    con.print(
        f"knee: {fmt(k['knee_sessions_per_s'])} sessions/s ({k['rule']})"
        + (
            "; the knee is the sweep's top level: raise --sweep"
            if k.get("at_top")
            else "; the knee is the sweep's lowest level: the engines miss the SLO at the lightest load tried "
            "(lower --sweep or loosen the SLO)"
            if k.get("at_bottom")
            else ""
        ),
        highlight=False,
    )
    cols = COMPACT if compact else TABLE
    table = Table("config", "load", *(label for _, label in cols), "mechanisms acted")
    for row in result["rows"]:
        table.add_row(row["config"], f"{row['load']:g}x", *(fmt(row.get(key), row.get(f"{key}_ci95")) for key, _ in cols), acted(row))
    con.print(table)
    if not compact and "symmetric_pace" in result:
        door_table = Table("config", "load", *(label for _, label in DOOR_TABLE),
                           title=f"the door: symmetric denominator paced by {result['symmetric_pace']} (docs/bench.md); "
                           f"each engine has {seats} seats")
        for row in result["rows"]:
            door_table.add_row(row["config"], f"{row['load']:g}x", *(fmt(row.get(k), row.get(f"{k}_ci95")) for k, _ in DOOR_TABLE))
        con.print(door_table)
    if compact:
        con.print(f"every column of every row: {result['out']}/rows.csv", highlight=False)
        return
    ratios = Table("config", "load", *(f"{m} vs {b}" for b in BASELINES for m in ("goodput", "ttft_p95_continuation_s")))
    for row in result["rows"]:
        cells = []
        for b in BASELINES:
            for m in ("goodput", "ttft_p95_continuation_s"):
                name = f"{m}_vs_{b.replace('-', '_')}"
                cells.append(fmt(row.get(name), row.get(f"{name}_ci95")))
        ratios.add_row(row["config"], f"{row['load']:g}x", *cells)
    con.print(ratios)
    sim = result.get("sim")
    if sim:
        fit = sim["profile"]["step_model"]["fit"]
        con.print(
            f"simulator: coda sim on the same sessions, profile measured through the API in this run ({sim['profile']['description']}; "
            f"fit error: prefill median {fit['prefill_median_err']:.3f}, decode median {fit['decode_median_err']:.3f}); settings: "
            f"{sim['settings']}; error = sim / measured - 1; target {sim['target']}",
            highlight=False,
            soft_wrap=True,
        )
        k = sim["knee"]
        con.print(f"knee: {fmt(k['real'])} sessions/s on the engines, {fmt(k['simulated'])} simulated (error {fmt(k['error'])})"
                  + ("; the simulated knee is its sweep's top level: raise --sim-sweep" if k["simulated_at_top"] else ""), highlight=False)
        errs = Table("config", "load", *SIM_ERROR_METRICS, "targets met")
        for e in sim["errors"]:
            errs.add_row(
                e["config"],
                f"{e['load']:g}x",
                *(f"{e[k]:+.2f}" if e[k] is not None else "-" for k in SIM_ERROR_METRICS),
                "yes" if e["targets_met"] else "no",
            )
        con.print(errs)
    con.print(f"wrote {result['out']}", highlight=False)


def plot(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = sorted((r for r in rows if r["config"] == config), key=lambda r: r["load"])
        x = [r["load"] for r in mine]
        for ax, key in zip(axes, ("goodput", "ttft_p95_continuation_s")):
            y = [r[key] if r[key] is not None else np.nan for r in mine]
            err = np.array(
                [[r[key] - r[f"{key}_ci95"][0], r[f"{key}_ci95"][1] - r[key]] if r.get(f"{key}_ci95") else [0.0, 0.0] for r in mine]
            ).T
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=config)
    axes[0].set_ylabel("goodput (SLO-meeting / offered)")
    axes[0].set_ylim(0, 1.05)
    axes[1].set_ylabel("continuation TTFT p95 (s)")
    for ax in axes:
        ax.set_xlabel("load (x the knee)")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
