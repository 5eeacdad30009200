"""Agreement: `coda bench` against `coda fake-engine` replays exactly what `coda sim` simulates
for the same workload, since both run the same worker, scheduler and cost model: every round is
sent and completes, the engine sees the trace's token counts, and it serves each prompt's prefix
from its cache exactly where the simulator does.

Both report latency under one definition: ITL is per request ``(e2e - ttft) / (output_tokens - 1)``
in both, which is what the timing comparison uses; the pooled gaps differ by construction (a
simulated step is one token, a streamed chunk may carry several), so they are not compared.
Whether the timings agree (TTFT, ITL, throughput within 10%) depends on how promptly the machine
runs the engine and the client, so it is a benchmark, not a test: `python benchmarks/bench_agreement.py`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from coda.bench.agreement import replay


def test_bench_on_the_fake_engine_replays_what_the_simulator_simulates(tmp_path):
    sim, bench, sim_dir, bench_dir = replay(tmp_path)
    sim_records = {(r["session_id"], r["round"]): r for r in map(json.loads, (sim_dir / "requests.jsonl").read_text().splitlines())}
    bench_records = [json.loads(line) for line in (bench_dir / "requests.jsonl").read_text().splitlines()]
    assert bench["failed"] == bench["rejected"] == 0 and sim["completed"] > 15
    assert {r["state"] for r in bench_records} == {"completed"} and len(bench_records) >= sim["completed"]
    for r in bench_records:
        assert r["server_prompt_tokens"] == r["prompt_tokens"] == r["trace_prompt_tokens"]
        assert r["output_tokens"] == r["trace_output_tokens"]
        s = sim_records[(r["session_id"], r["round"])]  # the engine hit the prefixes the simulator hit
        assert r["hbm_hit_tokens"] == s["hbm_hit_tokens"] + s["dram_hit_tokens"] + s["ssd_hit_tokens"]
        # the chunk gaps add up to the decode time that the ITL spreads over the tokens
        assert len(r["gaps_s"]) == r["output_tokens"] - 1 and sum(r["gaps_s"]) == pytest.approx(
            r["finish_s"] - r["first_token_s"], abs=1e-5
        )
    # ITL, what the timing benchmark compares, has one definition in both
    assert sim["itl_p50_s"] == pytest.approx(itl_median(list(sim_records.values()), sim["window_s"]))
    assert bench["itl_p50_s"] == pytest.approx(itl_median(bench_records, bench["window_s"]))


def itl_median(records: list[dict], window: list[float]) -> float:
    """The median over completed requests ready in the window of (e2e - ttft) / (output_tokens - 1)."""
    done = [r for r in records if r["state"] == "completed" and window[0] <= r["ready_s"] <= window[1] and r["output_tokens"] > 1]
    return float(np.median([(r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in done]))
