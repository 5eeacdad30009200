"""Every constant of every shipped profile names its kind of source (measured, fitted, cited,
assumed or derived), and ``coda profile show`` prints it beside the constant."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coda.cli import app
from coda.cli.profile import _constants
from coda.cost.profile import load_profile
from coda.cost.provenance import CLASSES, classify

PROFILES = sorted(p.stem for p in (Path(__file__).parents[2] / "src/coda/cost/profiles").glob("*.json"))


@pytest.mark.parametrize(
    ("text", "cls"),
    [
        ("measured: RTXPRO6000_Llama-3.1-8B_tp2_*.csv", "measured"),
        ("measured by others: NCCL baseline of flashinfer pull 5023", "cited"),
        ("fitted: measured: RTX4090_Llama-3.1-8B_tp1_*.csv", "fitted"),
        ("fit: rows kept out of the fit", "fitted"),
        ("datasheet: PCIe Gen5 x16, 64 GB/s per direction", "cited"),
        ("model card: Llama-3.1-8B config.json", "cited"),
        ("vLLM source: CustomAllreduce max_size, 8 MiB", "cited"),
        ("derived from config.json: attention 94 x 71.3M", "cited"),
        ("derived: 90% of GPU memory minus the weights per rank", "derived"),
        ("assumed, not calibrated: prefill FLOPs at 40% of peak", "assumed"),
        ("not measured: no engine-time measurement on this GPU; 0 is used", "assumed"),
        ("transferred: fitted for rtxpro6000-qwen3-30b-a3b, not measured on a100", "assumed"),
        ("KV reads of decode attention as a share of peak HBM bandwidth; calibrated to the Coda paper's numbers", "fitted"),
        ("a number from nowhere", "unstated"),
    ],
)
def test_a_provenance_names_its_kind_of_source(text, cls):
    assert classify(text) == cls


@pytest.mark.parametrize("name", PROFILES)
def test_every_constant_of_a_shipped_profile_has_a_known_source(name):
    p = load_profile(name)
    rows = _constants(p)
    assert {"tiers.hbm_kv_bytes"} <= {n for n, _, _ in rows}
    for constant, value, prov in rows:
        if value == "-":  # a field the profile leaves empty (None) states nothing
            continue
        assert classify(prov) in CLASSES, f"{name}: {constant} = {value}: {prov!r}"


def test_profile_show_prints_the_source_of_each_constant():
    out = CliRunner().invoke(app, ["profile", "show", "-p", "rtxpro6000-llama31-8b-tp2", "--json"])
    assert out.exit_code == 0, out.output
    sources = json.loads(out.stdout)["sources"]
    assert sources["gpu.link.custom_allreduce.floor_s"] == "cited"
    assert sources["operators.layer.qkv_proj"] == "fitted"
    assert sources["tiers.hbm_kv_bytes"] == "derived"
    assert sources["engine.step_s"] == "assumed"  # not measured on this GPU: 0, and the profile says so
    assert set(sources.values()) <= set(CLASSES)
