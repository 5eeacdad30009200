"""Simulator observers behind Findings 5-8: decode-batch composition and routing opportunity.

Both are handed to ``Simulation`` at construction, then ``bind(cost, window)`` to that simulation's
cost model and measurement window before it runs.

``on_step`` reports each batch once it has run (a pure-decode run cut short by an arrival reports
only the steps it executed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from coda.cost.model import CohortPlan
from coda.metrics.requests import Window
from coda.policy.routing import SMetric, candidates, context_distance
from coda.policy.snapshots import RoutingSnapshot, WorkerView
from coda.sim.observe import SimObserver


def near_uniform(contexts: np.ndarray) -> np.ndarray:
    """As many requests, the same total tokens, lengths differing by at most one token."""
    n, total = len(contexts), int(contexts.sum())
    q, r = divmod(total, n)
    return np.full(n, q, dtype=np.int64) + (np.arange(n) < r)


@dataclass
class _Batch:
    start_s: float
    durations_s: np.ndarray
    prefill: bool
    contexts: np.ndarray


class DecodeAttention(Protocol):
    """What the observers ask of a simulation's cost model (every model of ``coda.cost`` has it)."""

    def decode_attention_s(self, contexts: np.ndarray) -> float: ...


@dataclass
class DecodeMix(SimObserver):
    """Per executed step in the window: its kind and time; for multi-request decode steps, the
    max/min context ratio and the within-batch CV; for multi-request pure-decode steps, the
    attention time of the observed contexts and of a near-uniform batch (same count and total)."""

    cost: DecodeAttention | None = None
    window: Window = Window(0.0, 0.0)
    worker_fields: frozenset[str] = frozenset()
    steps: int = 0
    time_s: float = 0.0
    pure_steps: int = 0
    pure_time_s: float = 0.0
    multi_pure_steps: int = 0
    multi_pure_time_s: float = 0.0
    attn_observed_s: float = 0.0
    attn_uniform_s: float = 0.0
    _ratios: list[np.ndarray] = field(default_factory=list)
    _cvs: list[np.ndarray] = field(default_factory=list)
    _run_gaps: list[tuple[float, int]] = field(default_factory=list)  # (observed / uniform attention, steps)

    def on_step(self, worker: int, start_s: float, durations_s: np.ndarray, prefill_chunks: Sequence[tuple[int, int]],
                decode_contexts: np.ndarray, plan: CohortPlan | None) -> None:
        self._account(_Batch(start_s, durations_s, bool(prefill_chunks), decode_contexts))

    def on_route(self, snap: RoutingSnapshot, chosen: int) -> None:
        pass

    def bind(self, cost: DecodeAttention, window: Window) -> None:
        self.cost, self.window = cost, window

    def _account(self, b: _Batch) -> None:
        ends = b.start_s + np.cumsum(b.durations_s)
        starts = ends - b.durations_s
        steps = np.flatnonzero((starts >= self.window.start_s) & (starts <= self.window.end_s))
        if steps.size == 0:
            return
        durs = b.durations_s[steps]
        t = float(durs.sum())
        self.steps += steps.size
        self.time_s += t
        n = len(b.contexts)
        if not b.prefill:
            self.pure_steps += steps.size
            self.pure_time_s += t
        if n < 2:
            return
        ctx = b.contexts.astype(np.float64)
        grow = steps.astype(np.float64)  # a pure-decode run grows every context by one token per step
        self._ratios.append(((ctx.max() + grow) / (ctx.min() + grow)).astype(np.float32))
        self._cvs.append((ctx.std() / (ctx.mean() + grow)).astype(np.float32))
        if b.prefill:
            return
        self.multi_pure_steps += steps.size
        self.multi_pure_time_s += t
        first, last = int(steps[0]), int(steps[-1])
        assert self.cost is not None, "bind() the observer to its simulation first"
        uniform = near_uniform(b.contexts)
        obs = (self.cost.decode_attention_s(b.contexts + first) + self.cost.decode_attention_s(b.contexts + last)) / 2 * steps.size
        uni = (self.cost.decode_attention_s(uniform + first) + self.cost.decode_attention_s(uniform + last)) / 2 * steps.size
        self.attn_observed_s += obs
        self.attn_uniform_s += uni
        self._run_gaps.append((obs / uni if uni > 0 else 1.0, steps.size))

    # --- results -----------------------------------------------------------------------------
    def ratios(self) -> np.ndarray:
        return np.concatenate(self._ratios) if self._ratios else np.empty(0, dtype=np.float32)

    def cvs(self) -> np.ndarray:
        return np.concatenate(self._cvs) if self._cvs else np.empty(0, dtype=np.float32)

    def run_gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """Observed/uniform attention per run and its step count (the weight)."""
        if not self._run_gaps:
            return np.empty(0), np.empty(0)
        g = np.array(self._run_gaps, dtype=np.float64)
        return g[:, 0], g[:, 1]


@dataclass
class RoutingOpportunity(SimObserver):
    """For each routing decision in the window: the workers that satisfy SMetric's affinity and
    load constraints as well as the chosen one, and whether the most context-compatible of them
    (smallest ``context_distance``, ties by load then id, as Coda's router) is the chosen one."""

    smetric: SMetric
    window: Window = Window(0.0, 0.0)
    worker_fields: frozenset[str] = frozenset({"match", "decode_contexts"})
    decisions: int = 0
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    distance_gaps: list[float] = field(default_factory=list)

    def on_step(self, *args: Any) -> None:
        pass

    def bind(self, cost: DecodeAttention, window: Window) -> None:
        self.window = window

    def on_route(self, snap: RoutingSnapshot, chosen: int) -> None:
        if not self.window.start_s <= snap.now_s <= self.window.end_s:
            return
        self.decisions += 1
        eligible, kind = self.eligible(snap)
        counts = self.by_kind.setdefault(kind, {"decisions": 0, "multi_eligible": 0, "comparable": 0, "differs": 0})
        counts["decisions"] += 1
        if len(eligible) < 2:
            return
        counts["multi_eligible"] += 1
        if any(not w.decode_contexts for w in eligible):
            return  # Coda's rule acts only when every candidate reports its decoders
        counts["comparable"] += 1
        arrival = snap.request.prompt_tokens
        dist = {w.worker_id: context_distance(w.decode_contexts, arrival) for w in eligible}
        best = min(eligible, key=lambda w: (dist[w.worker_id], w.active_requests, w.worker_id))
        if best.worker_id != chosen:
            counts["differs"] += 1
            self.distance_gaps.append(dist[chosen] - dist[best.worker_id])

    def eligible(self, snap: RoutingSnapshot) -> tuple[list[WorkerView], str]:
        """Workers as good as the chosen one under SMetric: same best HBM match within the load
        bound when affinity decides, else every worker within the load bound."""
        ws = candidates(snap)
        bound = self.smetric.load_bound(ws)
        holder = self.smetric.affinity(snap)
        if holder is not None:
            return [w for w in ws if w.match.hbm_blocks == holder.match.hbm_blocks and w.active_requests <= bound], "affinity"
        return [w for w in ws if w.active_requests <= bound], "load"
