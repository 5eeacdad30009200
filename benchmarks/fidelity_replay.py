"""Fidelity on recorded runs: replay an open-loop run's requests in ``coda sim`` with any profile
and engine settings, and report every statistic's error against what the run measured.

The run is a per-request JSONL as vLLM benchmark harnesses write it (``coda.workload.requests``:
arrival, input and output tokens) with each request's measured times: TTFT (``ttft_s``, ``ttft``
or ``ttft_ms``), TPOT (``tpot_s``, ``tpot``, ``tpot_ms``; else (latency - TTFT) / (output - 1)) and
latency (``latency_s``, ``latency``, ``e2e_latency``, ``e2e_s``, ``latency_ms``); seconds unless the
name ends in ``_ms``. Every request counts (no warm-up window: a recorded run is what it is), and
the simulator drains every request. Statistics: mean, p50, p90, p95, p99 of each, and output
tokens/s (output tokens over first arrival to last finish).

Setups name the engine settings of the configurations beyond one GPU (``SETUPS``): ``tp2`` runs a
TP 2 operators profile, ``dp2-ep`` a data-parallel group of two ranks with expert parallelism on a
TP 1 MoE profile (``data_parallel_size: 2``, ``enable_expert_parallel: true``); ``--profile`` and
``--config`` override them. Without ``--requests``, ``--example`` replays a seeded synthetic open-loop
run through each setup and its one-GPU counterpart and prints the predicted statistics and the
step-time change (no measured run here: no errors are claimed).

    python benchmarks/fidelity_replay.py --requests run.jsonl --setup tp2 --profile my-tp2-profile.json
    python benchmarks/fidelity_replay.py --requests run.jsonl --setup dp2-ep --json errors.json
    python benchmarks/fidelity_replay.py --example
    python benchmarks/fidelity_replay.py --tp2-check          # needs $CODA_DATA_DIR/profiles

``--tp2-check`` holds the TP 2 model to the shared TP 2 operator files without any end-to-end run:
each operator of the profile derived from TP 1 and of the one fitted to the TP 2 files against the
TP 2 rows (signed median error), whole per-rank steps against the sum of the rows at the same counts,
and the share of a simulated step that goes to collectives, for those profiles and for Qwen3-32B
derived from Llama-3.1-8B's TP 1 operators at TP 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from coda.config.load import read_config, validated
from coda.cost.model import build_cost_model
from coda.cost.profile import Profile, load_profile
from coda.errors import CodaError
from coda.profiling.derive import derive, measured_steps
from coda.profiling.hf_config import read_config as read_model_config
from coda.profiling.measured import read_attention
from coda.profiling.operator_fit import open_setup, read_table
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.requests import read_requests
from coda.workload.schema import Round, Session, Workload

#: engine settings of each setup (a SimConfig's fields); ``--profile`` / ``--config`` override them
SETUPS: dict[str, dict[str, Any]] = {
    "tp1": {"profile": "rtxpro6000-llama31-8b", "workers": 1},
    "tp2": {"profile": "rtxpro6000-llama31-8b-tp2", "workers": 1},
    "dp2-ep": {"profile": "rtxpro6000-qwen3-30b-a3b", "workers": 2, "data_parallel_size": 2, "enable_expert_parallel": True},
    "dp2": {"profile": "rtxpro6000-qwen3-30b-a3b", "workers": 2},
}
#: each setup of ``--example`` and the one-GPU (or independent-ranks) setup it is compared with
EXAMPLE_PAIRS = (("tp2", "tp1"), ("dp2-ep", "dp2"))
ENGINE = {
    "system": "vllm",
    "max_num_seqs": 256,
    "max_num_batched_tokens": 2048,
    "chunk_tokens": 16,
    "dram": False,
    "warmup_s": 0.0,
    "drain_s": 3600.0,
}
STATS = ("mean", "p50", "p90", "p95", "p99")
METRICS = ("ttft", "tpot", "e2e")
#: measured field names of each metric, with the factor to seconds
FIELDS = {
    "ttft": (("ttft_s", 1.0), ("ttft", 1.0), ("ttft_ms", 1e-3)),
    "tpot": (("tpot_s", 1.0), ("tpot", 1.0), ("tpot_ms", 1e-3)),
    "e2e": (("latency_s", 1.0), ("latency", 1.0), ("e2e_latency", 1.0), ("e2e_s", 1.0), ("latency_ms", 1e-3)),
}


def stats(values: np.ndarray) -> dict[str, float]:
    return {"mean": float(np.mean(values)), **{f"p{q}": float(np.percentile(values, q)) for q in (50, 90, 95, 99)}}


def measured_times(path: Path) -> dict[str, dict[str, float]]:
    """Each kept request's measured TTFT, TPOT and latency by its session id (``req-<line>``)."""
    out: dict[str, dict[str, float]] = {}
    with path.open() as fh:
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            row = json.loads(text)
            got = {m: next((float(row[k]) * f for k, f in FIELDS[m] if isinstance(row.get(k), (int, float))), None) for m in METRICS}
            if got["ttft"] is None or got["e2e"] is None:
                raise CodaError(
                    f"{path}:{line}: a measured run needs each request's TTFT and latency ({FIELDS['ttft'][0][0]}, "
                    f"{FIELDS['e2e'][0][0]} or their other names); this row has {', '.join(sorted(row))}"
                )
            if got["tpot"] is None:
                n = next(float(row[k]) for k in ("output_toks", "output_tokens", "output_len", "completion_tokens") if k in row)
                got["tpot"] = (got["e2e"] - got["ttft"]) / (n - 1) if n > 1 else None
            out[f"req-{line}"] = got  # type: ignore[assignment]
    return out


