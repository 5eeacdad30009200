"""`coda profile measure` on a CPU: a smoke test that writes CSVs `fit` can read."""

import importlib.metadata
import importlib.util
import json
import math

import numpy as np
import pytest

from coda.cost.profile import Machine
from coda.profiling.measured import read_attention, read_skew

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="PyTorch is not installed (only `coda profile measure` needs it)"
)


@needs_torch
def test_cpu_smoke_writes_readable_csvs(tmp_path):
    from coda.profiling.measure import run

    files = run(tmp_path, device="cpu", budget_s=60.0, seed=1)
    names = {p.name for p in files}
    assert {"cohorts.csv", "hardware.json"} <= names
    machine = Machine.model_validate(json.loads((tmp_path / "hardware.json").read_text())["machine"])
    assert machine.torch == importlib.metadata.version("torch") and machine.cpus >= 1  # the software measured, not paths or host names
    grid = read_attention(next(p for p in files if p.name.endswith("_attention.csv")))
    assert {b.regime for b in grid} == {"pure", "prefill"}
    assert all(b.seconds > 0 for b in grid)
    skew = read_skew(next(p for p in files if p.name.endswith("_skew.csv")))
    assert skew and all(r.skew.decodes.sum() == r.nb * r.kv_big + (r.n - r.nb) * r.kvs for r in skew)


@needs_torch
def test_decode_attention_is_exact_on_ragged_contexts():
    """The nested-jagged launch computes attention of each request over its own context only."""
    import torch

    from coda.profiling.measure import DecodeBench

    bench = DecodeBench(torch, "cpu", kv_heads=2, q_heads=8, head_dim=16)
    ctx = np.array([5, 40, 17])
    torch.manual_seed(0)
    out = bench.launch(ctx)().transpose(1, 2)
    torch.manual_seed(0)
    k = torch.randn(int(ctx.sum()), 2, 16)
    v = torch.randn(int(ctx.sum()), 2, 16)
    q = torch.randn(3, 2, 4, 16)
    start = 0
    for i, c in enumerate(ctx):
        ki, vi = k[start : start + c], v[start : start + c]
        s = torch.einsum("hgd,chd->hgc", q[i], ki) / math.sqrt(16)
        ref = torch.einsum("hgc,chd->ghd", s.softmax(-1), vi)
        assert torch.allclose(out.unbind()[i], ref, atol=1e-5)
        start += c
