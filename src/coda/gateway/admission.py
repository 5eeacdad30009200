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

from coda.gateway.prometheus import GatewayMetrics
from coda.gateway.replica import Replica, open_store
from coda.gateway.store import Sessions, Synced
from coda.gateway.view import GatewayState, Ticket, Worker
from coda.policy.contracts import Decision
from coda.policy.snapshots import IngressSnapshot
from coda.serving.errors import ApiError
from coda.shell import strict_json
from coda.shell.liveness import Liveness, gate_decisions

MESSAGES = {
    "queue_full": "every worker's engine queue is at the policy's limit",
    "kv_full": "every worker's KV cache is at the policy's limit",
    "tenant_over_share": "this tenant is using more than its share of in-flight tokens while the cluster is saturated",
    "overloaded": "every worker is at its load limit",
    "session_slots_full": "every agent-session slot is taken",
    "new_session_deferred": "the cluster is saturated, so new agent sessions wait while running ones finish",
    "defer_budget_spent": "this new agent session has waited for a slot as long as the session policy defers one",
    "deadline_unmeetable": "the predicted time to first token exceeds the request's deadline",
    "predicted_wait": "the engines are predicted to have room for this request within this session's deferral budget",
    "wait_over_budget": "the engines are predicted to have no room for this request within this session's deferral budget",
    "engine_queue_full": "no engine could start this request of an admitted session at once, and none freed room while it was held",
    "gateway_queue_full": "the gateway's queue of deferred requests is full",
    "store_unreachable": "the store the gateway replicas share is unreachable and store.on_unreachable is closed",
    "store_contended": "the other gateway replicas' counts kept changing while this request was being placed",
}
#: Retry-After of a request deferred while the store is away (assumed: about a store restart)
STORE_RETRY_AFTER_S = 1.0
#: publications per decision at most while the router's pick moves with the counts read back
#: (assumed: the pick stands after one re-read unless other replicas decide at the same moment);
#: a pick that never stands is a defer (``store_contended``), never an admission on counts the pick did not see
PLAN_TRIES = 8


class JsonlLog:
    """JSONL records, buffered (the gateway flushes them twice a second and on close); ``sample``:
    the share of records written (each kept independently at random)."""

    def __init__(self, path: str | None, sample: float = 1.0) -> None:
        self._out: TextIO | None = None
        self.sample = sample
        if path == "-":
            self._out = sys.stderr
        elif path:
            self._out = io.open(path, "a", buffering=1 << 16)  # noqa: UP020  (explicit buffer size)

    @property
    def enabled(self) -> bool:
        return self._out is not None

    def write(self, record: dict[str, Any]) -> None:
        if self._out is None or (self.sample < 1.0 and random.random() >= self.sample):
            return
        self._out.write(strict_json.dumps(record) + "\n")

    def flush(self) -> None:
        if self._out is not None:
            self._out.flush()

    def close(self) -> None:
        if self._out is not None and self._out is not sys.stderr:
            self._out.close()
        self._out = None


