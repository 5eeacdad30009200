"""The paired cohort-gain model: pairing measured launches, the cut features, the grouped
held-out fit, the profile section, and ``cohort_gain_bounds`` answering from it."""

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coda.cost.cohorts import cut_features
from coda.cost.model import build_cost_model
from coda.cost.paired import gain_of_log_speedup, term_matrix
from coda.cost.profile import load_profile, profile_data, validate_profile
from coda.errors import CodaError
from coda.profiling.gain_fit import (
    choose_quantile,
    cross_fold_bounds,
    fit_gain,
    grouped_folds,
    held_out_predictions,
    least_squares,
    pair_features,
    transferred,
)
from coda.profiling.measured import Batch, SkewRow, read_skew
from coda.profiling.pairs import Pair, PairSet, Scale, UniformTimes, measured_pairs, pairs_of
from tests.conftest import shared_path
from tests.tolerance import approx_tree

SETUPS = {
    "rtx4090-llama31-8b": "RTX4090_Llama-3.1-8B_tp1",
    "rtxpro6000-qwen3-30b-a3b": "RTXPRO6000_Qwen3-30B-A3B_tp1",
}


def _batch(n: int, ctx: int, seconds: float, role: str = "grid") -> Batch:
    return Batch("pure", role, np.full(n, ctx, dtype=np.int64), (), seconds, 0)


def _row(n: int, nb: int, kvs: int, kvb: int, t_mean: float, t_max: float, t_skew: float) -> SkewRow:
    skew = Batch("pure", "skew", np.array([kvs] * (n - nb) + [kvb] * nb, dtype=np.int64), (), t_skew, 7)
    return SkewRow("pure", n, nb, kvs, kvb, _batch(n, kvs, t_mean, "mean"), _batch(n, kvb, t_max, "max"), skew)


# --- pairing ---------------------------------------------------------------------------------


def test_uniform_times_interpolate_in_batch_size_and_never_extrapolate():
    u = UniformTimes.of([_batch(4, 1024, 10.0), _batch(8, 1024, 18.0), _batch(8, 1024, 20.0), _batch(8, 1024, 16.0)])
    assert u.at(8, 1024) == (18.0, False)  # the median of the three measurements
    assert u.at(6, 1024) == (14.0, True)
    assert u.at(2, 1024) is None and u.at(9, 1024) is None and u.at(6, 2048) is None
    # A line through three points: the middle one predicted from its neighbours exactly.
    line = UniformTimes.of([_batch(n, 64, 1.0 + 0.5 * n) for n in (2, 4, 8)])
    assert line.leave_one_out() == pytest.approx([0.0])


def test_pairs_put_the_skewed_launch_on_the_uniform_time_base():
    # The uniform table measured 1 s per request at context 100 and 3 s per request at 1000; the
    # skew file's own uniform batches read twice as long, so its skewed launch is halved.
    table = [_batch(n, c, n * (1.0 if c == 100 else 3.0)) for c in (100, 1000) for n in (1, 2, 3, 4, 6, 8)]
    rows = [_row(8, 2, 100, 1000, 16.0, 48.0, 30.0), _row(8, 3, 100, 1000, 16.0, 48.0, 40.0), _row(8, 1, 100, 4096, 16.0, 1.0, 9.0)]
    ps = measured_pairs(rows, UniformTimes.of(table), "synthetic")
    assert ps.scale.factor == pytest.approx(2.0) and ps.scale.shapes == 5  # 3 at t_mean, 2 at t_max
    assert ps.skipped == 1  # no uniform batch measured at 4096
    a, b = ps.pairs
    assert (a.short_s, a.long_s, a.full_s, a.interpolated) == (6.0, 6.0, 15.0, False)
    assert a.gain == pytest.approx((15 - 12) / 15) and a.cut == 6
    assert (b.short_s, b.long_s, b.interpolated) == (5.0, 9.0, True)  # 5 requests lie between measured sizes
    assert a.group != b.group and list(a.contexts()) == [100] * 6 + [1000] * 2


def test_pairing_without_a_shared_shape_is_one_line_error():
    rows = [_row(8, 2, 100, 1000, 16.0, 48.0, 30.0)]
    with pytest.raises(CodaError, match="cannot be put on one time base"):
        Scale.between(rows, UniformTimes.of([_batch(8, 64, 1.0)]), "x_skew.csv")


# --- features ----------------------------------------------------------------------------------


