"""Measured full-versus-cohort pairs: what a cohort split of a skewed decode batch gained.

A pure-decode skew row (``n`` requests, ``nb`` at ``kv_big``, the rest at ``kvs``) was measured as
one launch (``t_skew_us``); its two cohorts are uniform batches, ``n - nb`` at ``kvs`` and ``nb`` at
``kv_big``, which a uniform table measured (the setup's attention CSV, or the skew file's own
uniform batches). The measured gain of the split is (T_full - T_short - T_long) / T_full.

Two files measured separately need not share a time base: the skew file's uniform batches are
compared with the uniform table at the shapes both measured, and the skewed launch is divided by
the median ratio (``Scale``) before pairing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coda.errors import CodaError
from coda.profiling.measured import Batch, SkewRow, read_attention


@dataclass(frozen=True, slots=True)
class UniformTimes:
    """Seconds per layer of uniform pure-decode batches, by context then batch size.

    A batch size between two measured ones at the same context is interpolated linearly: at one
    context a launch's work grows in proportion to its requests (time = fixed + per request +
    work / bandwidth), and what bends that line (FA2's split count, waves of CTAs) is what
    ``leave_one_out`` measures. Nothing is extrapolated beyond the measured sizes or contexts.
    """

    by_context: dict[int, tuple[np.ndarray, np.ndarray]]

    @classmethod
    def of(cls, batches: Iterable[Batch]) -> UniformTimes:
        """From uniform pure-decode batches; a shape measured more than once keeps its median."""
        seen: dict[int, dict[int, list[float]]] = {}
        for b in batches:
            if b.regime == "pure" and b.batch and b.decodes.min() == b.decodes.max():
                seen.setdefault(int(b.decodes[0]), {}).setdefault(b.batch, []).append(b.seconds)
        table = {}
        for ctx, rows in seen.items():
            ns = np.array(sorted(rows))
            table[ctx] = (ns, np.array([float(np.median(rows[n])) for n in ns]))
        return cls(table)

    def exact(self, n: int, context: int) -> float | None:
        ns, ts = self.by_context.get(context, (np.empty(0), np.empty(0)))
        i = int(np.searchsorted(ns, n))
        return float(ts[i]) if i < len(ns) and ns[i] == n else None

    def at(self, n: int, context: int) -> tuple[float, bool] | None:
        """(seconds, interpolated) of ``n`` decodes at ``context``, or None outside what was measured."""
        if context not in self.by_context:
            return None
        ns, ts = self.by_context[context]
        if not ns[0] <= n <= ns[-1]:
            return None
        hit = self.exact(n, context)
        return (hit, False) if hit is not None else (float(np.interp(n, ns, ts)), True)

    def leave_one_out(self, context_min: int = 1) -> np.ndarray:
        """Relative error (predicted / measured - 1) of every interior batch size predicted from its
        two measured neighbours at the same context. The gap is twice what pairing interpolates
        across on a doubling grid, so this overstates the pairing's error."""
        out = []
        for ctx, (ns, ts) in self.by_context.items():
            if ctx < context_min:
                continue
            for i in range(1, len(ns) - 1):
                out.append(np.interp(ns[i], [ns[i - 1], ns[i + 1]], [ts[i - 1], ts[i + 1]]) / ts[i] - 1.0)
        return np.array(out)


@dataclass(frozen=True, slots=True)
class Scale:
    """Skew-file time over uniform-table time at the shapes both measured (``t_mean``, ``t_max``)."""

    factor: float  # the median ratio
    shapes: int  # uniform measurements of the skew file (t_mean, t_max) that the table also measured
    p10: float
    p90: float
    max_deviation: float  # largest |ratio / factor - 1|

    @classmethod
    def between(cls, rows: Iterable[SkewRow], uniform: UniformTimes, source: str) -> Scale:
        ratios = []
        for r in rows:
            for b in (r.mean, r.max):
                t = uniform.exact(b.batch, int(b.decodes[0])) if r.regime == "pure" else None
                if t is not None:
                    ratios.append(b.seconds / t)
        if not ratios:
            raise CodaError(f"{source}: no uniform batch of the skew file was also measured in the uniform table, so the two "
                            "cannot be put on one time base; pass the attention CSV of the same setup")
        x = np.array(ratios)
        f = float(np.median(x))
        return cls(f, len(x), float(np.percentile(x, 10)), float(np.percentile(x, 90)), float(np.max(np.abs(x / f - 1.0))))


@dataclass(frozen=True, slots=True)
class Pair:
    """One measured split: the skewed launch (on the uniform table's time base) and its two cohorts."""

    n: int
    nb: int
    kvs: int
    kv_big: int
    full_s: float
    short_s: float
    long_s: float
    interpolated: bool  # a cohort's batch size lies between two measured ones
    line: int

    @property
    def cut(self) -> int:
        return self.n - self.nb

    @property
    def group(self) -> tuple[int, int, float]:
        """The shape group held out together: (n, nb, kv_big / kvs), every short context."""
        return self.n, self.nb, round(self.kv_big / self.kvs, 6)

    @property
    def gain(self) -> float:
        return (self.full_s - self.short_s - self.long_s) / self.full_s

    @property
    def log_speedup(self) -> float:
        """ln(T_full / (T_short + T_long)), what the paired model regresses."""
        return float(np.log(self.full_s / (self.short_s + self.long_s)))

    def contexts(self) -> np.ndarray:
        return np.array([self.kvs] * self.cut + [self.kv_big] * self.nb, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class PairSet:
    pairs: list[Pair]
    skipped: int  # pure rows whose cohorts the uniform table cannot give
    scale: Scale
    fitted_on: str  # the files, by name
    interpolation: np.ndarray  # ``UniformTimes.leave_one_out`` over the contexts the pairs use

    def groups(self) -> list[tuple[int, int, float]]:
        return [p.group for p in self.pairs]

    def gains(self) -> np.ndarray:
        return np.array([p.gain for p in self.pairs])


def measured_pairs(rows: list[SkewRow], uniform: UniformTimes, fitted_on: str) -> PairSet:
    """Every pure skew row whose two cohorts the uniform table measured or brackets."""
    scale = Scale.between(rows, uniform, fitted_on)
    pairs, skipped = [], 0
    for r in rows:
        if r.regime != "pure":
            continue
        short, long = uniform.at(r.n - r.nb, r.kvs), uniform.at(r.nb, r.kv_big)
        if short is None or long is None:
            skipped += 1
            continue
        pairs.append(Pair(r.n, r.nb, r.kvs, r.kv_big, r.skew.seconds / scale.factor, short[0], long[0], short[1] or long[1], r.skew.line))
    kvs = min((r.kvs for r in rows if r.regime == "pure"), default=1)
    return PairSet(pairs, skipped, scale, fitted_on, uniform.leave_one_out(context_min=kvs))


def pairs_of(rows: list[SkewRow], skew: Path, attention: Path | None) -> PairSet:
    """Pairs of a skew CSV's rows with the uniform batches of ``attention`` (the same setup's
    attention CSV), or, without one, with the skew file's own uniform batches (fewer shapes pair)."""
    if attention is None:
        return measured_pairs(rows, UniformTimes.of(b for r in rows for b in (r.mean, r.max)), skew.name)
    return measured_pairs(rows, UniformTimes.of(read_attention(attention)), f"{skew.name} with {attention.name}")


def gain_summary(measured: np.ndarray, predicted: np.ndarray, conservative: np.ndarray) -> dict[str, Any]:
    """How a model's gains compare with measured ones: coverage of the conservative bound, the
    prediction's error and how often the bound would let a split through (positive)."""
    if len(measured) == 0:
        return {"shapes": 0}
    return {
        "shapes": int(len(measured)),
        "covered": float(np.mean(measured >= conservative)),
        "gain_mae": float(np.mean(np.abs(predicted - measured))),
        "conservative_positive": int(np.sum(conservative > 0)),
        "conservative_positive_wrong": int(np.sum((conservative > 0) & (measured < conservative))),
        "measured_gain_median": float(np.median(measured)),
        "measured_gain_max": float(np.max(measured)),
    }
