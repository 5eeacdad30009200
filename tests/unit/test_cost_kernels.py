"""Kernel-level decode attention: FA2's split rule, the per-SM cap, cohorts and their bounds."""

import heapq
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from coda.cost import kernels
from coda.cost.attention import KernelAttention
from coda.cost.model import AnalyticCost, CohortPlan, build_cost_model
from coda.cost.operators import OperatorCost
from coda.cost.profile import load_profile

P4090 = "rtx4090-llama31-8b"


def reference_num_splits(bhm: int, sms: int, nblocks: int, max_splits: int = 128) -> int:
    """flash_api.cpp's num_splits_heuristic, transcribed line by line (its floats are float32)."""
    f32 = np.float32
    if f32(bhm) >= f32(0.8) * f32(sms):
        return 1
    max_splits = min(max_splits, sms, nblocks)

    def eligible(s: int) -> bool:
        return s == 1 or -(-nblocks // s) != -(-nblocks // (s - 1))

    def eff(s: int) -> np.float32:
        waves = f32(bhm * s) / f32(sms)
        return waves / f32(math.ceil(waves))

    effs = [eff(s) if eligible(s) else f32(0.0) for s in range(1, max_splits + 1)]
    best = max(effs)
    for s in range(1, max_splits + 1):
        if eligible(s) and float(effs[s - 1]) >= 0.85 * float(best):
            return s
    return 1


def list_schedule_s(units: list[float], slots: int, bw: float, rate: float) -> float:
    """Exact fluid time: units start in order on the first free slot; each runs at min(b, B/active)."""
    if len(units) <= slots:
        loads = sorted(units)
    else:
        heap = [0.0] * slots
        for u in units:
            heapq.heappush(heap, heapq.heappop(heap) + u)
        loads = sorted(heap)
    t, done, active = 0.0, 0.0, len(loads)
    for load in loads:
        t += (load - done) * max(1.0 / rate, active / bw)
        done, active = load, active - 1
    return t


@pytest.fixture(scope="module")
def cost4090() -> OperatorCost:
    cost = build_cost_model(load_profile(P4090))
    assert isinstance(cost, OperatorCost)
    return cost


@pytest.fixture(scope="module")
def k4090(cost4090) -> KernelAttention:
    return cost4090.kernel


@given(st.integers(1, 600), st.sampled_from([216, 256, 264, 376]), st.integers(1, 4000))
def test_split_heuristic_is_flash_attention_2s(bhm, sms2, nblocks):
    assert kernels.fa2_num_splits(bhm, sms2, nblocks) == reference_num_splits(bhm, sms2, nblocks)


def test_split_heuristic_known_cases():
    # two 16K-token requests x 8 KV heads on an RTX 4090 (2 x 128 SMs): 15 splits (14 is ineligible)
    assert kernels.fa2_num_splits(16, 256, 128) == 15
    assert kernels.fa2_num_splits(128, 256, 128) == 2
    assert kernels.fa2_num_splits(205, 256, 128) == 1  # fills 80% of 2 x SMs: a single split


def test_drain_model_tracks_exact_list_scheduling():
    """A skewed batch without splits, laid out longest first: the closed form vs the exact fluid schedule."""
    fp = np.array([600.0, 12.0, 0.0, 0.0, 0.0, 0.0])
    ip = np.array([128, 256, 8, 32, 128, kernels.FAMILY_FA2], dtype=np.int64)
    for n, nb, short, long in [(32, 1, 4096, 16384), (64, 4, 2048, 8192), (128, 8, 1024, 4096), (32, 16, 4096, 16384)]:
        ctx = np.array([long] * nb + [short] * (n - nb), dtype=np.int64)
        units = [float(c) for _ in range(8) for c in ctx]  # batch-fastest, then KV head
        exact = list_schedule_s(units, 128, 600.0, 12.0)
        model = kernels.decode_layer_s(ctx, fp, ip)
        assert model == pytest.approx(exact, rel=0.08), (n, nb)


def test_skewed_batch_costs_more_than_uniform_of_same_total(k4090):
    skew = np.array([16384] + [4096] * 31)
    uniform = np.full(32, int(skew.mean()))
    ratio = k4090.decode_s(skew) / k4090.decode_s(uniform)
    assert 1.3 < ratio < 1.7  # measured on the RTX 4090: 1.47


def test_per_sm_cap_is_what_makes_skew_cost(k4090):
    skew = np.array([16384] + [4096] * 31, dtype=np.int64)
    uniform = np.full(32, int(skew.mean()), dtype=np.int64)
    fp = k4090.fp.copy()
    capped = kernels.decode_layer_s(skew, fp, k4090.ip) / kernels.decode_layer_s(uniform, fp, k4090.ip)
    fp[kernels.F_RATE] = fp[kernels.F_BW]  # one CTA may use the whole bandwidth
    free = kernels.decode_layer_s(skew, fp, k4090.ip) / kernels.decode_layer_s(uniform, fp, k4090.ip)
    assert capped > 1.3
    assert free < 1.02


def test_single_split_rule_changes_small_batches_only(k4090):
    ip_no_split = k4090.ip.copy()
    ip_no_split[kernels.I_SMS2] = 1  # every batch "fills the SMs": one split
    small = np.full(2, 16384, dtype=np.int64)
    split = kernels.decode_layer_s(small, k4090.fp, k4090.ip)
    whole = kernels.decode_layer_s(small, k4090.fp, ip_no_split)
    assert split == pytest.approx(162e-6, rel=0.1)  # measured on the RTX 4090 (attention grid: 2 decodes of 16,384)
    assert whole > 3 * split  # 16 CTAs of 16K tokens at the per-CTA rate vs 240 short splits
    large = np.full(64, 16384, dtype=np.int64)  # 64 x 8 heads >= 0.8 x 256: one split either way
    assert kernels.decode_layer_s(large, k4090.fp, k4090.ip) == kernels.decode_layer_s(large, k4090.fp, ip_no_split)


def test_balanced_family_barely_notices_skew(k4090):
    ip = k4090.ip.copy()
    ip[kernels.I_FAMILY] = kernels.FAMILY_BALANCED
    skew = np.array([16384] + [4096] * 31, dtype=np.int64)
    uniform = np.full(32, int(skew.mean()), dtype=np.int64)
    ratio = kernels.decode_layer_s(skew, k4090.fp, ip) / kernels.decode_layer_s(uniform, k4090.fp, ip)
    assert 0.97 < ratio < 1.05


contexts = st.lists(st.integers(1, 120_000), min_size=2, max_size=300)


@settings(max_examples=60)
@given(contexts, st.sampled_from([P4090, "a100-qwen3coder30b-fp8-fa2", "rtxpro6000-qwen3-30b-a3b-tp2"]))
def test_gain_sweep_equals_cohort_predictions(ctx, name):
    cost = build_cost_model(load_profile(name))
    c = np.array(ctx)
    gb = cost.unpaired_gain_bounds(c, None, 3e-4)  # the kernel's own, whatever paired section the profile carries
    assert list(gb.cuts) == list(range(1, len(c)))
    full = cost.kernel.decode_s(c)
    for cut in {1, len(c) // 2, len(c) - 1}:
        expect = (full - cost.kernel.cohorts_s(c, cut)) / full
        assert gb.predicted[cut - 1] == pytest.approx(expect, abs=1e-12)
    assert np.all(gb.conservative <= gb.predicted)


@settings(max_examples=40)
@given(contexts, st.floats(0, 1))
def test_plan_charges_exactly_the_two_cohorts(ctx, frac):
    cost = build_cost_model(load_profile("a100-qwen3coder30b-fp8-fa2"))
    c = np.array(ctx)
    cut = 1 + int(frac * (len(c) - 2))
    plan = CohortPlan(cut)
    assert cost.step_s((), c, plan) - cost.step_s((), c) == pytest.approx(
        cost.kernel.cohorts_s(c, cut) - cost.kernel.decode_s(c), abs=1e-12
    )


@settings(max_examples=80)
@given(contexts, st.integers(0, 299), st.integers(1, 5000), st.sampled_from([P4090, "a100-qwen3coder30b-fp8-fa2"]))
@example([1369, 4097], 0, 40, P4090)
def test_more_tokens_never_cheaper_for_the_same_launch(ctx, i, extra, name):
    """More tokens (or one more request) never make a launch cheaper while FA2 keeps its split count.

    When the heuristic picks another split count the time may drop (a real FA2 effect: 27 x 4
    heads of long contexts split 2 ways run slower than 28 split 5 ways); list scheduling also
    has small anomalies (Graham's: a longer unit can reorder the drain). Hypothesis found one of
    3.9% on the RTX 4090 profile (contexts 1369, 4097 -> 1409, 4097: the short request gains a
    12th block), hence a 5% tolerance, still far below what a wrong sign or a dropped term would
    produce.
    """
    kernel = build_cost_model(load_profile(name)).kernel
    ip = kernel.ip
    c = np.array(ctx, dtype=np.int64)

    def splits(x):
        return kernels.fa2_num_splits(len(x) * int(ip[kernels.I_KV_HEADS]), int(ip[kernels.I_SMS2]), -(-int(x.max()) // 128))

    more = c.copy()
    more[i % len(c)] += extra
    longer = np.append(c, extra)
    base = kernel.decode_s(c)
    for bigger in (more, longer):
        if splits(bigger) == splits(c):
            assert kernel.decode_s(bigger) >= base * (1 - 5e-2)


def test_out_of_domain_and_analytic_models_never_split():
    fa2 = build_cost_model(load_profile("a100-qwen3coder30b-fp8-fa2"))
    agent = np.array([60_000, 70_000, 90_000, 120_000])  # beyond the 16K measured domain
    assert not fa2.cohort_gain_bounds(agent).in_domain
    assert fa2.cohort_gain_bounds(np.array([1000, 2000, 8000, 16000])).in_domain
    analytic = AnalyticCost(load_profile())
    gb = analytic.cohort_gain_bounds(np.array([1000, 2000, 30000, 40000]))
    assert not gb.in_domain and np.all(gb.predicted < 0)  # linear model: a split only adds a launch


def test_prefill_is_quadratic_with_positive_slope_past_the_domain():
    cost = build_cost_model(load_profile("rtxpro6000-llama31-8b"))
    times = [cost.prefill_only_s(n, 0) for n in (1000, 8000, 32000, 64000, 128000)]
    assert all(b > a for a, b in zip(times, times[1:]))
    none = np.empty(0, dtype=np.int64)
    assert cost.kernel.varlen_s([(8000, 0)], none) / cost.kernel.varlen_s([(1000, 0)], none) > 30
    assert cost.prefill_only_s(1000, 200_000) > cost.prefill_only_s(1000, 100_000) > cost.prefill_only_s(1000, 0)


def test_mixed_step_runs_one_varlen_launch(cost4090):
    with_prefill = cost4090.step_s([(512, 1024)], [4096] * 8)
    attn = cost4090.varlen_attention_s([(512, 1024)], np.full(8, 4096))
    assert attn == pytest.approx(cost4090.kernel.varlen_s([(512, 1024)], np.full(8, 4096)) * cost4090.corrections["mixed"](512, 8, 4096))
    assert with_prefill == pytest.approx(cost4090.profile.engine.step_s + cost4090.dense_s(520, 9) + attn)
