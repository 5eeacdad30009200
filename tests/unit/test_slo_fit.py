import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.metrics.requests import Window, summarize
from experiments.slo_fit import TBT_GRID_S, TTFT_GRID_S, SloSample, fit_slo, gain_grid


def sample(ttft, itl, out, window_s=100.0):
    return SloSample(np.array(out, dtype=float), np.array(ttft, dtype=float), np.array(itl, dtype=float), window_s)


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0.01, 0.5), st.integers(1, 500)), min_size=1, max_size=40))
def test_surface_is_slo_throughput_at_every_grid_pair(rows):
    s = sample(*zip(*rows))
    surface = s.slo_surface(TTFT_GRID_S[::37], TBT_GRID_S[::41])
    for i, tbt in enumerate(TBT_GRID_S[::41]):
        for j, ttft in enumerate(TTFT_GRID_S[::37]):
            assert surface[i, j] == pytest.approx(s.slo_tps(ttft, tbt) * s.window_s)


def test_sample_matches_summarize_slo_throughput():
    records = [
        {"ready_s": 10.0, "first_token_s": 11.0, "finish_s": 20.0, "output_tokens": 10, "tbt_mean_s": 0.05, "state": "completed"},
        {"ready_s": 10.0, "first_token_s": 19.0, "finish_s": 30.0, "output_tokens": 50, "tbt_mean_s": 0.2, "state": "completed"},
        {
            "ready_s": 10.0,
            "first_token_s": 12.0,
            "finish_s": 150.0,
            "output_tokens": 70,
            "tbt_mean_s": 0.05,
            "state": "completed",
        },  # after the window
        {"ready_s": 10.0, "first_token_s": None, "finish_s": None, "output_tokens": 0, "tbt_mean_s": None, "state": "rejected"},
    ]
    w = Window(0.0, 100.0)
    s = SloSample.of(records, w)
    for ttft, tbt in ((2.0, 0.1), (10.0, 0.3), (0.5, 0.1)):
        assert s.slo_tps(ttft, tbt) == pytest.approx(summarize(records, w, ttft_slo_s=ttft, tbt_slo_s=tbt)["slo_tps"])


def test_fit_finds_thresholds_that_give_each_workload_its_share():
    rng = np.random.default_rng(0)
    a = sample(rng.exponential(5.0, 4000), rng.uniform(0.03, 0.2, 4000), np.full(4000, 100))
    b = sample(rng.exponential(20.0, 4000), rng.uniform(0.03, 0.2, 4000), np.full(4000, 100))
    # shares that the pair (TTFT 4 s, TBT 100 ms) produces, up to sampling
    targets = {"A": a.slo_tps(4.0, 0.1) * 100 / a.output.sum(), "B": b.slo_tps(4.0, 0.1) * 100 / b.output.sum()}
    fit = fit_slo({"A": [a], "B": [b]}, targets)
    assert fit.ttft_s == pytest.approx(4.0, rel=0.1) and fit.tbt_s == pytest.approx(0.1, abs=0.005)
    for k, t in targets.items():
        assert fit.shares[k] == pytest.approx(t, abs=0.005)


def test_gain_grid_is_a_ratio_of_sums_and_none_without_a_reference():
    fast = sample([0.5, 0.5], [0.05, 0.05], [10, 10])
    slow = sample([3.0, 0.5], [0.05, 0.05], [10, 10])
    grid = gain_grid([fast], [slow], ttfts=(1.0, 5.0, 0.1), tbts=(0.1,))
    assert grid == [[2.0, 1.0, None]]
