"""Fitting profiles to the shared measurements, checking them, and the CLI's user errors."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coda.cost.model import build_cost_model
from coda.cost.profile import Profile, load_profile
from coda.errors import CodaError
from coda.profiling.check import check_skew, layer_s
from coda.profiling.fit import fit_profile
from coda.profiling.measured import read_attention, read_skew
from tests.conftest import shared_path

SKEW = ("profiles", "RTX4090_Llama-3.1-8B_tp1_skew.csv")
GRID = ("profiles", "RTXPRO6000_Llama-3.1-8B_tp1_attention.csv")


@pytest.fixture(scope="module")
def pure_skew(tmp_path_factory) -> Path:
    """The shared skew file's pure-decode rows (the mixed rows take seconds to predict)."""
    src = shared_path(*SKEW)
    out = tmp_path_factory.mktemp("skew") / src.name
    with src.open() as fh, out.open("w", newline="") as dst:
        reader = csv.DictReader(fh)
        w = csv.DictWriter(dst, fieldnames=reader.fieldnames)
        w.writeheader()
        w.writerows(r for r in reader if r["regime"] == "pure")
    return out


@pytest.fixture(scope="module")
def skew_fit(pure_skew, tmp_path_factory) -> Path:
    """The kernel model fitted to the RTX 4090's pure skew rows alone (``coda profile fit --skew``)."""
    data = fit_profile(None, pure_skew, load_profile(), name="rtx4090-skew")
    Profile.model_validate(data)  # every constant carries provenance
    out = tmp_path_factory.mktemp("fit") / "rtx4090-skew.json"
    out.write_text(json.dumps(data))
    return out


def test_heldout_skew_targets_on_the_rtx4090(pure_skew, skew_fit):
    res = check_skew(load_profile(skew_fit), pure_skew)
    held = res["held_out"]["pure"]
    assert held["n"] >= 90
    assert held["ratio_mae"] <= 0.03
    assert held["ratio_p90_abs_err"] <= 0.08
    assert held["time_median_abs_pct_err"] <= 10.0
    assert held["ratio_mae"] < held["baseline_ratio_mae"]
    assert res["extrapolated"] == 0
    for key in ("n", "time_median_abs_pct_err", "ratio_mae", "ratio_p90_abs_err", "baseline_ratio_mae", "regime_breakdown"):
        assert key in res


def test_conservative_gain_covers_measured_cohort_gains(pure_skew, skew_fit):
    cov = check_skew(load_profile(skew_fit), pure_skew)["coverage"]["unpaired"]
    assert cov["held_out"]["shapes"] >= 8
    assert cov["held_out"]["covered"] >= 0.95
    assert cov["all"]["covered"] >= 0.95


def test_uniform_batches_match_the_fitted_base_grid():
    cost = build_cost_model(load_profile("rtxpro6000-llama31-8b"))
    grid = read_attention(shared_path(*GRID))
    for regime, limit in (("pure", 0.05), ("prefill", 0.06)):
        rows = [b for b in grid if b.regime == regime]
        err = np.array([layer_s(cost, b) / b.seconds - 1 for b in rows])
        assert np.median(np.abs(err)) <= limit, regime


def test_extrapolation_to_the_largest_contexts_is_checked_not_fitted(pure_skew):
    data = fit_profile(None, pure_skew, load_profile())
    att = data["attention"]
    assert att["held_out"]["context_from"] == 16384 and att["domain"]["context_max"] == 16384
    assert 0 < att["bounds"]["upper"] < 0.3 and 0 <= att["bounds"]["lower"] < 0.3


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_bad_inputs_are_one_line_errors(tmp_path, pure_skew):
    base = load_profile()
    with pytest.raises(CodaError, match="no such file"):
        fit_profile(tmp_path / "missing.csv", None, base)
    bad = _write(tmp_path / "RTX4090_Llama-3.1-8B_tp1_attention.csv", "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,2,abc,5\n")
    with pytest.raises(CodaError, match=r"attention.csv:2: kv_decode: 'abc' is not a number"):
        read_attention(bad)
    cols = _write(tmp_path / "x_skew.csv", "regime,n\npure,4\n")
    with pytest.raises(CodaError, match="missing column"):
        read_skew(cols)
    other = _write(
        tmp_path / "RTXPRO6000_Llama-3.1-8B_tp1_attention.csv", "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,2,16,5\n"
    )
    with pytest.raises(CodaError, match="different setups"):
        fit_profile(other, pure_skew, base)
    unnamed = _write(tmp_path / "grid.csv", "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,2,16,5\n")
    with pytest.raises(CodaError, match="unknown GPU"):
        fit_profile(unnamed, None, base)


def test_cli_check_json_and_exit_codes(pure_skew, skew_fit, tmp_path):
    run = [sys.executable, "-m", "coda.cli", "profile"]
    ok = subprocess.run([*run, "check", "-p", str(skew_fit), "--skew", str(pure_skew), "--json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["held_out"]["pure"]["ratio_mae"] <= 0.03
    bad = subprocess.run([*run, "check", "--skew", str(tmp_path / "none.csv")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
