"""Characterization: the observers count what really ran, and each finding's arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.cost.model import AnalyticCost
from coda.cost.profile import load_profile
from coda.eval.characterize import growth_findings, path_findings, startup_findings, tier_findings, tool_findings
from coda.eval.characterize_observe import DecodeMix, RoutingOpportunity, near_uniform
from coda.metrics.requests import Window
from coda.policy.routing import SMetric
from coda.policy.snapshots import PrefixMatch, RouteRequest, RoutingSnapshot, WorkerView
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.schema import Round, Session, ToolCall, Workload
from tests.conftest import make_session

EVERYTHING = Window(0.0, 1e12)


class PaddedAttention(AnalyticCost):
    """A kernel that pads every request to the batch's longest context: composition matters."""

    def decode_attention_s(self, contexts: np.ndarray) -> float:
        return 1e-6 * len(contexts) * float(np.max(contexts)) if len(contexts) else 0.0


@pytest.fixture(scope="module")
def padded() -> PaddedAttention:
    return PaddedAttention(load_profile("a100-qwen3coder30b-fp8-roofline"))


def _mix(cost, window=EVERYTHING) -> DecodeMix:
    mix = DecodeMix()
    mix.bind(cost, window)
    return mix


# --- DecodeMix ----------------------------------------------------------------------------
def test_a_decode_run_then_a_mixed_step(padded):
    mix = _mix(padded)
    ctx = np.array([100, 400])
    mix.on_step(0, 0.0, np.array([1.0, 1.0]), [], ctx, None)  # a 2-step pure-decode run that ran
    mix.on_step(0, 2.0, np.array([0.5]), [(64, 0)], ctx + 2, None)  # then a step with a prefill chunk
    assert mix.steps == 3 and mix.time_s == pytest.approx(2.5)
    assert mix.pure_steps == 2 and mix.pure_time_s == pytest.approx(2.0)
    assert mix.ratios().tolist() == pytest.approx([4.0, 401 / 101, 402 / 102])  # contexts grow one token per step
    std = np.std([100, 400])
    assert mix.cvs().tolist() == pytest.approx([std / 250, std / 251, std / 252])
    # F7 on the two pure steps: padded to the longest (800, 802 us) vs uniform 250/251 tokens each (500, 502 us)
    assert mix.attn_observed_s == pytest.approx(1602e-6) and mix.attn_uniform_s == pytest.approx(1002e-6)
    gap, weight = mix.run_gaps()
    assert gap.tolist() == pytest.approx([1602 / 1002]) and weight.tolist() == [2]


def test_steps_outside_the_window_and_single_decoders(padded):
    mix = _mix(padded, Window(1.5, 3.0))
    mix.on_step(1, 0.0, np.array([1.0, 1.0, 1.0, 1.0]), [], np.array([10, 20]), None)  # steps start at 0,1,2,3
    mix.on_step(2, 1.0, np.array([1.0, 1.0]), [], np.array([10]), None)  # steps start at 1, 2
    assert mix.steps == 2 + 1 and mix.pure_steps == 3
    assert mix.multi_pure_steps == 2 and mix.ratios().tolist() == pytest.approx([22 / 12, 23 / 13])


@given(st.lists(st.integers(1, 200_000), min_size=1, max_size=64))
def test_near_uniform_keeps_count_and_total(contexts):
    ctx = np.array(contexts)
    u = near_uniform(ctx)
    assert len(u) == len(ctx) and int(u.sum()) == int(ctx.sum()) and int(u.max() - u.min()) <= 1


@given(st.lists(st.integers(1, 200_000), min_size=2, max_size=64))
def test_a_linear_attention_model_sees_no_composition_gap(contexts):
    cost = AnalyticCost(load_profile("a100-qwen3coder30b-fp8-roofline"))
    ctx = np.array(contexts)
    assert cost.decode_attention_s(ctx) == pytest.approx(cost.decode_attention_s(near_uniform(ctx)), rel=1e-12)


def test_in_a_simulation_the_observer_counts_exactly_the_executed_steps():
    sessions = [make_session(f"s{i}", 0.3 * i, [(2000 + 500 * i, 300, 0.5), (200, 200, 0.0)]) for i in range(8)]
    wl = Workload(sessions=sessions, meta={"duration_s": 1000.0})
    mix = DecodeMix()
    sim = Simulation(wl, SimConfig(system="vllm", workers=2, warmup_s=0), observers=[mix])
    mix.bind(sim.cost, sim.window)
    sim.run()
    assert mix.steps == sum(w.steps for w in sim.workers)  # runs cut short by arrivals report only what ran


# --- RoutingOpportunity -------------------------------------------------------------------
def _view(wid, load, hbm=0, contexts=()):
    return WorkerView(worker_id=wid, active_requests=load, active_kv_blocks=0, waiting_requests=0, decode_contexts=contexts,
                      match=PrefixMatch(hbm_blocks=hbm))


def _snap(workers, continuation=True, now=1.0):
    req = RouteRequest(seq=0, session_id="s", is_continuation=continuation, prompt_tokens=5000, prompt_blocks=20)
    return RoutingSnapshot(now, req, tuple(workers))


