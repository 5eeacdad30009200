"""The store's session slots under a pause rule (``SessionLedger``'s ``pause``): a replica says when
none of its requests of a session is in flight any more (``Store.ended``), and the store lets the
slot lapse once the session has not come back within its own longest pause plus the margin, long
before the TTL, as the replica's own ledger does. In process (``LocalStore``), through the
one-host store's socket (``HostStore``), and in Redis's scripts (a real redis-server)."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

from coda.gateway.host_store import HostStore, serve_host_store
from coda.gateway.store import LocalStore, RedisStore, Store
from coda.shell.sessions import SessionLedger
from tests.conftest import ManualClock
from tests.integration.redis_server import RedisServer, redis_server  # noqa: F401  (a fixture)
from tests.waiting import HANG_GUARD_S

PAUSE = (30.0, 5.0)  # a session's pause before it has shown one, the margin past its longest
SESSION_TTL_S = 300.0  # longer than any wait here: a slot that goes, goes by its pause
TABLE_TTL_S = 60.0



def paused_store(clock: ManualClock) -> LocalStore:
    return LocalStore(SessionLedger(SESSION_TTL_S, None, PAUSE), clock, TABLE_TTL_S)


async def admit(s: Store, replica: str, session: str) -> bool:
    """A request of ``session`` admitted through ``replica`` (its claim, settled when new); whether it was a continuation."""
    claim = (await s.sync(replica, 1, {}, session)).sessions
    if not claim.active:
        await s.settle(session, claim.stamp, True)
    return claim.active


async def held(s: Store) -> int:
    """Slots taken, as a replica deciding a request without a session reads them."""
    return (await s.sync("probe", 1, {}, None)).sessions.count


async def lapses_by_its_own_pause(s: Store, clock: ManualClock) -> None:
    await admit(s, "a", "s1")
    clock.t = 1010.0
    await s.ended("s1")
    clock.t = 1044.0
    assert await held(s) == 1  # within its first pause (30 s) plus the margin (5 s) since its end
    clock.t = 1045.5
    assert await held(s) == 0  # not back: its slot lapsed, long before the 300 s TTL
    clock.t = 1050.0
    await admit(s, "a", "s2")
    clock.t = 1051.0
    await s.ended("s2")
    clock.t = 1054.0
    assert await admit(s, "b", "s2")  # back after 3 s, through another replica: a continuation
    clock.t = 1099.0
    assert await held(s) == 1  # it came back: the lapse due at 1086 is off
    await s.ended("s2")
    clock.t = 1106.5
    assert await held(s) == 1
    clock.t = 1107.5
    assert await held(s) == 0  # its own longest pause (3 s) plus the margin


def test_a_local_store_lapses_a_slot_once_its_session_has_not_come_back_within_its_pause():
    clock = ManualClock(1000.0)
    asyncio.run(lapses_by_its_own_pause(paused_store(clock), clock))


def test_without_a_pause_rule_the_ttl_alone_releases_a_slot():
    async def main() -> None:
        clock = ManualClock(1000.0)
        s = LocalStore(SessionLedger(SESSION_TTL_S), clock, TABLE_TTL_S)
        await admit(s, "a", "s1")
        await s.ended("s1")
        clock.t += SESSION_TTL_S
        assert await held(s) == 1
        clock.t += 1.0
        assert await held(s) == 0

    asyncio.run(main())


def test_the_shell_reports_a_session_once_none_of_its_requests_is_in_flight():
    ledger = SessionLedger(SESSION_TTL_S, None, PAUSE)
    ledger.touch("s1", 0.0)
    ledger.touch("s1", 1.0)
    assert not ledger.ended("s1", 2.0)  # one still in flight
    assert ledger.ended("s1", 3.0)
    assert not SessionLedger(SESSION_TTL_S).ended("s1", 3.0)  # no pause rule: nothing to report


def test_the_one_host_store_lapses_a_slot_by_its_pause_as_in_process(tmp_path: Path):
    path = tmp_path / "store.sock"

    async def main() -> None:
        clock = ManualClock(1000.0)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        sock.listen()
        server = await serve_host_store(paused_store(clock), sock)
        client = HostStore(str(path))
        try:
            await lapses_by_its_own_pause(client, clock)
        finally:
            await client.close()
            server.close()

    asyncio.run(main())


def test_redis_lapses_a_slot_by_its_sessions_own_pause(redis_server: RedisServer):  # noqa: F811
    """Redis keeps its own time, so the first store's pause is read where it is kept (the lapse
    due at the end plus the pause plus the margin), and a second store's short pause is waited out."""
    keys = redis_server.client()

    async def main() -> None:
        store = RedisStore(redis_server.url, "slow", TABLE_TTL_S, SESSION_TTL_S, PAUSE)
        quick = RedisStore(redis_server.url, "quick", TABLE_TTL_S, SESSION_TTL_S, (0.05, 0.05))
        try:
            await admit(store, "a", "s1")
            await store.ended("s1")
            assert keys.zscore("slow:lapses", "s1") == int(keys.hget("slow:ended", "s1")) + 35_000  # first pause + margin, in ms
            assert await admit(store, "b", "s1")  # back through another replica: a continuation
            assert not keys.hexists("slow:ended", "s1") and keys.zscore("slow:lapses", "s1") is None
            pause = int(keys.hget("slow:pauses", "s1"))
            await store.ended("s1")
            assert keys.zscore("slow:lapses", "s1") == int(keys.hget("slow:ended", "s1")) + pause + 5_000  # its own pause + margin

            await admit(quick, "a", "s1")
            await quick.ended("s1")
            guard = time.monotonic() + HANG_GUARD_S  # under the 300 s TTL: only the pause can free the slot
            while await held(quick):
                assert time.monotonic() < guard, "the slot did not lapse"
                await asyncio.sleep(0.02)
            assert not any(keys.exists(f"quick:{k}") for k in ("sessions", "lapses", "ended", "pauses"))  # nothing left behind
        finally:
            await store.close()
            await quick.close()

    asyncio.run(main())
