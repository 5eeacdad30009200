"""Session slots a shell keeps for its ingress policy: which agent sessions hold an admission slot,
released after the policy's TTL without a request. The simulator and the gateway keep one each
(the gateway's replicas share theirs through the store)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from coda.policy.contracts import IngressPolicy
from coda.policy.ingress import SessionAdmission


def ledger_ttl_s(policy: IngressPolicy) -> float:
    """The TTL a shell's session ledger runs with: the policy's, or the session policy's default
    (so ``session_active`` means the same whether or not a policy reads it)."""
    return SessionAdmission().idle_ttl_s if policy.session_ttl_s is None else policy.session_ttl_s


class SessionLedger:
    """Sessions that hold an admission slot, released after ``ttl_s`` without a request; and
    sessions waiting for one, with when a request of theirs was first deferred (the deferral
    budget of ``coda.policy.ingress.SessionAdmission``), forgotten once admitted or after ``ttl_s``
    without a deferral.

    Time is passed in (the gateway's monotonic clock, the simulator's virtual time). Sessions
    are kept in last-seen order, so expiring them is amortized O(1) per call. With a ``limit``,
    the least recently seen slot (or deferral) is dropped when one more would pass it (a shell
    that takes slots from clients bounds its memory so)."""

    __slots__ = ("ttl_s", "limit", "_seen", "_deferred")

    def __init__(self, ttl_s: float, limit: int | None = None) -> None:
        self.ttl_s = ttl_s
        self.limit = limit
        self._seen: OrderedDict[str, float] = OrderedDict()
        #: session -> (first deferred, last deferred), in last-deferred order
        self._deferred: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def _expire(self, now_s: float) -> None:
        seen = self._seen
        while seen:
            sid, t = next(iter(seen.items()))
            if now_s - t <= self.ttl_s:
                break
            seen.popitem(last=False)
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
        if self.limit is not None and len(self._seen) > self.limit:
            self._seen.popitem(last=False)

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
