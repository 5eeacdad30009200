"""The empirical step model: the fit recovers known constants, the form follows the data, the
cost model charges what the profile says, and a bad endpoint gives one clear line."""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pytest

from coda.cost.empirical import EmpiricalCost, step_features
from coda.cost.model import build_cost_model
from coda.cost.profile import Machine, Profile, load_profile
from coda.errors import CodaError
from coda.profiling.api_measure import ApiSample, DecodeSample, EngineInfo, Plan, PrefillSample, Prober, _samples
from coda.profiling.empirical_fit import COLUMNS, fit_api_stream, fit_step_model, measured_profile, served_model

TRUE = {"api_latency_s": 5e-3, "api_id_token_s": 2.5e-6, "api_text_token_s": 1e-6, "fixed_s": 1e-3, "token_s": 6e-6, "seq_s": 4e-5,
        "prefill_pair_s": 1.5e-8, "decode_context_s": 1.5e-7}
INFO = EngineInfo("http://127.0.0.1:1", "tiny", "/models/tiny", "0.32.0", 6144, 32, 8000)


def timings(true: dict[str, float], noise: float, seed: int = 0) -> tuple[list[PrefillSample], list[DecodeSample]]:
    """What `Prober.measure` would return from an engine whose steps follow ``true`` exactly, with
    relative noise on every repeat."""
    theta = np.array([true[c] for c in COLUMNS])
    rng = np.random.default_rng(seed)

    def repeats(t: float) -> list[float]:
        return [t * (1 + noise * rng.standard_normal()) for _ in range(5)]

    pre = []
    for n, c, text in [(16, 0, 0), (128, 0, 0), (512, 0, 0), (1024, 0, 0), (2048, 0, 0), (4096, 0, 0), (6000, 0, 0), (64, 1500, 0),
                       (64, 4500, 0), (512, 3000, 0), (1, 63, 64), (5, 1019, 1024), (9, 3063, 3072)]:
        t = theta @ np.concatenate(([1.0, 0 if text else n + c, text], step_features([(n, c)], ())))
        pre.append(PrefillSample(n, c, repeats(t), text_tokens=text))
    dec = []
    for b, ctx in [(1, 100), (1, 2000), (1, 5000), (2, 500), (2, 3000), (4, 100), (4, 1800), (8, 100), (8, 800)]:
        t = theta[3:] @ step_features((), [ctx] * b)
        dec.append(DecodeSample(b, ctx, repeats(t)))
    return pre, dec


def test_fit_recovers_known_constants_from_synthetic_timings():
    fit = fit_step_model(*timings(TRUE, noise=0.01))
    for k, v in TRUE.items():
        assert fit.constants[k] == pytest.approx(v, rel=0.15), k
    assert fit.form == COLUMNS
    assert np.median(fit.prefill_err) < 0.02 and np.median(fit.decode_err) < 0.02 and fit.loo_score < 0.03


def test_exact_timings_are_fitted_exactly():
    fit = fit_step_model(*timings(TRUE, noise=0.0))
    assert all(fit.constants[k] == pytest.approx(v, rel=1e-6) for k, v in TRUE.items())


def test_the_form_follows_the_data():
    """An engine without quadratic prefill attention gets a model without it; with it, keeps it."""
    linear = fit_step_model(*timings({**TRUE, "prefill_pair_s": 0.0}, noise=0.01))
    assert "prefill_pair_s" not in linear.form and linear.constants["prefill_pair_s"] == 0.0
    assert linear.forms["prefill_pair_s+decode_context_s"] >= linear.forms["decode_context_s"] - 0.005
    quadratic = fit_step_model(*timings(TRUE, noise=0.01))
    assert quadratic.forms["decode_context_s"] > 3 * quadratic.forms["prefill_pair_s+decode_context_s"]


def test_too_few_shapes_is_refused():
    pre, dec = timings(TRUE, 0.0)
    with pytest.raises(ValueError, match="at least 3"):
        fit_step_model(pre[:2], dec)


