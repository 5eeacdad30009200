"""Intervals over seeds: Student-t quantiles at any degrees of freedom (against published table
values), means with t intervals, and jackknife intervals on ratios of sums."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.metrics.requests import mean_ci, ratio_ci, t_quantile

# Two-sided 95% (and one 99%) critical values of Student's t, from the standard tables
# (e.g. NIST/SEMATECH e-Handbook of Statistical Methods, table 1.3.6.7.2), to 3 decimals.
KNOWN = [(1, 0.95, 12.706), (2, 0.95, 4.303), (4, 0.95, 2.776), (9, 0.95, 2.262), (10, 0.95, 2.228), (11, 0.95, 2.201),
         (15, 0.95, 2.131), (20, 0.95, 2.086), (29, 0.95, 2.045), (30, 0.95, 2.042), (60, 0.95, 2.000), (100, 0.95, 1.984),
         (10, 0.99, 3.169)]


@pytest.mark.parametrize(("df", "level", "value"), KNOWN)
def test_t_quantiles_match_the_published_table(df, level, value):
    assert t_quantile(df, level) == pytest.approx(value, abs=5e-4)


def test_the_t_quantile_tends_to_the_normal_one():
    assert t_quantile(100_000) == pytest.approx(1.95996, abs=1e-4)


def test_mean_ci_uses_t_with_n_minus_1_df_beyond_ten_seeds():
    ci = mean_ci(float(i) for i in range(11))  # mean 5, sample sd sqrt(11): half-width = t(10)
    assert ci["n"] == 11 and ci["mean"] == 5.0
    assert ci["ci95"] == pytest.approx(2.228, abs=1e-3)  # not 1.96
    assert mean_ci([None, 3.0]) == {"mean": 3.0, "ci95": None, "n": 1} and mean_ci([])["mean"] is None


def test_ratio_ci_is_the_ratio_of_sums_with_a_jackknife_interval():
    num, den = [110.0, 96.0, 130.0], [100.0, 100.0, 100.0]
    r, lo, hi = ratio_ci(num, den)
    assert r == pytest.approx(336 / 300)
    loo = [(336 - x) / 200 for x in num]  # leave one seed out
    mean = sum(loo) / 3
    se = math.sqrt(2 / 3 * sum((v - mean) ** 2 for v in loo))
    assert (lo, hi) == (pytest.approx(r - 4.303 * se, abs=1e-3), pytest.approx(r + 4.303 * se, abs=1e-3))


def test_ratio_ci_edge_cases():
    assert ratio_ci([5.0], [4.0]) == (1.25, None, None)  # one seed: a point
    assert ratio_ci([1.0, 2.0], [0.0, 0.0]) == (None, None, None)
    assert ratio_ci([1.0, 2.0], [0.0, 3.0]).lo is None  # a leave-one-out denominator of 0
    with pytest.raises(ValueError, match="paired"):
        ratio_ci([1.0, 2.0], [1.0])


pairs = st.lists(st.tuples(st.floats(1.0, 1e4), st.floats(1.0, 1e4)), min_size=2, max_size=20)


@given(pairs, st.floats(0.01, 100.0))
def test_ratio_ci_holds_its_ratio_and_ignores_the_unit(data, scale):
    num, den = [a for a, _ in data], [b for _, b in data]
    r, lo, hi = ratio_ci(num, den)
    assert lo <= r <= hi
    r2, lo2, hi2 = ratio_ci([a * scale for a in num], [b * scale for b in den])
    assert (r2, lo2, hi2) == (pytest.approx(r), pytest.approx(lo, rel=1e-9, abs=1e-9), pytest.approx(hi, rel=1e-9, abs=1e-9))
    same = ratio_ci(den, den)
    assert same.ratio == pytest.approx(1.0) and same.hi - same.lo == pytest.approx(0.0, abs=1e-9)  # a system against itself
