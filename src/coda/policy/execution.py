"""Execution admission: how a pure-decode batch's attention is launched."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from coda.cost.model import CohortPlan, CostModel
from coda.policy.contracts import ExecutionPolicy, PlanChoice


@dataclass(frozen=True, slots=True)
class FullBatch(ExecutionPolicy):
    """One attention launch for the whole batch (what every engine does today)."""

    name: str = "full"

    def plan(self, contexts: np.ndarray) -> CohortPlan | None:
        return None

    def explain(self, contexts: np.ndarray) -> PlanChoice:
        return PlanChoice(None, "full: one launch")


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
        return self.explain(contexts).plan

    def explain(self, contexts: np.ndarray) -> PlanChoice:
        n = len(contexts)
        if n < self.min_requests:
            return PlanChoice(None, "cohort: fewer than min_requests")
        srt = np.sort(contexts)
        if srt[-1] < self.min_ratio * srt[0]:
            return PlanChoice(None, "cohort: contexts within min_ratio")
        m = max(self.m_min, math.ceil(self.rho * n))
        if m > n - m:
            return PlanChoice(None, "cohort: no cut leaves both cohorts m requests")
        cuts = np.arange(m, n - m + 1)
        gb = self.cost.cohort_gain_bounds(srt, cuts, self.launch_allowance_s)
        if not gb.in_domain:
            return PlanChoice(None, "cohort: no validated gain bounds for this batch")
        best = np.lexsort((gb.cuts, np.abs(2 * gb.cuts - n), -gb.predicted))[0]
        if gb.conservative[best] < self.gamma:
            return PlanChoice(None, "cohort: conservative gain below gamma")
        plan = CohortPlan(cut=int(gb.cuts[best]), gain_lower_bound=float(gb.conservative[best]), predicted_gain=float(gb.predicted[best]))
        return PlanChoice(plan, "cohort: conservative gain at least gamma")


@dataclass(frozen=True, slots=True)
class SplitAlways(ExecutionPolicy):
    """Every pure-decode batch of at least ``min_requests`` with two distinct contexts is split at
    the largest ratio between neighbouring sorted contexts, whatever the predicted gain: for
    checking that a split changes no output, and for measuring what splits cost where no model
    predicts their gain. Not a serving policy."""

    min_requests: int = 2
    name: str = "split_always"

    def plan(self, contexts: np.ndarray) -> CohortPlan | None:
        return self.explain(contexts).plan

    def explain(self, contexts: np.ndarray) -> PlanChoice:
        if len(contexts) < max(2, self.min_requests):
            return PlanChoice(None, "split_always: fewer than min_requests")
        srt = np.sort(np.asarray(contexts, dtype=np.float64))
        if srt[0] == srt[-1]:
            return PlanChoice(None, "split_always: one context length")
        cut = int(np.argmax(srt[1:] / srt[:-1])) + 1
        return PlanChoice(CohortPlan(cut=cut, gain_lower_bound=-math.inf), "split_always: largest neighbour ratio")
