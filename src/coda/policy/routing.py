"""Routing: which worker serves a request. Every router is a pure function of a snapshot.

Load is the worker's active requests (running, restoring and waiting). ``match`` in each
``WorkerView`` is the request's prefix already resident on that worker, by tier. ``explain``
says which rule chose and the scores it compared, for decision logs and analyses.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter
from typing import Literal, NamedTuple

import numpy as np

from coda.policy.contracts import RouteChoice, Router
from coda.policy.snapshots import RoutingSnapshot, WorkerView

_healthy = attrgetter("healthy")
_load = attrgetter("active_requests")
_least_load = attrgetter("active_requests", "active_kv_blocks", "worker_id")
_load_then_id = attrgetter("active_requests", "worker_id")
_hbm = attrgetter("match.hbm_blocks")


class WorkerColumns(NamedTuple):
    """What routers read of every worker, as arrays by position, where a shell keeps them so (the
    simulator does: a decision then reads three arrays, not each of its workers' views). A snapshot
    carries them (``columns(snap)``) only when every worker is healthy and worker ``i`` is
    ``snap.workers[i]``."""

    active_requests: np.ndarray
    active_kv_blocks: np.ndarray
    #: the request's HBM hit on each worker (zeros where the router reads no match)
    hbm_blocks: np.ndarray
    #: each worker's ``WorkerView.decode_contexts``
    decode_contexts: Sequence[tuple[int, ...]]


def columns(snap: RoutingSnapshot) -> WorkerColumns | None:
    """The snapshot's worker columns, where its shell gives them."""
    return getattr(snap.workers, "columns", None)


def least_loaded(snap: RoutingSnapshot) -> int:
    """``least_loaded_of`` the candidates, read from the columns where the snapshot has them."""
    cols = columns(snap)
    if cols is None:
        return least_loaded_of(candidates(snap)).worker_id
    active = cols.active_requests
    tied = np.flatnonzero(active == active.min())
    return int(tied[cols.active_kv_blocks[tied].argmin()])  # the first of the fewest blocks: the lowest id


def candidates(snap: RoutingSnapshot) -> list[WorkerView]:
    """Healthy workers, or all of them when none is healthy (the request must go somewhere)."""
    ws = snap.workers
    healthy = list(compress(ws, map(_healthy, ws)))  # a step per worker in C: a router reads every worker on each decision
    return healthy or list(ws)


def rendezvous(key: str, names: Sequence[str]) -> int:
    """The index in ``names`` with the highest random weight for ``key`` (rendezvous hashing): every
    process that sees the same names picks the same one, and removing a name moves only the keys
    that chose it. Names, not positions, are hashed, so the order of the list does not matter."""
    if not names:
        raise ValueError("rendezvous needs at least one name")
    return max(range(len(names)), key=lambda i: (hashlib.blake2b(f"{key}\0{names[i]}".encode(), digest_size=8).digest(), names[i]))


def least_loaded_of(workers: Sequence[WorkerView]) -> WorkerView:
    """Fewest active requests, then fewest active KV blocks, then lowest id."""
    return min(workers, key=_least_load)


@dataclass(frozen=True, slots=True)
class RoundRobin(Router):
    """The request's arrival counter modulo the healthy workers."""

    name: str = "round_robin"
    worker_fields: frozenset[str] = frozenset()

    def route(self, snap: RoutingSnapshot) -> int:
        if columns(snap) is not None:  # every worker healthy, each at its id
            return snap.request.seq % len(snap.workers)
        ws = candidates(snap)
        return ws[snap.request.seq % len(ws)].worker_id


@dataclass(frozen=True, slots=True)
class LeastLoaded(Router):
    """Fewest active requests (then fewest active KV blocks)."""

    name: str = "least_loaded"
    worker_fields: frozenset[str] = frozenset()

    def route(self, snap: RoutingSnapshot) -> int:
        return least_loaded(snap)


@dataclass(frozen=True, slots=True)
class SMetric(Router):
    """Session affinity with a load guard.

    A session's first request goes to a least-loaded worker. A continuation goes to the worker
    with the largest local (HBM) prefix hit while that worker's load is within the overload
    bound of the minimum load: ``load <= min_load + max(slack, ratio * min_load)``; otherwise
    (no hit anywhere, or the holder is overloaded) to a least-loaded worker. Where the shell
    cannot see residency and names the session's home worker (``RouteRequest.home_worker``),
    every request of the session without a hit goes there under the same load bound.
    """

    slack: int = 2
    ratio: float = 0.25
    name: str = "smetric"
    worker_fields: frozenset[str] = frozenset({"match"})

    def affinity(self, snap: RoutingSnapshot) -> WorkerView | None:
        """The worker KV affinity chooses, or ``None`` when affinity does not decide."""
        cols = columns(snap)
        if cols is not None:
            return self._affinity_by_columns(snap, cols)
        ws = candidates(snap)
        if snap.request.is_continuation:
            hits = list(map(_hbm, ws))
            top = max(hits)
            if top > 0:  # the largest hit, then the fewest active requests, then the lowest id
                best = min(compress(ws, map(top.__eq__, hits)), key=_load_then_id)
                return best if best.active_requests <= self.load_bound(ws) else None
        if snap.request.home_worker is None:
            return None
        home = next((w for w in ws if w.worker_id == snap.request.home_worker), None)
        return home if home is not None and home.active_requests <= self.load_bound(ws) else None

    def _affinity_by_columns(self, snap: RoutingSnapshot, cols: WorkerColumns) -> WorkerView | None:
        """``affinity`` read from the columns: the same choice, the same order of ties."""
        active, hbm = cols.active_requests, cols.hbm_blocks
        chosen = snap.request.home_worker
        if snap.request.is_continuation:
            top = int(hbm.max())
            if top > 0:
                tied = np.flatnonzero(hbm == top)
                chosen = int(tied[active[tied].argmin()])
        if chosen is None or not 0 <= chosen < len(active):
            return None
        return snap.workers[chosen] if active[chosen] <= self._bound(int(active.min())) else None

    def load_bound(self, workers: Sequence[WorkerView]) -> float:
        """The most active requests a worker may have and still be chosen for affinity."""
        return self._bound(min(map(_load, workers)))

    def _bound(self, lo: int) -> float:
        return lo + max(self.slack, self.ratio * lo)

    def route(self, snap: RoutingSnapshot) -> int:
        chosen = self.affinity(snap)
        return chosen.worker_id if chosen is not None else least_loaded(snap)

    def explain(self, snap: RoutingSnapshot) -> RouteChoice:
        chosen = self.affinity(snap)
        hits = {w.worker_id: float(w.match.hbm_blocks) for w in candidates(snap)}
        if chosen is not None:
            return RouteChoice(chosen.worker_id, "affinity", {"hbm_hit_blocks": hits})
        return RouteChoice(least_loaded_of(candidates(snap)).worker_id, "least loaded", {"hbm_hit_blocks": hits})


@dataclass(frozen=True, slots=True)
class DynamoKV(Router):
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
    worker_fields: frozenset[str] = frozenset({"match"})

    def cost(self, w: WorkerView, prompt_blocks: int) -> float:
        m = w.match
        credited = self.device_credit * m.hbm_blocks + self.host_credit * m.dram_blocks + self.disk_credit * m.ssd_blocks
        return self.weight * max(prompt_blocks - credited, 0.0) + w.active_kv_blocks

    def route(self, snap: RoutingSnapshot) -> int:
        return self.explain(snap).worker_id

    def explain(self, snap: RoutingSnapshot) -> RouteChoice:
        ws = candidates(snap)
        costs = [self.cost(w, snap.request.prompt_blocks) for w in ws]
        scores = {"cost": {w.worker_id: c for w, c in zip(ws, costs)}}
        if self.temperature <= 0:
            return RouteChoice(min(zip(costs, (w.worker_id for w in ws)))[1], "least cost", scores)
        lo = min(costs)
        weights = [math.exp(-(c - lo) / self.temperature) for c in costs]
        rng = random.Random(self.seed * 1_000_003 + snap.request.seq)
        return RouteChoice(rng.choices([w.worker_id for w in ws], weights=weights)[0], "sampled by cost", scores)


@functools.lru_cache(maxsize=4096)
def _log_contexts(contexts: tuple[int, ...]) -> np.ndarray:
    """log2 of each context (at least 1), kept per tuple: between two decisions only the workers
    that stepped have new contexts, and a large cluster compares tens of the others each time."""
    logs = np.log2(np.maximum(np.asarray(contexts, dtype=np.float64), 1.0))
    logs.flags.writeable = False
    return logs


def context_distance(contexts: Sequence[int], arrival_tokens: int) -> float:
    """Mean |log2(l / L)| over a worker's active decoders: how far its contexts are from the arrival's."""
    return float(np.abs(_log_contexts(tuple(contexts)) - math.log2(max(arrival_tokens, 1))).mean())


@dataclass(frozen=True, slots=True)
class ContextCompatible(Router):
    """Coda's context-compatibility router on top of SMetric (registered as ``context_compatible``;
    ``coda`` is an alias).

    When KV affinity decides (SMetric chooses a prefix holder), that choice stands. Otherwise,
    among workers at the minimum load or ``load_slack`` above it (the load-eligible ones), choose
    the one whose active decoders are closest in context length to the arrival (``L``: its prompt,
    the reusable prefix and the new input together), so decode batches stay homogeneous; ties by
    load, then id. The parent's (least-loaded) choice stands only when no load-eligible worker has
    an active decode population (the Coda paper's fallback; ``idle_near_worker="fall_back"`` falls back
    as soon as one of them has none).
    """

    parent: SMetric = SMetric()
    load_slack: int = 1
    idle_near_worker: Literal["skip", "fall_back"] = "skip"
    name: str = "context_compatible"
    worker_fields: frozenset[str] = frozenset({"match", "decode_contexts"})

    def near(self, snap: RoutingSnapshot) -> list[tuple[int, int, tuple[int, ...]]]:
        """The workers within ``load_slack`` of the least load, among which compatibility decides:
        ``(worker id, active requests, decode contexts)`` each, in worker order."""
        cols = columns(snap)
        if cols is not None:
            active = cols.active_requests
            ids = np.flatnonzero(active <= int(active.min()) + self.load_slack).tolist()
            return [(i, int(active[i]), cols.decode_contexts[i]) for i in ids]
        ws = candidates(snap)
        bound = min(map(_load, ws)) + self.load_slack
        return [(w.worker_id, w.active_requests, w.decode_contexts) for w in ws if w.active_requests <= bound]

    def distances(self, snap: RoutingSnapshot) -> dict[int, float] | None:
        """Context distance to the arrival of each near worker with decoders; ``None`` when
        compatibility cannot decide, so the parent's choice stands."""
        return self._distances(self.near(snap), snap.request.prompt_tokens)

    def _distances(self, near: list[tuple[int, int, tuple[int, ...]]], arrival_tokens: int) -> dict[int, float] | None:
        decoding = [(wid, contexts) for wid, _, contexts in near if contexts]
        if not decoding or (self.idle_near_worker == "fall_back" and len(decoding) < len(near)):
            return None
        return {wid: context_distance(contexts, arrival_tokens) for wid, contexts in decoding}

    def route(self, snap: RoutingSnapshot) -> int:
        return self.explain(snap).worker_id

    def explain(self, snap: RoutingSnapshot) -> RouteChoice:
        held = self.parent.affinity(snap)
        if held is not None:
            return RouteChoice(held.worker_id, "affinity")
        near = self.near(snap)
        dist = self._distances(near, snap.request.prompt_tokens)
        if dist is None:
            return RouteChoice(least_loaded(snap), "least loaded (no eligible worker decoding)")
        load = {wid: active for wid, active, _ in near}  # every worker with a distance is near
        best = min(dist, key=lambda wid: (dist[wid], load[wid], wid))
        return RouteChoice(best, "context compatible", {"context_distance": dist})