def test_routing_opportunity_counts_ties_and_compatibility():
    sm = SMetric()
    opp = RoutingOpportunity(sm)
    opp.bind(None, Window(0.0, 10.0))
    # affinity: workers 0 and 1 hold the same 10 blocks within the load bound; 1's decoders are closer to 5000 tokens
    snap = _snap([_view(0, 1, 10, (100_000,)), _view(1, 2, 10, (5000, 6000)), _view(2, 0, 0, (5000,))])
    chosen = sm.route(snap)
    assert chosen == 0
    opp.on_route(snap, chosen)
    # a first request: every worker within the load bound is eligible, but worker 2 has no decoders
    snap2 = _snap([_view(0, 1, 0, (100,)), _view(1, 1, 0, (200,)), _view(2, 0)], continuation=False)
    opp.on_route(snap2, sm.route(snap2))
    # a decision outside the window is ignored
    opp.on_route(_snap([_view(0, 0), _view(1, 0)], now=11.0), 0)
    assert opp.decisions == 2
    assert opp.by_kind == {"affinity": {"decisions": 1, "multi_eligible": 1, "comparable": 1, "differs": 1},
                           "load": {"decisions": 1, "multi_eligible": 1, "comparable": 0, "differs": 0}}
    assert opp.distance_gaps == pytest.approx([abs(np.log2(100_000 / 5000)) - (0 + abs(np.log2(6000 / 5000))) / 2])


def test_an_overloaded_holder_is_not_an_affinity_tie():
    opp = RoutingOpportunity(SMetric())
    eligible, kind = opp.eligible(_snap([_view(0, 9, 10, (1,)), _view(1, 0, 0, (1,)), _view(2, 3, 0, (1,))]))
    assert kind == "load" and [w.worker_id for w in eligible] == [1]  # bound: 0 + max(2, 0) = 2


# --- F1-F4 arithmetic ---------------------------------------------------------------------
def _rec(path, reusable, prompt, hbm=0, dram=0, ssd=0, admitted=1.0, ready=1.0, first=2.0, preempted=0):
    return {"path": path, "reusable_tokens": reusable, "prompt_tokens": prompt, "hbm_hit_tokens": hbm, "dram_hit_tokens": dram,
            "ssd_hit_tokens": ssd, "admitted_s": admitted, "state_ready_s": ready, "first_token_s": first, "preemptions": preempted}


def test_tiers_paths_and_startup_cost():
    recs = [
        _rec("hbm", 1000, 1200, hbm=768, first=1.5),
        _rec("dram", 1000, 1100, hbm=256, dram=512, ready=1.2, first=3.0),
        _rec("recompute", 600, 700, first=5.0),
        _rec("ssd", 600, 700, ssd=512, ready=2.0, first=4.0, preempted=1),
    ]
    f1 = tier_findings(recs, 256)
    # reusable in whole chunks: 768, 768, 512, 512; not resident = 0 + 0 + 512 + 0
    assert f1["tokens"] == {"hbm": 1024, "dram": 512, "ssd": 512, "not_resident": 512}
    assert f1["token_share"]["hbm"] == pytest.approx(1024 / 2560)
    f2 = path_findings(recs)
    assert f2["counts"] == {"hbm": 1, "dram": 1, "ssd": 1, "recompute": 1} and f2["share"]["ssd"] == 0.25
    f3, per = startup_findings(recs)
    assert f3["excluded_preempted"] == 1 and f3["paths"]["ssd"]["requests"] == 0
    assert f3["total_s"] == pytest.approx(0.5 + 2.0 + 4.0)
    assert f3["paths"]["dram"]["mean_restore_s"] == pytest.approx(0.2) and f3["paths"]["dram"]["mean_prefill_s"] == pytest.approx(1.8)
    assert f3["paths"]["recompute"]["share_of_total"] == pytest.approx(4.0 / 6.5)


def test_growth_and_longest_first_tool_share(tiny_workload):
    f4g, g = growth_findings(tiny_workload)
    # session a: prompts 3024, 3374, 3614; b: 4024, 4544; c: 800
    assert g.tolist() == pytest.approx([3614 / 3024, 4544 / 4024, 1.0])
    assert f4g["multi_round_sessions"] == 2 and f4g["ge4_share"] == 0.0
    calls = [100.0] + [1.0] * 99
    rounds = [Round(new_input_tokens=10, output_tokens=1, tools=[ToolCall(name="Bash", duration_s=d)]) for d in calls]
    f4t, d = tool_findings(Workload(sessions=[Session(session_id="t", start_s=0.0, rounds=rounds)]))
    assert f4t["calls"] == 100 and f4t["total_s"] == 199.0
    assert f4t["top_1pct_calls_time_share"] == pytest.approx(100 / 199)
    assert f4t["top_10pct_calls_time_share"] == pytest.approx(109 / 199)
    assert f4t["calls_share_holding_50pct_time"] == pytest.approx(0.01)  # the one 100 s call holds 50.3%
    assert tool_findings(tiny_workload)[0]["calls"] == 3
