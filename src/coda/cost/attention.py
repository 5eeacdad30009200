"""Kernel-level attention of one rank (``coda.cost.kernels``), shared by the kernel and the
operator cost models: decode launches with FA2's split rule, varlen launches for steps with
prefill chunks, cohort splits and their validated gain bounds."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from coda.cost.cohorts import CohortPlan, GainBounds, admissible_cuts
from coda.cost.profile import AttentionSpec, GpuSpec
from coda.errors import CodaError


def load_kernels(profile_name: str) -> ModuleType:
    """``coda.cost.kernels``, imported when a profile first needs it: its numba kernels are not part
    of the base install (what vLLM's scheduler plugin needs), only of ``coda[sim]``."""
    try:
        from coda.cost import kernels
    except ModuleNotFoundError as err:
        if err.name != "numba":
            raise
        raise CodaError(
            f"profile {profile_name} has an attention section, whose kernel model needs numba: pip install 'coda[sim]'"
        ) from None
    return kernels


class KernelAttention:
    """Attention seconds of every layer of one rank, from the kernel model's fitted constants."""

    def __init__(
        self,
        profile_name: str,
        gpu: GpuSpec,
        att: AttentionSpec,
        *,
        layers: int,
        q_heads: int,
        kv_heads: int,
        head_dim: int,
        kv_dtype_bytes: int,
    ) -> None:
        kernels = self._k = load_kernels(profile_name)
        tok = 2.0 * head_dim * kv_dtype_bytes  # bytes of one token-head (K and V)
        rate = att.cta_bw_bytes_s / tok
        self.fp = np.array(
            [gpu.hbm_bw_bytes_s * att.mem_efficiency / tok, rate, att.cta_overhead_s * rate, att.launch_s, att.per_request_s, att.combine_s]
        )
        family = kernels.FAMILY_BALANCED if att.family == "balanced" else kernels.FAMILY_FA2
        self.ip = np.array([gpu.num_sms * att.ctas_per_sm, 2 * gpu.num_sms, kv_heads, q_heads, att.block_n, family], dtype=np.int64)
        self.layers = layers
        self._lo, self._hi = att.bounds.lower, att.bounds.upper
        self._domain = att.domain

    def in_domain(self, contexts: Sequence[int] | np.ndarray) -> bool:
        """Whether a decode batch lies inside the measured domain (else predictions extrapolate)."""
        c = np.asarray(contexts)
        return len(c) > 0 and self._domain.contains(len(c), int(c.min()), int(c.max()))

    def decode_s(self, contexts: np.ndarray) -> float:
        c = np.asarray(contexts, dtype=np.int64)
        if len(c) == 0:
            return 0.0
        return self.layers * self._k.decode_layer_s(c, self.fp, self.ip)

    def cohorts_s(self, contexts: np.ndarray, cut: int) -> float:
        c = np.sort(np.asarray(contexts, dtype=np.int64))
        return self.decode_s(c[:cut]) + self.decode_s(c[cut:])

    def varlen_s(self, prefill_chunks: Sequence[tuple[int, int]], decode_contexts: np.ndarray) -> float:
        new = np.array([p for p, _ in prefill_chunks], dtype=np.int64)
        cached = np.array([c for _, c in prefill_chunks], dtype=np.int64)
        return self.layers * self._k.varlen_layer_s(np.asarray(decode_contexts, dtype=np.int64), new, cached, self.fp, self.ip)

    def gain_bounds(self, contexts: Sequence[int] | np.ndarray, cuts: np.ndarray | None, launch_allowance_s: float) -> GainBounds:
        c = np.asarray(contexts, dtype=np.int64)
        k = admissible_cuts(len(c), cuts)
        pred, cons = self._k.gain_sweep(c, k, self.fp, self.ip, self._lo, self._hi, launch_allowance_s / self.layers)
        return GainBounds(k, pred, cons, self.in_domain(c))


class AttentionSteps:
    """A step of a model whose attention is one launch per step: varlen when it holds prefill
    chunks, two launches under a cohort plan, one decode launch otherwise; plus the model's fixed
    time per step and its other operators (``step_fixed_s``, ``operators_s``)."""

    if TYPE_CHECKING:  # what a model mixing this in provides
        step_fixed_s: float

        def operators_s(self, tokens: int, sequences: int) -> float: ...

        def varlen_attention_s(self, prefill_chunks: Sequence[tuple[int, int]], decode_contexts: np.ndarray) -> float: ...

        def cohort_attention_s(self, contexts: np.ndarray, plan: CohortPlan) -> float: ...

        def decode_attention_s(self, contexts: np.ndarray) -> float: ...

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
        return self.step_fixed_s + self.operators_s(tokens, len(chunks) + len(ctx)) + attn