def test_features_of_a_two_level_batch_and_of_a_general_one():
    f = cut_features([1000, 100, 100, 1000, 100, 100], np.array([4]))  # unsorted on purpose
    assert f["log2_ratio"][0] == pytest.approx(np.log2(10))
    assert f["cut_fraction"][0] == pytest.approx(4 / 6)
    assert f["log2_short_total"][0] == pytest.approx(np.log2(400))
    assert f["log2_long_total"][0] == pytest.approx(np.log2(2000))
    assert (f["log2_short_max"][0], f["log2_long_max"][0]) == pytest.approx((np.log2(100), np.log2(1000)))
    g = cut_features([5, 1, 3, 9, 2], np.array([1, 3]))  # sorted: 1 2 3 5 9
    assert g["log2_short_max"] == pytest.approx(np.log2([1, 3]))
    assert g["log2_short_total"] == pytest.approx(np.log2([1, 6]))
    assert g["log2_long_total"] == pytest.approx(np.log2([19, 14]))
    assert g["log2_ratio"] == pytest.approx(np.log2([9, 3]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 200_000), min_size=2, max_size=64), st.data())
def test_features_split_the_batch(ctx, data):
    cut = data.draw(st.integers(1, len(ctx) - 1))
    f = {k: v[0] for k, v in cut_features(ctx, np.array([cut])).items()}
    assert 2 ** f["log2_short_total"] + 2 ** f["log2_long_total"] == pytest.approx(sum(ctx))
    assert f["log2_ratio"] >= 0 and 0 < f["cut_fraction"] < 1
    assert f["log2_long_max"] == pytest.approx(np.log2(max(ctx)))
    assert f["log2_long_max"] - f["log2_ratio"] == pytest.approx(f["log2_short_max"])


# --- the fit -----------------------------------------------------------------------------------

TERMS = ("log2_ratio", "cut_fraction", "log2_long_total", "cut_fraction*cut_fraction")
TRUE = (0.05, 0.02, -0.15, 0.01, 0.2)  # intercept, then one per term


def _synthetic_pairs(noise: float, seed: int = 1) -> PairSet:
    """Pairs whose ln-speedup is ``TRUE`` on ``TERMS``, plus Gaussian noise of sd ``noise``."""
    rng = np.random.default_rng(seed)
    pairs = []
    for n in (8, 16, 32, 64):
        for nb in (1, 2, 4):
            for kvs in (256, 512, 1024):
                for ratio in (4, 16):
                    kvb = kvs * ratio
                    f = {k: v[0] for k, v in cut_features([kvs] * (n - nb) + [kvb] * nb, np.array([n - nb])).items()}
                    z = TRUE[0] + TRUE[1] * f["log2_ratio"] + TRUE[2] * f["cut_fraction"] + TRUE[3] * f["log2_long_total"]
                    z += TRUE[4] * f["cut_fraction"] ** 2 + noise * rng.standard_normal()
                    short, long = 1e-5 * (n - nb), 2e-5 * nb
                    pairs.append(Pair(n, nb, kvs, kvb, (short + long) * np.exp(z), short, long, False, 0))
    return PairSet(pairs, 0, Scale(1.0, 1, 1.0, 1.0, 0.0), "synthetic", np.empty(0))


def test_fit_recovers_known_coefficients_and_bounds_noise():
    exact = fit_gain(_synthetic_pairs(0.0), terms=TERMS).section
    assert exact["intercept"] == pytest.approx(TRUE[0], abs=1e-9)
    assert exact["coefficients"] == pytest.approx(TRUE[1:], abs=1e-9)
    assert exact["residual_bound"] == pytest.approx(0.0, abs=1e-9)
    noisy = fit_gain(_synthetic_pairs(0.02), terms=TERMS)
    # cut_fraction and its square are nearly collinear on these cuts: the fit is judged by the
    # ln-speedup it predicts, which must be close to the noise-free one.
    x = term_matrix(pair_features(_synthetic_pairs(0.0)), TERMS)
    truth = TRUE[0] + x @ np.array(TRUE[1:])
    fitted = noisy.section["intercept"] + x @ np.array(noisy.section["coefficients"])
    assert np.max(np.abs(fitted - truth)) < 0.02
    # A one-sided 95% bound of N(0, 0.02) residuals is about 1.645 sd.
    assert 0.02 < noisy.section["residual_bound"] < 0.06
    assert noisy.held_out["covered"] >= 0.95 and noisy.section["held_out"]["coverage"] >= 0.95
    validate_profile(profile_data("rtx4090-llama31-8b") | {"cohort_gain": noisy.section}, "synthetic")


def test_least_squares_refuses_an_undetermined_model():
    x = np.column_stack([np.arange(6.0), 2 * np.arange(6.0)])
    with pytest.raises(CodaError, match="determine only 2 of the model's 3"):
        least_squares(x, np.ones(6))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=12, max_size=80), st.integers(2, 5), st.integers(0, 1000))
