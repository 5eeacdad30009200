"""Ingress admission: admit, defer or reject a request before it reaches an engine.

Every policy is a pure function of an ``IngressSnapshot`` (no I/O, no clock): the gateway builds
snapshots from live telemetry, the simulator from its workers, and both enforce the same
``Decision``. A policy declares the signals it reads (``signals``, names from
``coda.policy.contracts.SIGNALS``) so a
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

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from coda.policy.contracts import SEVERITY, Decision, IngressPolicy
from coda.policy.params import AtLeastOne, Count, Fraction, NonNegative, Positive
from coda.policy.snapshots import IngressSnapshot, WorkerLoad


def room(snap: IngressSnapshot, has_room: Callable[[WorkerLoad], bool]) -> bool:
    """Whether some healthy worker with fresh telemetry passes ``has_room`` (stale ones are full)."""
    return any(w.healthy and not w.stale and has_room(w) for w in snap.workers)


def binding(snap: IngressSnapshot, pressed: Mapping[str, Callable[[WorkerLoad], bool]]) -> str:
    """The signals that left no worker room: the names of ``pressed`` that hold on some usable
    worker, and ``telemetry`` when a worker is stale or unhealthy, joined by ``+``."""
    names = set()
    for w in snap.workers:
        if not w.healthy or w.stale:
            names.add("telemetry")
        else:
            names.update(name for name, check in pressed.items() if check(w))
    return "+".join(sorted(names))


@dataclass(frozen=True, slots=True)
class AdmitAll(IngressPolicy):
    """Admit everything (the baseline)."""

    name: str = "admit_all"
    signals: frozenset[str] = frozenset()

    def decide(self, snap: IngressSnapshot) -> Decision:
        return Decision("admit", self.name)


@dataclass(frozen=True, slots=True)
class QueueLimit(IngressPolicy):
    """Defer what the engine would only queue: while every worker has ``max_waiting`` requests in
    its engine queue, or could not start the request at once (every seat taken, or what it would
    newly occupy does not fit in the KV cache beside what is in flight: ``WorkerLoad.can_start``)."""

    max_waiting: AtLeastOne = 4
    retry_after_s: NonNegative = 1.0
    name: str = "queue_limit"
    signals: frozenset[str] = frozenset({"queue_depth", "inflight_requests", "inflight_tokens"})


    def decide(self, snap: IngressSnapshot) -> Decision:
        if room(snap, lambda w: w.queue_depth < self.max_waiting and w.can_start()):
            return Decision("admit", self.name)
        signal = binding(snap, {"queue_depth": lambda w: w.queue_depth >= self.max_waiting, "inflight_requests": lambda w: not w.has_seat(),
                                "inflight_tokens": lambda w: not w.fits()})
        return Decision("defer", self.name, "queue_full", 503, self.retry_after_s, signal)


@dataclass(frozen=True, slots=True)
class KVHeadroom(IngressPolicy):
    """Defer while every worker's KV cache is at least ``max_kv_usage`` full."""

    max_kv_usage: Fraction = 0.9
    retry_after_s: NonNegative = 1.0
    name: str = "kv_headroom"
    signals: frozenset[str] = frozenset({"kv_usage"})


    def decide(self, snap: IngressSnapshot) -> Decision:
        if room(snap, lambda w: w.kv_usage < self.max_kv_usage):
            return Decision("admit", self.name)
        return Decision("defer", self.name, "kv_full", 503, self.retry_after_s, binding(snap, {"kv_usage": lambda w: True}))


def saturated(snap: IngressSnapshot, kv_high: float, queue_high: int, queue_age_s: float) -> bool:
    """A dual gate over signals that move within seconds: no worker has room, a worker having none
    when its KV is pressed (``kv_high`` KV use, or the request does not fit beside what is in flight:
    ``WorkerLoad.fits``) AND its queue is (``queue_high`` requests waiting, the oldest unanswered one
    waiting ``queue_age_s``, or every seat taken). Either alone is a busy engine that still serves
    what it is sent at its pace: a full cache with nothing waiting, or a queue that drains."""

    def has_room(w: WorkerLoad) -> bool:
        kv_pressed = w.kv_usage >= kv_high or not w.fits()
        queue_pressed = w.queue_depth >= queue_high or w.queue_age_s >= queue_age_s or not w.has_seat()
        return not (kv_pressed and queue_pressed)

    return not room(snap, has_room)


