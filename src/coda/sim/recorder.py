"""Accumulators the simulator fills while it runs: pooled inter-token gaps, decode concurrency,
occupancy samples. Per-token work is avoided: a run of k decode steps adds one array of k
durations weighted by how many measured requests decoded in it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coda.metrics.requests import Window
from coda.sim.request import SimRequest


class Recorder:
    def __init__(self, window: Window) -> None:
        self.window = window
        self._gap_vals: list[np.ndarray] = []
        self._gap_w: list[np.ndarray] = []
        self._single: list[float] = []
        self.decode_time_integral = 0.0
        self.busy_time = 0.0
        self.pure_decode_time = 0.0
        self.samples: dict[str, list[float]] = {"t_s": [], "live_sessions": [], "hbm_used_frac": [], "waiting": [], "running": []}

    def steps(self, decoders: Sequence[SimRequest], start: float, durs: np.ndarray) -> None:
        m = 0
        for r in decoders:
            m += r.measured
        if m:
            self._gap_vals.append(durs)
            self._gap_w.append(np.full(durs.size, float(m)))
        a, b = self.window.start_s, self.window.end_s
        end = start + float(durs.sum())
        overlap = min(end, b) - max(start, a)
        if overlap > 0:
            self.decode_time_integral += len(decoders) * overlap

    def gap(self, req: SimRequest, gap: float) -> None:
        if req.measured:
            self._single.append(gap)

    def gaps(self) -> tuple[np.ndarray, np.ndarray]:
        vals = self._gap_vals + [np.array(self._single)]
        ws = self._gap_w + [np.ones(len(self._single))]
        return np.concatenate(vals), np.concatenate(ws)

    def decode_concurrency(self, workers: int) -> float:
        """Mean number of decoding requests per worker over the window."""
        return self.decode_time_integral / self.window.length_s / max(workers, 1)