def test_folds_hold_whole_groups_out(groups, k, seed):
    if len(set(groups)) < k:
        with pytest.raises(CodaError, match="cannot fill"):
            grouped_folds(groups, k, seed)
        return
    folds = grouped_folds(groups, k, seed)
    assert {f for f in folds} == set(range(k))
    for g in set(groups):
        assert len({f for f, h in zip(folds, groups) if h == g}) == 1


def test_held_out_predictions_do_not_see_their_fold():
    # z is exact on x except one outlier; its own prediction must not bend towards it.
    x = np.arange(20.0)[:, None]
    z = 1.0 + 0.5 * x[:, 0]
    z[7] += 100.0
    folds = np.arange(20) % 4
    pred = held_out_predictions(x, z, folds)
    assert pred[7] == pytest.approx(1.0 + 0.5 * 7, abs=1e-9)  # the other folds hold no outlier
    assert pred[3] == pytest.approx(z[3], abs=1e-9)  # nor for its own fold's other rows
    assert abs(pred[0] - z[0]) > 1.0  # the other folds were fitted with it


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=20, max_size=120), st.integers(0, 99))
def test_chosen_quantile_covers_the_target_across_folds(resid, seed):
    r = np.array(resid)
    folds = np.random.default_rng(seed).permutation(len(r)) % 4
    try:
        q, cov = choose_quantile(r, folds, 0.95)
    except CodaError:  # only when even the other folds' largest residual leaves too many above it
        assert np.mean(r <= cross_fold_bounds(r, folds, 1.0)) < 0.95
        return
    assert cov >= 0.95 and 0.95 <= q <= 1.0
    assert cov == pytest.approx(np.mean(r <= cross_fold_bounds(r, folds, q)))


def test_cross_fold_bound_uses_only_the_other_folds():
    r = np.array([0.0, 0.0, 0.0, 5.0, 1.0, 1.0, 1.0, 1.0])
    folds = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    b = cross_fold_bounds(r, folds, 1.0)
    assert list(b) == [1.0] * 4 + [5.0] * 4


# --- the profile section and the policy's bounds ----------------------------------------------


def test_section_round_trips_and_malformed_sections_are_one_line_errors():
    data = profile_data("rtx4090-llama31-8b")
    p = validate_profile(data, "x")
    assert p.cohort_gain is not None and p.cohort_gain.kind == "paired"
    again = validate_profile(json.loads(p.model_dump_json()), "again")
    assert again.cohort_gain == p.cohort_gain
    g = data["cohort_gain"]
    bad = {
        "coefficients": g["coefficients"][:-1],
        "terms": [*g["terms"][:-1], "log2_bogus"],
        "provenance": "measured somewhere",
        "version": 2,
        "residual_bound": -0.1,
    }
    for field, value in bad.items():
        with pytest.raises(CodaError) as err:
            validate_profile(data | {"cohort_gain": g | {field: value}}, "bad.json")
        assert "\n" not in str(err.value) and "bad.json" in str(err.value), field
    domain = g["domain"] | {"design_r_inverse": [[1.0]]}
    with pytest.raises(CodaError, match="design_r_inverse"):
        validate_profile(data | {"cohort_gain": g | {"domain": domain}}, "bad.json")


def test_transferred_section_is_labelled_and_keeps_its_origin():
    src = load_profile("rtxpro6000-qwen3-30b-a3b").cohort_gain.model_dump()
    once = transferred(src, "rtxpro6000-qwen3-30b-a3b", "a100-target")
    assert once["transferred_from"] == "rtxpro6000-qwen3-30b-a3b"
    assert once["provenance"].startswith("transferred: fitted for rtxpro6000-qwen3-30b-a3b, not measured on a100-target; fitted:")
    twice = transferred(once, "a100-target", "third")
    assert twice["transferred_from"] == "rtxpro6000-qwen3-30b-a3b" and twice["provenance"].count("transferred:") == 1
    data = profile_data("a100-qwen3coder30b-fp8-roofline")
    assert validate_profile(data | {"cohort_gain": once}, "t").cohort_gain.transferred_from == "rtxpro6000-qwen3-30b-a3b"
    with pytest.raises(CodaError, match="provenance must start with 'transferred:'"):
        validate_profile(data | {"cohort_gain": once | {"provenance": src["provenance"]}}, "t")


