"""Where gateway replicas keep what must be global: each replica's in-flight counts and the
session slots.

A replica publishes its whole count table (``n|worker``, ``t|tenant``, ...; numbers only) with
a sequence number; the store keeps the newest table per replica for ``replica_ttl_s`` and
answers with the sum of every *other* live replica's tables, in one atomic step. Decisions are
check-and-take: a replica publishes its table with the request it is deciding on already counted
(a pending take), so of two replicas deciding at once the one the store serves second sees the
first's take. A replica killed without saying goodbye stops refreshing its table, which expires.

Session slots are a second table: session id -> when a request of it was last admitted. A claim
reads whether the session holds a slot and how many are taken, atomically with the publication;
a session without a slot takes a *tentative* one (a third table, with a short TTL), which counts
as taken for every other claim but does not make the session active, so no request is admitted as
a continuation of a session whose first request may yet be refused. ``settle`` ends the tentative
claim: the slot is taken when its request was admitted, dropped when not. Each claim is its own
(its session and its stamp), so settling one never ends another: a session whose first requests
are decided through two replicas at once counts as claimed until both are settled.

Under a policy with a pause rule (``SessionLedger``'s ``pause``) the slots follow it too: a replica
says when none of its requests of a session is in flight any more (``ended``), and the slot lapses
once the session has not come back (claimed again) within its own longest pause plus the margin.
The replicas count a session's requests, each its own: a session with requests in flight through
two replicas at once pauses from the first of them to report, so a request through the other
that runs past that pause and its margin loses the slot to the pause rule; its session's next
request claims one as a new session would.

``LocalStore`` is the in-process default (one replica; it also serves several replica ids in one
process, which the tests use); ``RedisStore`` runs the same steps as Lua scripts on a Redis server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from coda.shell.sessions import SessionLedger

#: how far a claim's stamp moves past another open claim of the same session made at the same
#: instant, so each claim is named by its session and stamp (the scripts' 1 ms)
CLAIM_STEP_S = 0.001
#: a tentative claim not settled within this long (its replica died deciding) stops counting
#: (assumed: decisions take milliseconds)
CLAIM_TTL_S = 5.0
#: longest wait for the store's answer before it counts as unreachable (assumed: a store on the
#: same network answers in well under a millisecond)
STORE_TIMEOUT_S = 0.5


class StoreUnavailable(Exception):
    """The store did not answer; the replica serves on its own state meanwhile."""


@dataclass(frozen=True, slots=True)
class Sessions:
    """The session slots as a claim found them."""

    #: the claimed session holds a slot (False without a session)
    active: bool
    #: slots taken or tentatively claimed, this claim excluded
    count: int
    #: the tentative claim's time in the store's clock (``settle`` ends this claim only); 0 when
    #: the session was active, or without a session
    stamp: float = 0.0


@dataclass(frozen=True, slots=True)
class Synced:
    #: every other live replica's counts, summed by name
    others: dict[str, float]
    sessions: Sessions


class Store(Protocol):
    #: what ``/ready`` calls it when it answers ("in-process", "redis")
    kind: str

    async def sync(self, replica: str, seq: int, counts: Mapping[str, float], session: str | None) -> Synced:
        """Keep ``counts`` as ``replica``'s table unless a newer ``seq`` is held; claim ``session``'s slot."""
        ...

    async def settle(self, session: str, stamp: float, admitted: bool) -> None:
        """End the tentative claim made at ``stamp``: take the slot when its request was admitted."""
        ...

    async def ended(self, session: str) -> None:
        """None of this replica's requests of ``session`` is in flight any more: its pause starts."""
        ...

    async def restore_sessions(self, ages: Sequence[tuple[str, float]]) -> None:
        """Slots this replica gave while the store was away: (session, seconds since last admitted)."""
        ...

    async def drop(self, replica: str) -> None:
        """``replica`` leaves: its table goes now instead of at its TTL."""
        ...

    async def close(self) -> None: ...


