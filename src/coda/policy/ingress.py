"""Ingress admission: admit, defer or reject a request before it reaches an engine.

Every policy is a pure function of an ``IngressSnapshot`` (no I/O, no clock): the gateway builds
snapshots from live telemetry, the simulator from its workers, and both enforce the same
``Decision``. A policy declares the signals it reads (``needs``, names from ``SIGNALS``) so a
shell that cannot supply one refuses to start instead of deciding on a made-up value.

Pressure is judged per worker and admission asks whether *any* healthy worker has room, since
the router then places the request: a worker whose telemetry is stale counts as full.

Thresholds in counts default to each engine's own limits (``WorkerLoad.max_num_seqs``,
``WorkerLoad.kv_capacity_tokens``), so a default acts on a 16-seat test engine and on a
1,024-seat GPU alike; a policy given an explicit count uses it for every worker.

Decisions: ``admit``; ``defer`` (the shell holds the request in a bounded queue and asks again
whenever something that could free room happens, until a maximum wait, then answers ``503`` with
``Retry-After``; see ``coda.policy.spec.DeferSpec``); ``reject`` (``429`` when the
tenant is over its share, ``529`` when the cluster is overloaded), with a reason from a fixed
set so it can label metrics.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

#: every signal a policy may need; the gateway maps each to a source (engine /metrics or its own view)
SIGNALS = ("queue_depth", "kv_usage", "inflight_requests", "inflight_tokens", "prefix_hit", "tenant_share", "deadline_slack")

Action = Literal["admit", "defer", "reject"]
SEVERITY: dict[str, int] = {"admit": 0, "defer": 1, "reject": 2}


@dataclass(slots=True, frozen=True)
class WorkerLoad:
    """One worker's load as the shell observed it."""

    worker_id: int
    healthy: bool = True
    #: its telemetry is too old to trust (a stale worker counts as full)
    stale: bool = False
    #: requests in the engine's waiting queue (vLLM's ``vllm:num_requests_waiting``)
    queue_depth: int = 0
    #: share of the engine's KV blocks held by its running requests (``vllm:kv_cache_usage_perc``)
    kv_usage: float = 0.0
    #: requests sent to the engine and not yet finished (running, restoring or waiting there)
    inflight_requests: int = 0
    #: prompt tokens of those requests
    inflight_tokens: int = 0
    #: requests the engine runs at once (vLLM's ``--max-num-seqs``); 0 when unknown
    max_num_seqs: int = 0
    #: tokens the engine's KV cache holds (vLLM: ``num_gpu_blocks`` x ``block_size`` of its
    #: ``vllm:cache_config_info``); 0 when unknown
    kv_capacity_tokens: int = 0

    def can_start(self, prompt_tokens: int) -> bool:
        """A request sent now would start at once: a seat is free and its prompt fits in the KV cache
        beside the prompts in flight (by the shell's own count, which has no scrape lag). A limit
        that is unknown does not bind; the first request always fits an idle engine."""
        seats = self.max_num_seqs <= 0 or self.inflight_requests < self.max_num_seqs
        kv = self.kv_capacity_tokens <= 0 or self.inflight_requests == 0 or self.inflight_tokens + prompt_tokens <= self.kv_capacity_tokens
        return seats and kv


