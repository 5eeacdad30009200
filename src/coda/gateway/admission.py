"""Enforcing ingress decisions: admit, hold deferred requests in a bounded queue, reject; and
the JSONL logs: decisions (one record per request, with the signal values behind its decision)
and the optional, sampled access log.

A deferred request is decided again whenever something that could free room happens (a
request ends, telemetry arrives, another replica's counts change) until ``max_wait_s``; then it
gets ``503`` + ``Retry-After``. Each decision reads every replica's counts and takes its share
atomically through the store (``Admission.decide``).
"""

from __future__ import annotations

import asyncio
import io
import random
import sys
import time
from dataclasses import asdict
from typing import Any, TextIO

from coda import strict_json
from coda.api_errors import ApiError
from coda.gateway.metrics import GatewayMetrics
from coda.gateway.replica import Replica, open_store
from coda.gateway.state import GatewayState, Ticket, Worker
from coda.gateway.store import Synced
from coda.policy.ingress import Decision, IngressSnapshot

MESSAGES = {
    "queue_full": "every worker's engine queue is at the policy's limit",
    "kv_full": "every worker's KV cache is at the policy's limit",
    "tenant_over_share": "this tenant is using more than its share of in-flight tokens while the cluster is saturated",
    "overloaded": "every worker is at its load limit",
    "session_slots_full": "every agent-session slot is taken",
    "new_session_deferred": "the cluster is saturated, so new agent sessions wait while running ones finish",
    "deadline_unmeetable": "the predicted time to first token exceeds the request's deadline",
    "gateway_queue_full": "the gateway's queue of deferred requests is full",
    "store_unreachable": "the store the gateway replicas share is unreachable and store.on_unreachable is closed",
}
#: Retry-After of a request deferred while the store is away (assumed: about a store restart)
STORE_RETRY_AFTER_S = 1.0
#: publications per decision at most while the router's pick moves with the counts read back
#: (assumed: the pick settles after one re-read unless other replicas decide at the same moment)
PLAN_TRIES = 3


class JsonlLog:
    """JSONL records, buffered (flushed about once a second and on close); ``sample``: the share
    of records written (each kept independently at random)."""

    def __init__(self, path: str | None, sample: float = 1.0) -> None:
        self._out: TextIO | None = None
        self.sample = sample
        if path == "-":
            self._out = sys.stderr
        elif path:
            self._out = io.open(path, "a", buffering=1 << 16)  # noqa: UP020  (explicit buffer size)
        self._flushed = time.monotonic()

    @property
    def enabled(self) -> bool:
        return self._out is not None

    def write(self, record: dict[str, Any]) -> None:
        if self._out is None or (self.sample < 1.0 and random.random() >= self.sample):
            return
        self._out.write(strict_json.dumps(record) + "\n")
        now = time.monotonic()
        if now - self._flushed > 1.0:
            self._out.flush()
            self._flushed = now

    def close(self) -> None:
        if self._out is not None and self._out is not sys.stderr:
            self._out.close()
        self._out = None


def record(t: Ticket, d: Decision, snap: IngressSnapshot, shadow: Decision | None, waited_s: float, deferred: bool) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "ts": round(time.time(), 6), "rid": t.rid, "path": t.path, "tenant": t.tenant, "session": t.session_id, "model": t.model,
        "prompt_tokens": t.prompt_tokens, "policy": d.policy, "action": d.action, "reason": d.reason, "status": d.status,
        "retry_after_s": d.retry_after_s, "deferred": deferred, "waited_s": round(waited_s, 4), "prefix_hit": round(t.prefix_hit, 4),
        "signals": snap.signals(),
    }
    if shadow is not None:
        rec["shadow"] = asdict(shadow)
    return rec


