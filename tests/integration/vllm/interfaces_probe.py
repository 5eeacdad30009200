"""Coda's engine classes against an installed vLLM's own classes, without an engine (run with that
vLLM's Python; prints one JSON object of what it observed, which test_vllm_interfaces.py asserts).

No GPU and no model: the KV cache manager, its block pool, requests and their block hashes, the
offloading connector's CPU store, the attention metadata and the backend, worker and scheduler
classes are pure Python (or CPU tensors) in vLLM, so Coda's parts run on them as in an engine.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from types import SimpleNamespace
from typing import Any

import torch

import vllm
from coda.cost.model import build_cost_model
from coda.cost.profile import load_profile
from coda.integrations.vllm import cohort_backend, host_offload, scheduler, tiers, worker
from coda.integrations.vllm.cohort_plan import PLAN_ATTR, STEP
from coda.integrations.vllm.compat import check_version
from coda.integrations.vllm.retention import Retention
from coda.integrations.vllm.settings import ENFORCED, RetentionSettings, load_settings
from coda.shell.build import build_policies
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.kv_offload.base import LookupResult, OffloadingWorker, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.request import Request

BLOCK = 16
out: dict[str, Any] = {"vllm": vllm.__version__}


def params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def accepts(ours: Any, theirs: Any) -> bool:
    """Whether ``ours`` (an override) takes every parameter ``theirs`` (vLLM's method) is called with."""
    mine = inspect.signature(ours).parameters
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in mine.values()):
        return True
    return set(params(theirs)) <= set(mine)


# --- what Coda overrides, against this vLLM's signatures ------------------------------------------
check_version(vllm.__version__)
out["overrides"] = {
    "Scheduler.schedule": accepts(scheduler.CodaScheduler.schedule, Scheduler.schedule),
    "Scheduler.add_request": accepts(scheduler.CodaScheduler.add_request, Scheduler.add_request),
    "Scheduler._free_blocks": accepts(scheduler.CodaScheduler._free_blocks, Scheduler._free_blocks),
    "Worker.execute_model": accepts(worker.CodaWorker.execute_model, worker.PlatformWorker.execute_model),
    "OffloadingWorker.submit_store": accepts(host_offload.HostCopyWorker.submit_store, OffloadingWorker.submit_store),
    "OffloadingWorker.submit_load": accepts(host_offload.HostCopyWorker.submit_load, OffloadingWorker.submit_load),
}
out["abstract_left"] = {"PolicyQueue": sorted(scheduler.PolicyQueue.__abstractmethods__),
                        "HostCopyWorker": sorted(host_offload.HostCopyWorker.__abstractmethods__)}
out["queue_methods"] = sorted(m for m in RequestQueue.__abstractmethods__ if m not in vars(scheduler.PolicyQueue))
out["worker_base"] = worker.PlatformWorker.__name__
out["scheduler_output_takes_plan"] = "__slots__" not in vars(SchedulerOutput)

# --- the GPU prefix-cache probe and the waiting queue, on a real KV cache manager ----------------
init_none_hash(sha256)
hasher = get_request_block_hasher(BLOCK, sha256)
spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=64, dtype=torch.float32)
kvm = KVCacheManager(KVCacheConfig(num_blocks=17, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)]),
                     max_model_len=256, scheduler_block_size=BLOCK, hash_block_size=BLOCK, enable_caching=True)


def request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=8), None, arrival_time=0.0, block_hasher=hasher)


def run(req: Request) -> list[Any]:
    """Allocate the request's prompt (which caches its full blocks), as a step would; its blocks."""
    assert kvm.allocate_slots(req, req.num_tokens) is not None
    req.num_computed_tokens = req.num_tokens
    return [b for group in kvm.get_blocks(req.request_id).blocks for b in group]


prefix = list(range(100, 164))  # 4 blocks
a = request("a", prefix)
run(a)
kvm.free(a)
policies = build_policies(load_settings({}).policy_spec, build_cost_model(load_profile(load_settings({}).profile)), kinds=ENFORCED)
fake_scheduler = SimpleNamespace(kv_cache_manager=kvm, block_size=BLOCK, coda_reclaimable=lambda: 0)
queue = scheduler.PolicyQueue(fake_scheduler, policies.state, tiers.NoTiers("none"), explain_rules=True)  # type: ignore[arg-type]
b = request("b", prefix[:48] + list(range(500, 540)))
queue.add_request(b)
out["queue"] = {"head": queue.peek_request().request_id, "hit": list(queue._hit(b)), "rule": queue.decisions[0]["rule"],
                "free_blocks": kvm.block_pool.get_num_free_blocks()}

