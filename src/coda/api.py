"""The Python API: one simulation, or several systems compared over seeds, as ``coda sim`` and
``coda compare`` run them (same configuration, same results, same JSON)::

    import coda

    result = coda.simulate("synth:rate=1,duration=300,seed=0", coda.SimConfig(system="coda", workers=2))
    result.summary()["output_tps"]
    table = coda.compare("synth:rate=1,duration=300,seed=0", ["vllm", "coda"], seeds=[0, 1])
    table["ratios_vs_baseline"]["coda"]["output_tps"]

Bad input (an unknown system, a malformed spec or trace line) raises ``coda.errors.CodaError``
with a message that names it and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coda.errors import CodaError
from coda.sim import run
from coda.sim.config import SimConfig
from coda.sim.results import SimResult
from coda.workload.schema import Workload
from coda.workload.spec import load_workload

__all__ = ["SimResult", "compare", "simulate"]


def simulate(workload: str | Path | Workload, config: SimConfig | None = None, *, fmt: str | None = None) -> SimResult:
    """Simulate ``config``'s system (default ``SimConfig()``: the ``coda`` system on one worker) on ``workload``:
    a spec such as ``synth:rate=3,duration=600,seed=0``, a trace file (format detected unless
    ``fmt`` names it) or a ``Workload``. ``result.summary()`` is what ``coda sim --json`` prints,
    ``result.records`` one dict per request."""
    wl = workload if isinstance(workload, Workload) else load_workload(str(workload), fmt)
    return run.run_one(wl, config or SimConfig())


def compare(
    workload: str | Path,
    systems: Sequence[str],
    seeds: Sequence[int] = (0,),
    config: SimConfig | None = None,
    *,
    baseline: str | None = None,
    fmt: str | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """Every system of ``systems`` on the same workload for each seed: a synth spec is regenerated
    with each seed, a trace file is the same for all. Returns what ``coda compare --json`` prints:
    ``rows`` (one per system: means, and 95% intervals over several seeds) and
    ``ratios_vs_baseline`` (ratios of sums against ``baseline``, default the first system);
    ``out`` also writes each run's summary and per-request records there."""
    if not systems or not seeds:
        raise CodaError(f"compare: give at least one system and one seed (got systems={list(systems)}, seeds={list(seeds)})")
    return run.compare(str(workload), list(systems), list(seeds), config or SimConfig(), baseline=baseline, fmt=fmt, out=out)
