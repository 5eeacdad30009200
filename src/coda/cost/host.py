"""Host CPU in the step: the work an engine's steps wait for, or run beside, outside the forward pass.

A served engine's API server parses and tokenizes each request, detokenizes and frames every
streamed token, and its scheduler runs Python every step. On a GPU engine that CPU overlaps the
forward pass (a step lasts the longer of the two); on vLLM-CPU, with one core per worker, it
serializes with it (a step lasts their sum). The constants are a profile's ``step_model.host``
section (``coda.cost.profile.HostCosts``), fitted from probes through the API
(``coda.profiling.empirical_fit.fit_host``); a profile without one charges nothing here.

A request's own API time while the engine is idle is latency, charged before the scheduler
(``request_s`` of the cost model); only a request that arrives while steps run takes CPU from them.

Engines that share a machine also share its cores. Where the profile measured a ``contended``
section, a step taken while the engines serving at once want more cores than the machine has
lasts the contended form of its time (``coda.cost.profile.ContendedSteps``); ``Serving`` counts
the engines of one simulated machine that are taking steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coda.cost.profile import ContendedSteps, Profile


class Serving:
    """The engines of one machine that are taking steps now (shared by a cluster's workers)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


@dataclass(frozen=True, slots=True)
class HostModel:
    """Host CPU seconds per request, prompt token, streamed output token and step (``HostCosts``)."""

    request_s: float
    prompt_token_s: float
    output_token_s: float
    step_s: float
    shares_cores: bool
    contended: ContendedSteps | None = None

    @classmethod
    def of(cls, profile: Profile) -> HostModel | None:
        """The profile's host model; None where it measured none (its steps are charged as before)."""
        host = profile.step_model.host if profile.step_model is not None else None
        if host is None:
            return None
        return cls(**host.model_dump(exclude={"contended"}), contended=host.contended)

    def arrival_s(self, prompt_tokens: int) -> float:
        """CPU the API server spends on a request of ``prompt_tokens`` before its scheduler sees it."""
        return self.request_s + self.prompt_token_s * prompt_tokens

    def steps_s(self, forward_s: np.ndarray, outputs: int, backlog_s: float, serving: int = 1) -> np.ndarray:
        """Durations of steps whose forward passes take ``forward_s``, each emitting ``outputs``
        tokens; the first also carries ``backlog_s``, the CPU of requests that arrived while the
        engine ran; ``serving`` engines of the machine take steps now (this one included). Shared
        cores add the host's time to the forward's, separate ones overlap them."""
        if self.contended is not None and self.contended.contended(serving):
            forward_s = self.contended.base_s + self.contended.scale * forward_s
        host = np.full(len(forward_s), self.step_s + self.output_token_s * outputs)
        host[0] += backlog_s
        return forward_s + host if self.shares_cores else np.maximum(forward_s, host)