@dataclass(slots=True, frozen=True)
class IngressSnapshot:
    """What an admission decision may read about one arriving request and the cluster."""

    now_s: float
    tenant: str
    prompt_tokens: int
    workers: tuple[WorkerLoad, ...]
    session_id: str | None = None
    #: the request's session holds an admission slot (it was admitted within the session TTL)
    session_active: bool = False
    #: how many sessions hold a slot
    active_sessions: int = 0
    #: share of the prompt's blocks resident, in any tier, on the worker that holds most of them
    #: (0 when the policy does not read it)
    prefix_hit: float = 0.0
    #: prompt tokens in flight for this request's tenant
    tenant_inflight_tokens: int = 0
    #: the tenant's weight, and the sum of the weights of the tenants with work in flight (this one
    #: included): its entitlement is their ratio
    tenant_weight: float = 1.0
    active_weight: float = 1.0
    #: the request's time-to-first-token deadline minus the lowest predicted TTFT among healthy
    #: workers (``deadline_slack_s``); ``inf`` without a deadline
    deadline_slack_s: float = math.inf
    #: requests the shell holds deferred right now
    queued: int = 0

    @property
    def inflight_tokens(self) -> int:
        return sum(w.inflight_tokens for w in self.workers)

    @property
    def inflight_requests(self) -> int:
        return sum(w.inflight_requests for w in self.workers)

    @property
    def tenant_share(self) -> float:
        """The tenant's share of in-flight tokens if this request were admitted."""
        total = self.inflight_tokens + self.prompt_tokens
        return (self.tenant_inflight_tokens + self.prompt_tokens) / total if total else 0.0

    @property
    def entitlement(self) -> float:
        return self.tenant_weight / self.active_weight if self.active_weight > 0 else 1.0

    def signals(self) -> dict[str, float]:
        """Cluster-level values of every signal, for decision logs."""
        live = [w for w in self.workers if w.healthy]
        return {
            "queue_depth": sum(w.queue_depth for w in live),
            "kv_usage": max((w.kv_usage for w in live), default=0.0),
            "kv_usage_min": min((w.kv_usage for w in live), default=1.0),
            "inflight_requests": self.inflight_requests,
            "inflight_tokens": self.inflight_tokens,
            "prefix_hit": self.prefix_hit,
            "tenant_share": round(self.tenant_share, 4),
            "entitlement": round(self.entitlement, 4),
            "deadline_slack_s": self.deadline_slack_s,
            "stale_workers": sum(w.stale for w in live),
            "healthy_workers": len(live),
            "active_sessions": self.active_sessions,
            "queued": self.queued,
        }


@dataclass(slots=True, frozen=True)
class Decision:
    """``status``: the HTTP status the shell answers with when not admitting (503 defer, 429 / 529 reject)."""

    action: Action
    policy: str
    reason: str = "ok"
    status: int = 200
    retry_after_s: float = 0.0



class IngressPolicy(Protocol):
    name: str
    #: names from ``SIGNALS`` the policy reads
    needs: frozenset[str]

    def decide(self, snap: IngressSnapshot) -> Decision: ...


def room(snap: IngressSnapshot, has_room: Callable[[WorkerLoad], bool]) -> bool:
    """Whether some healthy worker with fresh telemetry passes ``has_room`` (stale ones are full)."""
    return any(w.healthy and not w.stale and has_room(w) for w in snap.workers)


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be within [0, 1], got {value}")


def _check_at_least(low: float, **values: float | None) -> None:
    """Counts and times a policy cannot work with below ``low`` (``None``: the default applies)."""
    for name, value in values.items():
        if value is not None and value < low:
            raise ValueError(f"{name} must be >= {low:g}, got {value}")


@dataclass(frozen=True, slots=True)
class AdmitAll:
    """Admit everything (the baseline)."""

    name: str = "admit_all"
    needs: frozenset[str] = frozenset()

    def decide(self, snap: IngressSnapshot) -> Decision:
        return Decision("admit", self.name)


@dataclass(frozen=True, slots=True)
class QueueLimit:
    """Defer what the engine would only queue: while every worker has ``max_waiting`` requests in
    its engine queue, or could not start the request at once (every seat taken, or its prompt
    does not fit in the KV cache beside the prompts in flight: ``WorkerLoad.can_start``)."""

    max_waiting: int = 4
    retry_after_s: float = 1.0
    name: str = "queue_limit"
    needs: frozenset[str] = frozenset({"queue_depth", "inflight_requests", "inflight_tokens"})

    def __post_init__(self) -> None:
        _check_at_least(1, max_waiting=self.max_waiting)
        _check_at_least(0, retry_after_s=self.retry_after_s)

    def decide(self, snap: IngressSnapshot) -> Decision:
        if room(snap, lambda w: w.queue_depth < self.max_waiting and w.can_start(snap.prompt_tokens)):
            return Decision("admit", self.name)
        return Decision("defer", self.name, "queue_full", 503, self.retry_after_s)


