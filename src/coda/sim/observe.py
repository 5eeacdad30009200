"""Observers: read-only hooks into a running simulation (characterization, analyses, experiments).

An observer sees each engine batch as it is scheduled, each state-admission decision and each
routing decision, with the snapshot it was made on. Observers must not mutate what they are given.
Subclass ``SimObserver`` and override what you need: the others do nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coda.cost.model import CohortPlan
from coda.policy.snapshots import AdmissionSnapshot, RoutingSnapshot


class SimObserver:
    #: optional ``WorkerView`` fields the observer needs built in routing snapshots
    #: (``coda.policy.contracts.WORKER_FIELDS``)
    worker_fields: frozenset[str] = frozenset()

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

    def on_admission(self, worker: int, snap: AdmissionSnapshot, chosen: int | None) -> None:
        """A state-admission decision of ``worker``'s policy on ``snap`` (``None``: it admitted nothing)."""

    def on_route(self, snap: RoutingSnapshot, chosen: int) -> None:
        """A routing decision on ``snap``."""
