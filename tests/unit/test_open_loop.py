"""Open-loop request traces under an engine configuration, and the roofline bound."""

import json
import math

import pytest

from coda.cost.model import build_cost_model
from coda.cost.profile import load_profile
from coda.errors import CodaError
from coda.sim.config import SimConfig
from coda.sim.roofline import config_roofline
from coda.sim.run import compare, run_one
from coda.workload.requests import read_requests
from coda.workload.spec import load_workload

PROFILE = "rtx4090-llama31-8b"


def _trace(path, n=20, gap_s=0.25):
    rows = [{"request_id": f"r{i}", "input_toks": 200 + 37 * i, "output_toks": 20 + 3 * i, "arrival_time": 1000.0 + gap_s * i,
             "first_token_ts": 0.0} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_per_request_jsonl_loads_as_open_loop_requests(tmp_path):
    wl = load_workload(str(_trace(tmp_path / "requests.jsonl")))
    assert len(wl.sessions) == 20 and wl.meta["source"] == "requests"
    first = wl.sessions[0].rounds[0]
    assert (first.new_input_tokens, first.output_tokens, first.at_s) == (200, 20, 0.0)
    assert wl.sessions[-1].rounds[0].at_s == pytest.approx(19 * 0.25)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt_len": 10, "output_len": 5, "timestamp": 3.5}) + "\n")
    assert read_requests(other).sessions[0].rounds[0].new_input_tokens == 10


def test_bad_trace_lines_name_the_line_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"input_toks": 10, "output_toks": 5, "arrival_time": 0})
        + "\n"
        + json.dumps({"input_toks": "x", "output_toks": 5, "arrival_time": 1})
        + "\n"
    )
    with pytest.raises(CodaError, match=r"bad.jsonl:2: input_toks: 'x' is not an integer"):
        read_requests(bad)
    bad.write_text(json.dumps({"input_toks": 10, "arrival_time": 0}) + "\n")
    with pytest.raises(CodaError, match=r"bad.jsonl:1: row: no output_toks"):
        read_requests(bad)
    bad.write_text("{oops\n")
    with pytest.raises(CodaError, match=r"bad.jsonl:1: json: not valid JSON"):
        read_requests(bad)


def test_a_20_request_trace_replays_under_the_engine_configuration(tmp_path):
    wl = read_requests(_trace(tmp_path / "requests.jsonl"))
    config = SimConfig(
        system="vllm",
        profile=PROFILE,
        chunk_tokens=16,
        num_gpu_blocks=2000,
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        warmup_s=0,
        drain_s=120,
        dram=False,
    )
    result = run_one(wl, config)
    summary = result.summary()
    assert summary["config"]["tiers"]["hbm_chunks_per_worker"] == 1999  # the configured KV block count less vLLM's null block
    assert summary["config"]["profile"]["extrapolated"] == []  # 2,048-token steps of 8 sequences: inside what was measured
    assert summary["completed"] == 20 and summary["itl_mean_s"] > 0 and summary["itl_p90_s"] >= summary["itl_p50_s"]
    first = min(result.records, key=lambda r: r["ready_s"])
    cost = build_cost_model(load_profile(PROFILE))
    assert first["ttft_s"] == pytest.approx(cost.prefill_only_s(200, 0))  # an idle engine prefills 200 tokens in one step


def test_kv_capacity_follows_vllms_gpu_memory_utilization():
    profile = load_profile(PROFILE)
    wl = load_workload("synth:rate=0.2,duration=60,seed=0,tokens=0.03")
    result = run_one(wl, SimConfig(system="vllm", profile=PROFILE, chunk_tokens=16, gpu_memory_utilization=0.9, dram=False))
    chunk = build_cost_model(profile).kv_bytes(16)
    expect = math.floor((0.9 * profile.gpu.memory_bytes - profile.weight_bytes_per_rank()) / chunk)
    assert result.summary()["config"]["tiers"]["hbm_chunks_per_worker"] == expect
    assert result.summary()["config"]["profile"]["extrapolated"] == ["steps up to 8192 tokens, operators measured to 2048"]
    with pytest.raises(CodaError, match="num_gpu_blocks and hbm_kv_gib both size the HBM KV"):
        run_one(wl, SimConfig(system="vllm", profile=PROFILE, num_gpu_blocks=10, hbm_kv_gib=1.0))


def test_roofline_bounds_every_system():
    spec = "synth:rate=1,duration=300,seed=0"
    base = SimConfig(system="vllm", workers=2)
    bound = config_roofline(load_workload(spec), base)
    assert 0 < bound["output_tps_bound"] <= bound["offered_tps"] and bound["batch"] <= base.max_num_seqs
    table = compare(spec, ["vllm", "coda"], [0], base)
    assert table["roofline"]["output_tps_bound"] == pytest.approx(bound["output_tps_bound"])
    for row in table["rows"]:
        assert 0 < row["roofline_fraction"] <= 1.0
        assert row["roofline_fraction"] == pytest.approx(row["output_tps"] / bound["output_tps_bound"])
    with pytest.raises(CodaError, match="states no GPU bandwidth"):
        config_roofline(load_workload(spec), SimConfig(system="vllm", profile="vllm-cpu-tiny"))