class Claims:
    """The open tentative claims, each (session, stamp); a session counts once while any of its
    claims is open. Claims expire ``ttl_s`` after their stamp (their replica died deciding)."""

    __slots__ = ("ttl_s", "_open", "_per_session")

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._open: dict[tuple[str, float], None] = {}  # in claim order, so the oldest expire first
        self._per_session: dict[str, int] = {}

    def count(self, now: float) -> int:
        """Sessions with an open claim."""
        while self._open:
            oldest = next(iter(self._open))
            if now - oldest[1] <= self.ttl_s:
                break
            self.settle(*oldest)
        return len(self._per_session)

    def claim(self, session: str, now: float) -> float:
        """Open a claim of ``session``; its stamp (``now``, moved past any open claim made at the same instant)."""
        stamp = now
        while (session, stamp) in self._open:
            stamp += CLAIM_STEP_S
        self._open[(session, stamp)] = None
        self._per_session[session] = self._per_session.get(session, 0) + 1
        return stamp

    def settle(self, session: str, stamp: float) -> None:
        """Close the claim made at ``stamp`` (gone already when it expired)."""
        if (session, stamp) not in self._open:
            return
        del self._open[(session, stamp)]
        left = self._per_session[session] - 1
        if left:
            self._per_session[session] = left
        else:
            del self._per_session[session]


def summed(tables: Sequence[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for table in tables:
        for k, v in table.items():
            out[k] = out.get(k, 0.0) + v
    return out


class LocalStore:
    """The store in this process; time from ``clock`` (the gateway's monotonic clock)."""

    kind = "in-process"

    def __init__(self, ledger: SessionLedger, clock: Callable[[], float], replica_ttl_s: float) -> None:
        self.ledger = ledger
        self.claims = Claims(CLAIM_TTL_S)
        self.clock = clock
        self.replica_ttl_s = replica_ttl_s
        self._tables: dict[str, tuple[int, float, dict[str, float]]] = {}  # replica -> (seq, expires, counts)

    def expire(self) -> None:
        """Drop the slots and claims past their TTL (each call to the store does too; this is for an idle gateway)."""
        now = self.clock()
        self.ledger.count(now)
        self.claims.count(now)

    async def sync(self, replica: str, seq: int, counts: Mapping[str, float], session: str | None) -> Synced:
        now = self.clock()
        held = self._tables.get(replica)
        if held is None or held[0] < seq:
            self._tables[replica] = (seq, now + self.replica_ttl_s, {k: float(v) for k, v in counts.items() if v})
        for r in [r for r, (_, expires, _) in self._tables.items() if expires < now]:
            del self._tables[r]
        others = summed([table for r, (_, _, table) in self._tables.items() if r != replica])
        active = self.ledger.active(session, now)
        count = self.ledger.count(now) + self.claims.count(now)
        stamp = 0.0
        if active:
            self.ledger.touch(session, now)
        elif session is not None:
            stamp = self.claims.claim(session, now)
        return Synced(others, Sessions(active, count, stamp))

    async def settle(self, session: str, stamp: float, admitted: bool) -> None:
        self.claims.settle(session, stamp)
        if admitted:
            self.ledger.touch(session, self.clock())

    async def ended(self, session: str) -> None:
        self.ledger.idle(session, self.clock())

    async def restore_sessions(self, ages: Sequence[tuple[str, float]]) -> None:
        now = self.clock()
        self.ledger.merge([(sid, now - age) for sid, age in ages])

    async def drop(self, replica: str) -> None:
        self._tables.pop(replica, None)

    async def close(self) -> None:
        pass


# Every script begins with _SLOTS: the session slots and the pause rule's state beside them, as SessionLedger keeps
# them. KEYS[1..4]: sessions (zset: session -> last admitted ms), lapses (zset: session -> when its slot lapses, ms), ended (hash:
# session -> when its last request ended, ms), pauses (hash: session -> its longest pause, ms); a session is in lapses and ended only
# while none of its requests is in flight. The four keys share one expiry, so none outlives the others.
_SLOTS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function forget(sids)
  for _, sid in ipairs(sids) do
    redis.call('ZREM', KEYS[1], sid)
    redis.call('ZREM', KEYS[2], sid)
    redis.call('HDEL', KEYS[3], sid)
    redis.call('HDEL', KEYS[4], sid)
  end
end
local function keep(ttl)
  for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
end
local function expire(ttl)
  forget(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - ttl)))
  forget(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. now))
