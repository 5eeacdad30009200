"""Tool-call duration predictor for tool-aware KV reclaim.

It learns only from tool calls that have already ended (their durations became observable when
the session's next request arrived), never from the call it predicts. For a call that has
been out for ``elapsed`` seconds it predicts the residual time D - elapsed over the durations D >
elapsed seen for the same tools (falling back to all tools): their mean, or their median.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Literal

import numpy as np

USER = "<user>"  # pseudo-tool: the session waits on its user (think time)


class _Samples:
    """Observed durations, sorted, as a list (for bisection) and an array (for the suffix sums,
    recomputed after each new sample without converting the list: a cluster's predictor holds
    every call its workers saw)."""

    __slots__ = ("values", "_array", "_suffix")

    def __init__(self) -> None:
        self.values: list[float] = []
        self._array = np.empty(0)
        self._suffix: np.ndarray | None = None

    def add(self, d: float) -> None:
        i = bisect.bisect_right(self.values, d)
        self.values.insert(i, d)
        self._array = np.insert(self._array, i, d)
        self._suffix = None

    def residual(self, elapsed: float, statistic: Literal["mean", "median"] = "mean") -> float | None:
        i = bisect.bisect_right(self.values, elapsed)
        n = len(self.values) - i
        if n == 0:
            return None
        if statistic == "median":
            return self.values[(i + len(self.values)) // 2] - elapsed
        if self._suffix is None:
            self._suffix = np.concatenate([np.cumsum(self._array[::-1])[::-1], [0.0]])
        return float(self._suffix[i]) / n - elapsed


class ToolPredictor:
    """Residual tool time by tool identity, learned online."""

    def __init__(self, min_samples: int = 5, statistic: Literal["mean", "median"] = "mean") -> None:
        self.min_samples = min_samples
        self.statistic = statistic
        self._by_key: dict[tuple[str, ...], _Samples] = {}
        self._all = _Samples()

    @staticmethod
    def key(names: Sequence[str]) -> tuple[str, ...]:
        return tuple(sorted(set(names))) or (USER,)

    def observe(self, names: Sequence[str], duration_s: float) -> None:
        k = self.key(names)
        self._by_key.setdefault(k, _Samples()).add(duration_s)
        if k != (USER,):
            self._all.add(duration_s)

    def known(self, names: Sequence[str]) -> bool:
        """Whether ``remaining`` predicts from observed calls (of these tools, or of all tools)."""
        k = self.key(names)
        own = self._by_key.get(k)
        return (own is not None and len(own.values) >= self.min_samples) or (k != (USER,) and len(self._all.values) >= self.min_samples)

    def remaining(self, names: Sequence[str], elapsed_s: float) -> float:
        """Predicted seconds until the call ends; 0 when nothing is known.

        A call that has outlived every observed call of its kind is in the tail, where a
        heavy-tailed duration's mean residual grows with the time already spent: predict that
        time again (``elapsed_s``).
        """
        k = self.key(names)
        for samples in (self._by_key.get(k), self._all if k != (USER,) else None):
            if samples is not None and len(samples.values) >= self.min_samples:
                r = samples.residual(elapsed_s, self.statistic)
                return elapsed_s if r is None else r
        return 0.0
