"""Routing: which worker serves a request. Every router is a pure function of a snapshot.

Load is the worker's active requests (running, restoring and waiting). ``match`` in each
``WorkerView`` is the request's prefix already resident on that worker, by tier.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from coda.types import RoutingSnapshot, WorkerView


class Router(Protocol):
    name: str
    #: snapshot fields the router reads beyond counts ("match", "decode_contexts")
    needs: frozenset[str]

    def route(self, snap: RoutingSnapshot) -> int:
        """The chosen ``worker_id`` (one of ``snap.workers``)."""
        ...


def candidates(snap: RoutingSnapshot) -> list[WorkerView]:
    """Healthy workers, or all of them when none is healthy (the request must go somewhere)."""
    healthy = [w for w in snap.workers if w.healthy]
    return healthy or list(snap.workers)


def least_loaded_of(workers: Sequence[WorkerView]) -> WorkerView:
    """Fewest active requests, then fewest active KV blocks, then lowest id."""
    return min(workers, key=lambda w: (w.active_requests, w.active_kv_blocks, w.worker_id))


@dataclass(frozen=True, slots=True)
class RoundRobin:
    """The request's arrival counter modulo the healthy workers."""

    name: str = "round_robin"
    needs: frozenset[str] = frozenset()

    def route(self, snap: RoutingSnapshot) -> int:
        ws = candidates(snap)
        return ws[snap.request.seq % len(ws)].worker_id


@dataclass(frozen=True, slots=True)
class LeastLoaded:
    """Fewest active requests (then fewest active KV blocks)."""

    name: str = "least_loaded"
    needs: frozenset[str] = frozenset()

    def route(self, snap: RoutingSnapshot) -> int:
        return least_loaded_of(candidates(snap)).worker_id


@dataclass(frozen=True, slots=True)
class SMetric:
    """Session affinity with a load guard.

    A session's first request goes to a least-loaded worker. A continuation goes to the worker
    with the largest local (HBM) prefix hit while that worker's load is within the overload
    bound of the minimum load: ``load <= min_load + max(slack, ratio * min_load)``; otherwise
    (no hit anywhere, or the holder is overloaded) to a least-loaded worker.
    """

    slack: int = 2
    ratio: float = 0.25
    name: str = "smetric"
    needs: frozenset[str] = frozenset({"match"})

    def affinity(self, snap: RoutingSnapshot) -> WorkerView | None:
        """The worker KV affinity chooses, or ``None`` when affinity does not decide."""
        if not snap.request.is_continuation:
            return None
        ws = candidates(snap)
        best = max(ws, key=lambda w: (w.match.hbm_blocks, -w.active_requests, -w.worker_id))
        if best.match.hbm_blocks == 0:
            return None
        lo = min(w.active_requests for w in ws)
        if best.active_requests <= lo + max(self.slack, self.ratio * lo):
            return best
        return None

    def route(self, snap: RoutingSnapshot) -> int:
        chosen = self.affinity(snap)
        return (chosen or least_loaded_of(candidates(snap))).worker_id


@dataclass(frozen=True, slots=True)
class DynamoKV:
    """NVIDIA Dynamo's KV-aware cost: ``w * prefill_blocks + decode_blocks``.

    Prefill blocks are the prompt's blocks not credited as hits: device (HBM) hits count fully,
    host (DRAM) and disk (SSD) hits with partial credits. Decode blocks are the worker's active
    KV blocks. Temperature 0 takes the minimum; above 0 a softmax over ``-cost / temperature``
    is sampled with a generator seeded from the request's sequence number (so the router stays
    a pure function of the snapshot).
    """

    weight: float = 1.0
    device_credit: float = 1.0
    host_credit: float = 0.75
    disk_credit: float = 0.25
    temperature: float = 0.0
    seed: int = 0
    name: str = "dynamo_kv"
    needs: frozenset[str] = frozenset({"match"})

    def cost(self, w: WorkerView, prompt_blocks: int) -> float:
        m = w.match
        credited = self.device_credit * m.hbm_blocks + self.host_credit * m.dram_blocks + self.disk_credit * m.ssd_blocks
        return self.weight * max(prompt_blocks - credited, 0.0) + w.active_kv_blocks

    def route(self, snap: RoutingSnapshot) -> int:
        ws = candidates(snap)
        costs = [self.cost(w, snap.request.prompt_blocks) for w in ws]
        if self.temperature <= 0:
            return min(zip(costs, (w.worker_id for w in ws)))[1]
        lo = min(costs)
        weights = [math.exp(-(c - lo) / self.temperature) for c in costs]
        rng = random.Random(self.seed * 1_000_003 + snap.request.seq)
        return rng.choices([w.worker_id for w in ws], weights=weights)[0]


def context_distance(contexts: Sequence[int], arrival_tokens: int) -> float:
    """Mean |log2(l / L)| over a worker's active decoders: how far its contexts are from the arrival's."""
    logs = np.log2(np.maximum(np.asarray(contexts, dtype=np.float64), 1.0))
    return float(np.abs(logs - math.log2(max(arrival_tokens, 1))).mean())


@dataclass(frozen=True, slots=True)
class CodaRouter:
    """Coda's compatibility-aware router on top of SMetric.

    When KV affinity decides (SMetric chooses a prefix holder), that choice stands. Otherwise,
    among workers at the minimum load or ``load_slack`` above it, choose the one whose active
    decoders are closest in context length to the arrival (``L = reusable prefix + new input``),
    so decode batches stay homogeneous; ties by load, then id. Without decoder telemetry on
    every such worker, the parent's (least-loaded) choice stands.
    """

    parent: SMetric = SMetric()
    load_slack: int = 1
    name: str = "coda"
    needs: frozenset[str] = frozenset({"match", "decode_contexts"})

    def compatible(self, snap: RoutingSnapshot) -> WorkerView | None:
        """The context-compatible choice, or ``None`` to fall back to the parent."""
        ws = candidates(snap)
        lo = min(w.active_requests for w in ws)
        near = [w for w in ws if w.active_requests <= lo + self.load_slack]
        if not near or any(not w.decode_contexts for w in near):
            return None
        arrival = snap.request.reusable_tokens + snap.request.new_tokens
        return min(near, key=lambda w: (context_distance(w.decode_contexts, arrival), w.active_requests, w.worker_id))

    def route(self, snap: RoutingSnapshot) -> int:
        chosen = self.parent.affinity(snap) or self.compatible(snap)
        return (chosen or least_loaded_of(candidates(snap))).worker_id