def record(t: Ticket, d: Decision, snap: IngressSnapshot, shadow: Decision | None, waited_s: float, deferred: bool,
           gates: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """``gates``: each gate that did not admit the request at some decision, with its last such decision."""
    rec: dict[str, Any] = {
        "ts": round(time.time(), 6), "rid": t.rid, "path": t.path, "tenant": t.tenant, "session": t.session_id,
        "session_source": t.session_source, "model": t.model,
        "prompt_tokens": t.prompt_tokens, "policy": d.policy, "action": d.action, "reason": d.reason, "status": d.status,
        "retry_after_s": d.retry_after_s, "deferred": deferred, "waited_s": round(waited_s, 4), "prefix_hit": round(t.prefix_hit, 4),
        "signals": snap.signals(), "gates": gates or {},
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
        self.liveness = Liveness.of(state.ingress)
        for gate in self.liveness.gates:  # every gate's series exists from the start, so one that never fires reads 0
            metrics.gate_touched.labels(gate)

    def kick(self) -> None:
        """Something that may free room happened: deferred requests decide again."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def decide(self, t: Ticket) -> tuple[Decision, IngressSnapshot, Decision | None]:
        """Decide with every replica's counts, atomically among replicas: count the request on the
        worker the router picks for it and claim its session's slot, in one publication of this
        replica's table that reads the others' back (``_count_where_routed``); decide on that;
        settle a new session's tentative claim (one more step: the slot taken or dropped). An
        admitted request keeps its worker (``Ticket.plan``); the caller begins it there before
        this replica decides again."""
        state, replica, sid = self.state, self.replica, t.session_id
        async with replica.decide_lock:
            (w, shadow_worker), synced, claimed, stands = await self._count_where_routed(t)
            # a session's slots as its claim found them; else the count the last publication read
            sessions = claimed if claimed is not None else synced.sessions if synced is not None and sid is None else None
            d, snap, shadow = state.decide(t, sessions)
            if not replica.up and replica.closed_when_down:
                d = Decision("defer", d.policy, "store_unreachable", 503, STORE_RETRY_AFTER_S)
            elif not stands and d.action == "admit":
                d = Decision("defer", d.policy, "store_contended", 503, STORE_RETRY_AFTER_S)
            if d.action == "admit":
                t.plan = (w, shadow_worker) if w is not None else None
            if sid is not None and claimed is not None and not claimed.active:
                await replica.settle(sid, claimed.stamp, d.action == "admit")
        return d, snap, shadow

    async def _count_where_routed(self, t: Ticket) -> tuple[tuple[Worker | None, int | None], Synced | None, Sessions | None, bool]:
        """Publish the table with ``t`` counted on the worker the router picks (the first
        publication also claims the session's slot), routing again on what comes back (the other
        replicas' counts, whether the session was known) until the pick stands; the last pick
        published, the store's last answer, the claim (``None`` without one), and whether the
        pick stood on the counts last read (else other replicas kept moving: ``PLAN_TRIES``)."""
        state = self.state
        plan = state.route(t, set())
        synced: Synced | None = None
        claimed: Sessions | None = None
        for _ in range(PLAN_TRIES):
            read, seen = state.others, t.session_seen
            state.pending = (t, plan[0]) if plan[0] is not None else None
            try:
                synced = await self.replica.publish(t.session_id if claimed is None else None)
            finally:
                state.pending = None
            if synced is None:
                return plan, None, claimed, True  # the store is away: this replica's own counts decide
            if claimed is None and t.session_id is not None:
                claimed = synced.sessions
                t.session_seen = claimed.active  # an earlier round went somewhere: a continuation for the router
            if plan[0] is None or (state.others is read and t.session_seen == seen):
                return plan, synced, claimed, True  # nothing new was read (always so in-process)
            fresh = state.route(t, set())
            if fresh[0] is plan[0]:
                return plan, synced, claimed, True
            plan = fresh
        return plan, synced, claimed, False

    def _observe(self, t: Ticket, d: Decision, snap: IngressSnapshot, gates: dict[str, dict[str, str]]) -> None:
        """Count each gate that did not admit ``t`` on this decision."""
        for g in self.liveness.observe(t.rid, gate_decisions(self.state.ingress, snap)):
            self.metrics.gate_fires.labels(g.policy, g.action, g.signal or g.reason).inc()
            gates[g.policy] = {"action": g.action, "reason": g.reason, "signal": g.signal}

    async def _hold(self, t: Ticket, d: Decision, snap: IngressSnapshot, shadow: Decision | None, gates: dict[str, dict[str, str]],
                    start: float) -> tuple[Decision, IngressSnapshot, Decision | None]:
        """Hold a deferred request until a decision admits or refuses it, or ``defer.max_wait_s`` passes."""
        state = self.state
        self.metrics.deferred.inc()
        if state.queued >= self.defer.max_queue:
            d = Decision("defer", d.policy, "gateway_queue_full", 503, d.retry_after_s)
        else:
            held_continuation = snap.session_active
            state.queued += 1
            state.held_continuations += held_continuation
            state.watch()
            try:
                deadline = start + self.defer.max_wait_s
                while d.action == "defer" and (left := deadline - time.monotonic()) > 0:
                    try:
                        await asyncio.wait_for(self._changed.wait(), left)
                    except TimeoutError:
                        pass
                    t.matches = state.match(t.hashes, t.candidates)  # what it would newly occupy may have shrunk while it waited
                    if not state.ledger.active(t.session_id, state.clock()):
                        await asyncio.sleep(0)  # held continuations of admitted sessions, woken together with it, decide first
                    d, snap, shadow = await self.decide(t)
                    self._observe(t, d, snap, gates)
            finally:
                state.queued -= 1
                state.held_continuations -= held_continuation
                state.watch()
        return d, snap, shadow

    async def admit(self, t: Ticket) -> dict[str, Any]:
        """The decision record of an admitted request (the caller adds routing and writes it);
        raises ``ApiError`` (503 / 429 / 529 with Retry-After) for a request that is not admitted."""
        state = self.state
        gates: dict[str, dict[str, str]] = {}
        d, snap, shadow = await self.decide(t)
        self._observe(t, d, snap, gates)
        start = time.monotonic()
        deferred = d.action == "defer"
        try:
            if deferred:
                d, snap, shadow = await self._hold(t, d, snap, shadow, gates, start)
        except BaseException:  # the exchange was cancelled (its client left) while the request was held
            self.liveness.forget(t.rid)
            raise
        waited = time.monotonic() - start
        rec = record(t, d, snap, shadow, waited, deferred, gates)
        self.metrics.requests_decided.inc()
        for gate in self.liveness.done(t.rid):
            self.metrics.gate_touched.labels(gate).inc()
        self.metrics.decisions.labels(d.policy, d.action, d.reason).inc()
        if shadow is not None:
            self.metrics.shadow.labels(shadow.policy, str(shadow.action == d.action).lower()).inc()
        if d.action == "admit":
            return rec
        if state.some_idle():
            self.metrics.refused_while_idle.inc()
        self.log.write(rec)
        why = MESSAGES.get(d.reason, d.reason)
        if d.action == "defer":
            raise ApiError(503, f"the gateway held this request for {waited:.1f} s without room ({why}, ingress policy {d.policy}); "
                           f"retry after {d.retry_after_s:g} s", d.reason, retry_after_s=d.retry_after_s)
        raise ApiError(d.status, f"rejected by ingress policy {d.policy}: {why}; retry after {d.retry_after_s:g} s", d.reason,
                       retry_after_s=d.retry_after_s)
