"""SLO thresholds calibrated on a baseline's published SLO share, and how gains move with them.

The Coda paper reports SLO throughput without its thresholds. The paper presets choose the
(TTFT, mean TBT) pair at which CacheWise keeps the paper's share of its output within SLO on
each workload, then show every gain's sign over a grid of thresholds, so a reader sees whether a
conclusion depends on where the SLO was put.

SLO throughput is evaluated here on arrays, for thousands of threshold pairs at once, with the
definition of :func:`coda.metrics.within_slo` and ``summarize``'s ``slo_tps``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from coda.metrics.requests import Window, column, within_slo

# Search grid of the calibration: TTFT bounds 10 ms-3,000 s (log-spaced, ~5% apart) and TBT
# bounds 20-300 ms (1 ms apart); chosen to cover every SLO an interactive or agent service uses.
TTFT_GRID_S = np.geomspace(0.01, 3000.0, 260)
TBT_GRID_S = np.round(np.arange(0.020, 0.3005, 0.001), 4)


@dataclass(frozen=True)
class SloSample:
    """One run's requests that finished in its measurement window: output, TTFT and ITL."""

    output: np.ndarray
    ttft: np.ndarray
    itl: np.ndarray
    window_s: float

    @classmethod
    def of(cls, records: Sequence[Mapping[str, Any]], window: Window) -> SloSample:
        finish, ready, first = column(records, "finish_s"), column(records, "ready_s"), column(records, "first_token_s")
        done = np.array([r.get("state", "completed") == "completed" and r.get("finish_s") is not None for r in records], dtype=bool)
        done &= (finish >= window.start_s) & (finish <= window.end_s)
        out = column(records, "output_tokens", 0.0)
        return cls(out[done], (first - ready)[done], column(records, "tbt_mean_s")[done], window.length_s)

    def slo_tps(self, ttft_s: float, tbt_s: float) -> float:
        ok = within_slo(np.ones(self.output.size, dtype=bool), self.ttft, self.itl, self.output, ttft_s, tbt_s)
        return float(self.output[ok].sum() / self.window_s)

    def slo_surface(self, ttfts: np.ndarray, tbts: np.ndarray) -> np.ndarray:
        """Output tokens within SLO (sum, not per second) for every (TBT, TTFT) pair of the grids."""
        surface = np.empty((tbts.size, ttfts.size))
        for i, tbt in enumerate(tbts):
            ok = within_slo(np.ones(self.output.size, dtype=bool), np.zeros_like(self.ttft), self.itl, self.output, np.inf, float(tbt))
            order = np.argsort(self.ttft[ok], kind="stable")
            ttft, cum = self.ttft[ok][order], np.concatenate(([0.0], np.cumsum(self.output[ok][order])))
            surface[i] = cum[np.searchsorted(ttft, ttfts, side="right")]
        return surface


@dataclass(frozen=True)
class SloFit:
    ttft_s: float
    tbt_s: float
    shares: dict[str, float]  # the baseline's share of output within SLO, per workload
    targets: dict[str, float]


def fit_slo(samples: Mapping[str, Sequence[SloSample]], targets: Mapping[str, float]) -> SloFit:
    """The grid pair whose shares (pooled over each workload's seeds) are closest to ``targets``
    in summed squared relative error; ties go to the larger, more lenient bounds."""
    err = np.zeros((TBT_GRID_S.size, TTFT_GRID_S.size))
    shares: dict[str, np.ndarray] = {}
    for label, target in targets.items():
        runs = samples[label]
        total = sum(float(s.output.sum()) for s in runs)
        shares[label] = sum(s.slo_surface(TTFT_GRID_S, TBT_GRID_S) for s in runs) / max(total, 1.0)
        err += (shares[label] / target - 1.0) ** 2
    flat = np.flatnonzero(err == err.min())[-1]
    i, j = np.unravel_index(flat, err.shape)
    return SloFit(float(TTFT_GRID_S[j]), float(TBT_GRID_S[i]), {k: float(v[i, j]) for k, v in shares.items()}, dict(targets))


def gain_grid(
    system: Sequence[SloSample], reference: Sequence[SloSample], ttfts: Sequence[float], tbts: Sequence[float]
) -> list[list[float | None]]:
    """SLO-throughput ratio (sum over seeds) of ``system`` over ``reference`` at each (TBT, TTFT) pair."""
    rows = []
    for tbt in tbts:
        row: list[float | None] = []
        for ttft in ttfts:
            a = sum(s.slo_tps(ttft, tbt) for s in system)
            b = sum(s.slo_tps(ttft, tbt) for s in reference)
            row.append(a / b if b > 0 else None)
        rows.append(row)
    return rows