end
local function touch(sid, ttl)
  local ended = redis.call('HGET', KEYS[3], sid)
  if ended then
    local pause = now - tonumber(ended)
    local longest = redis.call('HGET', KEYS[4], sid)
    if not longest or tonumber(longest) < pause then redis.call('HSET', KEYS[4], sid, pause) end
    redis.call('HDEL', KEYS[3], sid)
    redis.call('ZREM', KEYS[2], sid)
  end
  redis.call('ZADD', KEYS[1], now, sid)
  keep(ttl)
end
"""
# The open tentative claims: KEYS[6] (zset: 'session|stamp' -> stamp ms, one member per claim) and KEYS[7] (hash: session -> its
# open claims); a claim is closed once (settled or expired), so the hash counts exactly the sessions claimed.
_CLAIMS = """
local function settle_claim(claim)
  if redis.call('ZREM', KEYS[6], claim) == 1 then
    local sid = string.match(claim, '^(.*)|')
    if redis.call('HINCRBY', KEYS[7], sid, -1) <= 0 then redis.call('HDEL', KEYS[7], sid) end
  end
end
"""
# KEYS[5]: replicas (zset: replica -> expiry ms)
# ARGV: prefix, replica, seq, table ttl ms, session ('' for none), session ttl ms, claim ttl ms, then name, value pairs
_SYNC = _SLOTS + _CLAIMS + """
local prefix, me, seq, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local mine = prefix .. ':replica:' .. me
local held = redis.call('HGET', mine, '_seq')
if not held or tonumber(held) < seq then
  redis.call('DEL', mine)
  redis.call('HSET', mine, '_seq', ARGV[3])
  for i = 8, #ARGV, 2 do redis.call('HSET', mine, ARGV[i], ARGV[i + 1]) end
  redis.call('PEXPIRE', mine, ttl)
  redis.call('ZADD', KEYS[5], now + ttl, me)
  redis.call('PEXPIRE', KEYS[5], ttl)
