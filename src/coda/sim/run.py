"""Run one simulation or a comparison of systems over seeds (what ``coda sim``/``coda compare`` call)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from coda import __version__
from coda.errors import CodaError, invalid
from coda.metrics.requests import OPERATOR_KEYS, mean_ci, ratio_ci
from coda.policy.presets import system_preset
from coda.policy.spec import PoliciesOverride
from coda.shell import strict_json
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sim.results import SimResult
from coda.sim.roofline import config_roofline
from coda.sweep import Cell, SweepOptions, profile_digest, run_cells, workload_identity
from coda.sweep.executor import SERIAL
from coda.workload.schema import Workload
from coda.workload.spec import load_workload

# Metrics summed over seeds for ratio-of-sums gains (throughputs); the rest are averaged.
RATIO_METRICS = ("output_tps", "slo_tps", "useful_tps", "request_tps")
SUMMARY_METRICS = RATIO_METRICS + (
    "goodput", "ttft_p50_s", "ttft_p95_s", "tbt_p50_s", "tbt_p95_s", "tbt_p99_s",
    "e2e_p50_s", "e2e_p95_s", "reuse_rate", "reuse_hbm", "reuse_store", "decode_concurrency", "completed",
    *OPERATOR_KEYS,
)


def versions() -> dict[str, str]:
    import platform

    import numpy

    return {"coda": __version__, "python": platform.python_version(), "numpy": numpy.__version__}


def spec_seed(spec: str, default: int) -> int:
    """The seed written in a synth spec (``seed=K``), else ``default``."""
    m = re.search(r"seed=(\d+)", spec) if spec.startswith("synth") else None
    return int(m.group(1)) if m else default


def seeded_spec(spec: str, seed: int) -> str:
    """A synth spec with ``seed`` substituted; a file's path as it is (the same for every seed)."""
    if not spec.startswith("synth"):
        return spec
    if re.search(r"seed=\d+", spec):
        return re.sub(r"seed=\d+", f"seed={seed}", spec)
    return spec + ("," if ":" in spec else ":") + f"seed={seed}"


def seeded_workload(spec: str, seed: int, fmt: str | None = None) -> Workload:
    """A synth spec gets ``seed`` substituted; files are the same for every seed."""
    return load_workload(seeded_spec(spec, seed), fmt)


def run_one(workload: Workload, config: SimConfig, progress: Callable[[float], None] | None = None) -> SimResult:
    return Simulation(workload, config).run(progress)


def write_outputs(out: Path, result: SimResult, summary: dict[str, Any]) -> None:
    write_run_files(out, summary, result.records, result.occupancy())


def write_run_files(out: Path, summary: dict[str, Any], records: Sequence[dict[str, Any]], occupancy: dict[str, list[float]]) -> None:
    """A run's summary.json, requests.jsonl (one record a line) and occupancy.json in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(strict_json.dumps(summary, indent=2) + "\n")
    with (out / "requests.jsonl").open("w") as fh:
        for rec in records:
            fh.write(strict_json.dumps(rec) + "\n")
    (out / "occupancy.json").write_text(strict_json.dumps(occupancy) + "\n")


def sim_summary(result: SimResult, seed: int) -> dict[str, Any]:
    s = result.summary()
    s["seed"] = seed
    s["versions"] = versions()
    return s


class Variant(BaseModel):
    """A system in a comparison: a preset (``system``, default ``name``) with a ``policies`` block
    over it, reported under ``name``; a bare preset name is a variant of itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    system: str | None = None
    policies: PoliciesOverride | None = None

    @property
    def preset(self) -> str:
        return self.system or self.name


