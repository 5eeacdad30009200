"""Run one simulation or a comparison of systems over seeds (what ``coda sim``/``coda compare`` call)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
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


def seeded_workload(spec: str, seed: int, fmt: str | None = None) -> Workload:
    """A synth spec gets ``seed`` substituted; files are the same for every seed."""
    if spec.startswith("synth"):
        if re.search(r"seed=\d+", spec):
            spec = re.sub(r"seed=\d+", f"seed={seed}", spec)
        else:
            spec = spec + ("," if ":" in spec else ":") + f"seed={seed}"
    return load_workload(spec, fmt)


def run_one(workload: Workload, config: SimConfig, progress: Callable[[float], None] | None = None) -> SimResult:
    return Simulation(workload, config).run(progress)


def write_outputs(out: Path, result: SimResult, summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(strict_json.dumps(summary, indent=2) + "\n")
    with (out / "requests.jsonl").open("w") as fh:
        for rec in result.records:
            fh.write(strict_json.dumps(rec) + "\n")
    (out / "occupancy.json").write_text(strict_json.dumps(result.occupancy()) + "\n")


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


def compare(
    workload_spec: str,
    systems: Sequence[str | dict[str, Any] | Variant],
    seeds: Sequence[int],
    base: SimConfig,
    *,
    fmt: str | None = None,
    baseline: str | None = None,
    progress: Callable[[str, float], None] | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """Every system on the same workload per seed; rows hold means and 95% intervals over seeds."""
    chosen = variants(systems)
    per: dict[str, list[dict[str, Any]]] = {v.name: [] for v in chosen}
    bounds: list[dict[str, Any] | None] = []
    for seed in seeds:
        workload = seeded_workload(workload_spec, seed, fmt)
        bounds.append(_bound(workload, base))
        for v in chosen:
            cfg = base.with_overrides(system=v.preset, seed=seed, policies=v.policies)
            label = f"{v.name} seed {seed}"
            result = run_one(workload, cfg, (lambda f, label=label: progress(label, f)) if progress else None)
            summary = sim_summary(result, seed)
            summary["system"] = v.name
            per[v.name].append(summary)
            if out is not None:
                write_outputs(out / v.name / f"seed{seed}", result, summary)
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
    if base_name not in per:
        raise CodaError(f"--baseline {base_name}: not one of the systems compared ({', '.join(per)})")
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
