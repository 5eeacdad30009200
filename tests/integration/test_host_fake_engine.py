"""A host cost measured through the API is what the fit recovers: `coda fake-engine` simulates a
profile whose host CPU shares the forward pass's core (``step_model.host``), the host probes of
``coda profile measure --endpoint`` time it through HTTP, and ``fit_host`` gives it back.

The fake engine charges host CPU per emitted token whether or not a request streams, so a
streamed batch and a plain one take the same time on it: only the per-request and per-prompt-token
costs (the probes with requests sent beside a batch) are recovered here; the streamed terms are
covered by the fit's unit test (tests/unit/test_cost_host.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from coda.engines.launch import FakeEngineProcess
from coda.profiling.api_measure import PROBE_WORDS, HostSample, Prober
from coda.profiling.empirical_fit import fit_host

TINY = Path(__file__).parents[2] / "src/coda/cost/profiles/vllm-cpu-tiny.json"
#: host CPU the fake engine charges: large beside its ~1 ms steps, so a loaded machine's jitter in
#: the fake engine's real-time loop stays small against the delay it causes
HOST = {"request_s": 0.02, "prompt_token_s": 1e-4, "output_token_s": 0.0, "step_s": 0.0}
#: how far the fitted costs may be from the charged ones: the probes count the requests answered
#: within a batch's window (one may straddle each edge) and time through HTTP
TOLERANCE = 0.25
ENGINE = "engine:\n  chunk_tokens: 32\n  max_num_seqs: 8\n  max_num_batched_tokens: 4096\n  dram: false\n  ssd: false\n"


async def _probe(url: str) -> list[HostSample]:
    prober = Prober(url, seed=0)
    try:
        await prober.inspect()
        return [s for batch in (1, 3, 7) for s in await prober.host(batch, 32, 384, PROBE_WORDS)]
    finally:
        await prober.close()


@pytest.mark.slow
def test_host_probes_recover_the_fake_engines_host_cost(tmp_path: Path) -> None:
    data = json.loads(TINY.read_text())
    data["step_model"]["host"] = HOST | {"shares_cores": True}
    data["provenance"] |= {f"step_model.host.{k}": "assumed: the cost under test" for k in HOST}
    profile, config = tmp_path / "host.json", tmp_path / "engine.yaml"
    profile.write_text(json.dumps(data))
    config.write_text(ENGINE)
    with FakeEngineProcess("--profile", str(profile), "--config", str(config)) as engine:
        samples = asyncio.run(_probe(engine.url))
    assert sum(len(s.arrivals) for s in samples) >= 60  # enough requests beside the batches to fit on
    fitted = fit_host(samples, {k: data["step_model"][k] for k in ("fixed_s", "token_s", "seq_s", "prefill_pair_s")})
    assert fitted is not None
    costs, provenance = fitted
    assert costs["request_s"] == pytest.approx(HOST["request_s"], rel=TOLERANCE)
    assert costs["prompt_token_s"] == pytest.approx(HOST["prompt_token_s"], rel=TOLERANCE)
    assert provenance.startswith("fitted: host probes through the API")
