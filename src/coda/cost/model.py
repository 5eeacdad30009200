"""Cost model protocol, the analytic roofline model (v0) and the kernel-level model.

One engine step reads the dense/MoE weights once whatever its mix of prefill and decode, then
runs attention per request. ``step_s`` is what the simulator charges per iteration; ``h2d_s``,
``ssd_read_s`` and ``prefill_only_s`` are what state admission uses to rank requests;
``predict_decode``, ``predict_cohorts`` and ``cohort_gain_bounds`` are what execution admission
asks before splitting a decode batch. Nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from coda.cost.profile import Profile
from coda.errors import CodaError


@dataclass(frozen=True, slots=True)
class CohortPlan:
    """Split of a pure-decode batch's attention: the ``cut`` shortest contexts form one cohort."""

    cut: int
    gain_lower_bound: float = 0.0


class GainBounds(NamedTuple):
    """Relative attention gain of each cut (the ``cut`` shortest contexts form the short cohort).

    ``predicted`` = (T_full - T_short - T_long) / T_full; ``conservative`` uses the lower
    residual bound of the full batch, the upper bounds of the cohorts and a launch allowance.
    ``in_domain`` is False when the profile has no validated bounds or the batch lies outside
    its measured domain: callers must not split then.
    """

    cuts: np.ndarray
    predicted: np.ndarray
    conservative: np.ndarray
    in_domain: bool


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

    def predict_decode(self, contexts: Sequence[int] | np.ndarray) -> float:
        """Decode attention seconds of one launch over ``contexts``, all layers."""
        ...

    def predict_cohorts(self, contexts: Sequence[int] | np.ndarray, cut: int) -> float:
        """Decode attention seconds when the ``cut`` shortest contexts and the rest launch apart."""
        ...

    def cohort_gain_bounds(
        self, contexts: Sequence[int] | np.ndarray, cuts: np.ndarray | None = None, launch_allowance_s: float = 3e-4
    ) -> GainBounds:
        """Predicted and conservative gains of every cut (``None``: 1..n-1)."""
        ...


def _cuts(n: int, cuts: np.ndarray | Sequence[int] | None) -> np.ndarray:
    if cuts is None:
        return np.arange(1, n, dtype=np.int64)
    arr = np.asarray(cuts, dtype=np.int64)
    if len(arr) and (arr.min() < 1 or arr.max() > n - 1):
        raise ValueError(f"cuts must lie in 1..{n - 1} for {n} contexts")
    return arr


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

    def predict_decode(self, contexts: Sequence[int] | np.ndarray) -> float:
        return self.decode_attention_s(np.asarray(contexts))

    def predict_cohorts(self, contexts: Sequence[int] | np.ndarray, cut: int) -> float:
        return self.cohort_attention_s(np.asarray(contexts), CohortPlan(cut))

    def cohort_gain_bounds(
        self, contexts: Sequence[int] | np.ndarray, cuts: np.ndarray | None = None, launch_allowance_s: float = 3e-4
    ) -> GainBounds:
        """Linear in total context: a split only adds a launch; no validated bounds, so never in domain."""
        srt = np.sort(np.asarray(contexts, dtype=np.int64))
        k = _cuts(len(srt), cuts)
        full = self.decode_attention_s(srt)
        pred = -np.full(len(k), self._launch) / full if full > 0 else np.zeros(len(k))
        return GainBounds(k, pred, pred - launch_allowance_s / full if full > 0 else pred, False)

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

    # --- links -----------------------------------------------------------------------------
    def h2d_s(self, nbytes: float, outstanding_s: float = 0.0) -> float:
        return self.profile.h2d.seconds(nbytes) + max(0.0, outstanding_s)

    def d2h_s(self, nbytes: float) -> float:
        return self.profile.d2h.seconds(nbytes)

    def ssd_read_s(self, nbytes: float) -> float:
        return self.profile.ssd_read.seconds(nbytes)

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self._kv_tok


def _load_kernels(profile: Profile) -> ModuleType:
    """``coda.cost.kernels``, imported when a profile first needs it: its numba kernels are not part
    of the base install (what vLLM's scheduler plugin needs), only of ``coda[sim]``."""
    try:
        from coda.cost import kernels
    except ModuleNotFoundError as err:
        if err.name != "numba":
            raise
        raise CodaError(f"profile {profile.name} has an attention section, whose kernel model needs numba: pip install 'coda[sim]'") from None
    return kernels


