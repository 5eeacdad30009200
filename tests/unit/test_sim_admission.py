"""Engine admission inside the simulator: the starvation guard and shadow comparisons."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.schema import Workload
from tests.conftest import make_session

CHUNK_GIB = 96 * 1024 * 64 / 2**30


def _big_and_smalls():
    smalls = [make_session(f"s{i}", 0.5 * i, [(640, 200, 0.0)]) for i in range(30)]
    big = make_session("big", 0.2, [(6400, 10, 0.0)])
    return Workload(sessions=[big, *smalls], meta={"duration_s": 100.0})


def _admissions(hold: bool, admission: str = "promote_one"):
    cfg = SimConfig(system="coda", workers=1, chunk_tokens=64, hbm_kv_gib=105 * CHUNK_GIB, warmup_s=0,
                    policies={"state": {"params": {"w_max_s": 2.0, "hold_queue": hold, "admission": admission}}})
    sim = Simulation(_big_and_smalls(), cfg)
    sim.run()
    recs = {r["session_id"]: r for r in (q.record() for q in sim.requests)}
    return recs


def test_hold_queue_admits_the_large_request_once_memory_drains():
    guarded = _admissions(True)
    big = guarded["big"]
    # it waits at most W_max plus the time the running small requests take to drain
    assert big["admitted_s"] - big["ready_s"] < 2.0 + 3.0
    late = [r for r in guarded.values() if r["session_id"] != "big" and r["ready_s"] > big["ready_s"] + 2.0]
    assert late and all(r["admitted_s"] >= big["admitted_s"] for r in late)


def test_without_holding_the_queue_small_requests_keep_bypassing_it():
    for admission in ("promote_one", "every_slot"):
        paper = _admissions(False, admission)
        big = paper["big"]
        last_small_ready = max(r["ready_s"] for r in paper.values() if r["session_id"] != "big")
        assert big["admitted_s"] > last_small_ready, admission  # bypassed by every small request


def test_promote_one_asks_the_policy_once_per_step_and_admits_the_rest_in_fcfs_order():
    """Three cached continuations and a cold request wait when a step has room for all: with
    promote_one the policy's choice goes first and the others follow in arrival order; with
    every_slot the policy orders them all."""
    from coda.policy.state import TieredAging

    class Counting(TieredAging):
        calls = 0

        def choose(self, snap):
            Counting.calls += 1
            return super().choose(snap)

    orders = {}
    for admission in ("promote_one", "every_slot"):
        wl = Workload(sessions=[make_session(f"s{i}", 0.0, [(n, 4, 0.0)]) for i, n in enumerate((3000, 600, 2000, 100))], meta={"duration_s": 10.0})
        sim = Simulation(wl, SimConfig(system="coda", workers=1, chunk_tokens=64, warmup_s=0, policies={"state": {"params": {"admission": admission}}}))
        w = sim.workers[0]
        w.state_policy = Counting(sim.cost, admission=admission)
        Counting.calls = 0
        sim.run()
        orders[admission] = ([r.sess.session.session_id for r in sorted(sim.requests, key=lambda r: r.admit_seq)], Counting.calls)
    cheapest = "s3"  # 100 new tokens
    promote, asked = orders["promote_one"]
    assert promote[0] == cheapest and promote[1:] == ["s0", "s1", "s2"] and asked == 1
    every, asked_every = orders["every_slot"]
    assert every[0] == cheapest and asked_every == 4


def test_shadow_policy_counts_decisions_that_differ():
    wl = _big_and_smalls()
    cfg = SimConfig(system="coda", workers=1, chunk_tokens=64, hbm_kv_gib=105 * CHUNK_GIB, warmup_s=0,
                    policies={"state": {"shadow": "fifo"}, "router": {"shadow": "round_robin"}})
    res = Simulation(wl, cfg).run()
    sh = res.summary()["shadow"]
    assert sh["state"]["policy"] == "fifo" and sh["state"]["decisions"] >= len(wl.sessions)
    assert sh["state"]["differs"] > 0  # FIFO would have held the queue behind the large request
    assert sh["router"]["differs"] == 0  # one worker: every router agrees
    # the same system with FIFO in shadow of FIFO never differs
    same = Simulation(wl, cfg.with_overrides(system="vllm")).run().summary()["shadow"]["state"]
    assert same["differs"] == 0 and same["decisions"] > 0


def test_tool_aware_reclaim_evicts_the_session_out_longest():
    from coda.policy.tools import ToolPredictor

    p = ToolPredictor(min_samples=3)
    for d in (0.1, 0.2, 0.3):
        p.observe(["Read"], d)
    for d in (30.0, 60.0, 90.0):
        p.observe(["Task"], d)
    assert p.remaining(["Task"], 10.0) == pytest.approx(50.0)
    assert p.remaining(["Read"], 0.05) == pytest.approx(0.15)
    assert p.remaining(["Read"], 5.0) == 5.0  # outlived every Read seen: in the tail
    assert p.remaining(["Unknown"], 1.0) == pytest.approx(59.0)  # all tools: calls past 1 s were 30, 60, 90 s
    assert ToolPredictor().remaining(["Task"], 1.0) == 0.0  # nothing learned yet: plain LRU


def test_tool_aware_eviction_takes_the_longest_out_session_first_within_its_window():
    from collections import OrderedDict

    from coda.policy.eviction import Lru, ToolAware
    from coda.sim.kvcache import owners_of

    def c(owner, i):
        return (owner << 32) | i

    lru = OrderedDict((k, None) for k in [c(1, 3), c(1, 2), c(2, 5), c(2, 4), c(3, 1), c(2, 9)])
    policy = ToolAware(window_chunks=5, min_samples=3)
    for d in (90.0, 100.0, 110.0):
        policy.observe(["Task"], d)
    for d in (4.0, 5.0, 6.0):
        policy.observe(["Read"], d)
    status = {1: None, 2: (("Task",), 0.0), 3: (("Read",), 0.0)}  # owner 1 is not out
    # owner 2 first (in LRU order, within the 5-chunk window), then owner 3, then LRU
    assert policy.victims(lru, 4, status.__getitem__, owners_of) == [c(2, 5), c(2, 4), c(3, 1), c(1, 3)]
    assert policy.victims(lru, 2, lambda owner: None, owners_of) == [c(1, 3), c(1, 2)]  # nobody out: LRU
    assert Lru().victims(lru, 2, status.__getitem__, owners_of) == [c(1, 3), c(1, 2)]


def reference_victims(policy, lru, n: int, out) -> list[int]:
    """ToolAware's choice computed the plain way: every chunk scored through its owner, a stable
    sort by score (highest first) over the LRU window."""
    import numpy as np

    w = min(max(policy.window_chunks, n), len(lru))
    chunks = list(lru)[:w]
    score = [policy.score(c >> 32, out) for c in chunks]
    if not any(x > 0 for x in score):
        return chunks[:n]
    return [chunks[i] for i in np.lexsort((np.arange(w), -np.array(score)))[:n]]


@settings(max_examples=200)
@given(owners=st.lists(st.integers(0, 6), min_size=1, max_size=60), window=st.integers(1, 70), data=st.data())
def test_tool_aware_victims_equal_a_plain_stable_sort(owners, window, data):
    from collections import OrderedDict

    from coda.policy.eviction import ToolAware
    from coda.sim.kvcache import owners_of

    lru = OrderedDict(((o << 32) | i, None) for i, o in enumerate(owners))
    policy = ToolAware(window_chunks=window, min_samples=1)
    policy.observe(["Task"], 50.0)
    policy.observe(["Read"], 5.0)
    status = {o: data.draw(st.sampled_from([None, (), ("Task",), ("Read",)])) for o in range(7)}
    elapsed = data.draw(st.floats(0, 60))

    def out(owner):
        return None if status[owner] is None else (status[owner], elapsed)

    n = data.draw(st.integers(1, len(lru)))
    assert policy.victims(lru, n, out, owners_of) == reference_victims(policy, lru, n, out)


def test_the_median_statistic_predicts_the_median_residual():
    from coda.policy.tools import ToolPredictor

    p = ToolPredictor(min_samples=3, statistic="median")
    for d in (1.0, 2.0, 30.0):
        p.observe(["Task"], d)
    assert p.remaining(["Task"], 0.5) == pytest.approx(1.5)  # median of {1, 2, 30} = 2, minus 0.5
