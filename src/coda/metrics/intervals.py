"""Medians over a few repeats, with 95% percentile-bootstrap intervals, and ratios of medians
with theirs: what a benchmark that reruns each configuration a handful of times can say."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: bootstrap resamples per interval
BOOTSTRAP = 2000


def median_ci(values: Sequence[float | None], rng: np.random.Generator) -> tuple[float | None, list[float] | None]:
    """Median and its 95% percentile-bootstrap interval (None with fewer than two values)."""
    arr = np.array([v for v in values if v is not None], dtype=float)
    if arr.size == 0:
        return None, None
    if arr.size == 1:
        return float(arr[0]), None
    boot = np.median(rng.choice(arr, size=(BOOTSTRAP, arr.size)), axis=1)
    return float(np.median(arr)), [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]


def median_ratio_ci(
    num: Sequence[float | None], den: Sequence[float | None], rng: np.random.Generator
) -> tuple[float | None, list[float] | None]:
    """Ratio of medians and its 95% interval, each side resampled on its own (None where a median is 0 or missing)."""
    a = np.array([v for v in num if v is not None], dtype=float)
    b = np.array([v for v in den if v is not None], dtype=float)
    if a.size == 0 or b.size == 0 or np.median(b) == 0:
        return None, None
    point = float(np.median(a) / np.median(b))
    if a.size < 2 or b.size < 2:
        return point, None
    ma = np.median(rng.choice(a, size=(BOOTSTRAP, a.size)), axis=1)
    mb = np.median(rng.choice(b, size=(BOOTSTRAP, b.size)), axis=1)
    ok = mb != 0
    r = ma[ok] / mb[ok]
    return point, [float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))]