class KernelCost(AnalyticCost):
    """The analytic dense/MoE part with kernel-level attention (``coda.cost.kernels``).

    Decode batches run FA2 split-KV (or the ``balanced`` family) laid out longest first; steps
    with prefill chunks run FA2's varlen kernel over all their tokens, which is also what
    ``prefill_only_s`` charges (its quadratic term comes from the causal m-blocks). A cohort plan
    charges the two cohorts' launches, each with its own launch cost and split choice.
    """

    def __init__(self, profile: Profile) -> None:
        super().__init__(profile)
        att = profile.attention
        if att is None:
            raise ValueError(f"profile {profile.name} has no attention section")
        kernels = self._k = _load_kernels(profile)
        g, m = profile.gpu, profile.model
        tok = 2.0 * m.head_dim * m.kv_dtype_bytes  # bytes of one token-head (K and V)
        rate = att.cta_bw_bytes_s / tok
        self._fp = np.array(
            [g.hbm_bw_bytes_s * att.mem_efficiency / tok, rate, att.cta_overhead_s * rate, att.launch_s, att.per_request_s, att.combine_s]
        )
        family = kernels.FAMILY_BALANCED if att.family == "balanced" else kernels.FAMILY_FA2
        self._ip = np.array(
            [g.num_sms * att.ctas_per_sm, 2 * g.num_sms, m.num_kv_heads, m.num_q_heads, att.block_n, family], dtype=np.int64
        )
        self._layers = m.num_layers
        self._lo, self._hi = att.bounds.lower, att.bounds.upper
        self._domain = att.domain

    def in_domain(self, contexts: Sequence[int] | np.ndarray) -> bool:
        """Whether a decode batch lies inside the measured domain (else predictions extrapolate)."""
        c = np.asarray(contexts)
        return len(c) > 0 and self._domain.contains(len(c), int(c.min()), int(c.max()))

    def decode_attention_s(self, contexts: np.ndarray) -> float:
        c = np.asarray(contexts, dtype=np.int64)
        if len(c) == 0:
            return 0.0
        return self._layers * self._k.decode_layer_s(c, self._fp, self._ip)

    def cohort_attention_s(self, contexts: np.ndarray, plan: CohortPlan) -> float:
        c = np.sort(np.asarray(contexts, dtype=np.int64))
        return self.decode_attention_s(c[: plan.cut]) + self.decode_attention_s(c[plan.cut :])

    def varlen_attention_s(self, prefill_chunks: Sequence[tuple[int, int]], decode_contexts: np.ndarray) -> float:
        new = np.array([p for p, _ in prefill_chunks], dtype=np.int64)
        cached = np.array([c for _, c in prefill_chunks], dtype=np.int64)
        return self._layers * self._k.varlen_layer_s(np.asarray(decode_contexts, dtype=np.int64), new, cached, self._fp, self._ip)

    def prefill_attention_s(self, new: int, cached: int) -> float:
        if new <= 0:
            return 0.0
        return self.varlen_attention_s([(new, cached)], np.empty(0, dtype=np.int64))

    def step_s(
        self, prefill_chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int] | np.ndarray, plan: CohortPlan | None = None
    ) -> float:
        ctx = np.asarray(decode_contexts, dtype=np.int64)
        chunks = [(n, c) for n, c in prefill_chunks if n > 0]
        tokens = len(ctx) + sum(n for n, _ in chunks)
        if tokens == 0:
            return 0.0
        if chunks:
            attn = self.varlen_attention_s(chunks, ctx)
        elif plan is not None:
            attn = self.cohort_attention_s(ctx, plan)
        else:
            attn = self.decode_attention_s(ctx)
        return self.profile.overheads.step_s + self.dense_s(tokens) + attn

    def cohort_gain_bounds(
        self, contexts: Sequence[int] | np.ndarray, cuts: np.ndarray | None = None, launch_allowance_s: float = 3e-4
    ) -> GainBounds:
        c = np.asarray(contexts, dtype=np.int64)
        k = _cuts(len(c), cuts)
        pred, cons = self._k.gain_sweep(c, k, self._fp, self._ip, self._lo, self._hi, launch_allowance_s / self._layers)
        n, lo, hi = len(c), int(c.min()), int(c.max())
        return GainBounds(k, pred, cons, self._domain.contains(n, lo, hi))


def build_cost_model(profile: Profile) -> CostModel:
    """The empirical step model of a measured profile, the kernel-level model when the profile has
    an attention section, else the analytic roofline."""
    if profile.kind == "measured":
        from coda.cost.empirical import EmpiricalCost  # it builds on this module's types

        return EmpiricalCost(profile)
    if profile.attention is not None:
        return KernelCost(profile)
    return AnalyticCost(profile)