@pytest.fixture(scope="module")
def profile() -> Profile:
    pre, dec = timings(TRUE, noise=0.0)
    data = measured_profile("t", INFO, pre, dec, fit_step_model(pre, dec), kv_bytes_per_token=(2048, "given: test"),
                            samples="t.samples.csv", date="2026-01-01", machine=None, note="")
    return Profile.model_validate(data)


def test_a_measured_profile_records_the_machine_and_no_path_host_name_or_kernel_build(tmp_path, monkeypatch):
    """The endpoint's address, the model's local folder, the host's name and its kernel build say
    where a profile was written, not what it measured; the hardware and software do."""
    from coda.cli.profile import _engine_machine

    monkeypatch.chdir(tmp_path)
    pre, dec = timings(TRUE, noise=0.0)
    remote = EngineInfo("http://gpu-node-7.example:8123", "tiny", str(tmp_path / "fmodel"), "0.32.0", 6144, 32, 8000)
    assert _engine_machine(remote.url, remote.version) is None
    local = _engine_machine("http://127.0.0.1:8123", "0.32.0")
    assert local is not None and local["vllm"] == "0.32.0" and local["cpus"] == os.cpu_count() and local["torch"] is None
    for info, where in ((remote, None), (remote, local)):
        data = measured_profile("t", info, pre, dec, fit_step_model(pre, dec), kv_bytes_per_token=(2048, "given: test"),
                                samples="t.samples.csv", date="2026-01-01", machine=where, note="")
        text = json.dumps(data)
        for leak in (str(tmp_path), "fmodel", "gpu-node-7.example", remote.url, socket.gethostname(), platform.node(), platform.release()):
            assert not re.search(rf"(?<![\w.-]){re.escape(leak)}(?![\w.-])", text), leak
        assert Profile.model_validate(data).machine == (None if where is None else Machine(**local))
    hub = EngineInfo("http://127.0.0.1:1", "coder", "Qwen/Qwen3-Coder-30B-A3B-Instruct", "0.32.0", 6144, 32, 8000)
    assert served_model(hub) == "coder (Qwen/Qwen3-Coder-30B-A3B-Instruct)" and served_model(remote) == "tiny"


def test_measured_profile_has_provenance_and_builds_the_empirical_model(profile):
    assert profile.kind == "measured" and profile.gpu is None and profile.tiers.hbm_kv_bytes == 8000 * 2048
    assert profile.provenance["step_model.fixed_s"].startswith("fitted: ")
    assert isinstance(build_cost_model(profile), EmpiricalCost)
    data = profile.model_dump()
    del data["provenance"]["step_model.token_s"]
    with pytest.raises(ValueError, match="provenance missing for: step_model.token_s"):
        Profile.model_validate(data)
    data = profile.model_dump()
    data["step_model"] = None
    with pytest.raises(ValueError, match="needs a step_model section"):
        Profile.model_validate(data)


def test_cost_model_charges_the_step_formula(profile):
    cost = EmpiricalCost(profile)
    t = TRUE
    mixed = cost.step_s([(512, 1024), (0, 99)], [100, 300])
    assert mixed == pytest.approx(t["fixed_s"] + t["token_s"] * 514 + t["seq_s"] * 3 + t["prefill_pair_s"] * 512 * (1024 + 513 / 2)
                                  + t["decode_context_s"] * 400, rel=1e-6)
    ctx = np.array([100, 900, 4000])
    run = cost.decode_steps_s(ctx, 40)
    assert run[0] == pytest.approx(cost.step_s((), ctx)) and run[39] == pytest.approx(cost.step_s((), ctx + 39))
    assert cost.prefill_only_s(2048, 0) == pytest.approx(cost.step_s([(2048, 0)], ()))
    assert cost.request_s(1000) == pytest.approx(t["api_latency_s"] + 1000 * t["api_text_token_s"], rel=1e-6)
    assert cost.kv_bytes(10) == 20480 and cost.step_s((), []) == 0.0
    bounds = cost.cohort_gain_bounds(ctx)
    assert not bounds.in_domain and (bounds.predicted == 0).all() and (bounds.conservative < 0).all()
    assert cost.h2d_s(0) == 0.0
    with pytest.raises(CodaError, match="--no-dram"):
        cost.h2d_s(1e6)


