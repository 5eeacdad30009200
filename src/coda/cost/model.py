"""The cost model protocol every shell calls, the analytic roofline model (v0) and the kernel-level
model; ``build_cost_model`` picks a profile's model.

One engine step reads the dense/MoE weights once whatever its mix of prefill and decode, then
runs attention per request. The protocol is what the shells ask: ``step_s`` and
``decode_steps_s`` (the simulator's worker and the fake engine charge them per iteration),
``request_s`` (the engine's time before a request reaches its scheduler), ``prefill_only_s``,
``h2d_s`` and ``ssd_read_s`` (state admission ranks requests by them), ``d2h_s`` (eviction),
``kv_bytes`` (KV sizing), ``cohort_gain_bounds`` (execution admission). Nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from coda.cost.attention import AttentionSteps, KernelAttention
from coda.cost.cohorts import CohortPlan, GainBounds, no_split_gains
from coda.cost.empirical import EmpiricalCost
from coda.cost.geometry import expected_experts
from coda.cost.operators import OperatorCost
from coda.cost.paired import CohortGains
from coda.cost.parallel import tensor_parallel_comm
from coda.cost.profile import Profile

__all__ = ["AnalyticCost", "CohortPlan", "CostModel", "GainBounds", "KernelCost", "build_cost_model"]


@runtime_checkable
class CostModel(Protocol):
    profile: Profile

    def step_s(
        self, prefill_chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int] | np.ndarray, plan: CohortPlan | None = None
    ) -> float:
        """Duration of one engine step: prefill chunks as ``(new_tokens, cached_tokens)``, decodes by context."""
        ...

    def decode_steps_s(self, contexts: np.ndarray, k: int, plan: CohortPlan | None = None) -> np.ndarray:
        """Durations of ``k`` consecutive pure-decode steps whose contexts grow by one token each."""
        ...

    def request_s(self, prompt_tokens: int, running: int = 0) -> float:
        """The engine's time for a request before its scheduler sees it, arriving while ``running``
        requests run (0 where none was measured)."""
        ...

    def prefill_only_s(self, new: int, cached: int) -> float:
        """Time to prefill ``new`` tokens over ``cached`` ones in a step of their own."""
        ...

    def h2d_s(self, nbytes: float, outstanding_s: float = 0.0) -> float: ...

    def d2h_s(self, nbytes: float) -> float: ...

    def ssd_read_s(self, nbytes: float) -> float: ...

    def kv_bytes(self, tokens: int) -> int:
        """KV bytes of ``tokens`` tokens on one rank."""
        ...

    def cohort_gain_bounds(
        self, contexts: Sequence[int] | np.ndarray, cuts: np.ndarray | None = None, launch_allowance_s: float = 3e-4
    ) -> GainBounds:
        """Predicted and conservative gains of every cut (``None``: 1..n-1): the paired model of the
        profile's ``cohort_gain`` section when it has one (``coda.cost.paired``), else the model's own."""
        ...


class AnalyticCost(CohortGains):
    """Roofline model from the profile's GPU and model description.

    Dense/MoE part: max(weight bytes / bandwidth, 2 x active params x tokens / FLOP/s), where
    the MoE weights read are the experts the step's tokens touch (expected distinct experts of
    top-k routing). Decode attention: KV bytes read / bandwidth plus per-request and per-layer
    launch costs; linear in the batch's total context, so v0 predicts no gain from cohort splits
    (a split only adds launches). Prefill attention: causal FLOPs over new and cached tokens.
    Under tensor parallelism (``profile.tp``) weights, FLOPs and KV are split across the ranks
    and a step adds the collectives vLLM issues (``coda.cost.parallel``).
    """

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        g, m = profile.gpu, profile.model
        tp = self._tp = profile.tp
        self._bw = g.hbm_bw_bytes_s * g.mem_efficiency
        self._flops = g.peak_flops * g.compute_efficiency
        self._attn_flops = g.peak_flops * g.attn_compute_efficiency
        self._kv_tok = m.kv_bytes_per_token // min(tp, m.num_kv_heads)
        # causal attention FLOPs per (query token x key token), all layers: QK^T and PV.
        self._attn_pair_flops = 4.0 * m.num_q_heads / tp * m.head_dim * m.num_layers
        self._launch = profile.overheads.attn_launch_per_layer_s * m.num_layers
        self.comm = tensor_parallel_comm(profile)

    # --- weights ---------------------------------------------------------------------------
    def dense_s(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        m = self.profile.model
        nbytes = m.dense_weight_bytes
        if m.num_experts:
            nbytes += expected_experts(tokens, m.num_experts, m.experts_per_token) * m.expert_bytes * m.num_layers
        compute = max(nbytes / self._bw, 2.0 * m.active_params * tokens / self._flops) / self._tp
        return compute + (self.comm.step_s(tokens, 0) if self.comm is not None else 0.0)

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

    def unpaired_gain_bounds(self, contexts: np.ndarray, cuts: np.ndarray | None, launch_allowance_s: float) -> GainBounds:
        """Linear in total context: a split only adds a launch; no validated bounds, so never in domain."""
        return no_split_gains(len(contexts), cuts, self.decode_attention_s(contexts), self._launch, launch_allowance_s)

    def prefill_attention_s(self, new: int, cached: int) -> float:
        if new <= 0:
            return 0.0
        flops = self._attn_pair_flops * new * (cached + (new + 1) / 2.0)
        return max(flops / self._attn_flops, (cached + new) * self._kv_tok / self._bw) + self._launch

    # --- steps -----------------------------------------------------------------------------
    def step_s(
        self, prefill_chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int] | np.ndarray, plan: CohortPlan | None = None
    ) -> float:
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
        # Contexts grow by one token per step; between the end points the step time is taken as
        # linear (exact for v0; for the kernel model an interpolation, since its split choice
        # and drain change only at KV-block edges, a few tokens apart at most once per run).
        return np.linspace(first, last, k)

    def prefill_only_s(self, new: int, cached: int) -> float:
        if new <= 0:
            return 0.0
        return self.profile.overheads.step_s + self.dense_s(new) + self.prefill_attention_s(new, cached)

    def request_s(self, prompt_tokens: int, running: int = 0) -> float:
        return 0.0  # an analytic profile describes kernels, not an engine's API

    # --- links -----------------------------------------------------------------------------
    def h2d_s(self, nbytes: float, outstanding_s: float = 0.0) -> float:
        return self.profile.h2d.seconds(nbytes) + max(0.0, outstanding_s)

    def d2h_s(self, nbytes: float) -> float:
        return self.profile.d2h.seconds(nbytes)

    def ssd_read_s(self, nbytes: float) -> float:
        return self.profile.ssd_read.seconds(nbytes)

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self._kv_tok


class KernelCost(AttentionSteps, AnalyticCost):
    """The analytic dense/MoE part with kernel-level attention (``coda.cost.attention``).

    Decode batches run FA2 split-KV (or the ``balanced`` family) laid out longest first; steps
    with prefill chunks run FA2's varlen kernel over all their tokens, which is also what
    ``prefill_only_s`` charges (its quadratic term comes from the causal m-blocks). A cohort plan
    charges the two cohorts' launches, each with its own launch cost and split choice.
    """

    def __init__(self, profile: Profile) -> None:
        super().__init__(profile)
        att, m = profile.attention, profile.model
        if att is None:
            raise ValueError(f"profile {profile.name} has no attention section")
        self.kernel = KernelAttention(profile.name, profile.gpu, att, layers=m.num_layers, q_heads=max(1, m.num_q_heads // self._tp),
                                      kv_heads=max(1, m.num_kv_heads // self._tp), head_dim=m.head_dim, kv_dtype_bytes=m.kv_dtype_bytes)

    def in_domain(self, contexts: Sequence[int] | np.ndarray) -> bool:
        """Whether a decode batch lies inside the measured domain (else predictions extrapolate)."""
        return self.kernel.in_domain(contexts)

    def decode_attention_s(self, contexts: np.ndarray) -> float:
        return self.kernel.decode_s(contexts)

    def cohort_attention_s(self, contexts: np.ndarray, plan: CohortPlan) -> float:
        return self.kernel.cohorts_s(contexts, plan.cut)

    def varlen_attention_s(self, prefill_chunks: Sequence[tuple[int, int]], decode_contexts: np.ndarray) -> float:
        return self.kernel.varlen_s(prefill_chunks, decode_contexts)

    def prefill_attention_s(self, new: int, cached: int) -> float:
        if new <= 0:
            return 0.0
        return self.varlen_attention_s([(new, cached)], np.empty(0, dtype=np.int64))

    @property
    def step_fixed_s(self) -> float:
        return self.profile.overheads.step_s

    def operators_s(self, tokens: int, sequences: int) -> float:
        return self.dense_s(tokens)

    def unpaired_gain_bounds(self, contexts: np.ndarray, cuts: np.ndarray | None, launch_allowance_s: float) -> GainBounds:
        return self.kernel.gain_bounds(contexts, cuts, launch_allowance_s)


def build_cost_model(profile: Profile) -> CostModel:
    """The operator model of an operators profile, the empirical step model of a measured one, the
    kernel-level model when a profile has an attention section, else the analytic roofline."""
    if profile.kind == "operators":
        return OperatorCost(profile)
    if profile.kind == "measured":
        return EmpiricalCost(profile)
    if profile.attention is not None:
        return KernelCost(profile)
    return AnalyticCost(profile)