@dataclass(frozen=True, slots=True)
class KVHeadroom:
    """Defer while every worker's KV cache is at least ``max_kv_usage`` full."""

    max_kv_usage: float = 0.9
    retry_after_s: float = 1.0
    name: str = "kv_headroom"
    needs: frozenset[str] = frozenset({"kv_usage"})

    def __post_init__(self) -> None:
        _check_fraction("max_kv_usage", self.max_kv_usage)
        _check_at_least(0, retry_after_s=self.retry_after_s)

    def decide(self, snap: IngressSnapshot) -> Decision:
        if room(snap, lambda w: w.kv_usage < self.max_kv_usage):
            return Decision("admit", self.name)
        return Decision("defer", self.name, "kv_full", 503, self.retry_after_s)


def saturated(snap: IngressSnapshot, kv_high: float, queue_high: int) -> bool:
    """No worker has room: each is at ``kv_high`` KV use, has ``queue_high`` requests waiting, or
    could not start the request at once (``WorkerLoad.can_start``)."""
    return not room(snap, lambda w: w.kv_usage < kv_high and w.queue_depth < queue_high and w.can_start(snap.prompt_tokens))


@dataclass(frozen=True, slots=True)
class TenantShare:
    """Under saturation, reject (429) a request that would lift its tenant's share of in-flight
    tokens above ``(1 + slack)`` times its entitlement (its weight over the weights of the
    tenants with work in flight). Without saturation every tenant may use idle capacity."""

    slack: float = 0.1
    kv_high: float = 0.85
    queue_high: int = 2
    retry_after_s: float = 2.0
    name: str = "tenant_share"
    needs: frozenset[str] = frozenset({"tenant_share", "kv_usage", "queue_depth", "inflight_requests", "inflight_tokens"})

    def __post_init__(self) -> None:
        _check_fraction("kv_high", self.kv_high)
        _check_at_least(0, slack=self.slack, retry_after_s=self.retry_after_s)
        _check_at_least(1, queue_high=self.queue_high)

    def decide(self, snap: IngressSnapshot) -> Decision:
        if not saturated(snap, self.kv_high, self.queue_high):
            return Decision("admit", self.name)
        if snap.tenant_share > snap.entitlement * (1.0 + self.slack):
            return Decision("reject", self.name, "tenant_over_share", 429, self.retry_after_s)
        return Decision("admit", self.name)


#: ``Overload``'s limits for an engine whose seats are unknown
OVERLOAD_INFLIGHT, OVERLOAD_QUEUE = 64, 16


