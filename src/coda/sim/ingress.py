"""Ingress admission in the simulator, with the gateway's semantics.

The same ``coda.policy.ingress`` policy decides on an ``IngressSnapshot`` built from the
simulated workers (engine queue, active KV use, in-flight requests and tokens). ``defer``: the
request waits in the gateway's queue and is asked about again after ``retry_after_s``, until it
has waited ``defer_max_s``, then it is answered 503 and counts as rejected. ``reject``: 429/529.
A client that is rejected gives up on its session, so the session's unsent rounds count as
rejected too (``session_abandoned``), each at the time it would have become ready had the session
been served instantly: shedding never shrinks the goodput denominator.
"""

from __future__ import annotations

from collections.abc import Sequence

from coda.policy.ingress import Decision, IngressPolicy, IngressSnapshot, SessionLedger, WorkerLoad, session_ttl_s
from coda.sim.request import SimRequest
from coda.sim.worker import Worker

SIM_SIGNALS = frozenset({"queue_depth", "kv_usage", "inflight_requests", "inflight_tokens", "tenant_share", "prefix_hit", "deadline_slack"})


class SimIngress:
    def __init__(self, policy: IngressPolicy, defer_max_s: float, tenant_weights: dict[str, float] | None = None) -> None:
        self.policy = policy
        self.defer_max_s = defer_max_s
        self.weights = tenant_weights or {}
        ttl = session_ttl_s(policy)
        self.ledger = SessionLedger(ttl) if ttl is not None else None
        self.inflight_tokens: dict[int, int] = {}
        self.tenant_tokens: dict[str, int] = {}
        self.decisions: dict[str, int] = {}

    def snapshot(self, now: float, req: SimRequest, tenant: str, workers: Sequence[Worker], prefix_hit: float) -> IngressSnapshot:
        loads = tuple(
            WorkerLoad(
                worker_id=w.id,
                queue_depth=len(w.waiting),
                kv_usage=(w.hbm.used - len(w.hbm.lru)) / w.hbm.capacity,
                inflight_requests=w.active_requests,
                inflight_tokens=self.inflight_tokens.get(w.id, 0),
            )
            for w in workers
        )
        sid = req.sess.session.session_id
        active = [t for t, v in self.tenant_tokens.items() if v > 0 and t != tenant]
        return IngressSnapshot(
            now_s=now,
            tenant=tenant,
            prompt_tokens=req.orig_prompt_tokens,
            workers=loads,
            session_id=sid,
            session_active=self.ledger.active(sid, now) if self.ledger else False,
            active_sessions=self.ledger.count(now) if self.ledger else 0,
            prefix_hit=prefix_hit,
            tenant_inflight_tokens=self.tenant_tokens.get(tenant, 0),
            tenant_weight=self.weights.get(tenant, 1.0),
            active_weight=self.weights.get(tenant, 1.0) + sum(self.weights.get(t, 1.0) for t in active),
        )

    def decide(self, snap: IngressSnapshot) -> Decision:
        d = self.policy.decide(snap)
        key = f"{d.action}:{d.reason}"
        self.decisions[key] = self.decisions.get(key, 0) + 1
        if d.action == "admit" and self.ledger is not None:
            self.ledger.touch(snap.session_id, snap.now_s)
        return d

    def admitted(self, worker: int, tenant: str, tokens: int) -> None:
        self.inflight_tokens[worker] = self.inflight_tokens.get(worker, 0) + tokens
        self.tenant_tokens[tenant] = self.tenant_tokens.get(tenant, 0) + tokens

    def finished(self, worker: int, tenant: str, tokens: int) -> None:
        self.inflight_tokens[worker] -= tokens
        self.tenant_tokens[tenant] -= tokens
