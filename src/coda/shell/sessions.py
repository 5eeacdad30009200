"""Session slots a shell keeps for its ingress policy: which agent sessions hold an admission slot,
released after the policy's TTL without a request, or, under a policy that gives a pause
(``PredictedWait.slot_pause_s``), once the session has not come back within its own longest tool
pause plus a margin; and the adaptive cap on how many may hold one (``SessionCap``). The simulator
and the gateway keep one each; the gateway's replicas share theirs through the store, which
applies the same rules, told by each replica when a session's requests through it are over."""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from coda.policy.contracts import IngressPolicy
from coda.policy.ingress import CapRule, SessionAdmission


def ledger_ttl_s(policy: IngressPolicy) -> float:
    """The TTL a shell's session ledger runs with: the policy's, or the session policy's default
    (so ``session_active`` means the same whether or not a policy reads it)."""
    return SessionAdmission().idle_ttl_s if policy.session_ttl_s is None else policy.session_ttl_s


def _parts(policy: Any) -> Iterator[Any]:
    """The policy and, through a shadow wrapper or a composition, every policy it decides with."""
    policy = getattr(policy, "primary", policy)
    yield policy
    for p in getattr(policy, "parts", ()):
        yield from _parts(p)


def ledger_of(policy: IngressPolicy, limit: int | None = None) -> SessionLedger:
    """The session ledger a shell keeps for ``policy``: its TTL, and the pause rule of the first part that gives one."""
    pause = next((p.slot_pause_s for p in _parts(policy) if getattr(p, "slot_pause_s", None) is not None), None)
    return SessionLedger(ledger_ttl_s(policy), limit, pause)


class SessionCap:
    """The adaptive cap on sessions holding a slot, moved by a policy's ``CapRule`` on each first
    token of an admitted request. A late sample cuts the cap only when its request was sent after
    the last cut: the requests in flight at a cut were sent under the larger cap, and counting
    each of them would cut once per request instead of once per round trip. Until the first cut
    the cap grows in slow start (``CapRule.step``): agent sessions arrive faster than one per
    cap's worth of samples, and a cap opening that slowly refused sessions that idle engines
    could serve (782 of 1,237 requests on two fake engines holding at most 4 each). The first cut
    is by the rule's ``decrease``, as every other. Either way a sample grows the cap only
    while it is in use (fewer than twice as many sessions hold slots: Linux's test of a window
    that limits), so a light load does not open it without bound for the overload after."""

    __slots__ = ("rule", "cap", "cut_s", "slow_start")

    def __init__(self, rule: CapRule) -> None:
        self.rule = rule
        self.cap = float(rule.initial)
        self.cut_s = -math.inf
        self.slow_start = True

    @classmethod
    def of(cls, policy: IngressPolicy) -> SessionCap | None:
        """The cap of the first part of ``policy`` that gives a rule; ``None`` where none does."""
        rule = next((p.cap_rule for p in _parts(policy) if getattr(p, "cap_rule", None) is not None), None)
        return cls(rule) if rule is not None else None

    @property
    def limit(self) -> int:
        return max(int(self.cap), 1)

    def observe(self, ttft_s: float, sent_s: float, pressure: float, now_s: float, in_use: int) -> None:
        """A first token ``ttft_s`` after its request was sent at ``sent_s``, from a worker whose
        in-flight KV tokens were ``pressure`` times its capacity, while ``in_use`` sessions held slots."""
        cap = self.rule.step(self.cap, ttft_s, pressure, self.slow_start)
        if cap < self.cap:
            if sent_s < self.cut_s:
                return
            self.cut_s = now_s
            self.slow_start = False
        elif self.cap >= 2 * in_use:
            return
        self.cap = cap