class Admission:
    def __init__(self, state: GatewayState, metrics: GatewayMetrics, log: JsonlLog, replica: Replica | None = None) -> None:
        self.state = state
        self.defer = state.defer
        self.metrics = metrics
        self.log = log
        self.replica = replica or Replica(state, open_store(state), metrics)
        self.replica.on_change = self.kick
        self._changed = asyncio.Event()

    def kick(self) -> None:
        """Something that may free room happened: deferred requests decide again."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def decide(self, t: Ticket) -> tuple[Decision, IngressSnapshot, Decision | None]:
        """Decide with every replica's counts, atomically among replicas: claim the session's slot
        (learning whether it held one), count the request on the worker the router picks for it,
        publish that with this replica's table while reading the others', decide, and undo the
        claim when not admitted. An admitted request keeps its worker (``Ticket.plan``); the caller
        begins it there before this replica decides again."""
        state, replica, sid = self.state, self.replica, t.session_id
        async with replica.decide_lock:
            claimed = await replica.claim(sid) if sid is not None else None
            t.session_seen = claimed is not None and claimed.sessions.active
            (w, shadow_worker), synced = await self._count_where_routed(t)
            sessions = claimed.sessions if claimed is not None else synced.sessions if synced is not None else None
            d, snap, shadow = state.decide(t, sessions)
            if not replica.up and replica.closed_when_down:
                d = Decision("defer", d.policy, "store_unreachable", 503, STORE_RETRY_AFTER_S)
            if d.action == "admit":
                t.plan = (w, shadow_worker) if w is not None else None
            elif sid is not None and claimed is not None and not claimed.sessions.active:
                await replica.release(sid, claimed.sessions.stamp)
        return d, snap, shadow

    async def _count_where_routed(self, t: Ticket) -> tuple[tuple[Worker | None, int | None], Synced | None]:
        """Publish the table with ``t`` counted on the worker the router picks, routing again on
        the counts that come back until the pick stands (other replicas' counts may have changed
        since the last read); the last pick published, and what the store answered."""
        state = self.state
        plan = state.route(t, set())
        synced = None
        for attempt in range(PLAN_TRIES):
            read = state.others
            state.pending = (t, plan[0]) if plan[0] is not None else None
            try:
                synced = await self.replica.publish()
            finally:
                state.pending = None
            if synced is None or plan[0] is None or state.others is read or attempt == PLAN_TRIES - 1:
                break  # nothing new was read (always so in-process): the pick stands
            fresh = state.route(t, set())
            if fresh[0] is plan[0]:
                break
            plan = fresh
        return plan, synced

    async def admit(self, t: Ticket) -> dict[str, Any]:
        """The decision record of an admitted request (the caller adds routing and writes it);
        raises ``ApiError`` (503 / 429 / 529 with Retry-After) for a request that is not admitted."""
        state = self.state
        d, snap, shadow = await self.decide(t)
        start = time.monotonic()
        deferred = d.action == "defer"
        if deferred:
            self.metrics.deferred.inc()
            if state.queued >= self.defer.max_queue:
                d = Decision("defer", d.policy, "gateway_queue_full", 503, d.retry_after_s)
            else:
                state.queued += 1
                try:
                    deadline = start + self.defer.max_wait_s
                    while d.action == "defer" and (left := deadline - time.monotonic()) > 0:
                        try:
                            await asyncio.wait_for(self._changed.wait(), left)
                        except TimeoutError:
                            pass
                        d, snap, shadow = await self.decide(t)
                finally:
                    state.queued -= 1
        waited = time.monotonic() - start
        rec = record(t, d, snap, shadow, waited, deferred)
        self.metrics.decisions.labels(d.policy, d.action, d.reason).inc()
        if shadow is not None:
            self.metrics.shadow.labels(shadow.policy, str(shadow.action == d.action).lower()).inc()
        if d.action == "admit":
            return rec
        self.log.write(rec)
        why = MESSAGES.get(d.reason, d.reason)
        if d.action == "defer":
            raise ApiError(503, f"the gateway held this request for {waited:.1f} s without room ({why}, ingress policy {d.policy}); "
                           f"retry after {d.retry_after_s:g} s", d.reason, retry_after_s=d.retry_after_s)
        raise ApiError(d.status, f"rejected by ingress policy {d.policy}: {why}; retry after {d.retry_after_s:g} s", d.reason,
                       retry_after_s=d.retry_after_s)