@dataclass(frozen=True, slots=True)
class Overload:
    """Reject (529) when no worker has room: every one is at ``max_inflight`` gateway requests
    (default: its seats, ``max_num_seqs``), or at ``kv_reject`` KV use, or has ``queue_reject``
    requests waiting (default: a quarter of its seats)."""

    max_inflight: int | None = None
    kv_reject: float = 0.98
    queue_reject: int | None = None
    retry_after_s: float = 2.0
    name: str = "overload"
    needs: frozenset[str] = frozenset({"inflight_requests", "kv_usage", "queue_depth"})

    def __post_init__(self) -> None:
        _check_fraction("kv_reject", self.kv_reject)
        _check_at_least(1, max_inflight=self.max_inflight, queue_reject=self.queue_reject)
        _check_at_least(0, retry_after_s=self.retry_after_s)

    def limits(self, w: WorkerLoad) -> tuple[int, int]:
        """(max in flight, max waiting) for this worker: the explicit counts, else its seats' share."""
        seats = w.max_num_seqs
        inflight = self.max_inflight or seats or OVERLOAD_INFLIGHT
        return inflight, self.queue_reject or (max(1, seats // 4) if seats else OVERLOAD_QUEUE)

    def decide(self, snap: IngressSnapshot) -> Decision:
        def has_room(w: WorkerLoad) -> bool:
            inflight, queue = self.limits(w)
            return w.inflight_requests < inflight and w.kv_usage < self.kv_reject and w.queue_depth < queue

        if room(snap, has_room):
            return Decision("admit", self.name)
        return Decision("reject", self.name, "overloaded", 529, self.retry_after_s)


@dataclass(frozen=True, slots=True)
class SessionAdmission:
    """Admit whole agent sessions: a request of a session that holds a slot always passes; under
    saturation (or with ``max_sessions`` slots taken) a new session is deferred, so the sessions
    already running keep their KV and finish. A session idle for ``idle_ttl_s`` loses its slot
    (the shell's ``SessionLedger`` applies the TTL)."""

    max_sessions: int = 0  # 0: no cap, only saturation defers
    kv_high: float = 0.85
    queue_high: int = 2
    idle_ttl_s: float = 300.0
    retry_after_s: float = 2.0
    name: str = "session"
    needs: frozenset[str] = frozenset({"kv_usage", "queue_depth", "inflight_requests", "inflight_tokens"})

    def __post_init__(self) -> None:
        _check_fraction("kv_high", self.kv_high)
        if self.idle_ttl_s <= 0:
            raise ValueError(f"idle_ttl_s must be > 0, got {self.idle_ttl_s}")
        _check_at_least(0, max_sessions=self.max_sessions, retry_after_s=self.retry_after_s)
        _check_at_least(1, queue_high=self.queue_high)

    def decide(self, snap: IngressSnapshot) -> Decision:
        if snap.session_active:
            return Decision("admit", self.name, "session_continues")
        if self.max_sessions and snap.active_sessions >= self.max_sessions:
            return Decision("defer", self.name, "session_slots_full", 503, self.retry_after_s)
        if saturated(snap, self.kv_high, self.queue_high):
            return Decision("defer", self.name, "new_session_deferred", 503, self.retry_after_s)
        return Decision("admit", self.name)


@dataclass(frozen=True, slots=True)
class Deadline:
    """Reject (529) a request whose predicted time to first token already exceeds its deadline
    by more than ``grace_s``; serving it would spend GPU time on an answer nobody waits for."""

    grace_s: float = 0.0
    retry_after_s: float = 1.0
    name: str = "deadline"
    needs: frozenset[str] = frozenset({"deadline_slack"})

    def __post_init__(self) -> None:
        _check_at_least(0, retry_after_s=self.retry_after_s)

    def decide(self, snap: IngressSnapshot) -> Decision:
        if snap.deadline_slack_s + self.grace_s >= 0:
            return Decision("admit", self.name)
        return Decision("reject", self.name, "deadline_unmeetable", 529, self.retry_after_s)


@dataclass(frozen=True, slots=True)
class AllOf:
    """Every part decides; the most severe decision wins (reject > defer > admit), the first among equals."""

    parts: tuple[IngressPolicy, ...]
    name: str = ""
    needs: frozenset[str] = field(default=frozenset())

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("a composition needs at least one policy")
        object.__setattr__(self, "name", self.name or "+".join(p.name for p in self.parts))
        object.__setattr__(self, "needs", frozenset().union(*(p.needs for p in self.parts)))

    def decide(self, snap: IngressSnapshot) -> Decision:
        best: Decision | None = None
        for p in self.parts:
            d = p.decide(snap)
            if best is None or SEVERITY[d.action] > SEVERITY[best.action]:
                best = d
        assert best is not None
        return best


#: weight of the newest first-token time in a worker's TTFT estimate (assumed, not fitted)
TTFT_EWMA_WEIGHT = 0.2


def ttft_estimate(previous_s: float | None, sample_s: float) -> float:
    """A worker's predicted TTFT after one more observed first token (an exponential average)."""
    return sample_s if previous_s is None else (1 - TTFT_EWMA_WEIGHT) * previous_s + TTFT_EWMA_WEIGHT * sample_s


def deadline_slack_s(deadline_s: float | None, predicted_ttft_s: Sequence[float | None]) -> float:
    """A request's deadline minus the lowest predicted TTFT of the healthy workers it may go to (a
    worker that has served nothing yet predicts 0); ``inf`` without a deadline."""
    if deadline_s is None:
        return math.inf
    return deadline_s - min((t or 0.0 for t in predicted_ttft_s), default=math.inf)


def ledger_ttl_s(policy: IngressPolicy) -> float:
    """The TTL a shell's session ledger runs with: the policy's, or the session policy's default
    (so ``session_active`` means the same whether or not a policy reads it)."""
    ttl = session_ttl_s(policy)
    return SessionAdmission().idle_ttl_s if ttl is None else ttl


def session_ttl_s(policy: IngressPolicy) -> float | None:
    """The session TTL a policy asks the shell to apply (``None``: it does not track sessions); a
    shadowed policy's TTL is its primary's."""
    primary = getattr(policy, "primary", None)
    if primary is not None:
        return session_ttl_s(primary)
    if isinstance(policy, SessionAdmission):
        return policy.idle_ttl_s
    if isinstance(policy, AllOf):
        ttls = [t for t in map(session_ttl_s, policy.parts) if t is not None]
        return min(ttls) if ttls else None
    return None


class SessionLedger:
    """Sessions that hold an admission slot, released after ``ttl_s`` without a request.

    Time is passed in (the gateway's monotonic clock, the simulator's virtual time). Sessions
    are kept in last-seen order, so expiring them is amortized O(1) per call. With a ``limit``,
    the least recently seen slot is released when one more would pass it (a shell that takes
    slots from clients bounds its memory so)."""

    __slots__ = ("ttl_s", "limit", "_seen")

    def __init__(self, ttl_s: float, limit: int | None = None) -> None:
        self.ttl_s = ttl_s
        self.limit = limit
        self._seen: OrderedDict[str, float] = OrderedDict()

    def _expire(self, now_s: float) -> None:
        seen = self._seen
        while seen:
            sid, t = next(iter(seen.items()))
            if now_s - t <= self.ttl_s:
                break
            seen.popitem(last=False)

    def active(self, session_id: str | None, now_s: float) -> bool:
        self._expire(now_s)
        return session_id is not None and session_id in self._seen

    def count(self, now_s: float) -> int:
        self._expire(now_s)
        return len(self._seen)

    def touch(self, session_id: str | None, now_s: float) -> None:
        """An admitted request of ``session_id``: it holds (or takes) a slot until idle for the TTL."""
        if session_id is None:
            return
        self._seen[session_id] = now_s
        self._seen.move_to_end(session_id)
        if self.limit is not None and len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    def last_seen(self, session_id: str) -> float:
        """When the session last took its slot (``-inf`` when it holds none)."""
        return self._seen.get(session_id, -math.inf)

    def release(self, session_id: str, seen_s: float) -> None:
        """Undo the touch at ``seen_s`` (its request was not admitted); a later touch stands."""
        if self._seen.get(session_id) == seen_s:
            del self._seen[session_id]

    def merge(self, seen: Sequence[tuple[str, float]]) -> None:
        """Slots given elsewhere, as (session, last admitted): for each session the later time stands."""
        for sid, t in seen:
            if self._seen.get(sid, -math.inf) < t:
                self._seen[sid] = t
        self._seen = OrderedDict(sorted(self._seen.items(), key=lambda kv: kv[1]))

    def ages(self, now_s: float) -> list[tuple[str, float]]:
        """Every session holding a slot, with the seconds since it was last admitted."""
        self._expire(now_s)
        return [(sid, now_s - t) for sid, t in self._seen.items()]


def compose(parts: Sequence[IngressPolicy]) -> IngressPolicy:
    return parts[0] if len(parts) == 1 else AllOf(tuple(parts))
