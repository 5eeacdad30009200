"""Tool-aware retention: a finished request's KV blocks held while its session is out on a tool call.

vLLM frees a finished request's blocks into its LRU free queue, where the next allocations evict
them; an agent's session that returns after a 30 s tool call often finds them gone. When a request
ends with tool calls, ``Retention`` keeps one reference on each of its cached blocks (so they stay
out of the free queue) until the session returns or its predicted return time has passed. The
prediction is the eviction policy's (its ``remaining_s``; ``tool_aware``'s comes from its online
predictor, ``coda.policy.tools.ToolPredictor``): the tool time learned per tool identity from calls
that already ended.

Holds never cost a running or admitted request anything: the KV cache manager's allocations go
through ``Retention.allocate``, where every hold yields to an allocation that needs its blocks, the
longest predicted absence first. So a hold never causes a preemption and never keeps a request
waiting. Released blocks join the free queue as idle cached blocks (a later request may still hit
them).

A session returns when a new request's prompt contains the held request's prompt (its last full
block's hash is among the new request's block hashes, which chain the whole prefix): the tool's
duration is observed then, also for a session whose hold already ended (so long calls are learned,
not censored), and the hold ends once that request is admitted (its own references keep the
blocks). Nothing here imports vLLM: the pool and blocks are vLLM's ``BlockPool`` and
``KVCacheBlock`` in the engine, fakes in unit tests.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from coda.integrations.vllm.settings import RetentionSettings
from coda.policy.tools import ToolPredictor

#: finished requests whose return is awaited for learning, at most (assumed; the oldest are forgotten first)
AWAITED_MAX = 4096
T = TypeVar("T")


class Pool(Protocol):
    def touch(self, blocks: Sequence[Any]) -> None: ...

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None: ...


class Forecast(Protocol):
    """What retention reads of the eviction policy (``coda.policy.contracts.EvictionPolicy``)."""

    def remaining_s(self, tools: Sequence[str], elapsed_s: float) -> float | None: ...

    def observe(self, tools: Sequence[str], duration_s: float) -> None: ...


@dataclass(eq=False)
class Out:
    """A session out on a tool call: the request that ended it and the blocks held for it (none once released)."""

    request_id: str
    key: Hashable  # the hash of its prompt's last full block
    tools: tuple[str, ...]
    finished_s: float
    until_s: float
    blocks: list[Any] = field(default_factory=list)
    returned_by: str | None = None  # the request that continued the session

    @property
    def held(self) -> bool:
        return bool(self.blocks)


class Retention:
    """Holds, returns and releases; ``events`` collects this step's decisions for the trace."""

    def __init__(self, pool: Pool, policy: Forecast, settings: RetentionSettings) -> None:
        self.pool = pool
        self.policy = policy
        self.settings = settings
        self.events: list[dict[str, Any]] = []
        #: CPU time spent yielding holds to allocations (the retried allocation included), for the step's accounting
        self.yield_s = 0.0
        self._awaited: OrderedDict[Hashable, Out] = OrderedDict()
        self._by_arrival: dict[str, Out] = {}
        self._expiry: list[tuple[float, int, Out]] = []
        self._seq = itertools.count()

    # --- predictions ----------------------------------------------------------------------------
    def _absence_s(self, out: Out, now: float) -> float:
        """Predicted seconds until the session returns (-1 once it has: its hold goes last)."""
        if out.returned_by is not None:
            return -1.0
        elapsed = now - out.finished_s
        predicted = self.policy.remaining_s(out.tools, elapsed)
        return max(0.0, self.settings.prior_s - elapsed) if predicted is None else predicted

    # --- the session's events ---------------------------------------------------------------------
    def finished(self, request_id: str, key: Hashable | None, blocks: Sequence[Any], tools: Sequence[str], now: float) -> None:
        """A request ended; ``tools``: the tool calls it ended with (none: nothing is held)."""
        if not tools or key is None:
            return
        names = ToolPredictor.key(tools)
        observed = self.policy.remaining_s(names, 0.0)
        known = observed is not None
        predicted = observed if observed is not None else self.settings.prior_s
        hold_s = min(self.settings.max_hold_s, self.settings.hold_factor * predicted)
        out = Out(request_id, key, names, now, now + hold_s)
        held = [b for b in blocks if getattr(b, "block_hash", None) is not None and not getattr(b, "is_null", False)]
        rule = f"tool call: hold {self.settings.hold_factor:g} x the {'observed' if known else 'prior'} tool time, at most max_hold_s"
        if held and hold_s > 0:
            self.pool.touch(held)
            out.blocks = held
            heapq.heappush(self._expiry, (out.until_s, next(self._seq), out))
        else:
            rule = "tool call: nothing to hold (no cached block)" if not held else "tool call: predicted back at once, nothing held"
        self._await(out)
        self.events.append({"event": "hold" if out.held else "out", "request": request_id, "tools": list(names), "blocks": len(out.blocks),
                            "predicted_s": round(predicted, 6), "hold_s": round(hold_s, 6) if out.held else 0.0, "rule": rule})

    def _await(self, out: Out) -> None:
        old = self._awaited.pop(out.key, None)
        if old is not None and old.held:  # the same prompt ended again: the newer request is the session's
            self._release(old, "superseded: the same prompt ended again")
        self._awaited[out.key] = out
        while len(self._awaited) > AWAITED_MAX:
            _, gone = self._awaited.popitem(last=False)
            if gone.held:
                self._release(gone, "forgotten: more sessions out than tracked")

    def arrived(self, request_id: str, block_hashes: Sequence[Hashable], now: float) -> None:
        """A request reached the engine: if it continues a session that is out, observe the tool's duration."""
        out = None
        for h in reversed(block_hashes):  # the longest prefix that ended a request
            out = self._awaited.get(h)
            if out is not None:
                break
        if out is None or out.returned_by is not None:
            return
        del self._awaited[out.key]
        out.returned_by = request_id
        duration = now - out.finished_s
        self.policy.observe(out.tools, duration)
        if out.held:
            self._by_arrival[request_id] = out
        self.events.append({"event": "return", "request": request_id, "continues": out.request_id, "tools": list(out.tools),
                            "duration_s": round(duration, 6), "held": out.held,
                            "rule": "its prompt extends the prompt of a request that ended with tool calls"})

    def admitted(self, request_ids: Iterable[str]) -> None:
        """Requests the engine admitted: a returning session's hold ends (its request holds the blocks now)."""
        for rid in request_ids:
            out = self._by_arrival.pop(rid, None)
            if out is not None and out.held:
                self._release(out, "returned: its continuation is admitted")

    def left(self, request_id: str) -> None:
        """A request left the engine before admission (aborted): a hold kept for it waits for its expiry."""
        self._by_arrival.pop(request_id, None)

    # --- releases -----------------------------------------------------------------------------------
    def expire(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            _, _, out = heapq.heappop(self._expiry)
            if out.held:
                self._release(out, "expired: past the predicted return")

    def allocate(self, allocate: Callable[[], T | None], now: float) -> T | None:
        """``allocate()`` (an allocation of the KV cache manager), with every hold yielding to it.

        If it fails while blocks are held, all holds are released into the free queue, the longest
        predicted absence first (each tail first, as vLLM frees), and it is tried again: the free
        queue hands out its other idle blocks first, then held ones in that order. Then each hold
        takes back the leading run of its blocks the allocation left intact, so a hold loses only
        what was needed, from its tail. A failed allocation changes no block, so when even that
        fails every hold is as it was.
        """
        result = allocate()
        if result is not None or not self._expiry:
            return result
        t0 = time.thread_time()
        try:
            return self._yield_to(allocate, now)
        finally:
            self.yield_s += time.thread_time() - t0

    def _yield_to(self, allocate: Callable[[], T | None], now: float) -> T | None:
        held = [o for _, _, o in self._expiry if o.held]
        if not held:
            return None
        held.sort(key=lambda o: (self._absence_s(o, now), -o.finished_s), reverse=True)
        saved = [(o, [(b, b.block_hash) for b in o.blocks]) for o in held]
        for o in held:
            self.pool.free_blocks(reversed(o.blocks))
            o.blocks = []
        result = allocate()
        for o, blocks in saved:
            kept = [b for b, _ in itertools.takewhile(lambda bh: bh[0].block_hash == bh[1], blocks)]
            if kept:
                self.pool.touch(kept)
                o.blocks = kept
            if len(kept) < len(blocks):
                self.events.append({"event": "release", "request": o.request_id, "blocks": len(blocks) - len(kept), "kept": len(kept),
                                    "rule": "pressure: an allocation needs the blocks, the longest predicted absence yields first"})
        if any(not o.held for o in held):
            self._expiry = [e for e in self._expiry if e[2].held]
            heapq.heapify(self._expiry)
        return result

    def _release(self, out: Out, rule: str) -> None:
        blocks, out.blocks = out.blocks, []
        self.pool.free_blocks(reversed(blocks))  # as vLLM frees a request: the tail first, so the prefix is evicted last
        self._expiry = [e for e in self._expiry if e[2] is not out]
        heapq.heapify(self._expiry)
        self.events.append({"event": "release", "request": out.request_id, "blocks": len(blocks), "rule": rule})

    # --- what admission sees ------------------------------------------------------------------------
    def reclaimable(self) -> int:
        """Held blocks that only a hold keeps (releasing it would free them)."""
        return sum(1 for _, _, o in self._expiry if o.held for b in o.blocks if b.ref_cnt == 1)

    def held_requests(self) -> int:
        return sum(1 for _, _, o in self._expiry if o.held)
