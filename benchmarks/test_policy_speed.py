"""Policy decision latency (pytest-benchmark; run with `make bench`). Goals: one Tiered-Aging
decision over a 64-candidate frontier <= 20 us; a routing decision for 16 workers with 64 active
decoders each <= 50 us. Each is reported next to a trivial baseline measured in the same run."""

from __future__ import annotations

import numpy as np
import pytest

from coda.cost.model import build_cost_model
from coda.cost.profile import load_profile
from coda.policy.routing import ContextCompatible, DynamoKV, RoundRobin, SMetric
from coda.policy.snapshots import AdmissionSnapshot, PrefixMatch, RouteRequest, RoutingSnapshot, WorkerView
from coda.policy.state import Fifo, TieredAging

rng = np.random.default_rng(0)


def frontier(n=64):
    rows = []
    for i in range(n):
        prompt = int(rng.integers(5_000, 120_000))
        hbm = int(rng.integers(0, prompt // 256)) * 256 if rng.random() < 0.6 else 0
        dram = int(rng.integers(0, (prompt - hbm) // 256)) * 256 if rng.random() < 0.5 else 0
        rows.append((i, 20.0 + i * 0.1, prompt, hbm, dram, 0, (prompt - hbm) // 256 + 1, bool(rng.random() < 0.8)))
    return AdmissionSnapshot.from_rows(30.0, rows, free_blocks=500, h2d_outstanding_s=0.05)


@pytest.fixture(scope="module")
def cost():
    return build_cost_model(load_profile())


#: the paper's configuration and the throughput-and-tail one (tau 60 s, W_max 1,800 s)
POLICIES = {"fifo": lambda cost: Fifo(), "tiered_aging": TieredAging,
            "tiered_aging_tail": lambda cost: TieredAging(cost, tau_s=60.0, w_max_s=1800.0, admission="every_slot")}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_state_decision_64(benchmark, cost, policy):
    snap = frontier()
    pol = POLICIES[policy](cost)
    pol.choose(snap)  # warm the memo of link and prefill times, as in steady state
    benchmark(pol.choose, snap)


def routing_snapshot(workers=16, decoders=64):
    ws = tuple(
        WorkerView(
            worker_id=w,
            active_requests=int(rng.integers(60, 70)),
            active_kv_blocks=int(rng.integers(500, 1400)),
            waiting_requests=2,
            decode_contexts=tuple(int(x) for x in rng.integers(2_000, 150_000, decoders)),
            match=PrefixMatch(int(rng.integers(0, 300)), int(rng.integers(0, 50)), 0),
        )
        for w in range(workers)
    )
    req = RouteRequest(seq=7, session_id="s", is_continuation=False, prompt_tokens=48_000, prompt_blocks=188)
    return RoutingSnapshot(0.0, req, ws)


@pytest.mark.parametrize("router", [RoundRobin(), SMetric(), DynamoKV(), ContextCompatible()], ids=lambda r: r.name)
def test_route_16x64(benchmark, router):
    snap = routing_snapshot()
    benchmark(router.route, snap)


def test_indexer_match_128k_tokens_16_workers(benchmark):
    """Goal: <= 100 us to match a 128K-token prompt (500 blocks of 256 tokens) against 16 workers."""
    from coda.shell.kvindex import KVIndexer, WorkerTiers

    idx = KVIndexer()
    chain = list(range(10_000, 10_500))
    for w in range(16):
        idx.stored(f"hbm:{w}", chain[: 30 * w])  # worker w holds the first 30*w blocks
        idx.stored(f"hbm:{w}", range(w * 100_000, w * 100_000 + 5_000))  # and other sessions' blocks
    idx.stored("dram:0", chain)
    workers = [WorkerTiers(w, f"hbm:{w}", f"dram:{w // 4}") for w in range(16)]
    got = benchmark(idx.match, chain, workers)
    assert got[15].hbm_blocks == 450 and got[0].dram_blocks == 500


@pytest.mark.parametrize("profile", ["a100-qwen3coder30b-fp8-roofline", "a100-qwen3coder30b-fp8-fa2"])
def test_cohort_plan_256(benchmark, profile):
    """Goal: a cohort plan for 256 decoders in <= 50 us (the analytic profile has no bounds and
    returns at once: the baseline)."""
    from coda.policy.execution import Cohort

    cost = build_cost_model(load_profile(profile))
    contexts = rng.integers(2_000, 16_000, 256)  # inside the fitted domain, so the bounds are evaluated
    pol = Cohort(cost)
    pol.plan(contexts)  # compile the kernel model once
    benchmark(pol.plan, contexts)