def _inside_batch() -> np.ndarray:
    """A shape both setups' skew files measured: 24 at 512 and 8 at 2048, cut at 24."""
    return np.array([512] * 24 + [2048] * 8)


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_cohort_gain_bounds_answer_from_the_section_in_domain_only(name):
    profile = load_profile(name)
    cost = build_cost_model(profile)
    c = _inside_batch()
    gb = cost.cohort_gain_bounds(c, np.array([24]), 0.0)
    assert gb.in_domain and np.isfinite(gb.predicted[0])
    z = cost.paired.log_speedup(term_matrix(cut_features(c, np.array([24])), profile.cohort_gain.terms))
    assert gb.predicted[0] == pytest.approx(float(gain_of_log_speedup(z)[0]))
    assert gb.conservative[0] == pytest.approx(float(gain_of_log_speedup(z - profile.cohort_gain.residual_bound)[0]))
    assert gb.predicted[0] != pytest.approx(cost.unpaired_gain_bounds(c, np.array([24]), 0.0).predicted[0])
    allowance = cost.cohort_gain_bounds(c, np.array([24]), 1e-4)
    assert allowance.conservative[0] == pytest.approx(gb.conservative[0] - 1e-4 / cost.decode_attention_s(c))
    d = profile.cohort_gain.domain
    too_big = np.full(d.batch_max + 1, d.context_min)
    too_long = np.array([d.context_min] * 30 + [d.context_max * 2] * 2)
    too_short = np.array([max(1, d.context_min // 2)] * 30 + [d.context_min * 16] * 2)
    for outside in (too_big, too_long, too_short):
        o = cost.cohort_gain_bounds(outside)
        assert not o.in_domain and np.all(o.conservative == -np.inf)
    without = build_cost_model(profile.model_copy(update={"cohort_gain": None}))
    assert without.cohort_gain_bounds(c, np.array([24]), 3e-4) == without.unpaired_gain_bounds(c, np.array([24]), 3e-4)


def test_cuts_outside_the_measured_features_get_no_gain():
    cost = build_cost_model(load_profile("rtx4090-llama31-8b"))
    c = _inside_batch()
    gb = cost.cohort_gain_bounds(c)
    lo, hi = cost.paired.spec.domain.features["cut_fraction"]
    frac = gb.cuts / len(c)
    assert np.all(gb.predicted[(frac < lo) | (frac > hi)] == -np.inf)
    assert np.all((gb.conservative <= gb.predicted) | (gb.predicted == -np.inf))


# --- the shared measurements ---------------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(SETUPS))
def shared_pairs(request) -> tuple[str, PairSet]:
    prefix = SETUPS[request.param]
    skew = shared_path("profiles", f"{prefix}_skew.csv")
    return request.param, pairs_of(read_skew(skew), skew, shared_path("profiles", f"{prefix}_attention.csv"))


def test_held_out_coverage_on_the_shared_pairs(shared_pairs):
    name, pairs = shared_pairs
    assert len(pairs.pairs) >= 300 and pairs.skipped == 0
    fit = fit_gain(pairs)
    assert fit.held_out["covered"] >= 0.95 and fit.section["held_out"]["coverage"] >= 0.95
    assert fit.held_out["conservative_positive"] > 0  # the bound lets some split through
    assert fit.held_out["conservative_positive_wrong"] <= 0.05 * len(pairs.pairs)
    # The two files measured uniform batches on different time bases, tightly proportional.
    assert pairs.scale.max_deviation < 0.1
    # The shipped section is what the fit writes.
    refit = validate_profile(profile_data(name) | {"cohort_gain": fit.section}, name).cohort_gain.model_dump(exclude_none=True)
    assert refit == approx_tree(load_profile(name).cohort_gain.model_dump(exclude_none=True))


def test_cli_fit_gain_and_transfer_gain(tmp_path):
    skew = shared_path("profiles", "RTX4090_Llama-3.1-8B_tp1_skew.csv")
    run = [sys.executable, "-m", "coda.cli", "profile"]
    out = tmp_path / "fitted.json"
    ok = subprocess.run([*run, "fit-gain", "--skew", str(skew), "-p", "rtx4090-llama31-8b", "--out", str(out), "--json"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["paired_held_out"]["covered"] >= 0.95 and report["unpaired"]["shapes"] == report["pairs"]
    moved = tmp_path / "moved.json"
    ok = subprocess.run([*run, "transfer-gain", "--from", str(out), "-p", "a100-qwen3coder30b-fp8-roofline", "--out", str(moved)],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert load_profile(moved).cohort_gain.provenance.startswith("transferred: fitted for rtx4090-llama31-8b")
    for bad in (
        ["fit-gain", "--skew", str(tmp_path / "none_skew.csv"), "-p", "rtx4090-llama31-8b", "--out", str(out)],
        ["fit-gain", "--skew", str(skew), "-p", "rtx4090-llama31-8b", "--out", str(out), "--folds", "1"],
        ["transfer-gain", "--from", "a100-qwen3coder30b-fp8-roofline", "-p", "rtx4090-llama31-8b", "--out", str(moved)],
    ):
        res = subprocess.run([*run, *bad], capture_output=True, text=True)
        assert res.returncode == 2 and res.stderr.startswith("error: ") and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.count("\n") == 1
