"""`coda characterize` as a user runs it: findings.json, figures, provenance, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import shared_path

FINDING_KEYS = {"f1_tiers", "f2_paths", "f3_startup_cost", "f4_growth", "f4_tools", "f5_heterogeneity", "f6_decode_dominance",
                "f7_uniform_gap", "f8_routing_opportunity", "workload", "config"}
FIGURES = ["f1_f3_state.png", "f4_growth_tools.png", "f5_f7_decode.png", "f8_routing.png"]


def coda(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coda.cli", *args], capture_output=True, text=True, timeout=300)


def _check(proc: subprocess.CompletedProcess, out, profile: str = "a100-qwen3coder30b-fp8-calibrated") -> dict:
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert json.loads((out / "findings.json").read_text()) == json.loads(json.dumps(printed))
    assert FINDING_KEYS <= printed.keys()
    for name in printed["figures"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cfg = printed["config"]
    assert cfg["replay_vllm"]["system"] == "vllm" and cfg["replay_vllm"]["tiers"]["ssd"] is True
    assert cfg["replay_vllm"]["profile"]["name"] == profile and cfg["cost_model"]
    return printed


def test_synthetic_workload(tmp_path):
    out = tmp_path / "ch"
    # on the analytic roofline, whose attention is linear in total context, so F7's gap is exactly 0
    roofline = "a100-qwen3coder30b-fp8-roofline"
    f = _check(coda("characterize", "synth:rate=1,duration=900,seed=1", "--out", str(out), "--json", "--profile", roofline), out, roofline)
    assert f["figures"] == FIGURES and f["config"]["replay_smetric"]["system"] == "smetric"
    assert f["config"]["replay_vllm"]["workers"] == 4 and f["config"]["seed"] == 0
    assert f["workload"]["requests"] == f["workload"]["stats"]["requests"] > 0
    assert sum(f["f2_paths"]["counts"].values()) == f["f2_paths"]["requests"] == f["f1_tiers"]["requests"] > 0
    assert sum(f["f1_tiers"]["token_share"].values()) == pytest.approx(1.0)
    assert sum(p["share_of_total"] for p in f["f3_startup_cost"]["paths"].values()) == pytest.approx(1.0)
    assert f["f4_tools"]["calls"] > 0 and 0 < f["f4_tools"]["top_1pct_calls_time_share"] < 1
    assert 0 < f["f6_decode_dominance"]["pure_decode_time_share"] <= f["f6_decode_dominance"]["pure_decode_iteration_share"] <= 1
    assert f["f7_uniform_gap"]["attention_gap"] == pytest.approx(0.0, abs=1e-9)  # the analytic model is linear in total context
    assert f["f8_routing_opportunity"]["decisions"] > 0


def test_one_worker_skips_routing(tmp_path):
    out = tmp_path / "one"
    f = _check(coda("characterize", "synth:rate=0.5,duration=600,seed=2", "--out", str(out), "--json", "--workers", "1"), out)
    assert "skipped" in f["f8_routing_opportunity"] and "f8_routing.png" not in f["figures"]


@pytest.mark.slow
def test_mooncake_trace(tmp_path):
    path = shared_path("traces", "conversation_trace.jsonl")
    out = tmp_path / "moon"
    f = _check(coda("characterize", str(path), "--out", str(out), "--json"), out)
    assert f["workload"]["format"] == "mooncake" and f["workload"]["requests"] == 12_031
    assert f["workload"]["meta"]["load"]["kept_rows"] == 12_031
    assert f["f4_tools"]["calls"] == 0 and f["f2_paths"]["requests"] > 1000


@pytest.mark.parametrize(
    "args, needle",
    [
        (["missing.jsonl"], "missing.jsonl: no such workload file"),
        (["pyproject.toml", "--format", "nope"], "unknown workload format 'nope'; valid: coda, tracelab, mooncake, azure"),
        (["pyproject.toml"], "pyproject.toml: cannot tell the workload format"),
        (["synth:rate=1,duration=300", "--workers", "0"], "workers"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, needle):
    proc = coda("characterize", *args, "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert needle in proc.stderr


def test_wrong_format_names_the_line(tmp_path):
    path = shared_path("traces", "tracelab_example_sanitized_round_trace.jsonl")
    proc = coda("characterize", str(path), "--format", "mooncake", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2
    assert f"{path}:1: row: object missing required field `timestamp` (read with the mooncake reader" in proc.stderr


def test_an_engine_log_gives_the_paths_of_its_resumed_requests(tmp_path):
    log = tmp_path / "requests.jsonl"
    rows = [{"session_id": "a", "round": 0, "prompt_tokens": 100, "output_tokens": 20, "cached_tokens": 0},
            {"session_id": "a", "round": 1, "prompt_tokens": 150, "output_tokens": 5, "cached_tokens": 112},
            {"session_id": "a", "round": 2, "prompt_tokens": 160, "output_tokens": 5, "cached_tokens": 96}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ch"
    proc = coda("characterize", "--engine-log", str(log), "--block-tokens", "16", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    f = json.loads(proc.stdout)
    assert json.loads((out / "findings.json").read_text()) == f
    assert f["f2_paths"]["counts"] == {"hbm": 1, "dram": 0, "ssd": 0, "recompute": 1} and f["f2_paths"]["share"]["hbm"] == 0.5
    assert f["f1_tiers"]["tokens"]["not_resident"] == 48 and f["engine_log"]["requests"] == 3


@pytest.mark.parametrize(("args", "message"), [
    (["--engine-log", "LOG", "--block-tokens", "16"], "LOG:2: cached_tokens: 'x' is not a token count"),
    (["synth:rate=1,duration=60", "--engine-log", "LOG"], "pass a workload or --engine-log FILE (one of them)"),
    (["synth:rate=1,duration=60", "--block-tokens", "16"], "--block-tokens goes with --engine-log"),
])
def test_engine_log_mistakes_are_one_line(tmp_path, args, message):
    log = tmp_path / "bad.jsonl"
    log.write_text(json.dumps({"session_id": "a", "round": 0, "prompt_tokens": 10, "output_tokens": 2, "cached_tokens": 0}) + "\n"
                   + json.dumps({"session_id": "a", "round": 1, "prompt_tokens": 10, "output_tokens": 2, "cached_tokens": "x"}) + "\n")
    proc = coda("characterize", *[str(log) if a == "LOG" else a for a in args], "--out", str(tmp_path / "ch"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert message.replace("LOG", str(log)) in " ".join(proc.stderr.split())
