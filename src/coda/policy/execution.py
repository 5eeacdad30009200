"""Execution admission: how a pure-decode batch's attention is launched."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from coda.cost.model import CohortPlan, CostModel
from coda.policy.contracts import ExecutionPolicy


@dataclass(frozen=True, slots=True)
class FullBatch(ExecutionPolicy):
    """One attention launch for the whole batch (what every engine does today)."""

    name: str = "full"

    def plan(self, contexts: np.ndarray) -> CohortPlan | None:
        return None


@dataclass(frozen=True, slots=True)
class Cohort(ExecutionPolicy):
    """Coda's Compatibility-Aware execution admission.

    Only for pure-decode batches of at least ``min_requests`` whose max/min context is at least
    ``min_ratio``: sort by context and consider every cut ``k`` (the short cohort's size) with
    ``m <= k <= n - m``, ``m = max(m_min, ceil(rho * n))``; take the cut with the largest
    predicted relative gain of attention time (ties: the more balanced split, then the smaller
    cut) and apply it only if its *conservative* gain, after ``launch_allowance_s`` per
    iteration, is at least ``gamma``. The bounds come from the cost model's validated residuals;
    a model that cannot bound its error (out of its measured domain, or the analytic v0 without
    ``cohort_gain_bounds``) never splits.
    """

    cost: CostModel = field(compare=False)
    min_requests: int = 4
    min_ratio: float = 1.5
    rho: float = 0.35
    m_min: int = 2
    gamma: float = 0.05
    launch_allowance_s: float = 3e-4
    name: str = "cohort"

    def plan(self, contexts: np.ndarray) -> CohortPlan | None:
        n = len(contexts)
        if n < self.min_requests:
            return None
        srt = np.sort(contexts)
        if srt[-1] < self.min_ratio * srt[0]:
            return None
        m = max(self.m_min, math.ceil(self.rho * n))
        if m > n - m:
            return None
        cuts = np.arange(m, n - m + 1)
        gb = self.cost.cohort_gain_bounds(srt, cuts, self.launch_allowance_s)
        if not gb.in_domain:
            return None
        best = np.lexsort((gb.cuts, np.abs(2 * gb.cuts - n), -gb.predicted))[0]
        if gb.conservative[best] < self.gamma:
            return None
        return CohortPlan(cut=int(gb.cuts[best]), gain_lower_bound=float(gb.conservative[best]))
