"""The empirical step model: an engine's step time as measured through its API.

A live engine's internals are not visible from its API, so instead of a hardware model the step
time is a linear function of what a step holds (``step_features``), with constants fitted to
timings of controlled requests (``coda.profiling.empirical_fit``):

    step = fixed + token x (prefill tokens + decodes) + seq x (prefill chunks + decodes)
           + pair x sum of new x (cached + (new + 1) / 2) + context x sum of decode contexts

The pair term is causal prefill attention (quadratic in a chunk's size); the context term is
decode attention (linear in each context, so splitting a batch into cohorts gains nothing and the
model never claims validated bounds for it). No host link is measured: a profile of this kind
describes one engine without KV offload, and a transfer asked of it is an error.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coda.cost.cohorts import CohortPlan, GainBounds, no_split_gains
from coda.cost.paired import CohortGains
from coda.cost.profile import Profile
from coda.errors import CodaError

# Order of the step constants in ``step_features`` and ``EmpiricalCost.theta``.
TERMS = ("fixed_s", "token_s", "seq_s", "prefill_pair_s", "decode_context_s")


def pairs(new: int, cached: int) -> float:
    """Causal attention (query, key) pairs of a prefill chunk of ``new`` tokens over ``cached`` ones."""
    return new * (cached + (new + 1) / 2.0)


def step_features(prefill_chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int] | np.ndarray) -> np.ndarray:
    """The quantities each step constant multiplies, in ``TERMS`` order."""
    ctx = np.asarray(decode_contexts, dtype=np.float64)
    new = sum(n for n, _ in prefill_chunks)
    return np.array(
        [1.0, new + len(ctx), len(prefill_chunks) + len(ctx), sum(pairs(n, c) for n, c in prefill_chunks), float(ctx.sum())]
    )


class EmpiricalCost(CohortGains):
    """``CostModel`` of a ``measured`` profile (its ``step_model`` section)."""

    def __init__(self, profile: Profile) -> None:
        sm = profile.step_model
        if sm is None:
            raise ValueError(f"profile {profile.name} has no step_model section")
        self.profile = profile
        self.theta = np.array([getattr(sm, t) for t in TERMS])
        self._ctx_s = sm.decode_context_s
        self._kv_tok = sm.kv_bytes_per_token
        self._api = (sm.api_latency_s, sm.api_text_token_s, sm.api_stream_s, sm.api_stream_token_s)

    def request_s(self, prompt_tokens: int, running: int = 0) -> float:
        """What a client of text prompts waits beyond the engine's steps (the API server's work, more
        while it streams for ``running`` other requests), charged by the simulator before the
        request reaches the scheduler."""
        latency, per_token, stream, stream_token = self._api
        return latency + per_token * prompt_tokens + (stream + stream_token * prompt_tokens) * running

    def step_s(
        self, prefill_chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int] | np.ndarray, plan: CohortPlan | None = None
    ) -> float:
        chunks = [(n, c) for n, c in prefill_chunks if n > 0]
        if not chunks and len(decode_contexts) == 0:
            return 0.0
        return float(self.theta @ step_features(chunks, decode_contexts))

    def decode_steps_s(self, contexts: np.ndarray, k: int, plan: CohortPlan | None = None) -> np.ndarray:
        # Every context grows by one token per step, so each step costs len(contexts) x context more.
        return self.step_s((), contexts) + np.arange(k) * (len(contexts) * self._ctx_s)

    def decode_attention_s(self, contexts: np.ndarray) -> float:
        return float(np.sum(contexts)) * self._ctx_s

    def unpaired_gain_bounds(self, contexts: np.ndarray, cuts: np.ndarray | None, launch_allowance_s: float) -> GainBounds:
        """Linear attention: a split gains nothing, and nothing about splits was measured (never in domain)."""
        return no_split_gains(len(contexts), cuts, self.decode_attention_s(contexts), 0.0, launch_allowance_s)

    def prefill_only_s(self, new: int, cached: int) -> float:
        return self.step_s([(new, cached)], ()) if new > 0 else 0.0

    def _no_link(self, nbytes: float, what: str) -> float:
        if nbytes > 0:
            raise CodaError(
                f"profile {self.profile.name} measured one engine without KV offload and has no {what} link; "
                "simulate it without DRAM and SSD tiers (--no-dram)"
            )
        return 0.0

    def h2d_s(self, nbytes: float, outstanding_s: float = 0.0) -> float:
        return self._no_link(nbytes, "host-to-device") + max(0.0, outstanding_s)

    def d2h_s(self, nbytes: float) -> float:
        return self._no_link(nbytes, "device-to-host")

    def ssd_read_s(self, nbytes: float) -> float:
        return self._no_link(nbytes, "SSD")

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self._kv_tok
