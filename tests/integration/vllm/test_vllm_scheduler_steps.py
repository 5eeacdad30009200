"""``CodaScheduler`` stepped on vLLM 0.32.0's and 0.33.0's own classes, without an engine, with
async scheduling off and on; and the same script through the simulator's worker.

``scheduler_probe.py`` builds the scheduler as vLLM's engine core does (a real ``VllmConfig`` and
``KVCacheManager``, 16 blocks of 16 tokens, 4 seats) and steps ``schedule()`` and
``update_from_output()`` with a fake model on a scripted clock (one step a second). The script:

- at 0 s, ``a`` (70-token prompt), ``y`` (60 tokens, 3 out) and ``x`` (20 tokens), whose output is
  a tool call ending on its stop token (retention holds its blocks);
- at 1 s, ``c`` (110 tokens, 7 blocks), which does not fit;
- at 2 s and 3 s, ``d`` (60 tokens) and ``e`` (30 tokens), which fit, and Tiered-Aging admits them
  ahead of ``c``: cheaper, and ``c`` has not yet waited W_max (4 s);
- at 5 s ``c`` has waited W_max. With W_max preemption the scheduler preempts the requests that
  arrived after it, the youngest first (``e``, then ``d``), and admits ``c``; without it, ``c``
  waits until running requests end.

The decisions must be the same on both vLLM releases in each mode, and, without async scheduling
(where a step's output is known before the next step is scheduled, as in the simulator), the same
as the simulated worker's on the same script.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sim.request import SessionState, SimRequest
from coda.workload.schema import Workload
from tests.conftest import make_session
from tests.integration.vllm.support import ROOT, build_tiny_model, vllm_python
from tests.integration.vllm.test_vllm_interfaces import vllm033_python

pytestmark = pytest.mark.vllm
PROBE = Path(__file__).with_name("scheduler_probe.py")
BLOCK, NUM_BLOCKS, SEATS, W_MAX = 16, 17, 4, 4.0  # vLLM counts its null block among the 17
REQUESTS = [
    {"id": "a", "t": 0, "prompt": 70, "output": 40},
    {"id": "x", "t": 0, "prompt": 20, "tool": "bash"},
    {"id": "y", "t": 0, "prompt": 60, "output": 3},
    {"id": "c", "t": 1, "prompt": 110, "output": 5},
    {"id": "d", "t": 2, "prompt": 60, "output": 20},
    {"id": "e", "t": 3, "prompt": 30, "output": 20},
]
PROFILE = "a100-qwen3coder30b-fp8-roofline"  # the scheduler's default: both shells rank by the same costs


def policies(preempt: bool) -> dict[str, Any]:
    return {"state": {"name": "tiered_aging", "params": {"w_max_s": W_MAX, "preempt": preempt}}, "execution": "full"}


RUNS = {
    "sync": {"async": False, "settings": {"system": "coda", "policies": policies(True)}},
    "async": {"async": True, "settings": {"system": "coda", "policies": policies(True)}},
    "sync, no preemption": {"async": False, "settings": {"system": "coda", "policies": policies(False)}},
}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("scheduler-steps") / "model")


_probed: dict[str, dict[str, Any]] = {}


def probe(version: str, model: Path) -> dict[str, Any]:
    """The script's runs on one vLLM release (once per test session): ``outputs`` and one result per run."""
    if version not in _probed:
        python = vllm_python() if version == "0.32.0" else vllm033_python()
        script = {"model": str(model), "runs": list(RUNS.values()), "block": BLOCK, "num_blocks": NUM_BLOCKS, "max_num_seqs": SEATS,
                  "ticks": 200, "requests": REQUESTS}
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.run([python, str(PROBE)], input=json.dumps(script), capture_output=True, text=True, timeout=600, env=env,
                              cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert got["vllm"] == version
        _probed[version] = {"outputs": got["outputs"], **dict(zip(RUNS, got["runs"], strict=True))}
    return _probed[version]


@pytest.fixture(params=["0.32.0", "0.33.0"])
def observed(request, model) -> dict[str, Any]:
    return probe(request.param, model)


def test_the_scheduler_is_an_async_scheduler_exactly_where_vllm_asks_for_async_scheduling(observed):
    sync, asynchronous = observed["sync"], observed["async"]
    assert (sync["class"], sync["traced_class"], sync["async_scheduler"]) == ("CodaScheduler", "CodaScheduler", False)
    assert (asynchronous["class"], asynchronous["traced_class"], asynchronous["async_scheduler"]) == ("CodaAsyncScheduler",) * 2 + (True,)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_w_max_preempts_the_youngest_running_requests_for_the_overdue_one(observed, mode):
    run = observed[mode]
    # c arrived at 1 s; at 5 s (W_max later) e and d, which arrived after it, make room, youngest first
    assert run["w_max"][0] == {"t": 5.0, "for": "c", "preempted": ["e", "d"], "admitted": ["c"]}
    assert {"t": 5, "admitted": ["c"], "preempted": ["d", "e"]} in run["steps"]
    assert run["counts"]["preemptions"] == 2
    assert "W_max: oldest does not fit, preempt" in run["rules"]
    # the tool call ended on its stop token and retention held its blocks; every request finished
    assert ["hold", "x"] in run["retention"] and ["x", "stop"] in [[f[0], f[2]] for f in run["finished"]]
    assert sorted(f[0] for f in run["finished"]) == sorted(r["id"] for r in REQUESTS) and run["left"] == {"waiting": 0, "running": 0}


def test_without_w_max_preemption_the_overdue_request_waits_for_running_ones_to_end(observed):
    run = observed["sync, no preemption"]
    admitted_c = next(s["t"] for s in run["steps"] if "c" in s["admitted"])
    # vLLM's own preemption (decode growth) still acts; none is made for c
    assert admitted_c - 1 > W_MAX + 1 and run["counts"]["preemptions"] == 0 and not any(w["for"] for w in run["w_max"])


def test_both_releases_decide_alike(model):
    assert probe("0.33.0", model) == probe("0.32.0", model)


def simulated(preempt: bool, outputs: dict[str, int]) -> list[dict[str, Any]]:
    """The script through one simulated worker, stepped on the same clock: each tick first delivers the
    previous step's outputs, then schedules (as the probe without async scheduling does)."""
    wl = Workload(sessions=[make_session(r["id"], 0.0, [(100, 1, 0.0)]) for r in REQUESTS], meta={"duration_s": 10.0})
    cfg = SimConfig(system="coda", workers=1, chunk_tokens=BLOCK, num_gpu_blocks=NUM_BLOCKS, dram=False, warmup_s=0, max_num_seqs=SEATS,
                    max_num_batched_tokens=1024, decode_run_max=1, profile=PROFILE,
                    policies=policies(preempt) | {"eviction": "lru"})
    sim = Simulation(wl, cfg)
    w = sim.workers[0]
    w.on_finish = lambda req: None
    names: dict[int, str] = {}
    steps: dict[int, dict[str, list[str]]] = {}
    tick = 0

    def log(kind: str, fn: Any) -> Any:
        def wrapped(req: SimRequest) -> None:
            steps.setdefault(tick, {"admitted": [], "preempted": []})[kind].append(names[req.rid])
            fn(req)
        return wrapped

    w._admit, w._preempt = log("admitted", w._admit), log("preempted", w._preempt)
    pending = []
    for i, r in enumerate(REQUESTS):
        sess = SessionState(i, wl.sessions[i], sim.versions.new_owner())
        req = SimRequest(i, sess, 0, "scripted", float(r["t"]))
        req.prompt_tokens = req.orig_prompt_tokens = r["prompt"]
        req.output_tokens = outputs[r["id"]]
        req.chain = sess.fresh_ids(r["prompt"] // BLOCK)
        req.owners = (sess.owner,)
        names[i] = r["id"]
        pending.append((r["t"], req))
    for tick in range(200):
        sim.loop.now = float(tick)
        for _, req in [p for p in pending if p[0] == tick]:
            w.enqueue(req)
        if w.busy:
            w._step_end(w._gen)
        else:
            w._schedule()
        if tick > REQUESTS[-1]["t"] and not w.busy and not w.waiting:
            break
    return [{"t": t, "admitted": s["admitted"], "preempted": sorted(s["preempted"])} for t, s in sorted(steps.items())]


@pytest.mark.parametrize("mode", ["sync", "sync, no preemption"])
def test_the_simulated_worker_decides_as_the_scheduler_does(observed, mode):
    assert simulated(mode == "sync", observed["outputs"]) == observed[mode]["steps"]
