"""What execution admission asks of every cost model, in types of its own: a cohort split of a
decode batch and the gains of each cut. A module of its own so that every model (analytic,
kernel, empirical, operators) imports it without importing the others."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


@dataclass(frozen=True, slots=True)
class CohortPlan:
    """Split of a pure-decode batch's attention: the ``cut`` shortest contexts form one cohort.
    ``predicted_gain`` and ``gain_lower_bound``: the cut's predicted and conservative relative gain
    of attention time (``predicted_gain`` is None where no model predicted it)."""

    cut: int
    gain_lower_bound: float = 0.0
    predicted_gain: float | None = None


class GainBounds(NamedTuple):
    """Relative attention gain of each cut (the ``cut`` shortest contexts form the short cohort).

    ``predicted`` = (T_full - T_short - T_long) / T_full; ``conservative`` uses the lower
    residual bound of the full batch, the upper bounds of the cohorts and a launch allowance.
    ``in_domain`` is False when the profile has no validated bounds or the batch lies outside
    its measured domain: callers must not split then. A paired gain model (``coda.cost.paired``)
    also marks single cuts outside its measured ranges, with -inf in both arrays.
    """

    cuts: np.ndarray
    predicted: np.ndarray
    conservative: np.ndarray
    in_domain: bool


#: What the paired gain model (``coda.cost.paired``) sees of a cut, the quantities the Coda paper
#: names: the context-length ratio (the long cohort's longest context over the short cohort's),
#: the cut fraction (short cohort's share of the requests) and each cohort's total and maximum
#: context, totals and maxima as log2 (they span four orders of magnitude).
CUT_FEATURES = ("log2_ratio", "cut_fraction", "log2_short_total", "log2_long_total", "log2_short_max", "log2_long_max")


def cut_features(contexts: np.ndarray | Sequence[int], cuts: np.ndarray) -> dict[str, np.ndarray]:
    """``CUT_FEATURES`` of each cut of a batch: the ``cut`` shortest contexts form the short cohort.

    Defined for any batch; on a two-level batch (``n - nb`` at ``kvs``, ``nb`` at ``kv_big``) cut at
    ``n - nb`` they are log2(kv_big / kvs), (n - nb) / n, log2((n - nb) kvs), log2(nb kv_big),
    log2(kvs) and log2(kv_big).
    """
    c = np.sort(np.asarray(contexts, dtype=np.float64))
    k = np.asarray(cuts, dtype=np.int64)
    prefix = np.concatenate([[0.0], np.cumsum(c)])
    short_max, long_max = c[k - 1], np.full(len(k), c[-1])
    return {
        "log2_ratio": np.log2(long_max / short_max),
        "cut_fraction": k / len(c),
        "log2_short_total": np.log2(prefix[k]),
        "log2_long_total": np.log2(prefix[-1] - prefix[k]),
        "log2_short_max": np.log2(short_max),
        "log2_long_max": np.log2(long_max),
    }


def admissible_cuts(n: int, cuts: np.ndarray | Sequence[int] | None) -> np.ndarray:
    """``cuts`` checked against a batch of ``n`` (``None``: every cut 1..n-1)."""
    if cuts is None:
        return np.arange(1, n, dtype=np.int64)
    arr = np.asarray(cuts, dtype=np.int64)
    if len(arr) and (arr.min() < 1 or arr.max() > n - 1):
        raise ValueError(f"cuts must lie in 1..{n - 1} for {n} contexts")
    return arr


def no_split_gains(
    n: int, cuts: np.ndarray | Sequence[int] | None, full_s: float, split_cost_s: float, launch_allowance_s: float
) -> GainBounds:
    """Gains of a model whose attention is linear in total context: a split only adds
    ``split_cost_s`` (a launch), and nothing about splits was validated (never in domain)."""
    k = admissible_cuts(n, cuts)
    if full_s <= 0:
        zero = np.zeros(len(k))
        return GainBounds(k, zero, zero, False)
    pred = np.full(len(k), -split_cost_s / full_s)
    return GainBounds(k, pred, pred - launch_allowance_s / full_s, False)
