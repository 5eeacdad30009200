"""HBM reclaim: which idle (cached, unreferenced) KV chunks a worker evicts when it needs room.

A policy's ``victims(lru, n, out, owners)`` picks ``n`` chunks of ``lru`` (idle chunks, least
recently used first; ``owners`` maps chunk ids to their owner, a session or a shared prefix, as
the shell lays them out). ``out(owner)`` is what the shell observes of the owner's session:
``(tools, elapsed_s)`` while it waits on its tool calls (``()``: on its user), ``None`` while it
is not out. Shells report every ended tool call to ``observe`` (its duration became observable
when the session's next request arrived). The contract is ``coda.policy.contracts.EvictionPolicy``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import ClassVar, Literal

import numpy as np

from coda.policy.contracts import EvictionPolicy, OutStatus, Owners
from coda.policy.params import AtLeastOne
from coda.policy.tools import ToolPredictor


@dataclass(frozen=True, slots=True)
class Lru(EvictionPolicy):
    """The least recently used idle chunks (a released request's tail goes first, its prefix last)."""

    name: str = "lru"
    session_status: ClassVar[bool] = False

    def victims(self, lru: OrderedDict[int, None], n: int, out: OutStatus, owners: Owners) -> list[int]:
        return list(islice(lru, n))


@dataclass(slots=True)
class ToolAware(EvictionPolicy):
    """CacheWise-style reclaim: within the first ``window_chunks`` idle chunks in LRU order, evict
    first the chunks of sessions whose current tool call is predicted to stay out longest; the rest
    (shared chunks, sessions not out) in LRU order. Within a session LRU order keeps its tail going
    first, so its prefix survives longest. The prediction is the residual tool time learned online
    from ended calls of the same tools (``statistic``: its mean or its median; see ``ToolPredictor``)."""

    window_chunks: AtLeastOne = 2048
    min_samples: AtLeastOne = 5
    statistic: Literal["mean", "median"] = "mean"
    name: str = "tool_aware"
    session_status: ClassVar[bool] = True
    predictor: ToolPredictor = field(init=False, compare=False)

    def __post_init__(self) -> None:
        self.predictor = ToolPredictor(self.min_samples, self.statistic)

    def observe(self, tools: Sequence[str], duration_s: float) -> None:
        self.predictor.observe(tools, duration_s)

    def remaining_s(self, tools: Sequence[str], elapsed_s: float) -> float | None:
        return self.predictor.remaining(tools, elapsed_s) if self.predictor.known(tools) else None

    def score(self, owner: int, out: OutStatus) -> float:
        """Predicted seconds until the owner's session sends its next request; 0 when it is not out."""
        status = out(owner)
        return 0.0 if status is None else self.predictor.remaining(*status)

    def _scores(self, owners: Iterable[int], out: OutStatus) -> dict[int, float]:
        """``score`` of each owner, once each (a window holds several runs of some owners)."""
        scores: dict[int, float] = {}
        for o in owners:
            if o not in scores:
                scores[o] = self.score(o, out)
        return scores

    def victims(self, lru: OrderedDict[int, None], n: int, out: OutStatus, owners: Owners) -> list[int]:
        w = min(max(self.window_chunks, n), len(lru))
        chunks = np.fromiter(islice(lru, w), dtype=np.int64, count=w)
        # The window is runs of one owner's chunks (a released request's chain joins the LRU at
        # once): each owner is scored once, each run gets its owner's score.
        owners = owners(chunks)
        starts = np.flatnonzero(owners[1:] != owners[:-1]) + 1
        run_owner = owners[np.concatenate(([0], starts))].tolist()
        scores = self._scores(run_owner, out)
        if not any(v > 0 for v in scores.values()):
            return chunks[:n].tolist()
        score = np.repeat([scores[o] for o in run_owner], np.diff(starts, prepend=0, append=w))
        order = np.argsort(-score, kind="stable")  # highest score first, LRU order among equals
        return chunks[order[:n]].tolist()

    def victims_by_runs(self, runs: Iterable[tuple[int, Iterable[int]]], size: int, n: int, out: OutStatus) -> list[int]:
        """``victims`` read from the idle chunks as runs of one owner's chunks in LRU order
        (``(owner, chunks)``; ``size`` chunks in all), as a shell that keeps them passes them: the
        same chunks in the same order, found in a step per run of the window rather than per chunk.
        A run's chunks all precede the next run's, so ordering runs by score, stably, orders their
        chunks as the stable sort over chunks does."""
        w = min(max(self.window_chunks, n), size)
        window: list[tuple[int, Iterable[int], int]] = []  # (owner, its chunks, how many of them lie in the window)
        left = w
        for owner, chunks in runs:
            if left <= 0:
                break
            take = min(len(chunks), left)  # type: ignore[arg-type]
            window.append((owner, chunks, take))
            left -= take
        scores = self._scores([o for o, _, _ in window], out)
        if any(v > 0 for v in scores.values()):
            window.sort(key=lambda r: -scores[r[0]])  # stable: LRU order among equals
        chosen: list[int] = []
        for _, chunks, take in window:
            k = min(take, n - len(chosen))
            chosen.extend(islice(chunks, k))
            if len(chosen) == n:
                break
        return chosen
