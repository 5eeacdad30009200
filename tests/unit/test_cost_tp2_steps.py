"""Whole per-rank steps at TP 2 against the TP 2 operator files themselves: the profile derived
from TP 1 (what ``coda profile derive --tp 2`` writes) and the one fitted to the TP 2 files, each
summed over its operators and compared with the sum the files measured at the same counts
(``coda.profiling.derive.measured_steps``; collectives and MoE blocks are in neither)."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coda.cost.model import build_cost_model
from coda.cost.profile import Profile, load_profile
from coda.profiling.derive import derive, measured_steps
from coda.profiling.hf_config import read_config
from tests.conftest import shared_path

SETUPS = {"rtxpro6000-llama31-8b": "RTXPRO6000_Llama-3.1-8B", "rtxpro6000-qwen3-30b-a3b": "RTXPRO6000_Qwen3-30B-A3B"}
#: |predicted / measured - 1| over the pure-decode and single-prefill rows: median, p90 (stated in docs/fidelity.md)
LIMITS = {
    ("rtxpro6000-llama31-8b", "derived"): (0.03, 0.05),
    ("rtxpro6000-llama31-8b", "fitted"): (0.03, 0.06),
    # The derived Qwen3 rank is 5% fast at the median: partly the TP 2 files' qk_norm rows, which
    # repeat TP 1's to the last digit (the profiler did not measure them at TP 2).
    ("rtxpro6000-qwen3-30b-a3b", "derived"): (0.08, 0.16),
    ("rtxpro6000-qwen3-30b-a3b", "fitted"): (0.03, 0.06),
}


def _errors(src: str, how: str) -> dict[str, np.ndarray]:
    folder = shared_path("profiles")
    shared_path("profiles", f"{SETUPS[src]}_tp2_dense.csv")
    p = load_profile(src)
    profile = Profile.model_validate(derive(p, p.geometry, 2)) if how == "derived" else load_profile(f"{src}-tp2")
    rows = measured_steps(profile, folder, SETUPS[src], 2)
    return {k: np.array([pred / meas - 1 for regime, pred, meas in rows if regime == k]) for k in ("decode", "prefill")}


@pytest.mark.parametrize(("src", "how"), sorted(LIMITS))
def test_tp2_steps_match_the_tp2_operator_files(src, how):
    median, p90 = LIMITS[src, how]
    for regime, err in _errors(src, how).items():
        assert len(err) > 100, regime  # every decode batch and prefill chunk of the grid the dense file covers
        assert np.median(np.abs(err)) <= median, (regime, np.median(np.abs(err)))
        assert np.percentile(np.abs(err), 90) <= p90, (regime, np.percentile(np.abs(err), 90))


def test_measured_steps_sum_what_the_files_hold():
    """A decode batch of one at 16 tokens of context: the sum by hand from the TP 2 files' rows."""
    shared_path("profiles", "RTXPRO6000_Llama-3.1-8B_tp2_dense.csv")
    rows = measured_steps(load_profile("rtxpro6000-llama31-8b-tp2"), shared_path("profiles"), "RTXPRO6000_Llama-3.1-8B", 2)
    def read(kind: str) -> dict[tuple[str, int], float]:
        path = shared_path("profiles", f"RTXPRO6000_Llama-3.1-8B_tp2_{kind}.csv")
        with path.open() as fh:
            r = csv.DictReader(fh)
            key = "tokens" if kind == "dense" else "sequences"
            return {(row["layer"], int(row[key])): float(row["time_us"]) * 1e-6 for row in r}

    dense, seq = read("dense"), read("per_sequence")
    per_layer = sum(dense[op, 1] for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "act_fn", "rotary_emb"))
    per_layer += 2 * dense["layernorm", 1]
    attention = 7.989e-6  # the attention file's first row: one decode at 16 tokens
    want = 32 * (per_layer + attention) + dense["embedding", 1] + dense["final_layernorm", 1] + seq["lm_head", 1] + seq["sampler", 1]
    assert rows[0][0] == "decode"
    assert rows[0][2] == pytest.approx(want, rel=1e-9)


def test_tp2_check_reports_each_operator_and_the_share_of_a_step_in_collectives(tmp_path):
    """``benchmarks/fidelity_replay.py --tp2-check``: the report's collectives are the profile's own."""
    folder = shared_path("profiles")
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "tp2.json"
    env = {**os.environ, "CODA_DATA_DIR": str(folder.parent)}
    run = subprocess.run([sys.executable, str(root / "benchmarks/fidelity_replay.py"), "--tp2-check", "--json", str(out)],
                         capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    llama = report["operators"]["rtxpro6000-llama31-8b-tp2 (fitted to the TP 2 files)"]
    assert {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head", "sampler", "attention, decode"} <= set(llama)
    q32 = Profile.model_validate(derive(load_profile("rtxpro6000-llama31-8b"),
                                        read_config(root / "src/coda/profiling/models/Qwen3-32B.json"), 2))
    cost = build_cost_model(q32)
    shown = report["comm"]["Qwen3-32B TP 2 (derived from rtxpro6000-llama31-8b)"]["decode 32 x 2,000"]
    assert shown["comm_s"] == pytest.approx(cost.comm.step_s(32, 32), rel=1e-9)
    assert shown["step_s"] == pytest.approx(cost.step_s((), np.full(32, 2000, dtype=np.int64)), rel=1e-9)
    assert 0 < shown["share"] < 1
