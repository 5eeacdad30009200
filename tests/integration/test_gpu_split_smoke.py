"""The GPU split benchmark's CPU smoke run (benchmarks/gpu_cohort_split.py --device cpu --quick):
it checks its kernel against the PyTorch reference, and writes files that `coda profile fit-gain`'s
readers take and pair, so a lent GPU's run feeds the paired-gain profile as it comes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from coda.profiling.measured import read_attention, read_skew
from coda.profiling.pairs import pairs_of

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("torch")


def test_the_cpu_smoke_run_writes_a_skew_and_an_attention_file_that_pair_without_interpolation(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_cohort_split.py"), "--device", "cpu", "--quick", "--reps", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "largest difference from the PyTorch reference on a 4-request batch: 0" in proc.stdout
    out = tmp_path / "torch"
    skew, attention = out / "CPU_Qwen3-30B-A3B_tp1_skew.csv", out / "CPU_Qwen3-30B-A3B_tp1_attention.csv"
    rows, batches = read_skew(skew), read_attention(attention)
    assert len(rows) == 4 and {(r.n, r.nb, r.kvs, r.kv_big) for r in rows} == {(4, 2, 32, 64), (4, 2, 32, 128), (4, 2, 64, 128), (4, 2, 64, 256)}
    assert all(b.regime == "pure" for b in batches)
    pairs = pairs_of(rows, skew, attention)
    # every skewed batch pairs with cohorts measured as they are (2 at the short context, 2 at the long one)
    assert len(pairs.pairs) == 4 and pairs.skipped == 0 and not any(p.interpolated for p in pairs.pairs)
    assert pairs.scale.factor == pytest.approx(1.0)  # one run, one time base: the files' shared shapes are the same launches
    mixes = [json.loads(line) for line in (out / "agent_mixes.jsonl").read_text().splitlines()]
    assert mixes and all(set(m["split_us"]) == set(m["gain"]) and m["full_us"] > 0 for m in mixes)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["device"] == "cpu" and meta["kernels"] == ["torch"] and meta["stopped_early"] is None