def setup_config(setup: str, profile: str | None, config: Path | None) -> SimConfig:
    data = {**ENGINE, **SETUPS[setup]}
    if config is not None:
        data.update(read_config(config))
    if profile is not None:
        data["profile"] = profile
    return validated(SimConfig, data, f"setup {setup}", show_input=True)


def simulate(workload: Workload, cfg: SimConfig) -> tuple[dict[str, dict[str, float]], float]:
    """Per-request simulated times by session id, and output tokens/s."""
    records = Simulation(workload, cfg).run().records
    done = [r for r in records if r["finish_s"] is not None]
    times = {r["session_id"]: {"ttft": r["ttft_s"], "tpot": r["tbt_mean_s"], "e2e": r["e2e_s"]} for r in done}
    span = max(r["finish_s"] for r in done) - min(r["ready_s"] for r in records)
    return times, sum(r["output_tokens"] for r in done) / span


def compare(sim: dict[str, dict[str, float]], real: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Every statistic of the requests both completed: measured, simulated, relative error."""
    both = sorted(set(sim) & set(real))
    out = {}
    for m in METRICS:
        pairs = [(sim[k][m], real[k][m]) for k in both if sim[k][m] is not None and real[k][m] is not None]
        s, r = stats(np.array([p[0] for p in pairs])), stats(np.array([p[1] for p in pairs]))
        out.update({f"{m}_{q}_s": {"sim": s[q], "real": r[q], "error": s[q] / r[q] - 1.0, "requests": len(pairs)} for q in STATS})
    return out


def describe(cfg: SimConfig) -> dict[str, Any]:
    p = load_profile(cfg.profile)
    return {
        "profile": p.name,
        "description": p.description,
        "engine_time": p.engine_time_note(),
        "config": cfg.model_dump(exclude_defaults=True),
        "link": p.gpu.link.generation if p.gpu and p.gpu.link else None,
    }


def replay(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    cfg = setup_config(args.setup, args.profile, args.config)
    workload = read_requests(args.requests)
    real = measured_times(args.requests)
    times, tps = simulate(workload, cfg)
    report = {
        "requests": str(args.requests),
        "setup": args.setup,
        **describe(cfg),
        "statistics": compare(times, real),
        "output_tps": {"sim": tps},
    }
    table = Table(title=f"{args.requests.name} replayed with setup {args.setup}, profile {report['profile']}")
    for col in ("statistic", "measured", "simulated", "error"):
        table.add_column(col, justify="right")
    for k, v in report["statistics"].items():
        table.add_row(k, f"{v['real'] * 1e3:.2f} ms", f"{v['sim'] * 1e3:.2f} ms", f"{v['error']:+.1%}")
    console.print(yaml.safe_dump({k: report[k] for k in ("profile", "engine_time", "config", "link")}, sort_keys=False, width=200))
    console.print(table)
    return report


def example_workload(seed: int, requests: int, rate: float) -> Workload:
    """A seeded open-loop run: Poisson arrivals, prompts and outputs lognormal around 1,000 and 200 tokens."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, requests))
    n_in = np.clip(rng.lognormal(np.log(1000), 0.8, requests), 16, 8000).astype(int)
    n_out = np.clip(rng.lognormal(np.log(200), 0.7, requests), 2, 2000).astype(int)
    sessions = [
        Session(
            session_id=f"req-{i + 1}",
            start_s=float(a),
            rounds=[Round(new_input_tokens=int(p), output_tokens=int(o), kind="user", at_s=float(a))],
        )
        for i, (a, p, o) in enumerate(zip(t, n_in, n_out))
    ]
    return Workload(
        sessions=sessions, meta={"duration_s": float(t[-1]), "source": f"example: seed {seed}, {requests} requests at {rate} req/s"}
    )


def step_changes(setup: str, base: str) -> list[tuple[str, float, float]]:
    """Step times of a few batches under a setup's profile and its counterpart's (seconds)."""
    a, b = (build_cost_model(load_profile(SETUPS[s]["profile"])) for s in (setup, base))
    shapes = [
        ("decode 1 x 1,000", (), [1000]),
        ("decode 32 x 2,000", (), [2000] * 32),
        ("decode 128 x 2,000", (), [2000] * 128),
        ("prefill 2,048 new", [(2048, 0)], []),
        ("prefill 512 over 4,096 + 32 decodes", [(512, 4096)], [2000] * 32),
    ]
    return [
        (name, b.step_s(chunks, np.array(ctx, dtype=np.int64)), a.step_s(chunks, np.array(ctx, dtype=np.int64)))
        for name, chunks, ctx in shapes
    ]


def example(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    workload = example_workload(args.seed, args.example_requests, args.example_rate)
    console.print(f"workload: {workload.meta['source']}; engine settings {ENGINE}")
    out: dict[str, Any] = {"workload": workload.meta["source"], "setups": {}}
    for setup, base in EXAMPLE_PAIRS:
        table = Table(title=f"predicted: {setup} against {base} (no measured run: no errors)")
        for col in ("statistic", base, setup, "change"):
            table.add_column(col, justify="right")
        runs = {}
        for s in (base, setup):
            cfg = setup_config(s, None, None)
            times, tps = simulate(workload, cfg)
            runs[s] = {
                **{
                    f"{m}_{q}_s": v for m in METRICS for q, v in stats(np.array([t[m] for t in times.values() if t[m] is not None])).items()
                },
                "output_tps": tps,
            }
            out["setups"][s] = {**describe(cfg), "predicted": runs[s]}
        for k in runs[base]:
            table.add_row(k, f"{runs[base][k]:.4g}", f"{runs[setup][k]:.4g}", f"{runs[setup][k] / runs[base][k] - 1:+.1%}")
        console.print(table)
        if setup == "tp2":
            steps = Table(title=f"step time: {SETUPS[base]['profile']} against {SETUPS[setup]['profile']} (collectives included)")
            for col in ("step", base, setup, "change"):
                steps.add_column(col, justify="right")
            for name, t1, t2 in step_changes(setup, base):
                steps.add_row(name, f"{t1 * 1e3:.2f} ms", f"{t2 * 1e3:.2f} ms", f"{t2 / t1 - 1:+.1%}")
            console.print(steps)
            out["step_changes"] = {name: {base: t1, setup: t2} for name, t1, t2 in step_changes(setup, base)}
    return out


TP2_SETUPS = {"rtxpro6000-llama31-8b": "RTXPRO6000_Llama-3.1-8B", "rtxpro6000-qwen3-30b-a3b": "RTXPRO6000_Qwen3-30B-A3B"}
MODELS = Path(__file__).resolve().parents[1] / "src/coda/profiling/models"
#: steps whose collective share --tp2-check prints: (name, prefill chunks, decode contexts)
COMM_SHAPES = (
    ("decode 1 x 1,000", (), [1000]),
    ("decode 32 x 2,000", (), [2000] * 32),
    ("decode 128 x 2,000", (), [2000] * 128),
    ("prefill 512 new", [(512, 0)], []),
    ("prefill 2,048 new", [(2048, 0)], []),
    ("prefill 512 over 4,096 + 32 decodes", [(512, 4096)], [2000] * 32),
)


def _signed(x: np.ndarray) -> dict[str, float]:
    return {"signed_median": float(np.median(x)), "median": float(np.median(np.abs(x))), "p90": float(np.percentile(np.abs(x), 90)),
            "rows": len(x)}


def operator_errors(profile: Profile, folder: Path, setup: str) -> dict[str, dict[str, float]]:
    """Each dense and per-sequence operator of ``profile`` against every TP 2 row of ``setup``."""
    ops = profile.operators
    assert ops is not None
    s, out = open_setup(folder, setup, 2), {}
    for kind, table, count in (("dense", {**ops.layer, **ops.step}, "tokens"), ("per_sequence", ops.per_sequence, "sequences")):
        for op, (x, t) in read_table(s.csv(kind), count, ("layer", count, "time_us")).items():
            if op in table:
                out[op] = _signed(np.interp(x, table[op].knots, table[op].seconds) / t - 1)
    cost = build_cost_model(profile)
    layers = cost.rank.g.num_layers
    by_regime: dict[str, list[float]] = {"pure": [], "prefill": [], "mixed": []}
    for b in read_attention(s.csv("attention")):
        pred = cost.varlen_attention_s(list(b.prefill), b.decodes) if b.prefill else cost.decode_attention_s(b.decodes)
        by_regime[b.regime].append(pred / layers / b.seconds - 1)
    for regime, name in (("pure", "decode"), ("prefill", "prefill"), ("mixed", "mixed")):
        out[f"attention, {name}"] = _signed(np.array(by_regime[regime]))
    return out


def comm_shares(profile: Profile) -> dict[str, dict[str, float]]:
    cost = build_cost_model(profile)
    out = {}
    for name, chunks, ctx in COMM_SHAPES:
        c = np.array(ctx, dtype=np.int64)
        tokens, seqs = len(c) + sum(n for n, _ in chunks), len(c) + len(chunks)
        step, comm = cost.step_s(chunks, c), cost.comm.step_s(tokens, seqs)
        out[name] = {"step_s": step, "comm_s": comm, "share": comm / step}
    return out


def tp2_check(console: Console) -> dict[str, Any]:
    data = os.environ.get("CODA_DATA_DIR")
    if not data:
        raise CodaError("--tp2-check: CODA_DATA_DIR is unset; point it at the folder holding profiles/ (the measured operator files)")
    folder = Path(data) / "profiles"
    if not folder.is_dir():
        raise CodaError(f"{folder}: no such folder; set CODA_DATA_DIR to the folder holding profiles/ (the measured operator files)")
    out: dict[str, Any] = {"operators": {}, "steps": {}, "comm": {}}
    profiles = {}
    for src, setup in TP2_SETUPS.items():
        p = load_profile(src)
        assert p.geometry is not None
        profiles[f"{src}-tp2 (derived from TP 1)"] = (Profile.model_validate(derive(p, p.geometry, 2)), setup)
        profiles[f"{src}-tp2 (fitted to the TP 2 files)"] = (load_profile(f"{src}-tp2"), setup)
    # another model and another TP degree at once, as Qwen3-32B at TP 2 is derived from Llama-3.1-8B at TP 1
    profiles["Qwen3-30B-A3B TP 2 derived from rtxpro6000-llama31-8b"] = (
        Profile.model_validate(derive(load_profile("rtxpro6000-llama31-8b"), read_model_config(MODELS / "Qwen3-30B-A3B.json"), 2)),
        TP2_SETUPS["rtxpro6000-qwen3-30b-a3b"])
    for label, (p, setup) in profiles.items():
        out["operators"][label] = operator_errors(p, folder, setup)
        rows = measured_steps(p, folder, setup, 2)
        out["steps"][label] = {k: _signed(np.array([a / b - 1 for r, a, b in rows if r == k])) for k in ("decode", "prefill")}
    ops = Table(title="TP 2 operators against the TP 2 files: signed median / median |error| / p90 |error|")
    ops.add_column("operator")
    for label in profiles:
        ops.add_column(label, justify="right")
    names = sorted({op for v in out["operators"].values() for op in v})
    for op in names:
        cells = [out["operators"][label].get(op) for label in profiles]
        ops.add_row(op, *(f"{e['signed_median']:+.1%} / {e['median']:.1%} / {e['p90']:.1%}" if e else "-" for e in cells))
    for k in ("decode", "prefill"):
        cells = [out["steps"][label][k] for label in profiles]
        ops.add_row(f"whole step, {k} ({cells[0]['rows']} rows)", *(f"{e['signed_median']:+.1%} / {e['median']:.1%} / {e['p90']:.1%}"
                                                                    for e in cells))
    console.print(ops)
    llama = load_profile("rtxpro6000-llama31-8b")
    q32 = Profile.model_validate(derive(llama, read_model_config(MODELS / "Qwen3-32B.json"), 2))
    comm_profiles = {"Qwen3-32B TP 2 (derived from rtxpro6000-llama31-8b)": q32,
                     "rtxpro6000-llama31-8b-tp2": load_profile("rtxpro6000-llama31-8b-tp2"),
                     "rtxpro6000-qwen3-30b-a3b-tp2": load_profile("rtxpro6000-qwen3-30b-a3b-tp2")}
    comm = Table(title="simulated step and its collectives at TP 2 (ms, share of the step)")
    comm.add_column("step")
    for label in comm_profiles:
        comm.add_column(label, justify="right")
    for label, p in comm_profiles.items():
        out["comm"][label] = comm_shares(p)
    for name, _, _ in COMM_SHAPES:
        cells = [out["comm"][label][name] for label in comm_profiles]
        comm.add_row(name, *(f"{c['step_s'] * 1e3:.2f} ms, {c['comm_s'] * 1e3:.2f} ms ({c['share']:.1%})" for c in cells))
    console.print(comm)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=Path, help="per-request JSONL of a measured open-loop run")
    ap.add_argument("--setup", choices=sorted(SETUPS), default="tp2", help="engine settings (default tp2)")
    ap.add_argument("--profile", help="profile name or JSON path (default: the setup's)")
    ap.add_argument("--config", type=Path, help="YAML/TOML of SimConfig fields laid over the setup's")
    ap.add_argument("--example", action="store_true", help="no measured run: predict each setup and its one-GPU counterpart")
    ap.add_argument("--tp2-check", action="store_true", help="no run: the TP 2 model against the shared TP 2 operator files")
    ap.add_argument("--example-requests", type=int, default=300)
    ap.add_argument("--example-rate", type=float, default=2.0, help="requests per second of the example run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the report as JSON")
    args = ap.parse_args()
    if sum((args.requests is not None, args.example, args.tp2_check)) != 1:
        ap.error("give one of --requests RUN.jsonl (a measured run), --example or --tp2-check")
    console = Console()
    try:
        report = replay(args, console) if args.requests else example(args, console) if args.example else tp2_check(console)
    except CodaError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
