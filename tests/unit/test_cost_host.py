"""The host model (``coda.cost.host``): its arithmetic, its fit from host probes, and a profile
without host costs simulating exactly as one whose host costs are zero (the worker's old path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coda.cost.empirical import pairs
from coda.cost.host import HostModel
from coda.cost.profile import load_profile
from coda.profiling.api_measure import HostSample
from coda.profiling.empirical_fit import fit_host
from coda.sim.config import SimConfig
from coda.sim.run import run_one, seeded_workload

TINY = Path(__file__).parents[2] / "src/coda/cost/profiles/vllm-cpu-tiny.json"
STEP = {"fixed_s": 1e-3, "token_s": 4e-6, "seq_s": 3e-5, "prefill_pair_s": 1e-8, "decode_context_s": 2e-7}
WALL_CLOCK = ("wall_s", "speed_x")  # how long the run took here, not what it simulated
HOST = {"request_s": 4e-3, "prompt_token_s": 2e-5, "output_token_s": 3e-4, "step_s": 5e-4}


def test_shared_cores_add_host_time_to_the_forward_pass() -> None:
    host = HostModel(**HOST, shares_cores=True)
    forward = np.array([0.010, 0.002, 0.002])
    # per step: 0.5 ms + 4 tokens x 0.3 ms = 1.7 ms; the first also carries two arrivals of 100 tokens (2 x 6 ms)
    backlog = 2 * host.arrival_s(100)
    assert host.arrival_s(100) == pytest.approx(4e-3 + 100 * 2e-5)
    assert host.steps_s(forward, 4, backlog) == pytest.approx([0.010 + 0.0017 + 0.012, 0.0037, 0.0037])


def test_separate_cores_overlap_host_time_up_to_the_forward_pass() -> None:
    host = HostModel(**HOST, shares_cores=False)
    forward = np.array([0.010, 0.001])
    # host 1.7 ms per step: hidden behind a 10 ms forward pass, not behind a 1 ms one
    assert host.steps_s(forward, 4, 0.0) == pytest.approx([0.010, 0.0017])
    assert host.steps_s(forward, 4, 0.012)[0] == pytest.approx(0.0137)


CONTENDED = {"base_s": 0.08, "scale": 9.0, "engine_cores": 1.9, "cores": 2, "fit_median_err": 0.1}


def test_a_contended_step_is_its_fitted_form_only_when_the_serving_engines_oversubscribe_the_cores() -> None:
    from coda.cost.profile import ContendedSteps

    host = HostModel(**HOST, shares_cores=True, contended=ContendedSteps(**CONTENDED))
    forward = np.array([0.002, 0.004])
    alone = host.steps_s(forward, 2, 0.0, serving=1)
    # one engine wants 1.9 of 2 cores: as before; two want 3.8: each step 80 ms + 9 x its forward pass, then the host's time
    assert alone == pytest.approx(HostModel(**HOST, shares_cores=True).steps_s(forward, 2, 0.0))
    assert host.steps_s(forward, 2, 0.0, serving=2) == pytest.approx(0.08 + 9.0 * forward + 5e-4 + 2 * 3e-4)
    assert not ContendedSteps(**CONTENDED | {"cores": 4}).contended(2) and ContendedSteps(**CONTENDED | {"cores": 4}).contended(3)


def _profile(tmp_path: Path, host: dict[str, Any] | None) -> Path:
    data = json.loads(TINY.read_text())
    if host is not None:
        data["step_model"]["host"] = host
        data["provenance"] |= {f"step_model.host.{k}": "assumed: a test's" for k in host if k not in ("shares_cores", "contended")}
        data["provenance"] |= {f"step_model.host.contended.{k}": "assumed: a test's" for k in host.get("contended") or {}}
    path = tmp_path / f"tiny-{'host' if host else 'none'}-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(data))
    return path


def _simulate(profile: Path, workers: int = 1, rate: int = 8) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    config = SimConfig(workers=workers, profile=str(profile), system="vllm", chunk_tokens=32, max_num_seqs=8, max_num_batched_tokens=4096,
                       dram=False, ssd=False, warmup_s=0, drain_s=60)
    result = run_one(seeded_workload(f"synth:rate={rate},duration=60,seed=1,tokens=0.03", 1), config)
    return {k: v for k, v in result.summary().items() if k not in WALL_CLOCK}, list(result.records)


def test_a_profile_without_host_costs_simulates_as_before(tmp_path: Path) -> None:
    """No host section leaves the worker's path untouched; zero host costs must then give the same
    run to the bit (a host model that charged anything by itself would differ here)."""
    none = _profile(tmp_path, None)
    assert HostModel.of(load_profile(str(none))) is None
    zero = _profile(tmp_path, {k: 0.0 for k in HOST} | {"shares_cores": True})
    base = _simulate(none)
    assert _simulate(zero) == base
    slow = _simulate(_profile(tmp_path, HOST | {"shares_cores": True}))
    assert slow[0]["completed"] == base[0]["completed"]
    assert sum(r["ttft_s"] for r in slow[1]) > sum(r["ttft_s"] for r in base[1])


def test_contention_slows_only_engines_that_serve_at_once(tmp_path: Path) -> None:
    """One worker never oversubscribes two cores: the contended section changes nothing, to the bit.
    Two workers serving at once do, and their requests wait longer."""
    plain = _profile(tmp_path, HOST | {"shares_cores": True})
    contended = _profile(tmp_path, HOST | {"shares_cores": True, "contended": CONTENDED})
    assert _simulate(contended) == _simulate(plain)
    two_plain, two_contended = _simulate(plain, workers=2, rate=64), _simulate(contended, workers=2, rate=64)
    assert two_contended[0]["completed"] == two_plain[0]["completed"] > 0
    served = [[r["ttft_s"] for r in run[1] if r["ttft_s"] is not None] for run in (two_plain, two_contended)]
    assert np.mean(served[1]) > 2 * np.mean(served[0])


def _samples(true: dict[str, float], noise: float, rng: np.random.Generator) -> list[HostSample]:
    """What the host probes would time on an engine whose host CPU follows ``true`` exactly."""
    out = []
    for batch in (1, 3, 7):
        quiet = 384 * (STEP["fixed_s"] + batch * STEP["token_s"])
        per_step = true["step_s"] + batch * true["output_token_s"]
        out.append(HostSample(batch, 40, 384, 0, True, quiet, quiet + 384 * per_step * (1 + noise * rng.standard_normal()), ()))
        for words, n in ((32, 50), (384, 40)):
            arrivals = tuple((int(rng.integers(words, 3 * words)), 0) for _ in range(n))
            cpu = sum(true["request_s"] + true["prompt_token_s"] * new + STEP["token_s"] * new + STEP["seq_s"] + STEP["prefill_pair_s"]
                      * pairs(new, 0) for new, _ in arrivals)
            out.append(HostSample(batch, 40, 384, words, False, quiet, quiet + cpu * (1 + noise * rng.standard_normal()), arrivals))
    return out


def test_fit_host_recovers_known_costs() -> None:
    rng = np.random.default_rng(0)
    exact = fit_host(_samples(HOST, 0.0, rng), STEP)
    assert exact is not None
    assert exact[0] == pytest.approx(HOST, rel=1e-6)
    assert exact[1].startswith("fitted: ")
    noisy = fit_host(_samples(HOST, 0.02, rng), STEP)
    assert noisy is not None
    assert noisy[0] == pytest.approx(HOST, rel=0.15)


def test_fit_host_needs_two_batches_and_two_sizes() -> None:
    samples = _samples(HOST, 0.0, np.random.default_rng(0))
    assert fit_host([s for s in samples if s.batch == 1], STEP) is None
    assert fit_host([s for s in samples if s.words != 32], STEP) is None