def saturation_signal(snap: IngressSnapshot, kv_high: float, queue_high: int, queue_age_s: float) -> str:
    """The signals of ``saturated``'s gate that are pressed (``binding``)."""
    return binding(snap, {"kv_usage": lambda w: w.kv_usage >= kv_high, "inflight_tokens": lambda w: not w.fits(),
                          "queue_depth": lambda w: w.queue_depth >= queue_high, "queue_age": lambda w: w.queue_age_s >= queue_age_s,
                          "inflight_requests": lambda w: not w.has_seat()})


#: the oldest unanswered request's wait at which a queue counts as pressed (assumed: a few times the
#: unloaded time to first token of a long agent prompt, about 0.35 s on the load benchmark's engines)
QUEUE_AGE_S = 2.0


def jittered(base_s: float, jitter: float, key: str) -> float:
    """``base_s`` stretched by up to ``jitter`` of itself, by a hash of ``key`` (a pure function, so
    every shell answers alike, while clients deferred together come back spread out)."""
    u = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2.0**64
    return base_s * (1.0 + jitter * u)


@dataclass(frozen=True, slots=True)
class TenantShare(IngressPolicy):
    """Under saturation, reject (429) a request that would lift its tenant's share of in-flight
    tokens above ``(1 + slack)`` times its entitlement (its weight over the weights of the
    tenants with work in flight). Without saturation every tenant may use idle capacity."""

    slack: NonNegative = 0.1
    kv_high: Fraction = 0.85
    queue_high: AtLeastOne = 2
    max_queue_age_s: NonNegative = QUEUE_AGE_S
    retry_after_s: NonNegative = 2.0
    name: str = "tenant_share"
    signals: frozenset[str] = frozenset({"tenant_share", "kv_usage", "queue_depth", "queue_age", "inflight_requests", "inflight_tokens"})


    def decide(self, snap: IngressSnapshot) -> Decision:
        if not saturated(snap, self.kv_high, self.queue_high, self.max_queue_age_s):
            return Decision("admit", self.name)
        if snap.tenant_share > snap.entitlement * (1.0 + self.slack):
            return Decision("reject", self.name, "tenant_over_share", 429, self.retry_after_s, "tenant_share")
        return Decision("admit", self.name)


#: ``Overload``'s limits for an engine whose seats are unknown
OVERLOAD_INFLIGHT, OVERLOAD_QUEUE = 64, 16


@dataclass(frozen=True, slots=True)
class Overload(IngressPolicy):
    """Reject (529) when no worker has room: every one is at ``max_inflight`` gateway requests
    (default: its seats, ``max_num_seqs``), or at ``kv_reject`` KV use, or has ``queue_reject``
    requests waiting (default: a quarter of its seats)."""

    max_inflight: AtLeastOne | None = None
    kv_reject: Fraction = 0.98
    queue_reject: AtLeastOne | None = None
    retry_after_s: NonNegative = 2.0
    name: str = "overload"
    signals: frozenset[str] = frozenset({"inflight_requests", "kv_usage", "queue_depth"})


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
        signal = binding(
            snap,
            {
                "inflight_requests": lambda w: w.inflight_requests >= self.limits(w)[0],
                "kv_usage": lambda w: w.kv_usage >= self.kv_reject,
                "queue_depth": lambda w: w.queue_depth >= self.limits(w)[1],
            },
        )
        return Decision("reject", self.name, "overloaded", 529, self.retry_after_s, signal)