def variants(systems: Sequence[str | dict[str, Any] | Variant]) -> list[Variant]:
    """Systems as given on the command line or in a config file, checked: every preset exists and
    every name appears once."""
    out = []
    for i, item in enumerate(systems):
        try:
            v = item if isinstance(item, Variant) else Variant(name=item) if isinstance(item, str) else Variant.model_validate(item)
        except ValidationError as err:
            raise invalid(f"systems[{i}]", err, "give a preset name or {name, system, policies}") from None
        system_preset(v.preset)
        out.append(v)
    if not out:
        raise CodaError("systems: none given; name at least one preset (see `coda systems`), e.g. --systems vllm,coda")
    names = [v.name for v in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CodaError(f"systems: {', '.join(twice)} appear more than once; give each variant its own name")
    return out


def _bound(workload: Workload, config: SimConfig) -> dict[str, Any] | None:
    """The physical output bound of a seed's workload, or None for a profile without weights (a measured one)."""
    try:
        return config_roofline(workload, config)
    except CodaError:
        return None


def _fraction(runs: Sequence[dict[str, Any]], bounds: Sequence[dict[str, Any] | None]) -> float | None:
    """A system's output tokens/s over the bound, as a ratio of sums over seeds."""
    if not all(bounds):
        return None
    return sum(r["output_tps"] for r in runs) / sum(b["output_tps_bound"] for b in bounds)  # type: ignore[index]


def _compare_cell(spec: str, fmt: str | None, cfg: SimConfig, name: str, with_files: bool) -> dict[str, Any]:
    """One system on one seed's workload: its summary, the workload's output bound and, with
    ``with_files``, the per-request records and occupancy series ``--out`` keeps."""
    workload = seeded_workload(spec, cfg.seed, fmt)
    result = run_one(workload, cfg)
    summary = sim_summary(result, cfg.seed)
    summary["system"] = name
    cell: dict[str, Any] = {"summary": summary, "bound": _bound(workload, cfg)}
    if with_files:
        cell["records"] = result.records
        cell["occupancy"] = result.occupancy()
    return cell


def compare_cells(workload_spec: str, chosen: Sequence[Variant], seeds: Sequence[int], base: SimConfig, *, fmt: str | None = None,
                  with_files: bool = False) -> list[Cell]:
    """The cells of a comparison, seed-major (every system on seed 0, then on seed 1, ...); each
    is keyed by its full config, its seed's workload and its cost profile's content."""
    profile = profile_digest(base.profile)
    cells = []
    for seed in seeds:
        identity = workload_identity(seeded_spec(workload_spec, seed), fmt)
        for v in chosen:
            cfg = base.with_overrides(system=v.preset, seed=seed, policies=v.policies)
            config = {"cell": "compare", "name": v.name, "sim": cfg.model_dump(mode="json"), "workload": identity, "profile": profile}
            cells.append(Cell(f"{v.name} seed {seed}", config, partial(_compare_cell, workload_spec, fmt, cfg, v.name, with_files)))
    return cells


def compare(
    workload_spec: str,
    systems: Sequence[str | dict[str, Any] | Variant],
    seeds: Sequence[int],
    base: SimConfig,
    *,
    fmt: str | None = None,
    baseline: str | None = None,
    out: Path | None = None,
    sweep: SweepOptions = SERIAL,
) -> dict[str, Any]:
    """Every system on the same workload per seed; rows hold means and 95% intervals over seeds.
    The cells run as ``sweep`` says; with ``out``, each writes its run's files under
    ``out/<system>/seed<seed>``."""
    chosen = variants(systems)
    if baseline is not None and baseline not in {v.name for v in chosen}:
        raise CodaError(f"--baseline {baseline}: not one of the systems compared ({', '.join(v.name for v in chosen)})")
    seeded_workload(workload_spec, seeds[0], fmt)  # a workload the cells cannot read fails here, as one line, before any runs
    cells = compare_cells(workload_spec, chosen, seeds, base, fmt=fmt, with_files=out is not None)

    def written(cell: Cell, value: dict[str, Any]) -> dict[str, Any]:
        if out is not None:
            summary = value["summary"]
            write_run_files(out / summary["system"] / f"seed{summary['seed']}", summary, value.pop("records"), value.pop("occupancy"))
        return value

    done = run_cells(cells, sweep, title="compare", on_result=written)
    per: dict[str, list[dict[str, Any]]] = {v.name: [] for v in chosen}
    bounds: list[dict[str, Any] | None] = []
    for i, value in enumerate(done):
        per[value["summary"]["system"]].append(value["summary"])
        if i % len(chosen) == 0:
            bounds.append(value["bound"])
    rows = []
    for system in per:
        runs = per[system]
        row: dict[str, Any] = {"system": system}
        for key in SUMMARY_METRICS:
            stats = mean_ci(r.get(key) for r in runs)
            row[key] = stats["mean"]
            if len(runs) > 1:
                row[f"{key}_ci95"] = stats["ci95"]
        row["sim_time_s"] = sum(r["sim_time_s"] for r in runs) / len(runs)
        row["wall_s"] = sum(r["wall_s"] for r in runs)
        row["seeds"] = list(seeds)
        row["config"] = runs[0]["config"]
        row["roofline_fraction"] = _fraction(runs, bounds)
        rows.append(row)
    base_name = baseline or chosen[0].name
    gains = {system: {key: ratio_ci([r[key] for r in per[system]], [r[key] for r in per[base_name]]) for key in RATIO_METRICS}
             for system in per}
    ratios = {system: {key: g.ratio for key, g in by_key.items()} for system, by_key in gains.items()}
    intervals = {system: {key: None if g.lo is None else [g.lo, g.hi] for key, g in by_key.items()} for system, by_key in gains.items()}
    return {
        "rows": rows,
        "baseline": base_name,
        "ratios_vs_baseline": ratios,
        "ratios_vs_baseline_ci95": intervals,  # jackknife over seeds; None with one seed
        "seeds": list(seeds),
        "workload": workload_spec,
        "slo": base.slo.model_dump(),
        "roofline": bounds[0] if len(bounds) == 1 else {"per_seed": bounds} if all(bounds) else None,
        "versions": versions(),
    }
