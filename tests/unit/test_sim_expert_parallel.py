"""Data-parallel groups with expert parallelism: the group's step cost and lockstep ranks."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coda.cost.expert_parallel import ExpertParallelGroup
from coda.cost.model import build_cost_model
from coda.cost.profile import load_profile
from coda.errors import CodaError
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sim.observe import SimObserver
from coda.workload.schema import Workload
from tests.conftest import make_session

MOE = "rtxpro6000-qwen3-30b-a3b"


def test_a_group_step_is_the_slowest_rank_plus_the_shared_moe_and_its_collectives():
    cost = build_cost_model(load_profile(MOE))
    group = ExpertParallelGroup(cost, 2)
    small, big = ([], np.array([500] * 4)), ([(512, 0)], np.array([900] * 8))
    step = group.step_s([small, big])
    slowest = max(group.local_s(*small), group.local_s(*big))
    shared = cost.moe_s(4 + 520, 0.5) + cost.rank.g.moe_layers * group.comm.layer_s([4, 520])
    assert step == pytest.approx(slowest + shared)
    # a rank alone computes its own MoE on half the experts, and still pays the collectives
    alone = group.step_s([big])
    assert alone == pytest.approx(group.local_s(*big) + cost.moe_s(520, 0.5) + cost.rank.g.moe_layers * group.comm.layer_s([520]))
    assert group.local_s(*big) < cost.step_s(*big)  # its MoE blocks moved out of the rank's own part


def test_ranks_under_cuda_graphs_run_the_largest_ranks_token_count():
    """vLLM's DP padding: every rank's step fits the CUDA graphs, so every rank, an idle one too,
    runs the largest count through its dense operators and the dispatch."""
    cost = build_cost_model(load_profile(MOE))
    group = ExpertParallelGroup(cost, 2)
    small, big = ([], np.array([500] * 4)), ([(96, 0)], np.array([900] * 8))
    assert group.padded_tokens([4, 104]) == 104 and group.padded_tokens([4, 520]) == 0
    step = group.step_s([small, big])
    padded_small = group.local_s(*small) + (cost.dense_s(104, 4) - cost.moe_s(104)) - (cost.dense_s(4, 4) - cost.moe_s(4))
    assert group.local_s(*small, 104) == pytest.approx(padded_small)
    assert group.local_s(*big, 104) == pytest.approx(group.local_s(*big))  # the largest rank is not padded
    # the padding tokens route alike: routed pairs, no further experts
    g, m = cost.rank.g, load_profile(MOE).operators.moe
    pairs = g.moe_layers * m.pair_s * g.experts_per_token * 0.5
    assert cost.moe_pairs_s(100, 0.5) == pytest.approx(100 * pairs)
    comm = g.moe_layers * group.comm.layer_s([104, 104])
    assert step == pytest.approx(max(padded_small, group.local_s(*big)) + cost.moe_s(108, 0.5) + cost.moe_pairs_s(100, 0.5) + comm)
    alone = group.step_s([big])  # the idle rank's dummy batch is padded to 104 tokens as well
    assert alone == pytest.approx(group.local_s(*big) + cost.moe_s(104, 0.5) + cost.moe_pairs_s(104, 0.5) + comm)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 600), st.integers(0, 64)), min_size=1, max_size=2))
def test_padding_never_makes_a_group_step_cheaper(ranks):
    cost = build_cost_model(load_profile(MOE))
    group = ExpertParallelGroup(cost, 2)
    batches = [([(n, 0)] if n else [], np.full(d, 700, dtype=np.int64)) for n, d in ranks]
    tokens = [n + d for n, d in ranks]
    if sum(tokens) == 0:
        return
    unpadded = max(group.local_s(*b) for b in batches) + cost.moe_s(sum(tokens), 0.5) + cost.rank.g.moe_layers * group.comm.layer_s(tokens)
    assert group.step_s(batches) >= unpadded * (1 - 1e-12)


def test_expert_parallelism_needs_an_moe_profile_at_tp1():
    with pytest.raises(CodaError, match="no experts"):
        ExpertParallelGroup(build_cost_model(load_profile("rtxpro6000-llama31-8b")), 2)
    with pytest.raises(CodaError, match="TP 1 profile"):
        ExpertParallelGroup(build_cost_model(load_profile("rtxpro6000-qwen3-30b-a3b-tp2")), 2)
    with pytest.raises(CodaError, match="does not divide"):
        ExpertParallelGroup(build_cost_model(load_profile(MOE)), 3)


def _workload(sessions: list[tuple[float, list[tuple[int, int, float]]]]) -> Workload:
    return Workload(sessions=[make_session(f"s{i}", t, rounds) for i, (t, rounds) in enumerate(sessions)], meta={"duration_s": 60.0})


class Steps(SimObserver):
    def __init__(self):
        self.by_worker: dict[int, list[tuple[float, float]]] = {}

    def on_step(self, worker, start_s, durations_s, prefill_chunks, decode_contexts, plan):
        ends = start_s + np.cumsum(durations_s)
        starts = np.concatenate([[start_s], ends[:-1]])
        self.by_worker.setdefault(worker, []).extend(zip(starts.tolist(), ends.tolist()))


rounds = st.lists(st.tuples(st.integers(50, 3000), st.integers(1, 40), st.floats(0, 2)), min_size=1, max_size=3)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), rounds), min_size=2, max_size=8))
def test_ranks_of_a_group_step_together(sessions):
    steps = Steps()
    cfg = SimConfig(profile=MOE, workers=4, data_parallel_size=2, enable_expert_parallel=True, warmup_s=0, chunk_tokens=16,
                    max_num_batched_tokens=2048)
    sim = Simulation(_workload(sessions), cfg, observers=[steps])
    sim.run()
    assert sum(len(v) for v in steps.by_worker.values()) == sum(w.steps for w in sim.workers)
    for a, b in ((0, 1), (2, 3)):  # the two groups' ranks: a step of one either is a step of the other or does not overlap it
        theirs = steps.by_worker.get(b, [])
        for s, e in steps.by_worker.get(a, []):
            assert all((s, e) == pytest.approx((s2, e2)) or e2 <= s + 1e-12 or s2 >= e - 1e-12 for s2, e2 in theirs)


def test_a_group_is_as_fast_as_its_slowest_rank():
    """Two ranks, one prefilling a long prompt: the other's decode steps stretch to the shared step."""
    wl = _workload([(0.0, [(4000, 4, 0.0)]), (0.0, [(100, 30, 0.0)])])
    chunk = SimConfig(profile=MOE, workers=2, warmup_s=0, max_num_batched_tokens=1024)
    prefill_alone = ExpertParallelGroup(build_cost_model(load_profile(MOE)), 2).local_s([(1024, 0)], np.empty(0, dtype=np.int64))
    longest = {}
    for ep in (False, True):
        steps = Steps()
        Simulation(wl, chunk.with_overrides(data_parallel_size=2, enable_expert_parallel=ep), observers=[steps]).run()
        decoder = min(steps.by_worker, key=lambda w: len(steps.by_worker[w]) < 30)  # the rank that decodes 30 tokens
        longest[ep] = max(e - s for s, e in steps.by_worker[decoder][1:])  # its decode steps, after its own prefill
    assert longest[True] > prefill_alone > longest[False]


def test_data_parallel_settings_are_checked():
    wl = _workload([(0.0, [(100, 2, 0.0)])])
    with pytest.raises(CodaError, match="multiple of data_parallel_size"):
        Simulation(wl, SimConfig(profile=MOE, workers=3, data_parallel_size=2, warmup_s=0))
    with pytest.raises(CodaError, match="no experts"):
        Simulation(wl, SimConfig(profile="rtxpro6000-llama31-8b", workers=2, data_parallel_size=2, enable_expert_parallel=True, warmup_s=0))
