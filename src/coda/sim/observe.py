"""Observers: read-only hooks into a running simulation (characterization, shadow analyses).

An observer sees each engine batch as it is scheduled and each routing decision with the
snapshot it was made on. Observers must not mutate what they are given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from coda.cost.model import CohortPlan
from coda.policy.snapshots import RoutingSnapshot


class SimObserver(Protocol):
    #: extra routing-snapshot fields the observer needs built ("match", "decode_contexts")
    worker_fields: frozenset[str]

    def on_step(
        self,
        worker: int,
        start_s: float,
        durations_s: np.ndarray,
        prefill_chunks: Sequence[tuple[int, int]],
        decode_contexts: np.ndarray,
        plan: CohortPlan | None,
    ) -> None:
        """A batch that has just run: ``len(durations_s)`` consecutive steps (more than one only for a
        pure-decode run, which an arrival may have cut short; only executed steps are reported)
        starting at ``start_s``; prefill chunks are ``(new_tokens, cached_tokens)`` before the step;
        ``decode_contexts`` are the decoders' contexts at the first step (each grows by one token per
        step of a pure-decode run)."""
        ...

    def on_route(self, snap: RoutingSnapshot, chosen: int) -> None: ...