class SessionLedger:
    """Sessions that hold an admission slot, released after ``ttl_s`` without a request; and
    sessions waiting for one, with when a request of theirs was first deferred (the deferral
    budget of ``coda.policy.ingress.SessionAdmission``), forgotten once admitted or after ``ttl_s``
    without a deferral.

    Time is passed in (the gateway's monotonic clock, the simulator's virtual time). Sessions
    are kept in last-seen order, so expiring them is amortized O(1) per call. With a ``limit``,
    the least recently seen slot (or deferral) is dropped when one more would pass it (a shell
    that takes slots from clients bounds its memory so).

    With ``pause`` (a session's pause before it has shown one, a margin), a slot is also released
    once its session has had no request in flight for its own longest pause so far (from a
    request's end to its session's next admission) plus the margin: a session that is done, or
    gone, stops holding a slot long before the TTL, so the cap turns over. The shell reports each
    admitted request's end (``ended``)."""

    __slots__ = ("ttl_s", "limit", "pause", "_seen", "_deferred", "_inflight", "_ended", "_pause_s", "_lapses")

    def __init__(self, ttl_s: float, limit: int | None = None, pause: tuple[float, float] | None = None) -> None:
        self.ttl_s = ttl_s
        self.limit = limit
        self.pause = pause
        self._seen: OrderedDict[str, float] = OrderedDict()
        #: session -> (first deferred, last deferred), in last-deferred order
        self._deferred: OrderedDict[str, tuple[float, float]] = OrderedDict()
        #: with ``pause``: requests in flight per session, when its last one ended (none in flight),
        #: its longest pause seen, and (when the slot lapses, session, that end) in time order
        self._inflight: dict[str, int] = {}
        self._ended: dict[str, float] = {}
        self._pause_s: dict[str, float] = {}
        self._lapses: list[tuple[float, str, float]] = []

    def _drop(self, session_id: str) -> None:
        self._inflight.pop(session_id, None)
        self._ended.pop(session_id, None)
        self._pause_s.pop(session_id, None)

    def _expire(self, now_s: float) -> None:
        seen = self._seen
        while seen:
            sid, t = next(iter(seen.items()))
            if now_s - t <= self.ttl_s:
                break
            seen.popitem(last=False)
            self._drop(sid)
        lapses = self._lapses
        while lapses and lapses[0][0] < now_s:
            _, sid, ended = heapq.heappop(lapses)
            if self._ended.get(sid) == ended and sid in seen:  # idle since that end: its slot lapses
                del seen[sid]
                self._drop(sid)
        deferred = self._deferred
        while deferred and now_s - next(iter(deferred.values()))[1] > self.ttl_s:
            deferred.popitem(last=False)

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
        self._deferred.pop(session_id, None)
        self._seen[session_id] = now_s
        self._seen.move_to_end(session_id)
        if self.pause is not None:
            self._inflight[session_id] = self._inflight.get(session_id, 0) + 1
            ended = self._ended.pop(session_id, None)
            if ended is not None:
                self._pause_s[session_id] = max(self._pause_s.get(session_id, 0.0), now_s - ended)
        if self.limit is not None and len(self._seen) > self.limit:
            self._drop(self._seen.popitem(last=False)[0])

    def ended(self, session_id: str | None, now_s: float) -> bool:
        """An admitted request of ``session_id`` ended: with none left in flight, its slot lapses
        after the session's longest pause plus the margin (``pause``) unless it comes back.
        True when that left none in flight (the shell tells its store so, ``idle``)."""
        if self.pause is None or session_id is None or session_id not in self._seen:
            return False
        left = self._inflight.get(session_id, 1) - 1
        self._inflight[session_id] = left
        if left > 0:
            return False
        self.idle(session_id, now_s)
        return True

    def idle(self, session_id: str, now_s: float) -> None:
        """``session_id`` has had no request in flight since ``now_s``: its pause runs from here.
        A store's ledger hears this from each shell that counted the session's requests, since
        its own touches are claims, not requests."""
        if self.pause is None or session_id not in self._seen:
            return
        self._inflight[session_id] = 0
        self._ended[session_id] = now_s
        first, margin = self.pause
        heapq.heappush(self._lapses, (now_s + self._pause_s.get(session_id, first) + margin, session_id, now_s))

    def defer(self, session_id: str | None, now_s: float) -> None:
        """A request of ``session_id``, which holds no slot, was deferred at ``now_s``."""
        if session_id is None or self.active(session_id, now_s):
            return
        first = self._deferred.pop(session_id, (now_s, now_s))[0]
        self._deferred[session_id] = (first, now_s)
        if self.limit is not None and len(self._deferred) > self.limit:
            self._deferred.popitem(last=False)

    def deferred_for_s(self, session_id: str | None, now_s: float) -> float:
        """Seconds since the session was first deferred while waiting for a slot (0 when it is not waiting)."""
        self._expire(now_s)
        entry = self._deferred.get(session_id) if session_id is not None else None
        return now_s - entry[0] if entry is not None else 0.0

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
