"""Ingress admission in the simulator, with the gateway's semantics.

The same ``coda.policy.ingress`` policy decides on an ``IngressSnapshot`` built from the
simulated workers (engine queue, active KV use, in-flight requests and tokens). ``defer``: the
request waits in the gateway's queue, at most ``defer.max_queue`` of them, and decides again
whenever something that could free room happens (a request is admitted by an engine or
finishes), until it has waited ``defer.max_wait_s``; then it is answered 503 with the policy's
Retry-After. ``reject``: 429/529, or 503 at once without a hold. The simulated client does not retry: a request that is not
served ends its session, so the session's unsent rounds count as rejected too
(``session_abandoned``), each at the time it would have become ready had the session been served
instantly; shedding never shrinks the goodput denominator.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from coda.policy.contracts import Decision, IngressPolicy
from coda.policy.snapshots import IngressSnapshot, WorkerLoad
from coda.policy.spec import DeferSpec, TenantSpec
from coda.shell.estimates import DrainRate, deadline_slack_s
from coda.shell.ingress_view import ingress_snapshot
from coda.shell.liveness import Liveness, gate_decisions
from coda.shell.sessions import SessionCap, ledger_of
from coda.sim.request import SimRequest
from coda.sim.worker import Worker

SIM_SIGNALS = frozenset(
    {"queue_depth", "queue_age", "kv_usage", "inflight_requests", "inflight_tokens", "tenant_share", "prefix_hit", "deadline_slack",
     "drain_rate"}
)


class SimIngress:
    """The simulated gateway's admission state: in-flight tokens per worker and tenant, the
    requests sent to each worker without output yet (oldest first), what each worker freed as its
    requests ended (``DrainRate``), session slots and their adaptive cap, and the queue of deferred
    requests (oldest first)."""

    def __init__(self, policy: IngressPolicy, defer: DeferSpec, tenants: dict[str, TenantSpec]) -> None:
        self.policy = policy
        self.defer = defer
        self.tenants = tenants
        self.ledger = ledger_of(policy)
        self.cap = SessionCap.of(policy)
        self.drains: dict[int, DrainRate] = {}
        self.capacity: dict[int, int] = {}  # each worker's KV tokens, for the cap's pressure
        self.inflight_tokens: dict[int, int] = {}
        self.unanswered: dict[int, OrderedDict[int, float]] = {}
        self.tenant_tokens: dict[str, int] = {}
        self.decisions: dict[str, int] = {}
        self.liveness = Liveness.of(policy)
        self.deferred: OrderedDict[int, SimRequest] = OrderedDict()
        self.held_continuations: set[int] = set()  # of those, requests of sessions holding a slot when held

    def tenant(self, name: str) -> TenantSpec:
        return self.tenants.get(name) or TenantSpec()

    def snapshot(
        self,
        now: float,
        req: SimRequest,
        tenant: str,
        loads: tuple[WorkerLoad, ...],
        prefix_hit: float,
        predicted_ttft_s: Sequence[float | None],
    ) -> IngressSnapshot:
        deadline_ms = self.tenant(tenant).deadline_ms
        return ingress_snapshot(
            now=now,
            tenant=tenant,
            prompt_tokens=req.orig_prompt_tokens,
            workers=loads,
            session_id=req.sess.session.session_id,
            ledger=self.ledger,
            prefix_hit=prefix_hit,
            tenant_tokens=self.tenant_tokens,
            tenant_spec=self.tenant,
            deadline_slack_s=deadline_slack_s(deadline_ms / 1000 if deadline_ms is not None else None, predicted_ttft_s),
            queued=len(self.deferred),
            held_continuations=len(self.held_continuations),
            cap=self.cap,
        )

    def load(self, w: Worker) -> WorkerLoad:
        """What the ingress policy sees of a worker's load now."""
        self.capacity[w.id] = w.hbm.capacity * w.C
        freed, ended = self.drains[w.id].rates() if "drain_rate" in self.policy.signals and w.id in self.drains else (0.0, 0.0)
        return WorkerLoad(
            worker_id=w.id,
            queue_depth=len(w.waiting),
            kv_usage=(w.hbm.used - len(w.hbm.lru)) / w.hbm.capacity,
            inflight_requests=w.active_requests,
            inflight_tokens=self.inflight_tokens.get(w.id, 0),
            max_num_seqs=w.max_num_seqs,
            kv_capacity_tokens=w.hbm.capacity * w.C,
            freed_tokens_per_s=freed,
            ended_per_s=ended,
        )

    def decide(self, snap: IngressSnapshot, rid: int) -> Decision:
        """The decision on request ``rid`` (counted per gate; a request deferred for good is ``done`` by the caller)."""
        d = self.policy.decide(snap)
        key = f"{d.action}:{d.reason}"
        self.decisions[key] = self.decisions.get(key, 0) + 1
        self.liveness.observe(rid, gate_decisions(self.policy, snap))
        if d.action != "defer":
            self.liveness.done(rid)
        if d.action == "admit":
            self.ledger.touch(snap.session_id, snap.now_s)
        elif d.status == 503:  # held, or asked back at once: either spends the session's deferral budget
            self.ledger.defer(snap.session_id, snap.now_s)
        return d

    def queue_age_s(self, worker: int, now: float) -> float:
        """``WorkerLoad.queue_age_s``: how long the oldest request sent to ``worker`` has gone without output."""
        waiting = self.unanswered.get(worker)
        return now - next(iter(waiting.values())) if waiting else 0.0

    def hold(self, req: SimRequest, continuation: bool) -> bool:
        """Queue a deferred request (``continuation``: its session holds a slot); ``False`` when the
        queue is full (it is answered 503 at once)."""
        if req.rid in self.deferred:
            return True
        if len(self.deferred) >= self.defer.max_queue:
            return False
        self.deferred[req.rid] = req
        if continuation:
            self.held_continuations.add(req.rid)
        return True

    def release(self, req: SimRequest) -> bool:
        """Take a request out of the queue; ``False`` when it was not (or no longer) there."""
        self.held_continuations.discard(req.rid)
        return self.deferred.pop(req.rid, None) is not None

    def retry_all(self, now: float, decide_again: Callable[[SimRequest], Any]) -> None:
        """Something that may free room happened: every held request decides again, the
        continuations of sessions holding a slot first, each group oldest first."""
        held = sorted(self.deferred.values(), key=lambda r: not self.ledger.active(r.sess.session.session_id, now))
        for req in held:
            if req.rid in self.deferred:
                decide_again(req)

    def admitted(self, req: SimRequest, worker: int, tenant: str, now: float) -> None:
        """``req`` was sent to ``worker`` at ``now``, counted as newly occupying ``req.ingress_tokens``."""
        tokens = req.ingress_tokens
        self.inflight_tokens[worker] = self.inflight_tokens.get(worker, 0) + tokens
        self.tenant_tokens[tenant] = self.tenant_tokens.get(tenant, 0) + tokens
        self.unanswered.setdefault(worker, OrderedDict())[req.rid] = now
        self.drains.setdefault(worker, DrainRate()).sent(now)

    def answered(self, req: SimRequest) -> None:
        """Its first output came (at ``req.first_token_s``): a sample for the session cap, once."""
        now = req.first_token_s
        sent = self.unanswered.get(req.worker, {}).pop(req.rid, None)  # type: ignore[call-overload]
        if sent is not None and self.cap is not None:
            capacity = self.capacity.get(req.worker, 0)
            pressure = self.inflight_tokens.get(req.worker, 0) / capacity if capacity else 0.0
            self.cap.observe(now - sent, sent, pressure, now, self.ledger.count(now))

    def finished(self, req: SimRequest, tenant: str) -> None:
        """It ended (at ``req.finish_s``)."""
        now = req.finish_s
        self.answered(req)
        self.inflight_tokens[req.worker] -= req.ingress_tokens
        self.tenant_tokens[tenant] -= req.ingress_tokens
        self.drains[req.worker].ended(req.ingress_tokens, now)
        self.ledger.ended(req.sess.session.session_id, now)
