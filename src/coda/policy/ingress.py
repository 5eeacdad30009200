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
import math
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


#: the shortest Retry-After the predicted-wait door answers with (assumed: a client's round trip and a few engine steps)
MIN_RETRY_S = 0.5


def _time_to_free(short: float, per_s: float) -> float:
    """Seconds until ``short`` more units are freed at ``per_s`` (``inf`` when none are freed)."""
    if short <= 0:
        return 0.0
    return short / per_s if per_s > 0 else math.inf


def tokens_short(w: WorkerLoad) -> int:
    """KV tokens the requests sent to ``w`` must free before the arriving one fits beside them (0
    when it fits; an unknown capacity does not bind, and the first request fits an idle engine)."""
    if w.kv_capacity_tokens <= 0 or w.inflight_requests == 0:
        return 0
    return max(w.inflight_tokens + w.new_tokens - w.kv_capacity_tokens, 0)


def seats_short(w: WorkerLoad) -> int:
    """Requests that must end on ``w`` before the arriving one has a seat (0 when one is free)."""
    return max(w.inflight_requests + 1 - w.max_num_seqs, 0) if w.max_num_seqs > 0 else 0


def predicted_wait_s(w: WorkerLoad) -> float:
    """Seconds a request sent to ``w`` now would wait before it could start, as an engine that
    starts its requests in order sees it: until the requests sent before it have freed the KV tokens
    and the seat it lacks, at the rates they have been freeing them (``freed_tokens_per_s``,
    ``ended_per_s``); ``inf`` when it lacks room and nothing has been freed to predict from."""
    return max(_time_to_free(tokens_short(w), w.freed_tokens_per_s), _time_to_free(seats_short(w), w.ended_per_s))


def least_wait_s(snap: IngressSnapshot) -> float:
    """The least predicted wait over the healthy workers with fresh telemetry (the router then
    places the request; ``inf`` when there is none)."""
    return min((predicted_wait_s(w) for w in snap.workers if w.healthy and not w.stale), default=math.inf)


@dataclass(frozen=True, slots=True)
class CapRule:
    """Additive increase, multiplicative decrease of the number of sessions that may hold a slot, as
    TCP and concurrency limiters (Netflix concurrency-limits, Envoy adaptive concurrency) move a
    window: each first token of an admitted request is a sample; one late for the TTFT SLO, or one
    from a worker sent more KV than it holds (``pressure`` above 1: the shell's in-flight tokens over
    its capacity), cuts the cap by ``decrease``; an on-time one adds ``1 / cap``, about one session
    per cap's worth of samples, and a whole session before the first cut (slow start). The shell
    keeps the cap (``coda.shell.sessions.SessionCap``)."""

    ttft_slo_s: float
    initial: int
    least: int
    most: int  # 0: no upper bound
    decrease: float

    def step(self, cap: float, ttft_s: float, pressure: float, slow_start: bool = False) -> float:
        """The cap after one sample; in ``slow_start`` (before the first cut, as TCP opens its window)
        an on-time sample adds a whole session, so the cap doubles per cap's worth of samples."""
        if ttft_s > self.ttft_slo_s or pressure > 1.0:
            return max(float(self.least), cap * self.decrease)
        return min(cap + (1.0 if slow_start else 1.0 / cap), float(self.most) if self.most else math.inf)