end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. now)
local sums, names = {}, {}
for _, r in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do
  if r ~= me then
    local kv = redis.call('HGETALL', prefix .. ':replica:' .. r)
    for i = 1, #kv, 2 do
      local k = kv[i]
      if k ~= '_seq' then
        if sums[k] == nil then sums[k] = 0; names[#names + 1] = k end
        sums[k] = sums[k] + tonumber(kv[i + 1])
      end
    end
  end
end
local sid, sttl, cttl = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
expire(sttl)
for _, claim in ipairs(redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', '(' .. (now - cttl))) do
  settle_claim(claim)
end
local active, stamp = 0, 0
if sid ~= '' and redis.call('ZSCORE', KEYS[1], sid) then active = 1 end
local count = redis.call('ZCARD', KEYS[1]) + redis.call('HLEN', KEYS[7])
if active == 1 then
  touch(sid, sttl)
elseif sid ~= '' then
  stamp = now
  while redis.call('ZSCORE', KEYS[6], sid .. '|' .. stamp) do stamp = stamp + 1 end
  redis.call('ZADD', KEYS[6], stamp, sid .. '|' .. stamp)
  redis.call('HINCRBY', KEYS[7], sid, 1)
  redis.call('PEXPIRE', KEYS[6], cttl)
  redis.call('PEXPIRE', KEYS[7], cttl)
end
local out = {active, count, tostring(stamp)}
for _, k in ipairs(names) do out[#out + 1] = k; out[#out + 1] = tostring(sums[k]) end
return out
"""
# KEYS[5] unused (the claims' keys are 6 and 7, as in _SYNC); ARGV: session, claim stamp ms, 1 when admitted, session ttl ms
_SETTLE = _SLOTS + _CLAIMS + """
settle_claim(ARGV[1] .. '|' .. ARGV[2])
if ARGV[3] == '1' then touch(ARGV[1], tonumber(ARGV[4])) end
return 0
"""
# ARGV: session, session ttl ms, first pause ms, margin ms (SessionLedger.idle)
_ENDED = _SLOTS + """
local sid = ARGV[1]
if redis.call('ZSCORE', KEYS[1], sid) then
  redis.call('HSET', KEYS[3], sid, now)
  redis.call('ZADD', KEYS[2], now + tonumber(redis.call('HGET', KEYS[4], sid) or ARGV[3]) + tonumber(ARGV[4]), sid)
  keep(tonumber(ARGV[2]))
end
return 0
"""
# ARGV: session ttl ms, then session, age ms pairs; a slot given while the store was away (GT: a newer claim stands)
_RESTORE = _SLOTS + """
for i = 2, #ARGV, 2 do redis.call('ZADD', KEYS[1], 'GT', now - tonumber(ARGV[i + 1]), ARGV[i]) end
if #ARGV > 1 then keep(tonumber(ARGV[1])) end
return 0
"""


class RedisStore:
    """The store on a Redis server (redis-py's asyncio client): each step is one Lua script, so it
    is atomic among every replica's steps. Times are the server's (``TIME``), so replicas' clocks
    need not agree. Keys: ``PREFIX:replicas``, ``PREFIX:replica:ID``, ``PREFIX:sessions``, ``PREFIX:claims``, ``PREFIX:claimed``, and the
    pause rule's ``PREFIX:lapses``, ``PREFIX:ended``, ``PREFIX:pauses``. ``pause``: the session ledger's (``SessionLedger``),
    in the same units; Redis keeps times in whole milliseconds."""

    kind = "redis"

    def __init__(self, url: str, prefix: str, replica_ttl_s: float, session_ttl_s: float, pause: tuple[float, float] | None = None) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # no retries inside the client: a failed step is the replica's signal to serve on local state
        self.r = aioredis.from_url(url, decode_responses=True, socket_timeout=STORE_TIMEOUT_S, socket_connect_timeout=STORE_TIMEOUT_S,
                                   retry=Retry(NoBackoff(), 0))
        self.prefix = prefix
        self.replicas_key = f"{prefix}:replicas"
        #: _CLAIMS's KEYS[6..7]
        self.claim_keys = [f"{prefix}:claims", f"{prefix}:claimed"]
        #: _SLOTS's KEYS[1..4]
        self.slot_keys = [f"{prefix}:{k}" for k in ("sessions", "lapses", "ended", "pauses")]
        self.replica_ttl_ms = max(1, round(replica_ttl_s * 1000))
        self.session_ttl_ms = max(1, round(session_ttl_s * 1000))
        self.pause_ms = None if pause is None else (round(pause[0] * 1000), round(pause[1] * 1000))
        self._sync = self.r.register_script(_SYNC)
        self._settle = self.r.register_script(_SETTLE)
        self._ended = self.r.register_script(_ENDED)
        self._restore = self.r.register_script(_RESTORE)

    async def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        import redis

        try:
            return await script(keys=keys, args=args)
        except (redis.RedisError, OSError) as err:
            raise StoreUnavailable(f"{type(err).__name__}: {err}") from None

    async def sync(self, replica: str, seq: int, counts: Mapping[str, float], session: str | None) -> Synced:
        args: list[Any] = [self.prefix, replica, seq, self.replica_ttl_ms, session or "", self.session_ttl_ms, round(CLAIM_TTL_S * 1000)]
        for k, v in counts.items():
            if v:
                args += [k, repr(float(v))]
        out = await self._call(self._sync, [*self.slot_keys, self.replicas_key, *self.claim_keys], args)
        others = {out[i]: float(out[i + 1]) for i in range(3, len(out), 2)}
        return Synced(others, Sessions(bool(out[0]), int(out[1]), float(out[2]) / 1000))

    async def settle(self, session: str, stamp: float, admitted: bool) -> None:
        await self._call(
            self._settle, [*self.slot_keys, self.replicas_key, *self.claim_keys],
            [session, round(stamp * 1000), int(admitted), self.session_ttl_ms],
        )

    async def ended(self, session: str) -> None:
        if self.pause_ms is not None:  # without a pause rule there is nothing to keep (as SessionLedger.idle)
            await self._call(self._ended, self.slot_keys, [session, self.session_ttl_ms, *self.pause_ms])

    async def restore_sessions(self, ages: Sequence[tuple[str, float]]) -> None:
        args: list[Any] = [self.session_ttl_ms]
        for sid, age in ages:
            args += [sid, round(age * 1000)]
        await self._call(self._restore, self.slot_keys, args)

    async def drop(self, replica: str) -> None:
        import redis

        try:
            await self.r.delete(f"{self.prefix}:replica:{replica}")
            await self.r.zrem(self.replicas_key, replica)
        except (redis.RedisError, OSError) as err:
            raise StoreUnavailable(f"{type(err).__name__}: {err}") from None

    async def close(self) -> None:
        await self.r.aclose()
