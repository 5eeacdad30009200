"""State admission: which waiting request prepares its KV state next on a worker."""

from __future__ import annotations

from typing import Protocol

from coda.types import AdmissionSnapshot


class StatePolicy(Protocol):
    name: str
    #: how many oldest-ready candidates the policy looks at per decision
    frontier: int

    def choose(self, snap: AdmissionSnapshot) -> int | None:
        """Index of the candidate to admit now, or ``None`` to admit nothing at this opportunity."""
        ...


class Fifo:
    """vLLM's first-come-first-served: the oldest ready request, and nothing while it does not fit."""

    name = "fifo"
    frontier = 1

    def choose(self, snap: AdmissionSnapshot) -> int | None:
        if snap.candidates and snap.candidates[0].fits:
            return 0
        return None
