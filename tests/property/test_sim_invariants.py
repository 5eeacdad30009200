"""Hypothesis properties of the simulator: tokens conserved, KV never negative or over capacity
in any tier, every request ends completed, same seed same JSON, decisions blind to hidden fields,
cached routing and ingress snapshots equal to ones built afresh."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coda.policy.snapshots import PrefixMatch, WorkerLoad, WorkerView
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sim.request import RESTORING
from coda.sim.worker import Worker
from coda.workload.schema import Round, Session, ToolCall, Workload
from coda.workload.spec import load_workload

CHUNK_GIB = 96 * 1024 * 64 / 2**30  # one 64-token chunk of the paper profile


def check_worker(w: Worker) -> None:
    hbm = w.hbm
    assert 0 <= hbm.private and 0 <= hbm.used <= hbm.capacity
    assert all(r >= 0 for r in hbm.resident.values())
    assert set(hbm.lru) == {c for c, r in hbm.resident.items() if r == 0}
    holders = list(w.running) + [r for r in w.sim_requests if r.state == RESTORING and r.worker == w.id]
    assert sum(r.private for r in holders) == hbm.private
    for store in (w.dram, w.ssd):
        if store is not None:
            assert len(store) <= store.capacity


rounds_st = st.lists(
    st.tuples(st.integers(1, 900), st.integers(1, 120), st.floats(0, 5), st.sampled_from(["user", "tool_followup"])),
    min_size=1,
    max_size=5,
)
sessions_st = st.lists(st.tuples(st.floats(0, 20), rounds_st, st.booleans()), min_size=1, max_size=6)


def build(sessions) -> Workload:
    out = []
    for i, (start, rounds, grouped) in enumerate(sessions):
        rs = [
            Round(new_input_tokens=n, output_tokens=o, kind=k, tool_duration_s=t, tools=[ToolCall(name="Bash", duration_s=t)] if t else [],
                  prefix_tokens=128 if (j == 0 and grouped) else None)
            for j, (n, o, t, k) in enumerate(rounds)
        ]
        out.append(Session(session_id=f"s{i}", start_s=start, rounds=rs, prefix_group="g" if grouped else None))
    # a window longer than any run: every request is offered and measured
    return Workload(sessions=out, meta={"duration_s": 1e5})


def largest_chunks(wl: Workload, chunk: int) -> int:
    from coda.workload.schema import session_prompts

    return max(-(-(p + r.output_tokens + 1) // chunk) for s in wl.sessions for (_, p), r in zip(session_prompts(s), s.rounds))


@settings(max_examples=60)
@given(
    sessions=sessions_st,
    workers=st.integers(1, 3),
    spare=st.integers(0, 40),
    max_seqs=st.integers(1, 6),
    budget=st.sampled_from([128, 512, 4096]),
    dram=st.booleans(),
    dram_chunks=st.integers(0, 60),
    ssd=st.booleans(),
    shadow=st.booleans(),
    run_max=st.sampled_from([1, 7, 1024]),
    system=st.sampled_from(["vllm", "cachewise", "coda", "dynamo"]),
)
def test_every_request_completes_with_tokens_conserved_and_kv_in_bounds(
    sessions, workers, spare, max_seqs, budget, dram, dram_chunks, ssd, shadow, run_max, system
):
    wl = build(sessions)
    need = largest_chunks(wl, 64)
    cfg = SimConfig(
        workers=workers,
        chunk_tokens=64,
        hbm_kv_gib=(need + spare) * CHUNK_GIB,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        dram=dram,
        dram_kv_gib=dram_chunks * CHUNK_GIB * 4,
        ssd=ssd,
        ssd_kv_gib=20 * CHUNK_GIB * 4,
        cpu_shadow=shadow,
        warmup_s=0,
        drain_s=1e6,
        decode_run_max=run_max,
        per_worker_tiers=False,
        system=system,
        policies={"eviction": {"params": {"window_chunks": 8}}} if system in ("cachewise", "coda") else None,
    )
    sim = Simulation(wl, cfg)
    for w in sim.workers:
        w.sim_requests = sim.requests
        orig = w._step_end

        def checked(gen, _orig=orig, _w=w):
            _orig(gen)
            check_worker(_w)

        w._step_end = checked
    res = sim.run()
    assert len(res.records) == wl.num_requests
    for req in sim.requests:
        assert req.finish_s >= req.first_token_s >= req.ready_s
        assert req.emitted == req.output_tokens
        # KV holds prompt + output except the last sampled token
        assert req.computed == req.prompt_tokens + req.output_tokens - 1 - (req.prompt_tokens - req.orig_prompt_tokens)
    for w in sim.workers:
        assert w.hbm.private == 0 and not w.running and not w.waiting
        assert all(r == 0 for r in w.hbm.resident.values()), "leaked a reference"
    s = res.summary()
    assert s["completed"] == s["offered"] == wl.num_requests and s["unfinished"] == 0


@settings(max_examples=15)
@given(sessions=sessions_st, workers=st.integers(1, 3))
def test_same_seed_gives_identical_json(sessions, workers):
    wl = build(sessions)
    cfg = SimConfig(system="vllm", workers=workers, chunk_tokens=64, warmup_s=0)

    def run():
        s = Simulation(wl, cfg).run().summary()
        for k in ("wall_s", "speed_x"):
            s.pop(k)
        return json.dumps(s, sort_keys=True, default=str)

    assert run() == run()


@settings(max_examples=25)
@given(sessions=sessions_st, stop_at=st.floats(0.5, 25), perm_seed=st.integers(0, 1000))
def test_snapshots_do_not_depend_on_hidden_trace_fields(sessions, stop_at, perm_seed):
    """Permuting future output lengths and tool durations leaves every snapshot a policy sees unchanged."""
    import random

    wl = build(sessions)
    sim = Simulation(wl, SimConfig(system="vllm", workers=2, chunk_tokens=64, warmup_s=0))
    for sess in sim.sessions:
        sim.loop.at(sess.session.start_s, sim._start_session, sess)
    sim.loop.run(until=stop_at)

    def snapshots():
        snaps = [w.snapshot() for w in sim.workers]
        views = [(w.active_requests, w.hbm.used, len(w.waiting), w.decode_contexts()) for w in sim.workers]
        return snaps, views

    before = snapshots()
    rng = random.Random(perm_seed)
    live = [r for w in sim.workers for r in list(w.waiting) + list(w.running)]
    outs = [r.output_tokens for r in live]
    rng.shuffle(outs)
    for r, o in zip(live, outs):
        r.output_tokens = o + rng.randint(0, 500)
    assert snapshots() == before


@settings(max_examples=40)
@given(
    sessions=sessions_st,
    spare=st.integers(0, 20),
    max_seqs=st.integers(1, 4),
    w_max=st.sampled_from([0.5, 2.0, 20.0]),
    hold=st.booleans(),
    admission=st.sampled_from(["promote_one", "every_slot"]),
    tau=st.sampled_from([5.0, 60.0]),
    cost_unit=st.sampled_from(["seconds", "blocks"]),
)
def test_tiered_aging_never_bypasses_a_request_older_than_w_max(sessions, spare, max_seqs, w_max, hold, admission, tau, cost_unit):
    """Once a waiting request has waited W_max, no younger request on its worker is admitted before
    it while it fits (the paper's guard over the feasible set), whatever the aging and the cost
    (the paper's configuration and the throughput-and-tail one alike); with ``hold_queue``, not even
    while it does not fit."""
    wl = build(sessions)
    need = largest_chunks(wl, 64)
    params = {"w_max_s": w_max, "hold_queue": hold, "admission": admission, "tau_s": tau, "cost_unit": cost_unit}
    cfg = SimConfig(
        system="coda",
        workers=1,
        chunk_tokens=64,
        hbm_kv_gib=(need + spare) * CHUNK_GIB,
        max_num_seqs=max_seqs,
        warmup_s=0,
        policies={"state": {"params": params}},
    )
    sim = Simulation(wl, cfg)
    w = sim.workers[0]
    orig = w._admit
    violations = []

    def admit(req, _orig=orig):
        now = sim.loop.now
        for other in w.waiting:
            overdue = other is not req and now - other.arrived_s >= w_max and other.arrived_s < req.arrived_s
            if overdue and (hold or w._row(other)[-1]):
                violations.append((req.rid, other.rid, now))
        _orig(req)

    w._admit = admit
    sim.run()
    assert not violations
    assert all(r.finish_s >= 0 for r in sim.requests)


def fresh_views(sim: Simulation, chain: list[int]) -> tuple[WorkerView, ...]:
    """The reference routing views: every worker's built afresh, its match scanned chunk by chunk
    (the simulator reuses a view while its worker's version holds and skips workers without a hit)."""

    def lead(held, start: int) -> int:
        n = 0
        while start + n < len(chain) and chain[start + n] in held:
            n += 1
        return n

    views = []
    for w in sim.workers:
        match = PrefixMatch()
        if "match" in sim.worker_fields:
            h = lead(w.hbm.resident, 0)
            d = lead(w.dram.chunks, h) if w.dram is not None else 0
            match = PrefixMatch(h, d, lead(w.ssd.chunks, h + d) if w.ssd is not None else 0)
        views.append(
            WorkerView(
                w.id,
                len(w.running) + w.n_restoring + len(w.waiting),
                w.active_tokens // sim.C,
                len(w.waiting),
                w.decode_contexts() if "decode_contexts" in sim.worker_fields else (),
                match,
            )
        )
    return tuple(views)


def fresh_loads(sim: Simulation, req) -> tuple[WorkerLoad, ...]:
    """The reference ingress loads for ``req``, built afresh (what it would newly occupy from the
    HBM pools themselves, scanned chunk by chunk)."""

    def resident(w: Worker) -> int:
        n = 0
        while n < len(req.chain) and req.chain[n] in w.hbm.resident:
            n += 1
        return n

    ages = "queue_age" in sim.ingress.policy.signals
    return tuple(
        WorkerLoad(
            worker_id=w.id,
            queue_depth=len(w.waiting),
            kv_usage=(w.hbm.used - len(w.hbm.lru)) / w.hbm.capacity,
            queue_age_s=sim.ingress.queue_age_s(w.id, sim.loop.now) if ages else 0.0,
            inflight_requests=len(w.running) + w.n_restoring + len(w.waiting),
            inflight_tokens=sim.ingress.inflight_tokens.get(w.id, 0),
            new_tokens=req.orig_prompt_tokens - resident(w) * sim.C,
            max_num_seqs=w.max_num_seqs,
            kv_capacity_tokens=w.hbm.capacity * w.C,
        )
        for w in sim.workers
    )


@settings(max_examples=30)
@given(
    sessions=sessions_st,
    workers=st.integers(1, 9),
    system=st.sampled_from(["vllm", "cachewise", "coda", "dynamo", "smetric"]),
    dram=st.booleans(),
    ssd=st.booleans(),
    per_worker=st.booleans(),
    indexer=st.booleans(),
    spare=st.integers(0, 40),
)
def test_cached_snapshots_equal_a_fresh_build(sessions, workers, system, dram, ssd, per_worker, indexer, spare):
    wl = build(sessions)
    cfg = SimConfig(
        workers=workers,
        chunk_tokens=64,
        hbm_kv_gib=(largest_chunks(wl, 64) + spare) * CHUNK_GIB,
        dram=dram,
        dram_kv_gib=30 * CHUNK_GIB * 4,
        ssd=ssd,
        ssd_kv_gib=30 * CHUNK_GIB * 4,
        per_worker_tiers=per_worker,
        indexer=indexer,
        system=system,
        warmup_s=0,
        drain_s=1e6,
    )
    checked = check_snapshots(sim := Simulation(wl, cfg))
    sim.run()
    assert checked["route"] == checked["ingress"] == wl.num_requests


def check_snapshots(sim: Simulation) -> dict[str, int]:
    """Compare every routing and ingress snapshot the run takes with a fresh build; returns the counts."""
    routed, admitted = sim.routing_snapshot, sim.ingress_snapshot
    checked = {"route": 0, "ingress": 0}

    def routing_snapshot(req):
        snap = routed(req)
        assert snap.workers == fresh_views(sim, req.chain)
        checked["route"] += 1
        return snap

    def ingress_snapshot(req):
        snap = admitted(req)
        assert snap.workers == fresh_loads(sim, req)
        checked["ingress"] += 1
        return snap

    sim.routing_snapshot, sim.ingress_snapshot = routing_snapshot, ingress_snapshot
    return checked


@pytest.mark.parametrize("system", ["coda", "dynamo", "cachewise"])
def test_cached_snapshots_equal_a_fresh_build_on_a_node_sharing_cluster(system):
    """Nine workers (two full nodes sharing a DRAM store each, and one more) under a synthetic load."""
    sim = Simulation(load_workload("synth:rate=6,duration=150,seed=4"), SimConfig(system=system, workers=9))
    checked = check_snapshots(sim)
    sim.run()
    assert checked["route"] > 100 and any(w.dram is sim.workers[0].dram for w in sim.workers[1:])
