"""The paired cohort-gain model: a regression of measured full-versus-cohort gains.

The kernel model predicts a split's gain from three separately predicted launch times, so its
conservative bound stacks three residual bounds and is rarely positive. When a profile carries a
``cohort_gain`` section (fitted by ``coda profile fit-gain`` on pairs of measured launches: the
full skewed batch, and its two cohorts as uniform batches) the gain itself is predicted from the
cut's features and bounded by one held-out residual, as the Coda paper's Appendix A describes.
Outside the measured domain the model does not answer, so execution admission does not split.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from coda.cost.cohorts import GainBounds, admissible_cuts, cut_features
from coda.cost.profile import CohortGainSpec

LEVERAGE_TOLERANCE = 1e-9  # assumed: rounding, so that a measured pair's own leverage stays inside

if TYPE_CHECKING:
    from coda.cost.profile import Profile


def term_matrix(features: dict[str, np.ndarray], terms: Sequence[str]) -> np.ndarray:
    """One column per term (a product of features written ``a*b``), one row per cut."""
    rows = len(next(iter(features.values())))
    out = np.ones((rows, len(terms)))
    for j, term in enumerate(terms):
        for name in term.split("*"):
            out[:, j] *= features[name]
    return out


def gain_of_log_speedup(z: np.ndarray | float) -> np.ndarray:
    """Relative gain (T_full - T_short - T_long) / T_full from z = ln(T_full / (T_short + T_long))."""
    return -np.expm1(-np.asarray(z, dtype=np.float64))


class PairedGain:
    """Predicted and conservative gains of a profile's ``cohort_gain`` section."""

    def __init__(self, spec: CohortGainSpec) -> None:
        self.spec = spec
        self._coef = np.array(spec.coefficients)
        self._used = sorted({f for t in spec.terms for f in t.split("*")})
        self._r_inv = np.array(spec.domain.design_r_inverse)

    def batch_in_domain(self, contexts: np.ndarray) -> bool:
        d = self.spec.domain
        return d.batch_min <= len(contexts) <= d.batch_max and d.context_min <= contexts.min() and contexts.max() <= d.context_max

    def log_speedup(self, terms: np.ndarray) -> np.ndarray:
        return self.spec.intercept + terms @ self._coef

    def leverage(self, terms: np.ndarray) -> np.ndarray:
        """Each cut's leverage in the fit's design: how far its terms lie from the measured pairs'."""
        x = np.column_stack([np.ones(len(terms)), terms])
        return np.sum((x @ self._r_inv) ** 2, axis=1)

    def bounds(self, contexts: np.ndarray, cuts: np.ndarray | None, full_s: float, launch_allowance_s: float) -> GainBounds:
        """Gains of each cut; ``full_s`` (the model's time of the full batch's attention) turns the
        launch allowance into a share. Cuts outside the measured feature ranges or leverage get
        -inf, and a batch outside the measured sizes and contexts is not in domain."""
        k = admissible_cuts(len(contexts), cuts)
        if len(k) == 0 or full_s <= 0 or not self.batch_in_domain(contexts):
            none = np.full(len(k), -np.inf)
            return GainBounds(k, none, none, False)
        feats = cut_features(contexts, k)
        terms = term_matrix(feats, self.spec.terms)
        d = self.spec.domain
        inside = self.leverage(terms) <= d.leverage_max * (1 + LEVERAGE_TOLERANCE)
        for name in self._used:
            lo, hi = d.features[name]
            inside &= (feats[name] >= lo) & (feats[name] <= hi)
        z = self.log_speedup(terms)
        pred = np.where(inside, gain_of_log_speedup(z), -np.inf)
        cons = np.where(inside, gain_of_log_speedup(z - self.spec.residual_bound) - launch_allowance_s / full_s, -np.inf)
        return GainBounds(k, pred, cons, bool(inside.any()))


class CohortGains:
    """``cohort_gain_bounds`` for every cost model: the paired model of the profile's
    ``cohort_gain`` section when it has one, else the model's own ``unpaired_gain_bounds``."""

    if TYPE_CHECKING:  # what a model mixing this in provides
        profile: Profile

        def decode_attention_s(self, contexts: np.ndarray) -> float: ...

        def unpaired_gain_bounds(self, contexts: np.ndarray, cuts: np.ndarray | None, launch_allowance_s: float) -> GainBounds: ...

    @cached_property
    def paired(self) -> PairedGain | None:
        section = self.profile.cohort_gain
        return PairedGain(section) if section is not None else None

    def cohort_gain_bounds(
        self, contexts: Sequence[int] | np.ndarray, cuts: np.ndarray | None = None, launch_allowance_s: float = 3e-4
    ) -> GainBounds:
        """Predicted and conservative gains of every cut (``None``: 1..n-1)."""
        c = np.asarray(contexts, dtype=np.int64)
        if self.paired is None:
            return self.unpaired_gain_bounds(c, cuts, launch_allowance_s)
        return self.paired.bounds(c, cuts, self.decode_attention_s(c) if len(c) else 0.0, launch_allowance_s)
