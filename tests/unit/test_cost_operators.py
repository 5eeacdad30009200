"""The operator cost model: committed fits and their held-out errors, model geometry from config.json,
prediction of unmeasured models and TP degrees (the collectives themselves: test_cost_parallel.py)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coda.cost.geometry import expected_experts
from coda.cost.model import build_cost_model
from coda.cost.operators import OperatorCost
from coda.cost.profile import Profile, load_profile
from coda.errors import CodaError
from coda.profiling.derive import derive, validate
from coda.profiling.hf_config import read_config
from coda.profiling.operator_fit import MODELS_DIR, fit_operators
from tests.conftest import shared_path
from tests.tolerance import approx_tree

#: the shipped operator fits and the setup each was fitted to
FITS = {
    "rtx4090-llama31-8b": ("RTX4090_Llama-3.1-8B", 1),
    "rtxpro6000-llama31-8b": ("RTXPRO6000_Llama-3.1-8B", 1),
    "rtxpro6000-llama31-8b-tp2": ("RTXPRO6000_Llama-3.1-8B", 2),
    "rtxpro6000-qwen3-30b-a3b": ("RTXPRO6000_Qwen3-30B-A3B", 1),
    "rtxpro6000-qwen3-30b-a3b-tp2": ("RTXPRO6000_Qwen3-30B-A3B", 2),
}
LLAMA, QWEN = MODELS_DIR / "Llama-3.1-8B.json", MODELS_DIR / "Qwen3-30B-A3B.json"


@pytest.mark.parametrize("name", FITS)
def test_committed_fits_meet_their_held_out_targets(name):
    """Each operator of each shipped fit predicts the rows kept out of its fit."""
    ops = load_profile(name).operators
    assert ops is not None
    held = ops.held_out
    for op, err in held.items():
        family = op.split(".")[0]
        limit = {"layer": 0.05, "step": 0.05, "per_sequence": 0.05, "moe": 0.08, "attention": 0.06}[family]
        if op == "attention.mixed":
            limit = 0.07  # mixed prefill+decode launches: the kernel model with a 3-D correction
        assert err.median <= limit, (name, op, err)
        assert err.rows >= 10 or family == "per_sequence", (name, op)
    assert {"attention.decode", "attention.prefill", "attention.mixed"} <= held.keys()
    assert ("moe" in held) == ("qwen" in name and "tp2" not in name)  # MoE measured at TP 1 only


@pytest.mark.parametrize("name", ["rtx4090-llama31-8b", "rtxpro6000-qwen3-30b-a3b"])
def test_fit_reproduces_the_committed_profile(name):
    setup, tp = FITS[name]
    shared_path("profiles", f"{setup}_meta.yaml")
    data, _ = fit_operators(shared_path("profiles"), setup, tp, load_profile("a100-qwen3coder30b-fp8-roofline"))
    shipped = load_profile(name)
    assert data["name"] == name
    for op, curve in shipped.operators.layer.items():
        assert data["operators"]["layer"][op]["seconds"] == approx_tree(curve.seconds), op
    assert data["operators"]["held_out"] == approx_tree({k: v.model_dump() for k, v in shipped.operators.held_out.items()})


def test_rtx_pro_6000_is_the_server_edition():
    gpu = load_profile("rtxpro6000-llama31-8b").gpu
    assert gpu.hbm_bw_bytes_s == 1.597e12 and "Server Edition" in gpu.name


def test_gpu_profiles_say_they_measured_no_engine_time():
    p = load_profile("rtxpro6000-llama31-8b")
    assert p.engine.step_s == 0 and p.engine.request_s == 0
    assert p.provenance["engine.step_s"].startswith("not measured") and "not measured" in p.engine_time_note()


def test_a_step_sums_its_operators():
    cost = build_cost_model(load_profile("rtxpro6000-qwen3-30b-a3b-tp2"))
    assert isinstance(cost, OperatorCost)
    ctx = np.array([300, 900, 4000])
    step = cost.step_s([(256, 1024)], ctx)
    assert step == pytest.approx(cost.dense_s(259, 4) + cost.varlen_attention_s([(256, 1024)], ctx))
    g, m = cost.rank.g, load_profile("rtxpro6000-qwen3-30b-a3b-tp2").operators.moe
    moe = g.moe_layers * (m.fixed_s + m.expert_s * expected_experts(259, 128, 8) + m.pair_s * 259 * 8)
    assert cost.comm is not None and cost.dense_s(259, 4) > moe + cost.comm.step_s(259, 4) > moe
    run = cost.decode_steps_s(ctx, 10)
    assert run[0] == pytest.approx(cost.step_s((), ctx)) and run[-1] == pytest.approx(cost.step_s((), ctx + 9))


def test_tensor_parallelism_splits_kv_and_weights_per_rank():
    one, two = load_profile("rtxpro6000-llama31-8b"), load_profile("rtxpro6000-llama31-8b-tp2")
    assert build_cost_model(two).kv_bytes(1) * 2 == build_cost_model(one).kv_bytes(1) == 131072
    assert two.weight_bytes_per_rank() * 2 == pytest.approx(one.weight_bytes_per_rank())
    big = load_profile("a100x8-qwen3-235b-a22b-fp8")  # 4 KV heads over 8 ranks: one (replicated) per rank
    assert big.tp == 8 and big.gpu.link.kind == "nvlink" and build_cost_model(big).kv_bytes(1) == 2 * 94 * 1 * 128 * 2


# --- model geometry ------------------------------------------------------------------------------
def test_config_json_gives_the_published_parameter_counts():
    for path, total, active in (
        (LLAMA, 8.03e9, 8.03e9),
        (QWEN, 30.5e9, 3.35e9),
        (MODELS_DIR / "Qwen3-235B-A22B-Instruct-2507-FP8.json", 235.1e9, 22.2e9),
    ):
        g = read_config(path)
        t, a = g.params()
        assert t == pytest.approx(total, rel=0.01) and a == pytest.approx(active, rel=0.01), path.name
    fp8 = read_config(MODELS_DIR / "Qwen3-Coder-30B-A3B-Instruct-FP8.json")
    assert fp8.weight_bytes == 1 and fp8.moe_layers == 48 and fp8.qk_norm


def test_bad_config_json_is_a_one_line_error(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(CodaError, match="not valid JSON at line 1"):
        read_config(bad)
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(CodaError, match="num_hidden_layers: missing"):
        read_config(bad)
    mla = json.loads(QWEN.read_text()) | {"kv_lora_rank": 512}
    bad.write_text(json.dumps(mla))
    with pytest.raises(CodaError, match="multi-head latent attention"):
        read_config(bad)
    with pytest.raises(CodaError, match="no such file"):
        read_config(tmp_path / "missing.json")


# --- predicting what was not measured ----------------------------------------------------------
def _predict(src: str, model: Path, tp: int, setup: str) -> dict[str, dict[str, float]]:
    shared_path("profiles", f"{setup}_meta.yaml")
    derived = Profile.model_validate(derive(load_profile(src), read_config(model), tp))
    return validate(derived, shared_path("profiles"), setup, tp)


def test_llama_operators_predict_qwen3_on_the_same_gpu():
    err = _predict("rtxpro6000-llama31-8b", QWEN, 1, "RTXPRO6000_Qwen3-30B-A3B")
    for family in ("gemm", "elementwise", "per_sequence", "attention decode", "attention prefill", "attention mixed"):
        assert err[family]["median"] <= 0.15, (family, err[family])


def test_qwen3_operators_predict_llama_on_the_same_gpu():
    """The reverse misses the 15% target for GEMMs and elementwise operators: Qwen3-30B-A3B has no
    dense MLP to scale Llama's from, and its small matrices were measured cache-resident."""
    err = _predict("rtxpro6000-qwen3-30b-a3b", LLAMA, 1, "RTXPRO6000_Llama-3.1-8B")
    for family in ("per_sequence", "attention decode", "attention prefill", "attention mixed"):
        assert err[family]["median"] <= 0.15, (family, err[family])
    assert err["gemm"]["median"] <= 0.20 and err["elementwise"]["median"] <= 0.20


