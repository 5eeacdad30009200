"""Execution admission: how a pure-decode batch's attention is launched."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from coda.cost.model import CohortPlan


class ExecutionPolicy(Protocol):
    name: str

    def plan(self, contexts: np.ndarray) -> CohortPlan | None:
        """A cohort split for this pure-decode batch, or ``None`` to run it as one batch."""
        ...


class FullBatch:
    """One attention launch for the whole batch (what every engine does today)."""

    name = "full"

    def plan(self, contexts: np.ndarray) -> CohortPlan | None:
        return None
