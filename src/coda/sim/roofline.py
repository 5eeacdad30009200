"""The physical bound on output tokens/s for a workload on a profile's hardware.

Every decode step is taken at peak HBM bandwidth (datasheet) with the largest batch the
engine can hold at the workload's contexts, with no recompute, no prefill and no idle time:

    batch  = min(max_num_seqs, KV tokens per worker / mean decode context)
    step   = (weights a rank reads for that batch + the batch's KV on the rank) / peak bandwidth
    bound  = min(workers x batch / step, output tokens the workload offers per second)

The mean decode context is token-weighted: each output token attends to its prompt and the
output before it. The weights read are the dense ones plus the experts the batch's tokens
touch (expected distinct experts of top-k routing). A system's fraction of this bound says how
much of the hardware its scheduling leaves unused; no real engine reaches 1.
"""

from __future__ import annotations

from typing import Any

from coda.cost.geometry import expected_experts
from coda.cost.model import build_cost_model
from coda.cost.profile import Profile, load_profile
from coda.errors import CodaError
from coda.sim.config import SimConfig
from coda.sim.tiers import engine_kv_bytes
from coda.workload.schema import Workload, session_prompts
from coda.workload.stats import workload_duration_s


def decode_context(workload: Workload) -> tuple[float, float]:
    """(token-weighted mean decode context, output tokens) of a workload."""
    weighted = tokens = 0.0
    for s in workload.sessions:
        for (_, prompt), rnd in zip(session_prompts(s), s.rounds):
            o = rnd.output_tokens
            weighted += o * (prompt + (o - 1) / 2.0)
            tokens += o
    return (weighted / tokens if tokens else 0.0), tokens


def decode_read(profile: Profile, batch: int) -> tuple[float, float]:
    """(weight bytes, KV bytes per context token) one rank reads in a decode step of ``batch`` requests."""
    tp = profile.tp
    if profile.geometry is not None:
        g = profile.geometry
        total, _ = g.params()
        expert = 3.0 * g.hidden_size * g.moe_intermediate_size
        embedding = g.vocab_size * g.hidden_size  # looked up, not read whole
        dense = (total - embedding - g.moe_layers * g.num_experts * expert) * g.weight_bytes
        experts = g.moe_layers * expected_experts(batch, g.num_experts, g.experts_per_token) * expert * g.weight_bytes
    elif profile.model is not None:
        m = profile.model
        dense = m.dense_weight_bytes
        experts = m.num_layers * expected_experts(batch, m.num_experts, m.experts_per_token) * m.expert_bytes
    else:
        raise CodaError(
            f"profile {profile.name} states no model weights (a {profile.kind} profile); "
            "the roofline needs an operators or analytic profile"
        )
    return (dense + experts) / tp, float(profile.kv_bytes_per_token())


def roofline(workload: Workload, profile: Profile, *, workers: int, max_num_seqs: int, kv_bytes_per_worker: float) -> dict[str, Any]:
    """The bound and what it is made of (for ``coda profile roofline`` and ``coda compare``)."""
    if profile.gpu is None:
        raise CodaError(f"profile {profile.name} states no GPU bandwidth; the roofline needs an operators or analytic profile")
    context, tokens = decode_context(workload)
    duration = workload_duration_s(workload)
    _, kv_token = decode_read(profile, 1)
    batch = int(max(1, min(max_num_seqs, kv_bytes_per_worker // (kv_token * max(context, 1.0)))))
    weights, _ = decode_read(profile, batch)
    step_s = (weights + batch * context * kv_token) / profile.gpu.hbm_bw_bytes_s
    hardware = workers * batch / step_s
    offered = tokens / duration
    return {
        "output_tps_bound": min(hardware, offered),
        "bound_by": "hardware" if hardware <= offered else "workload",
        "hardware_tps": hardware,
        "offered_tps": offered,
        "batch": batch,
        "mean_decode_context": context,
        "step_s": step_s,
        "hbm_bw_bytes_s": profile.gpu.hbm_bw_bytes_s,
        "profile": profile.name,
        "workers": workers,
    }


def config_roofline(workload: Workload, config: SimConfig) -> dict[str, Any]:
    """The bound for a simulation's configuration: its profile, workers, seats and KV sizing."""
    profile = load_profile(config.profile)
    chunk_bytes = build_cost_model(profile).kv_bytes(config.chunk_tokens)
    kv = engine_kv_bytes(config, profile, chunk_bytes)
    return roofline(workload, profile, workers=config.workers, max_num_seqs=config.max_num_seqs, kv_bytes_per_worker=kv)
