"""The store gateway replicas share: the in-process ``LocalStore`` and ``RedisStore`` (a real
redis-server) answer the same steps alike: other replicas' tables summed, newest table kept,
expired and dropped tables gone, session slots claimed, released and restored."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import pytest

from coda.gateway.store import LocalStore, RedisStore, Store, StoreUnavailable
from coda.policy.ingress import SessionLedger
from tests.integration.redis_server import RedisServer, redis_server  # noqa: F401  (a fixture)
from tests.waiting import wait_until

TTL_S = 0.3  # a table's life without a refresh
SESSION_TTL_S = 300.0


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Backend:
    """Makes a store inside the running event loop, and lets a table's TTL pass."""

    make: Callable[[], Store]
    expire: Callable[[Store], Awaitable[None]]
    tick: Callable[[], Awaitable[None]]  # the store's clock moves on (a later claim gets a later stamp)


@pytest.fixture(params=["local", "redis"])
def backend(request) -> Iterator[Backend]:
    if request.param == "local":
        clock = Clock()

        async def later(_: Store) -> None:
            clock.t += 2 * TTL_S

        async def tick() -> None:
            clock.t += 0.01

        yield Backend(lambda: LocalStore(SessionLedger(SESSION_TTL_S), clock, TTL_S), later, tick)
        return
    server: RedisServer = request.getfixturevalue("redis_server")

    async def gone(_: Store) -> None:
        keys = server.client()
        await asyncio.to_thread(wait_until, lambda: not keys.exists("test:replica:b"), "replica b's table expires")

    async def next_ms() -> None:
        await asyncio.sleep(0.005)  # the server's clock, in ms, moves past the last claim's

    yield Backend(lambda: RedisStore(server.url, "test", TTL_S, SESSION_TTL_S), gone, next_ms)


def run(backend: Backend, body: Callable[[Store], Awaitable[None]]) -> None:
    async def main() -> None:
        store = backend.make()
        try:
            await body(store)
        finally:
            await store.close()

    asyncio.run(main())


def test_each_replica_reads_the_others_tables_summed_and_the_newest_table_stands(backend):
    async def body(s: Store) -> None:
        assert (await s.sync("a", 1, {"n|w0": 2, "t|x": 100}, None)).others == {}
        got = await s.sync("b", 1, {"n|w0": 1, "n|w1": 3, "t|x": 50, "q": 0}, None)
        assert got.others == {"n|w0": 2, "t|x": 100}  # a's table; b's own is not in it
        assert (await s.sync("a", 2, {"n|w0": 1}, None)).others == {"n|w0": 1, "n|w1": 3, "t|x": 50}
        await s.sync("a", 1, {"n|w0": 9}, None)  # an older table that arrives late changes nothing
        assert (await s.sync("c", 1, {}, None)).others == {"n|w0": 2, "n|w1": 3, "t|x": 50}
        await s.sync("b", 2, {"ttft|w0": 0.25, "ttftn|w0": 1}, None)
        assert (await s.sync("c", 2, {}, None)).others == {"n|w0": 1, "ttft|w0": 0.25, "ttftn|w0": 1}
        await s.drop("a")
        assert (await s.sync("c", 3, {}, None)).others == {"ttft|w0": 0.25, "ttftn|w0": 1}

    run(backend, body)


def test_a_table_not_refreshed_expires(backend):
    async def body(s: Store) -> None:
        await s.sync("b", 1, {"n|w0": 4}, None)
        assert (await s.sync("a", 1, {}, None)).others == {"n|w0": 4}
        await backend.expire(s)
        assert (await s.sync("a", 2, {}, None)).others == {}  # b died without a goodbye: its counts are gone, not leaked

    run(backend, body)


def test_session_slots_are_claimed_released_and_restored(backend):
    async def body(s: Store) -> None:
        first = (await s.sync("a", 1, {}, "s1")).sessions
        assert (first.active, first.count) == (False, 0)
        await backend.tick()
        again = (await s.sync("b", 1, {}, "s1")).sessions  # the same session through another replica holds its slot
        assert (again.active, again.count) == (True, 1)
        new = (await s.sync("a", 2, {}, "s2")).sessions
        assert (new.active, new.count) == (False, 1)
        await s.release("s2", new.stamp)  # s2's request was not admitted: its slot goes back
        assert (await s.sync("a", 3, {}, None)).sessions.count == 1
        await s.release("s1", first.stamp)  # an earlier claim's release leaves the later claim standing
        assert (await s.sync("a", 4, {}, "s1")).sessions.active
        await s.restore_sessions([("s9", 1.0)])  # a slot a replica gave while the store was away
        back = (await s.sync("a", 5, {}, "s9")).sessions
        assert back.active and back.count == 2

    run(backend, body)


def test_an_unreachable_redis_raises_store_unavailable(redis_server):  # noqa: F811
    async def main() -> None:
        store = RedisStore(redis_server.url, "test", TTL_S, SESSION_TTL_S)
        await store.sync("a", 1, {"n|w0": 1}, None)
        redis_server.kill()
        with pytest.raises(StoreUnavailable):
            await store.sync("a", 2, {"n|w0": 1}, None)
        await store.close()

    asyncio.run(main())