# --- retention on the real block pool --------------------------------------------------------------
retention = Retention(kvm.block_pool, policies.eviction, RetentionSettings())
c = request("c", list(range(700, 764)))  # 4 full blocks
blocks = run(c)
retention.finished("c", c.block_hashes[3], blocks, ("bash",), now=0.0)
kvm.free(c)
free_after_hold = kvm.block_pool.get_num_free_blocks()
big = request("big", list(range(2000, 2000 + 15 * BLOCK)))  # 15 blocks: more than the free ones, fewer with the held ones
got = retention.allocate(lambda: kvm.allocate_slots(big, big.num_tokens), now=1.0)
out["retention"] = {"held_blocks": len(blocks), "free_after_hold": free_after_hold, "allocated": got is not None,
                    "events": [(e["event"], e.get("blocks"), e.get("kept")) for e in retention.events]}

# --- the external tier probe on a real CPU offloading store ------------------------------------------
store = CPUOffloadingManager(num_chunks=8)
d = request("d", list(range(900, 964)) + [1])  # 4 full blocks and one token
keys = [make_offload_key(h, 0) for h in d.block_hashes[:3]]  # the store holds the first three
ctx = ReqContext(req_id="d")
store.prepare_store(keys, ctx)
store.complete_store(keys, ctx)
offloaded = tiers.OffloadedPrefix(
    store, [tiers.ChunkGroup(0, BLOCK, 1)], make_offload_key, frozenset({LookupResult.HIT, LookupResult.HIT_PENDING})
)
out["tiers"] = {"from_0": offloaded.tokens(d, 0), "from_1": offloaded.tokens(d, BLOCK), "valid": offloaded.still_valid(d, 0, 3 * BLOCK)}

# --- the cohort backend on real attention metadata ----------------------------------------------------
wrapped = cohort_backend.cohort_backend(CPUAttentionBackend)
builder, impl = wrapped.get_builder_cls(), wrapped.get_impl_cls()
base_builder, base_impl = CPUAttentionBackend.get_builder_cls(), CPUAttentionBackend.get_impl_cls()
out["backend"] = {
    "subclass": issubclass(wrapped, CPUAttentionBackend) and issubclass(builder, base_builder) and issubclass(impl, base_impl),
    "name": wrapped.get_name(),
    "build": accepts(builder.build, base_builder.build),
    "forward": accepts(impl.forward, base_impl.forward),
    "forward_params": params(base_impl.forward)[:8],
    "sliced_fields_exist": sorted(cohort_backend._SLICED - {f.name for f in dataclasses.fields(CommonAttentionMetadata)}),
}
n = 4
lens = torch.tensor([900, 40, 1200, 70], dtype=torch.int32)
cm_fields = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
cm = CommonAttentionMetadata(
    **{
        k: v
        for k, v in dict(
            query_start_loc=torch.arange(n + 1, dtype=torch.int32),
            query_start_loc_cpu=torch.arange(n + 1, dtype=torch.int32),
            seq_lens=lens,
            num_reqs=n,
            num_actual_tokens=n,
            max_query_len=1,
            max_seq_len=1200,
            block_table_tensor=torch.arange(4 * 80).reshape(4, 80),
            slot_mapping=torch.arange(n),
            causal=True,
            seq_lens_cpu_upper_bound=lens,
        ).items()
        if k in cm_fields
    }
)
STEP.begin((n, 2))
rows = cohort_backend._cohort_rows(cm)
short = cohort_backend._cohort_metadata(cm, rows[0]) if rows else None
STEP.end()
out["cohorts"] = {
    "rows": [r.tolist() for r in rows] if rows else None,
    "short": None
    if short is None
    else {
        "seq_lens": short.seq_lens.tolist(),
        "num_reqs": short.num_reqs,
        "max_seq_len": short.max_seq_len,
        "first_block_row": short.block_table_tensor[:, 0].tolist(),
        "query_start_loc": short.query_start_loc.tolist(),
    },
    "without_plan": cohort_backend._cohort_rows(cm) is None,
}
try:  # the CUDA platform's backends, where this vLLM can import them without a GPU
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    gpu = {}
    for name in ("FLASH_ATTN", "TRITON_ATTN", "FLASHINFER"):
        try:
            cls = getattr(cohort_backend, cohort_backend.PREFIX + name)
            gpu[name] = issubclass(cls.get_impl_cls(), AttentionBackendEnum[name].get_class().get_impl_cls())
        except Exception as err:  # noqa: BLE001 - recorded, not hidden: the test prints what could not be imported here
            gpu[name] = f"not importable here: {type(err).__name__}"
    out["gpu_backends"] = gpu
except ImportError as err:
    out["gpu_backends"] = str(err)
out["plan_attr"] = PLAN_ATTR
print(json.dumps(out))