@dataclass(frozen=True, slots=True)
class SessionAdmission(IngressPolicy):
    """Admit whole agent sessions: admitting half of two sessions can finish neither. A request of
    a session that holds a slot always passes, so the sessions running keep their KV and finish. A
    new session waits while the cluster is saturated (the dual gate of ``saturated``) or
    ``max_sessions`` slots are taken: deferred (503, a ``Retry-After`` of ``retry_after_s``
    stretched by up to ``retry_jitter`` so deferred clients do not return together) until it has
    been deferred for ``defer_budget_s``, then rejected (529), so a client stops waiting on a
    door that will not open soon. A session idle for ``idle_ttl_s`` loses its slot (the shell's
    ``SessionLedger`` applies the TTL and keeps when each waiting session was first deferred)."""

    max_sessions: Count = 0  # 0: no cap, only saturation defers
    kv_high: Fraction = 0.85
    queue_high: AtLeastOne = 2
    max_queue_age_s: NonNegative = QUEUE_AGE_S
    idle_ttl_s: Positive = 300.0
    retry_after_s: NonNegative = 2.0
    retry_jitter: NonNegative = 0.5
    #: assumed: about six of an agent client's retries at the default Retry-After
    defer_budget_s: NonNegative = 15.0
    name: str = "session"
    signals: frozenset[str] = frozenset({"kv_usage", "queue_depth", "queue_age", "inflight_requests", "inflight_tokens"})


    @property
    def session_ttl_s(self) -> float:  # type: ignore[override]
        return self.idle_ttl_s

    def decide(self, snap: IngressSnapshot) -> Decision:
        if snap.session_active:
            return Decision("admit", self.name, "session_continues")
        if self.max_sessions and snap.active_sessions >= self.max_sessions:
            reason, signal = "session_slots_full", "session_slots"
        elif saturated(snap, self.kv_high, self.queue_high, self.max_queue_age_s):
            reason, signal = "new_session_deferred", saturation_signal(snap, self.kv_high, self.queue_high, self.max_queue_age_s)
        else:
            return Decision("admit", self.name)
        if snap.session_deferred_s >= self.defer_budget_s:
            return Decision("reject", self.name, "defer_budget_spent", 529, self.retry_after_s, signal)
        retry = jittered(self.retry_after_s, self.retry_jitter, f"{snap.session_id}|{snap.now_s!r}")
        return Decision("defer", self.name, reason, 503, retry, signal)


@dataclass(frozen=True, slots=True)
class Deadline(IngressPolicy):
    """Reject (529) a request whose predicted time to first token already exceeds its deadline
    by more than ``grace_s``; serving it would spend GPU time on an answer nobody waits for."""

    grace_s: float = 0.0
    retry_after_s: NonNegative = 1.0
    name: str = "deadline"
    signals: frozenset[str] = frozenset({"deadline_slack"})


    def decide(self, snap: IngressSnapshot) -> Decision:
        if snap.deadline_slack_s + self.grace_s >= 0:
            return Decision("admit", self.name)
        return Decision("reject", self.name, "deadline_unmeetable", 529, self.retry_after_s, "deadline_slack")


@dataclass(frozen=True, slots=True)
class AllOf(IngressPolicy):
    """Every part decides; the most severe decision wins (reject > defer > admit), the first among equals."""

    parts: tuple[IngressPolicy, ...]
    name: str = ""
    signals: frozenset[str] = field(default=frozenset())

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("a composition needs at least one policy")
        object.__setattr__(self, "name", self.name or "+".join(p.name for p in self.parts))
        object.__setattr__(self, "signals", frozenset().union(*(p.signals for p in self.parts)))

    @property
    def session_ttl_s(self) -> float | None:  # type: ignore[override]
        """The shortest TTL a part asks for (``None`` when no part tracks sessions)."""
        ttls = [p.session_ttl_s for p in self.parts if p.session_ttl_s is not None]
        return min(ttls) if ttls else None

    def decide(self, snap: IngressSnapshot) -> Decision:
        best: Decision | None = None
        for p in self.parts:
            d = p.decide(snap)
            if best is None or SEVERITY[d.action] > SEVERITY[best.action]:
                best = d
        assert best is not None
        return best


def compose(parts: Sequence[IngressPolicy]) -> IngressPolicy:
    return parts[0] if len(parts) == 1 else AllOf(tuple(parts))
