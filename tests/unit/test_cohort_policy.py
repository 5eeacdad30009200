"""Compatibility-Aware cohort planning against a cost model's gain bounds."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from coda.policy.execution import Cohort, FullBatch, SplitAlways


class GB(NamedTuple):
    cuts: np.ndarray
    predicted: np.ndarray
    conservative: np.ndarray
    in_domain: bool


class TableCost:
    """Gain bounds given per cut by the test; records the contexts it was asked about."""

    def __init__(self, predicted, conservative, in_domain=True):
        self.predicted, self.conservative, self.in_domain = predicted, conservative, in_domain
        self.seen = None

    def cohort_gain_bounds(self, contexts, cuts, launch_allowance_s):
        self.seen = (contexts.copy(), cuts.copy(), launch_allowance_s)
        return GB(cuts, np.array([self.predicted(k) for k in cuts]), np.array([self.conservative(k) for k in cuts]), self.in_domain)


def test_guards_small_uniform_and_out_of_domain_batches():
    always = TableCost(lambda k: 0.5, lambda k: 0.4)
    pol = Cohort(always)
    assert pol.plan(np.array([1000, 5000, 9000])) is None  # n < 4
    assert pol.plan(np.array([1000, 1100, 1200, 1400])) is None  # max/min < 1.5
    assert Cohort(TableCost(lambda k: 0.5, lambda k: 0.4, in_domain=False)).plan(np.array([1000, 2000, 30000, 40000])) is None


def test_picks_largest_predicted_gain_and_applies_only_above_gamma():
    cost = TableCost(lambda k: {4: 0.2, 5: 0.3, 6: 0.3}.get(k, 0.1), lambda k: 0.06 if k == 5 else 0.01)
    pol = Cohort(cost)
    ctx = np.array([40000, 1000, 2000, 3000, 30000, 35000, 1500, 25000, 2500, 45000])
    plan = pol.plan(ctx)
    # n = 10, m = max(2, ceil(3.5)) = 4: cuts 4..6; 5 and 6 tie on predicted gain, 5 is more balanced
    assert plan is not None and plan.cut == 5 and plan.gain_lower_bound == 0.06
    contexts, cuts, allowance = cost.seen
    assert list(contexts) == sorted(ctx) and list(cuts) == [4, 5, 6] and allowance == 3e-4
    cost.conservative = lambda k: 0.049
    assert pol.plan(ctx) is None  # conservative gain below Gamma = 5%


def test_analytic_model_without_bounds_never_splits():
    from coda.cost.model import AnalyticCost
    from coda.cost.profile import load_profile

    cost = AnalyticCost(load_profile())
    if hasattr(cost, "cohort_gain_bounds"):
        return  # a kernel-level model with bounds is checked by the cost-model tests
    assert Cohort(cost).plan(np.array([1000, 2000, 30000, 40000])) is None


@given(
    ctx=st.lists(st.integers(1, 200_000), min_size=4, max_size=64),
    gains=st.lists(st.floats(-1, 1), min_size=64, max_size=64),
    cons=st.lists(st.floats(-1, 1), min_size=64, max_size=64),
)
def test_cohorts_cover_the_batch_with_minimum_sizes(ctx, gains, cons):
    cost = TableCost(lambda k: gains[k], lambda k: cons[k])
    pol = Cohort(cost)
    arr = np.array(ctx)
    plan = pol.plan(arr)
    n = len(ctx)
    m = max(2, math.ceil(0.35 * n))
    if plan is None:
        return
    assert m <= plan.cut <= n - m  # both cohorts have at least m requests and together cover all n
    assert plan.gain_lower_bound >= 0.05
    assert max(arr) >= 1.5 * min(arr)
    admissible = range(m, n - m + 1)
    best = max(gains[k] for k in admissible)
    assert gains[plan.cut] == best


def test_each_rule_that_declines_a_split_is_named_and_a_split_carries_both_gains():
    cost = TableCost(lambda k: 0.3, lambda k: 0.1)
    pol = Cohort(cost)
    assert pol.explain(np.array([1000, 5000, 9000])).rule == "cohort: fewer than min_requests"
    assert pol.explain(np.array([1000, 1100, 1200, 1400])).rule == "cohort: contexts within min_ratio"
    assert Cohort(cost, min_requests=2, m_min=2).explain(np.array([1000, 9000])).rule == "cohort: no cut leaves both cohorts m requests"
    assert Cohort(TableCost(lambda k: 0.3, lambda k: 0.1, in_domain=False)).explain(np.array([1000, 2000, 30000, 40000])).rule \
        == "cohort: no validated gain bounds for this batch"
    assert Cohort(TableCost(lambda k: 0.3, lambda k: 0.01)).explain(np.array([1000, 2000, 30000, 40000])).rule \
        == "cohort: conservative gain below gamma"
    split = pol.explain(np.array([1000, 2000, 30000, 40000]))
    assert split.rule == "cohort: conservative gain at least gamma"
    assert (split.plan.cut, split.plan.predicted_gain, split.plan.gain_lower_bound) == (2, 0.3, 0.1)
    assert pol.plan(np.array([1000, 2000, 30000, 40000])) == split.plan
    assert FullBatch().explain(np.array([1000, 40000])).plan is None


@given(st.lists(st.integers(1, 100_000), min_size=2, max_size=64))
def test_split_always_cuts_every_mixed_batch_at_its_largest_neighbour_ratio(ctx):
    arr = np.array(ctx)
    choice = SplitAlways().explain(arr)
    if min(ctx) == max(ctx):
        assert choice.plan is None and choice.rule == "split_always: one context length"
        return
    srt = sorted(ctx)
    k = choice.plan.cut
    assert 1 <= k <= len(ctx) - 1 and srt[k - 1] < srt[k]
    assert srt[k] / srt[k - 1] == max(srt[i + 1] / srt[i] for i in range(len(srt) - 1))
    assert choice.plan.predicted_gain is None  # nothing predicted it