def test_the_api_time_under_load_is_fitted_per_request_and_per_prompt_token():
    # exact: 10 ms + 20 us a token, and per streaming request 1 ms + 5 us a token
    api = [ApiSample(load, n, [0.010 + 20e-6 * n + (0.001 + 5e-6 * n) * load] * 3) for load in (0, 4, 7) for n in (40, 600)]
    stream, per_token, note = fit_api_stream(api)
    assert (stream, per_token) == pytest.approx((0.001, 5e-6)) and note.startswith("fitted: ")
    # a load that slows nothing fits to 0, never below
    flat = [ApiSample(load, n, [0.010 + 20e-6 * n - 0.0001 * load]) for load in (0, 4, 7) for n in (40, 600)]
    assert fit_api_stream(flat)[:2] == (0.0, 0.0)
    assert fit_api_stream([ApiSample(0, 40, [0.01])])[:2] == (0.0, 0.0)
    assert fit_api_stream([])[2].startswith("not measured: ")
    pre, dec = timings(TRUE, noise=0.0)
    data = measured_profile("t", INFO, pre, dec, fit_step_model(pre, dec), api, kv_bytes_per_token=(2048, "given: test"),
                            samples="t.samples.csv", date="2026-01-01", machine=None, note="")
    cost = EmpiricalCost(Profile.model_validate(data))
    assert cost.request_s(1000, running=5) - cost.request_s(1000) == pytest.approx(5 * (0.001 + 5e-6 * 1000))


def test_api_load_plan_leaves_the_probe_a_seat_and_the_streams_their_kv():
    plan = Plan.for_engine(INFO, max_batch=8, output_tokens=128)
    assert plan.streams == (0, 4, 7) and plan.probe_words == (32, 384) and plan.stream_tokens >= 512
    assert 7 * (64 + plan.stream_tokens + 32) + 3 * 384 + 32 <= 8000  # seven streams and the largest probe fit the KV


def test_a_probe_is_timed_to_its_first_token_and_a_failed_stream_is_one_error():
    import asyncio

    from coda.bench.client import Attempt

    prober = Prober("http://127.0.0.1:9")
    usage = {"completion_tokens": 1, "prompt_tokens": 64}

    async def served(body, headers):
        return Attempt(sent_s=1.0, status=200, first_token_s=1.2, end_s=1.25, usage=usage)

    async def cut(body, headers):
        return Attempt(sent_s=1.0, status=200, reason="stream_cut: closed", end_s=1.25, usage=usage)

    async def go(send):
        prober.endpoint.send = send
        return await prober.first_token([11, 12])

    assert asyncio.run(go(served)).seconds == pytest.approx(0.2)
    with pytest.raises(CodaError, match="stream_cut"):
        asyncio.run(go(cut))


def test_shipped_profile_loads_with_its_provenance():
    p = load_profile("vllm-cpu-tiny")
    assert p.kind == "measured" and p.step_model is not None and p.step_model.block_tokens == 32
    assert "vLLM-CPU" in p.description and p.step_model.fit.samples >= 20


def test_plan_keeps_within_the_engine():
    plan = Plan.for_engine(INFO, max_batch=8, output_tokens=128)
    assert max(n + c for n, c in plan.prefill) + 128 + 32 <= 6144
    assert all(b * (c + 128 + 32) <= 8000 for b, c in plan.decode) and max(b for b, _ in plan.decode) == 8
    metrics = _samples('vllm:cache_config_info{block_size="32",num_gpu_blocks="250",x="a,b"} 1.0\n')
    assert metrics["vllm:cache_config_info"] == [({"block_size": "32", "num_gpu_blocks": "250", "x": "a,b"}, 1.0)]
    assert _samples("<html>not metrics</html>") == {}


def measure(url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coda.cli", "profile", "measure", "--endpoint", url, "--out", "/tmp/never.json"],
                          capture_output=True, text=True, timeout=60)


def test_unreachable_endpoint_is_one_clear_line():
    proc = measure("http://127.0.0.1:9")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--endpoint http://127.0.0.1:9: cannot connect" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_server_that_is_not_openai_is_one_clear_line():
    class Html(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(404)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>not here</html>")

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = measure(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "not an OpenAI-compatible server" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
