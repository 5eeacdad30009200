"""The operator measurement (``coda profile measure --model-config``) on a CPU with a tiny MoE
geometry: it writes the files ``coda profile fit --operators`` reads, in the format it reads."""

import json
import subprocess
import sys

import pytest
import yaml

from coda.errors import CodaError
from coda.profiling.measured import read_attention
from coda.profiling.operator_fit import fit_operators, open_setup, read_moe, read_table

pytest.importorskip("torch")

TINY = {
    "model_type": "qwen3_moe",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 512,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ops")
    config = folder / "tiny" / "config.json"  # a model is named after its config's folder
    config.parent.mkdir()
    config.write_text(json.dumps(TINY))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "coda.cli",
            "profile",
            "measure",
            "--model-config",
            str(config),
            "--tp",
            "2",
            "--out",
            str(folder / "out"),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return folder / "out", config


def test_the_files_are_what_the_operator_fit_reads(measured):
    out, config = measured
    setup = open_setup(out, "CPU_tiny", 2)
    dense = read_table(setup.csv("dense"), "tokens", ("layer", "tokens", "time_us"))
    assert set(dense) == {
        "qkv_proj",
        "o_proj",
        "layernorm",
        "rotary_emb",
        "qk_norm",
        "embedding",
        "final_layernorm",
    }  # all MoE: no dense MLP
    assert set(read_table(setup.csv("per_sequence"), "sequences", ("layer", "sequences", "time_us"))) == {"lm_head", "sampler"}
    regimes = {b.regime for b in read_attention(setup.csv("attention"))}
    assert regimes == {"pure", "prefill", "mixed"}
    moe = read_moe(setup.csv("moe"))
    assert (moe[:, 1] <= 8).all() and (moe[:, 2] > 0).all()
    meta = yaml.safe_load((out / "CPU_tiny_meta.yaml").read_text())
    assert meta["tp_degrees"] == [2] and meta["gpu"] == "CPU" and meta["geometry"]["num_experts"] == 8 and meta["completed"]
    assert meta["measured_with"].startswith("coda profile measure --model-config: PyTorch")


def test_a_cpu_measurement_is_a_smoke_test_the_fit_refuses_by_name(measured):
    out, config = measured
    from coda.cost.profile import load_profile

    with pytest.raises(CodaError, match="unknown GPU 'CPU'"):
        fit_operators(out, "CPU_tiny", 2, load_profile(), model_config=config)
