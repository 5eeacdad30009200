"""Cost model protocol and the analytic roofline model (v0).

One engine step reads the dense/MoE weights once whatever its mix of prefill and decode, then
runs attention per request. ``step_s`` is what the simulator charges per iteration; ``h2d_s``,
``ssd_read_s`` and ``prefill_only_s`` are what state admission uses to rank requests. Nothing
here reads a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from coda.cost.profile import Profile


@dataclass(frozen=True, slots=True)
class CohortPlan:
    """Split of a pure-decode batch's attention: the ``cut`` shortest contexts form one cohort."""

    cut: int
    gain_lower_bound: float = 0.0


@runtime_checkable
class CostModel(Protocol):
    profile: Profile

    def step_s(self, prefill_chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int] | np.ndarray, plan: CohortPlan | None = None) -> float:
        """Duration of one engine step: prefill chunks as ``(new_tokens, cached_tokens)``, decodes by context."""
        ...

    def decode_steps_s(self, contexts: np.ndarray, k: int, plan: CohortPlan | None = None) -> np.ndarray:
        """Durations of ``k`` consecutive pure-decode steps whose contexts grow by one token each."""
        ...

    def decode_attention_s(self, contexts: np.ndarray) -> float:
        """Attention time of one pure-decode batch, all layers."""
        ...

    def h2d_s(self, nbytes: float, outstanding_s: float = 0.0) -> float: ...

    def d2h_s(self, nbytes: float) -> float: ...

    def ssd_read_s(self, nbytes: float) -> float: ...

    def prefill_only_s(self, new: int, cached: int) -> float:
        """Time to prefill ``new`` tokens over ``cached`` ones in a step of their own."""
        ...

    def kv_bytes(self, tokens: int) -> int: ...


class AnalyticCost:
    """Roofline model from the profile's GPU and model description.

    Dense/MoE part: max(weight bytes / bandwidth, 2 x active params x tokens / FLOP/s), where
    the MoE weights read are the experts the step's tokens touch (expected distinct experts of
    top-k routing). Decode attention: KV bytes read / bandwidth plus per-request and per-layer
    launch costs; linear in the batch's total context, so v0 predicts no gain from cohort splits
    (a split only adds launches). Prefill attention: causal FLOPs over new and cached tokens.
    """

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        g, m = profile.gpu, profile.model
        self._bw = g.hbm_bw_bytes_s * g.mem_efficiency
        self._flops = g.peak_flops * g.compute_efficiency
        self._attn_flops = g.peak_flops * g.attn_compute_efficiency
        self._kv_tok = m.kv_bytes_per_token
        # causal attention FLOPs per (query token x key token), all layers: QK^T and PV.
        self._attn_pair_flops = 4.0 * m.num_q_heads * m.head_dim * m.num_layers
        self._launch = profile.overheads.attn_launch_per_layer_s * m.num_layers

    # --- weights ---------------------------------------------------------------------------
    def dense_s(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        m = self.profile.model
        nbytes = m.dense_weight_bytes
        if m.num_experts:
            touched = m.num_experts * (1.0 - (1.0 - m.experts_per_token / m.num_experts) ** tokens)
            nbytes += touched * m.expert_bytes * m.num_layers
        return max(nbytes / self._bw, 2.0 * m.active_params * tokens / self._flops)

    # --- attention -------------------------------------------------------------------------
    def decode_attention_s(self, contexts: np.ndarray) -> float:
        n = len(contexts)
        if n == 0:
            return 0.0
        total = float(np.sum(contexts))
        return total * self._kv_tok / self._bw + n * self.profile.overheads.decode_per_request_s + self._launch

    def cohort_attention_s(self, contexts: np.ndarray, plan: CohortPlan) -> float:
        ordered = np.sort(contexts)
        return self.decode_attention_s(ordered[: plan.cut]) + self.decode_attention_s(ordered[plan.cut :])

    def prefill_attention_s(self, new: int, cached: int) -> float:
        if new <= 0:
            return 0.0
        flops = self._attn_pair_flops * new * (cached + (new + 1) / 2.0)
        return max(flops / self._attn_flops, (cached + new) * self._kv_tok / self._bw) + self._launch

    # --- steps -----------------------------------------------------------------------------
    def step_s(self, prefill_chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int] | np.ndarray, plan: CohortPlan | None = None) -> float:
        ctx = np.asarray(decode_contexts, dtype=np.int64)
        tokens = len(ctx) + sum(new for new, _ in prefill_chunks)
        if tokens == 0:
            return 0.0
        attn = self.cohort_attention_s(ctx, plan) if plan is not None and not prefill_chunks else self.decode_attention_s(ctx)
        attn += sum(self.prefill_attention_s(new, cached) for new, cached in prefill_chunks)
        return self.profile.overheads.step_s + self.dense_s(tokens) + attn

    def decode_steps_s(self, contexts: np.ndarray, k: int, plan: CohortPlan | None = None) -> np.ndarray:
        first = self.step_s((), contexts, plan)
        if k == 1:
            return np.array([first])
        last = self.step_s((), contexts + (k - 1), plan)
        # Contexts grow by one token per step; between the end points the step time is linear
        # in the total context for every kernel family modelled here (exact for v0).
        return np.linspace(first, last, k)

    def prefill_only_s(self, new: int, cached: int) -> float:
        if new <= 0:
            return 0.0
        return self.profile.overheads.step_s + self.dense_s(new) + self.prefill_attention_s(new, cached)

    # --- links -----------------------------------------------------------------------------
    def h2d_s(self, nbytes: float, outstanding_s: float = 0.0) -> float:
        return self.profile.h2d.seconds(nbytes) + max(0.0, outstanding_s)

    def d2h_s(self, nbytes: float) -> float:
        return self.profile.d2h.seconds(nbytes)

    def ssd_read_s(self, nbytes: float) -> float:
        return self.profile.ssd_read.seconds(nbytes)

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self._kv_tok


def build_cost_model(profile: Profile) -> CostModel:
    """The cost model a profile asks for (v0: always the analytic roofline)."""
    return AnalyticCost(profile)