@pytest.mark.parametrize(
    "src,model,setup",
    [("rtxpro6000-llama31-8b", LLAMA, "RTXPRO6000_Llama-3.1-8B"), ("rtxpro6000-qwen3-30b-a3b", QWEN, "RTXPRO6000_Qwen3-30B-A3B")],
)
def test_tp1_operators_predict_tp2(src, model, setup):
    err = _predict(src, model, 2, setup)
    for family, e in err.items():
        assert e["median"] <= 0.10, (family, e)


def test_derive_cli_writes_a_profile_and_refuses_bad_flags(tmp_path):
    run = [sys.executable, "-m", "coda.cli", "profile", "derive"]
    out = tmp_path / "p.json"
    ok = subprocess.run(
        [*run, "--gpu", "rtx4090-llama31-8b", "--model-config", str(QWEN), "--tp", "2", "--out", str(out), "--json"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    p = load_profile(out)
    assert p.kind == "operators" and p.tp == 2 and p.geometry.name == "Qwen3-30B-A3B"
    assert p.provenance["operators.moe.expert_s"].startswith("derived: no MoE measured")
    bad = subprocess.run([*run, "--gpu", "vllm-cpu-tiny", "--model-config", str(QWEN), "--out", str(out)], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "operators profile" in bad.stderr


def test_derive_predicts_a_model_outside_the_shared_data(tmp_path):
    """A dense model no setup measured (Mistral-7B's shape): wider layers cost more per step, and its
    KV follows its heads."""
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "mistral",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_attention_heads": 32,
                "num_hidden_layers": 32,
                "num_key_value_heads": 8,
                "vocab_size": 32768,
                "torch_dtype": "bfloat16",
            }
        )
    )
    src = load_profile("rtxpro6000-llama31-8b")
    mistral = build_cost_model(Profile.model_validate(derive(src, read_config(config), 1)))
    llama = build_cost_model(src)
    ctx = np.full(16, 2000)
    assert mistral.kv_bytes(1) == llama.kv_bytes(1)
    assert mistral.step_s((), ctx) < llama.step_s((), ctx)  # the same layers, a quarter of the vocabulary (lm_head)
    assert mistral.step_s((), ctx) == pytest.approx(llama.step_s((), ctx), rel=0.1)
    wide = json.loads(config.read_text()) | {"intermediate_size": 28672}
    config.write_text(json.dumps(wide))
    assert build_cost_model(Profile.model_validate(derive(src, read_config(config), 1))).step_s([(2048, 0)], ()) > llama.step_s(
        [(2048, 0)], ()
    )


def test_fit_cli_names_a_missing_setup(tmp_path):
    run = [sys.executable, "-m", "coda.cli", "profile", "fit", "--out", str(tmp_path / "p.json")]
    bad = subprocess.run([*run, "--operators", str(tmp_path), "--setup", "NOPE_Model"], capture_output=True, text=True)
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("error: --setup NOPE_Model: no NOPE_Model_meta.yaml")
        and "Traceback" not in bad.stderr
    )
    missing = subprocess.run([*run, "--operators", str(tmp_path / "absent"), "--setup", "X"], capture_output=True, text=True)
    assert missing.returncode == 2 and "no such folder" in missing.stderr
