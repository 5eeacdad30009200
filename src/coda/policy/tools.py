"""Tool-call duration predictor for tool-aware KV reclaim.

It learns only from tool calls that have already ended (their durations became observable when
the session's next request arrived), never from the call it predicts. For a call that has
been out for ``elapsed`` seconds it predicts the residual time D - elapsed over the durations D >
elapsed seen for the same tools (falling back to all tools): their mean, or their median.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import Literal

USER = "<user>"  # pseudo-tool: the session waits on its user (think time)


class _Samples:
    """Observed durations in sorted blocks, each with its sum.

    A cluster's predictor holds every call its workers saw (tens of thousands at hundreds of
    workers), and each reclaim asks for the mean over a suffix. One sorted array would be copied
    on every new sample and summed again on the next query; in blocks, a new sample is a step in
    one block, and a suffix sum is one block's tail summed plus the later blocks' sums."""

    __slots__ = ("_blocks", "_maxes", "_sums", "_after", "n", "split")

    def __init__(self, split: int = 128) -> None:
        #: a block splits in two halves beyond this many samples: 128 was the fastest of 64-1,024
        #: for 20,000-40,000 samples, seven new ones per 28 queries (measured, one machine)
        self.split = split
        self._blocks: list[list[float]] = []
        self._maxes: list[float] = []  # each block's largest sample, to find the block of a value
        self._sums: list[float] = []
        # (sum, count) of the samples in the blocks from each block on, recomputed after a change
        self._after: tuple[list[float], list[int]] | None = None
        self.n = 0

    def add(self, d: float) -> None:
        self.n += 1
        self._after = None
        if not self._blocks:
            self._blocks.append([d])
            self._maxes.append(d)
            self._sums.append(d)
            return
        b = min(bisect.bisect_left(self._maxes, d), len(self._blocks) - 1)
        block = self._blocks[b]
        bisect.insort_right(block, d)
        if len(block) > self.split:
            half = len(block) // 2
            low, high = block[:half], block[half:]
            self._blocks[b : b + 1] = [low, high]
            self._maxes[b : b + 1] = [low[-1], high[-1]]
            self._sums[b : b + 1] = [sum(low), sum(high)]
        else:
            self._maxes[b] = block[-1]
            self._sums[b] = sum(block)

    def _above(self, elapsed: float) -> tuple[int, int]:
        """(block, index in it) of the first sample greater than ``elapsed``; (blocks, 0) if none."""
        b = bisect.bisect_right(self._maxes, elapsed)
        if b == len(self._blocks):
            return b, 0
        return b, bisect.bisect_right(self._blocks[b], elapsed)

    def _at(self, rank: int) -> float:
        """The sample of this rank in sorted order."""
        for block in self._blocks:
            if rank < len(block):
                return block[rank]
            rank -= len(block)
        raise IndexError(rank)

    def residual(self, elapsed: float, statistic: Literal["mean", "median"] = "mean") -> float | None:
        b, k = self._above(elapsed)
        if b == len(self._blocks):
            return None
        if self._after is None:
            sums = list(itertools.accumulate(reversed(self._sums), initial=0.0))
            sizes = list(itertools.accumulate(map(len, reversed(self._blocks)), initial=0))
            sums.reverse()
            sizes.reverse()
            self._after = sums, sizes
        after_sum, after_n = self._after
        block = self._blocks[b]
        n = len(block) - k + after_n[b + 1]
        if statistic == "median":
            return self._at(self.n - n + n // 2) - elapsed
        return (sum(block[k:]) + after_sum[b + 1]) / n - elapsed


class ToolPredictor:
    """Residual tool time by tool identity, learned online."""

    def __init__(self, min_samples: int = 5, statistic: Literal["mean", "median"] = "mean") -> None:
        self.min_samples = min_samples
        self.statistic = statistic
        self._by_key: dict[tuple[str, ...], _Samples] = {}
        self._all = _Samples()
        self._keys: dict[tuple[str, ...], tuple[str, ...]] = {}  # the key of each tuple of names asked about

    @staticmethod
    def key(names: Sequence[str]) -> tuple[str, ...]:
        return tuple(sorted(set(names))) or (USER,)

    def _key(self, names: Sequence[str]) -> tuple[str, ...]:
        """``key``, kept per tuple of names: a reclaim asks about every session out in its window."""
        if not isinstance(names, tuple):
            return self.key(names)
        k = self._keys.get(names)
        if k is None:
            k = self._keys[names] = self.key(names)
        return k

    def observe(self, names: Sequence[str], duration_s: float) -> None:
        k = self._key(names)
        self._by_key.setdefault(k, _Samples()).add(duration_s)
        if k != (USER,):
            self._all.add(duration_s)

    def known(self, names: Sequence[str]) -> bool:
        """Whether ``remaining`` predicts from observed calls (of these tools, or of all tools)."""
        k = self._key(names)
        own = self._by_key.get(k)
        return (own is not None and own.n >= self.min_samples) or (k != (USER,) and self._all.n >= self.min_samples)

    def remaining(self, names: Sequence[str], elapsed_s: float) -> float:
        """Predicted seconds until the call ends; 0 when nothing is known.

        A call that has outlived every observed call of its kind is in the tail, where a
        heavy-tailed duration's mean residual grows with the time already spent: predict that
        time again (``elapsed_s``).
        """
        k = self._key(names)
        for samples in (self._by_key.get(k), self._all if k != (USER,) else None):
            if samples is not None and samples.n >= self.min_samples:
                r = samples.residual(elapsed_s, self.statistic)
                return elapsed_s if r is None else r
        return 0.0
