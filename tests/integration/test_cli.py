"""The `coda` command as a user runs it: JSON contracts, config files, clear errors (exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SIM_KEYS = {"output_tps", "slo_tps", "useful_tps", "request_tps", "ttft_p50_s", "ttft_p95_s", "tbt_p50_s", "tbt_p95_s",
            "e2e_p50_s", "e2e_p95_s", "reuse_rate", "decode_concurrency", "completed", "sim_time_s", "wall_s", "config"}
SMALL = "synth:rate=1,duration=300,seed=3"


def coda(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "coda.cli", *args], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"coda {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def test_sim_json_has_the_design_keys_and_is_deterministic():
    a = json.loads(coda("sim", "--workload", SMALL, "--workers", "2", "--json").stdout)
    b = json.loads(coda("sim", "--workload", SMALL, "--workers", "2", "--json").stdout)
    assert SIM_KEYS <= a.keys()
    assert a["config"]["workers"] == 2 and a["config"]["slo"] == {"ttft_s": 5.0, "tbt_s": 0.1}
    assert a["config"]["profile"]["name"] == "a100-qwen3coder30b-fp8-calibrated" and a["seed"] == 0
    for k in ("wall_s", "speed_x"):
        a.pop(k), b.pop(k)
    assert a == b
    assert a["completed"] > 0 and a["output_tps"] > 0


def test_config_file_equals_flags(tmp_path):
    flags = json.loads(coda("sim", "--workload", SMALL, "--workers", "2", "--slo-ttft-s", "2", "--warmup-s", "60", "--json").stdout)
    yaml_cfg = tmp_path / "c.yaml"
    yaml_cfg.write_text(f"workload: '{SMALL}'\nworkers: 2\nwarmup_s: 60\nslo:\n  ttft_s: 2\n")
    toml_cfg = tmp_path / "c.toml"
    toml_cfg.write_text(f"workload = '{SMALL}'\nworkers = 2\nwarmup_s = 60\n[slo]\nttft_s = 2\n")
    for cfg in (yaml_cfg, toml_cfg):
        got = json.loads(coda("sim", "--config", str(cfg), "--json").stdout)
        for k in ("wall_s", "speed_x"):
            got.pop(k), flags.pop(k, None)
        got.pop("workload_spec"), flags.pop("workload_spec", None)
        assert got == flags
    # flags override the file
    over = json.loads(coda("sim", "--config", str(yaml_cfg), "--workers", "1", "--json").stdout)
    assert over["config"]["workers"] == 1


def test_compare_rows_and_ratios(tmp_path):
    res = json.loads(coda("compare", "--workload", SMALL, "--systems", "vllm", "--seeds", "2", "--json", "--out", str(tmp_path)).stdout)
    assert [r["system"] for r in res["rows"]] == ["vllm"]
    row = res["rows"][0]
    assert row["seeds"] == [3, 4] and "output_tps_ci95" in row  # from the spec's seed=3
    assert res["ratios_vs_baseline"]["vllm"]["output_tps"] == pytest.approx(1.0)
    assert (tmp_path / "vllm" / "seed4" / "requests.jsonl").exists()
    assert json.loads((tmp_path / "compare.json").read_text())["rows"][0]["system"] == "vllm"


def test_compare_gives_each_ratio_a_jackknife_interval_over_seeds():
    res = json.loads(coda("compare", "--workload", SMALL, "--systems", "vllm,coda", "--seeds", "3", "--workers", "2", "--json").stdout)
    ci = res["ratios_vs_baseline_ci95"]
    assert ci["vllm"]["output_tps"] == [pytest.approx(1.0), pytest.approx(1.0)]  # the baseline against itself
    for key, ratio in res["ratios_vs_baseline"]["coda"].items():
        lo, hi = ci["coda"][key]
        assert lo < ratio < hi, key
    table = coda("compare", "--workload", SMALL, "--systems", "vllm,coda", "--seeds", "3", "--workers", "2").stdout
    line = next(ln for ln in table.splitlines() if "output_tps vs vllm" in ln)
    assert f"[{ci['coda']['output_tps'][0]:.4g}, {ci['coda']['output_tps'][1]:.4g}]" in line


def test_compare_pareto_writes_a_png_and_the_json_has_the_operator_metrics(tmp_path):
    from coda.metrics.requests import OPERATOR_KEYS

    png = tmp_path / "fig" / "pareto.png"
    res = json.loads(coda("compare", "--workload", SMALL, "--systems", "vllm,coda", "--seeds", "2", "--json", "--pareto", str(png)).stdout)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000  # two panels drawn, not an empty canvas
    for row in res["rows"]:
        assert set(OPERATOR_KEYS) <= row.keys() and "slowdown_p99_ci95" in row and "ttft_max_s_ci95" in row
        assert row["slowdown_p99"] >= 1 - 1e-9 and row["tasks"] >= row["tasks_censored"]
    table = coda("compare", "--workload", SMALL, "--systems", "vllm", "--pareto", str(png)).stdout
    assert "slowdown_p99" in table and "tasks_censored" in table and f"wrote {png}" in table.replace("\n", "")


def test_sim_out_writes_records(tmp_path):
    coda("sim", "--workload", SMALL, "--out", str(tmp_path / "o"), "--json")
    recs = [json.loads(line) for line in (tmp_path / "o" / "requests.jsonl").read_text().splitlines()]
    assert recs and {"ttft_s", "tbt_mean_s", "path", "worker", "hbm_hit_tokens"} <= recs[0].keys()
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["system"] == "coda"  # the default system
    occ = json.loads((tmp_path / "o" / "occupancy.json").read_text())
    assert len(occ["t_s"]) == len(occ["hbm_used_frac"]) > 3


def test_workload_commands(tmp_path):
    f = tmp_path / "w.jsonl"
    coda("workload", "synth", "--rate", "2", "--duration", "1800", "--seed", "1", "--out", str(f))
    st = json.loads(coda("workload", "stats", str(f), "--json").stdout)
    spec = json.loads(coda("workload", "stats", "synth:rate=2,duration=1800,seed=1", "--json").stdout)
    assert st == spec
    assert {"growth_p50", "growth_p90", "tool_p50_s", "tool_p90_s", "tool_p95_s", "tool_p99_s", "followup_frac", "prefix_reuse",
            "rounds_per_session_mean", "final_context_mean", "sessions", "requests", "request_rate"} <= st.keys()
    sub = tmp_path / "sub.jsonl"
    coda("workload", "subsample", str(f), "--rate", "1", "--out", str(sub))
    assert json.loads(coda("workload", "stats", str(sub), "--json").stdout)["request_rate"] == pytest.approx(1, rel=0.1)
    # a file and the same workload through sim give the same result
    a = json.loads(coda("sim", "--workload", str(f), "--json").stdout)
    b = json.loads(coda("sim", "--workload", "synth:rate=2,duration=1800,seed=1", "--json").stdout)
    assert a["output_tps"] == b["output_tps"]


def test_profile_show_prints_provenance_and_sizing():
    out = json.loads(coda("profile", "show", "--json").stdout)
    assert out["sizing"]["kv_kib_per_token"] == 96
    assert 6.0 < out["sizing"]["gib_per_67k_session"] < 6.3
    assert "paper" in out["profile"]["provenance"]["tiers.hbm_kv_bytes"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["sim", "--workload", "missing.jsonl"], "missing.jsonl: no such workload file"),
        (["sim", "--system", "nope"], "unknown system 'nope'; valid: "),
        (["sim", "--workers", "0"], "workers"),
        (["sim", "--workload", "synth:rate=-1,duration=10"], "rate must be > 0"),
        (["sim", "--workload", "synth:rate=1,duration=10,speed=3"], "unknown key 'speed'"),
        (["sim", "--hbm-kv-gib", "0.001"], "holds no"),
        (["sim", "--hbm-kv-gib", "0.5", "--workload", "synth:rate=1,duration=300"], "largest request needs"),
        (["sim", "--profile", "nope"], "unknown profile 'nope'"),
        (["sim", "--warmup-s", "5000", "--workload", "synth:rate=1,duration=300"], "leaves no measurement window"),
        (["compare", "--systems", "vllm,bogus"], "unknown system 'bogus'"),
        (["workload", "subsample", "synth:rate=1,duration=300", "--rate", "50", "--out", "x.jsonl"], "can only thin"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    proc = coda(*args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_malformed_workload_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"session_id": "a", "start_s": 0, "rounds": [{"new_input_tokens": 5, "output_tokens": -3}]}\n')
    proc = coda("sim", "--workload", str(f), check=False)
    assert proc.returncode == 2 and f"{f}:1: rounds[0].output_tokens" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_config_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("workers: [1, 2\n")
    proc = coda("sim", "--config", str(f), check=False)
    assert proc.returncode == 2 and "not valid YAML" in proc.stderr
    f.write_text("wrokers: 2\n")
    proc = coda("sim", "--config", str(f), check=False)
    assert proc.returncode == 2 and "wrokers" in proc.stderr
