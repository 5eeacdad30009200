"""With one session and no contention, the simulator charges exactly the cost model's times."""

import numpy as np
import pytest

from coda.cost.model import AnalyticCost
from coda.cost.profile import load_profile
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sim.observe import SimObserver
from coda.workload.schema import Workload
from tests.conftest import make_session


def _run(sessions, **cfg):
    wl = Workload(sessions=sessions, meta={"duration_s": 100.0})
    sim = Simulation(wl, SimConfig(**{"system": "vllm", "warmup_s": 0, **cfg}))
    return sim, sim.run()


def test_ttft_is_prefill_time_and_tbt_is_decode_step():
    sim, res = _run([make_session("a", 1.0, [(3000, 20, 0.0)])])
    cost = sim.cost
    rec = res.records[0]
    assert rec["ttft_s"] == pytest.approx(cost.prefill_only_s(3000, 0), rel=1e-9)
    steps = [cost.step_s((), [3001 + j]) for j in range(19)]
    assert rec["finish_s"] - rec["first_token_s"] == pytest.approx(sum(steps), rel=1e-9)
    assert rec["tbt_mean_s"] == pytest.approx(np.mean(steps), rel=1e-9)
    s = res.summary()
    assert s["tbt_p50_s"] == pytest.approx(np.median(steps), rel=1e-3)
    assert s["completed"] == 1 and s["unfinished"] == 0


def test_long_prompt_is_chunked_under_the_token_budget():
    sim, res = _run([make_session("a", 0.0, [(20000, 2, 0.0)])], max_num_batched_tokens=8192)
    cost = sim.cost
    expect = cost.step_s([(8192, 0)], []) + cost.step_s([(8192, 8192)], []) + cost.step_s([(3616, 16384)], [])
    assert res.records[0]["ttft_s"] == pytest.approx(expect, rel=1e-9)


def test_second_round_hits_its_own_prefix_in_hbm():
    sim, res = _run([make_session("a", 0.0, [(3000, 100, 2.0), (400, 10, 0.0)])], chunk_tokens=256)
    r0, r1 = res.records
    assert r1["ready_s"] == pytest.approx(r0["finish_s"] + 2.0)  # closed loop: completion + tool time
    # the whole previous context except its partial last chunk is an HBM hit
    assert r1["hbm_hit_tokens"] == (3000 + 100 - 1) // 256 * 256
    assert r1["path"] == "hbm" and r1["dram_hit_tokens"] == 0


def test_evicted_context_is_restored_from_dram_through_h2d():
    # HBM of 40 chunks: session b's prompt evicts a's cached context, which CPU-shadow kept in DRAM.
    cost = AnalyticCost(load_profile())
    chunk_gib = cost.kv_bytes(256) / 2**30
    sessions = [
        make_session("a", 0.0, [(5000, 10, 30.0), (100, 10, 0.0)]),
        make_session("b", 1.0, [(7000, 10, 0.0)]),
    ]
    sim, res = _run(sessions, hbm_kv_gib=40 * chunk_gib)
    a1 = next(r for r in res.records if r["session_id"] == "a" and r["round"] == 1)
    assert a1["path"] == "dram" and a1["dram_hit_tokens"] > 0
    assert a1["state_ready_s"] - a1["admitted_s"] == pytest.approx(cost.h2d_s(cost.kv_bytes(a1["dram_hit_tokens"])), rel=1e-9)


def test_observers_see_every_batch_and_routing_decision():
    class Obs(SimObserver):
        worker_fields = frozenset({"decode_contexts"})

        def __init__(self):
            self.steps = 0
            self.routes = []

        def on_step(self, worker, start_s, durations_s, prefill_chunks, decode_contexts, plan):
            assert len(durations_s) >= 1 and (prefill_chunks or len(decode_contexts))
            self.steps += len(durations_s)

        def on_route(self, snap, chosen):
            self.routes.append((snap.request.session_id, chosen))

    ob = Obs()
    wl = Workload(sessions=[make_session("a", 0.0, [(3000, 100, 2.0), (400, 10, 0.0)])], meta={"duration_s": 100.0})
    sim = Simulation(wl, SimConfig(system="vllm", warmup_s=0), observers=[ob])
    sim.run()
    assert ob.steps == sum(w.steps for w in sim.workers)
    assert ob.routes == [("a", 0), ("a", 0)]
