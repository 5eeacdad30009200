"""The store gateway replicas share: the in-process ``LocalStore`` and ``RedisStore`` (a real
redis-server) answer the same steps alike: other replicas' tables summed, newest table kept,
expired and dropped tables gone, session slots claimed, released and restored."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coda.gateway.store import LocalStore, RedisStore, Store, StoreUnavailable
from coda.shell.sessions import SessionLedger
from tests.conftest import ManualClock
from tests.integration.redis_server import RedisServer, redis_server  # noqa: F401  (a fixture)
from tests.waiting import wait_until

TTL_S = 60.0  # a table's life without a refresh: longer than any test takes
SHORT_TTL_S = 2.0  # the expiry test's, which waits for it to pass (long enough for two steps on a busy machine)
SESSION_TTL_S = 300.0



@dataclass
class Backend:
    """Makes a store (with a table TTL) inside the running event loop, and lets that TTL pass."""

    make: Callable[[float], Store]
    expire: Callable[[Store], Awaitable[None]]


@pytest.fixture(params=["local", "redis"])
def backend(request) -> Iterator[Backend]:
    if request.param == "local":
        clock = ManualClock(1000.0)

        async def later(_: Store) -> None:
            clock.t += 2 * SHORT_TTL_S

        yield Backend(lambda ttl: LocalStore(SessionLedger(SESSION_TTL_S), clock, ttl), later)
        return
    server: RedisServer = request.getfixturevalue("redis_server")

    async def gone(_: Store) -> None:
        keys = server.client()
        await asyncio.to_thread(wait_until, lambda: not keys.exists("test:replica:b"), "replica b's table expires")

    yield Backend(lambda ttl: RedisStore(server.url, "test", ttl, SESSION_TTL_S), gone)


def run(backend: Backend, body: Callable[[Store], Awaitable[None]], ttl_s: float = TTL_S) -> None:
    async def main() -> None:
        store = backend.make(ttl_s)
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

    run(backend, body, SHORT_TTL_S)


def test_session_slots_are_claimed_settled_and_restored(backend):
    async def body(s: Store) -> None:
        first = (await s.sync("a", 1, {}, "s1")).sessions
        assert (first.active, first.count) == (False, 0)
        await s.settle("s1", first.stamp, True)  # admitted: s1 holds a slot
        again = (await s.sync("b", 1, {}, "s1")).sessions  # the same session through another replica
        assert (again.active, again.count) == (True, 1)
        new = (await s.sync("a", 2, {}, "s2")).sessions
        assert (new.active, new.count) == (False, 1)
        # while s2's first request is being decided its claim counts as taken, but s2 is not a continuation yet
        other = (await s.sync("b", 2, {}, "s2")).sessions
        assert (other.active, other.count) == (False, 2)
        await s.settle("s2", new.stamp, False)  # the earlier claim's refusal leaves the later claim counting
        assert (await s.sync("c", 1, {}, None)).sessions.count == 2
        await s.settle("s2", other.stamp, False)  # refused too: s2 takes no slot
        assert (await s.sync("c", 2, {}, None)).sessions.count == 1
        first3 = (await s.sync("a", 3, {}, "s3")).sessions
        later3 = (await s.sync("b", 3, {}, "s3")).sessions
        await s.settle("s3", later3.stamp, False)  # the later claim's refusal leaves the earlier one counting
        assert (await s.sync("c", 3, {}, None)).sessions.count == 2
        await s.settle("s3", first3.stamp, False)
        assert (await s.sync("c", 4, {}, None)).sessions.count == 1
        await s.restore_sessions([("s9", 1.0)])  # a slot a replica gave while the store was away
        back = (await s.sync("a", 4, {}, "s9")).sessions
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


tables_st = st.dictionaries(st.sampled_from(["n|w0", "n|w1", "t|x", "q"]), st.integers(0, 5), max_size=4)
steps_st = st.lists(st.one_of(
    st.tuples(st.just("sync"), st.sampled_from("abc"), st.integers(-1, 2), tables_st, st.sampled_from([None, "s1", "s2"])),
    st.tuples(st.just("drop"), st.sampled_from("abc")),
    st.tuples(st.just("settle"), st.sampled_from(["s1", "s2"]), st.booleans(), st.integers(0, 3)),
), max_size=25)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=steps_st)
def test_local_and_redis_stores_answer_any_sequence_of_steps_alike(redis_server, steps):  # noqa: F811
    """Tables published (some late, with an older sequence number), replicas dropped, session
    slots claimed and settled: both stores read back the same sums and the same slots at every step."""
    redis_server.client().flushall()

    async def main() -> None:
        local = LocalStore(SessionLedger(SESSION_TTL_S), ManualClock(1000.0), 1000.0)
        remote = RedisStore(redis_server.url, "prop", 1000.0, SESSION_TTL_S)
        seqs = {r: 10 for r in "abc"}
        claims: dict[tuple[int, str], list[float]] = {}  # (store, session) -> its open claims' stamps, in that store's clock
        try:
            for step in steps:
                if step[0] == "settle":  # any open claim of the session, not only its last
                    for i, store in enumerate((local, remote)):
                        if stamps := claims.get((i, step[1])):
                            await store.settle(step[1], stamps.pop(step[3] % len(stamps)), step[2])
                    continue
                if step[0] == "drop":
                    await local.drop(step[1])
                    await remote.drop(step[1])
                    continue
                _, replica, bump, table, session = step
                seqs[replica] += bump  # -1: a table that arrives after a newer one; 0: the same one again
                a = await local.sync(replica, seqs[replica], table, session)
                b = await remote.sync(replica, seqs[replica], table, session)
                assert a.others == b.others
                assert (a.sessions.active, a.sessions.count) == (b.sessions.active, b.sessions.count)
                if session is not None and not a.sessions.active:
                    claims.setdefault((0, session), []).append(a.sessions.stamp)
                    claims.setdefault((1, session), []).append(b.sessions.stamp)
        finally:
            await remote.close()

    asyncio.run(main())