@dataclass(frozen=True, slots=True)
class PredictedWait(IngressPolicy):
    """Admit by the wait a request would see, held only where holding pays. The door predicts, per
    worker, how long a request sent there now would wait before it could start
    (``predicted_wait_s``: the KV tokens and seats the requests sent there must free first, at the
    rates they free them).

    With ``short_engine_queue`` (the default) an engine is sent only what it could start at once
    (a least predicted wait of 0), so its queue stays at about one step's worth and the ordering
    happens here, where sessions are known: a continuation of a session that holds a slot waits
    in the shell's hold until an engine has room, and held continuations go first (a new
    session's request is not sent while one is held). Without it, continuations always pass and
    a new request is sent when its predicted wait is within ``wait_share`` of the TTFT SLO, the
    rest left to its prefill and to what the prediction misses.

    A new session's request is refused at once (503, no hold) while the adaptive session cap is
    reached (``CapRule``; ``max_sessions`` bounds it). A request not sent is held (defer) only
    when its predicted wait fits what is left of the session's deferral budget
    ``defer_budget_s``; else it is refused at once, 503 with a Retry-After of the wait until it
    would be admitted, and 529 once the budget is spent. A session whose slot went unused for its
    own longest tool pause so far (``first_pause_s`` before one is seen) plus ``pause_margin_s``,
    or for ``idle_ttl_s``, releases it (the shell's ``SessionLedger``)."""

    ttft_slo_s: Positive = 5.0
    #: measured: on two vLLM-CPU workers at 4x the knee it kept more SLO-meeting requests and fewer late continuations
    #: than sending within wait_share (at the knee the door costs either way: docs/gateway.md)
    short_engine_queue: bool = True
    #: assumed: half the SLO for the wait, half for the prefill and the prediction's error (without short_engine_queue)
    wait_share: Fraction = 0.5
    #: assumed: about six of an agent client's retries at SessionAdmission's Retry-After, as there
    defer_budget_s: NonNegative = 15.0
    retry_after_s: NonNegative = 2.0  # when nothing has ended yet to predict from
    retry_jitter: NonNegative = 0.5
    adaptive_cap: bool = True
    #: assumed: a cap that starts open, at about the seats of two small engines
    cap_initial: AtLeastOne = 32
    cap_least: AtLeastOne = 2
    max_sessions: Count = 0  # 0: the adaptive cap alone bounds
    #: assumed: TCP's 0.5 halves too hard for a sample per request; 0.9 per late sample, at most once per round trip
    cap_decrease: Fraction = 0.9
    #: assumed: an agent's tool call or user turn, before the session has shown one
    first_pause_s: Positive = 30.0
    #: assumed: a client's round trip and the jitter of its tool's run time
    pause_margin_s: NonNegative = 5.0
    #: assumed: twice first_pause_s; a slot whose session never ends a request (a client gone mid-stream) goes by this TTL
    idle_ttl_s: Positive = 60.0
    name: str = "predicted_wait"
    signals: frozenset[str] = frozenset({"inflight_requests", "inflight_tokens", "drain_rate"})

    @property
    def session_ttl_s(self) -> float:  # type: ignore[override]
        return self.idle_ttl_s

    @property
    def slot_pause_s(self) -> tuple[float, float]:
        """(a session's pause before it has shown one, the margin past its longest): the shell's
        ``SessionLedger`` releases a slot unused that long after its session's last request ended."""
        return self.first_pause_s, self.pause_margin_s

    @property
    def cap_rule(self) -> CapRule | None:
        if not self.adaptive_cap:
            return None
        return CapRule(self.ttft_slo_s, self.cap_initial, self.cap_least, self.max_sessions, self.cap_decrease)

    def admit_wait_s(self) -> float:
        return self.wait_share * self.ttft_slo_s

    @staticmethod
    def _short(snap: IngressSnapshot) -> str:
        """The signal that keeps the request off the engines: the KV tokens or the seats they lack."""
        return binding(snap, {"inflight_tokens": lambda w: tokens_short(w) > 0, "inflight_requests": lambda w: seats_short(w) > 0})

    def decide(self, snap: IngressSnapshot) -> Decision:
        key = f"{snap.session_id}|{snap.now_s!r}"
        if snap.session_active:
            if not self.short_engine_queue or (wait := least_wait_s(snap)) <= 0:
                return Decision("admit", self.name, "session_continues")
            until = max(wait, MIN_RETRY_S) if math.isfinite(wait) else self.retry_after_s
            return Decision("defer", self.name, "engine_queue_full", 503, jittered(until, self.retry_jitter, key), self._short(snap))
        left = self.defer_budget_s - snap.session_deferred_s
        cap = min((c for c in (self.max_sessions, snap.session_cap) if c), default=0)
        if snap.session_id is not None and cap and snap.active_sessions >= cap:
            if left <= 0:
                return Decision("reject", self.name, "defer_budget_spent", 529, self.retry_after_s, "session_slots")
            return Decision("reject", self.name, "session_slots_full", 503, jittered(self.retry_after_s, self.retry_jitter, key),
                            "session_slots")
        wait = least_wait_s(snap)
        sent_at = 0.0 if self.short_engine_queue else self.admit_wait_s()  # the longest predicted wait it is sent with
        behind = self.short_engine_queue and snap.held_continuations > 0  # held continuations go first
        if wait <= sent_at and not behind:
            return Decision("admit", self.name)
        signal = self._short(snap) if wait > 0 else "held_continuations"
        if left <= 0:
            return Decision("reject", self.name, "defer_budget_spent", 529, self.retry_after_s, signal)
        until = max(wait - sent_at, MIN_RETRY_S) if math.isfinite(wait) else self.retry_after_s
        retry = jittered(until, self.retry_jitter, key)
        if wait <= left:
            return Decision("defer", self.name, "predicted_wait", 503, retry, signal)
        return Decision("reject", self.name, "wait_over_budget", 503, retry, signal)


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
