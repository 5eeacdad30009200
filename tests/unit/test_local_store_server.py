"""The one-host store (``coda.gateway.host_store``): a ``LocalStore`` served over a Unix socket
answers every step through ``HostStore`` as it answers them in process, and a store that is not
there, stops answering, or comes back is the replica's ``StoreUnavailable`` and then a store again."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from coda.gateway.host_store import HostStore, serve_host_store
from coda.gateway.store import LocalStore, Store, StoreUnavailable, Synced
from coda.shell.sessions import SessionLedger

TTL_S = 60.0
SESSION_TTL_S = 300.0


def local() -> LocalStore:
    return LocalStore(SessionLedger(SESSION_TTL_S), lambda: 1000.0, TTL_S)


def listener(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    return sock


async def steps(s: Store) -> list[Synced]:
    """Every kind of step; each sync's answer: tables kept, summed, superseded and dropped; session
    slots claimed, settled both ways and restored."""
    out = [
        await s.sync("a", 1, {"n|w0": 2, "t|x": 100, "q": 0}, None),
        await s.sync("b", 1, {"n|w0": 1, "n|w1": 3, "ttft|w0": 0.25, "ttftn|w0": 1}, "s1"),
        await s.sync("a", 2, {"n|w0": 1}, "s2"),
        await s.sync("a", 1, {"n|w0": 9}, None),  # an older table that arrives late changes nothing
    ]
    await s.settle("s1", out[1].sessions.stamp, True)
    await s.settle("s2", out[2].sessions.stamp, False)
    await s.restore_sessions([("s9", 1.0)])
    out.append(await s.sync("c", 1, {}, "s1"))
    await s.drop("b")
    out.append(await s.sync("c", 2, {}, "s9"))
    return out


def test_every_step_answers_as_the_store_in_process(tmp_path):
    path = tmp_path / "store.sock"

    async def main() -> tuple[list[Synced], list[Synced]]:
        server = await serve_host_store(local(), listener(path))
        client = HostStore(str(path))
        try:
            return await steps(client), await steps(local())
        finally:
            await client.close()
            server.close()

    remote, here = asyncio.run(main())
    assert remote == here
    assert here[1].others == {"n|w0": 2.0, "t|x": 100.0}  # a's table; b's own is not in it
    assert here[-1].others == {"n|w0": 1.0}  # b dropped; a's newest table
    assert (here[-2].sessions.active, here[-2].sessions.count) == (True, 2)  # s1 settled admitted, s2 refused, s9 restored
    assert here[-1].sessions.active  # s9 restored


#: a parent process that serves the store on argv[1] until it is killed
PARENT = """
import asyncio, socket, sys, time
from coda.gateway.host_store import serve_host_store
from coda.gateway.store import LocalStore
from coda.shell.sessions import SessionLedger

async def main():
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(sys.argv[1])
    sock.listen()
    await serve_host_store(LocalStore(SessionLedger(300.0), time.monotonic, 60.0), sock)
    print("serving", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@contextlib.contextmanager
def parent(path: Path) -> Iterator[subprocess.Popen[str]]:
    """The store served by another process (killed at the end, as a parent that dies)."""
    path.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", PARENT, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "serving\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_store_absent_or_dead_is_store_unavailable_until_one_answers_again(tmp_path):
    path = tmp_path / "store.sock"
    client = HostStore(str(path))
    sync = asyncio.new_event_loop()

    def step(seq: int, counts: dict[str, float]) -> Synced:
        return sync.run_until_complete(client.sync("a", seq, counts, None))

    try:
        with pytest.raises(StoreUnavailable):
            step(1, {})  # nothing listens there yet
        with parent(path) as first:
            assert step(2, {"n|w0": 1}).others == {}  # the next step connects
            first.kill()
            first.wait()
            with pytest.raises(StoreUnavailable):
                step(3, {"n|w0": 1})  # the parent died: its connection is gone
        with parent(path):
            assert step(4, {"n|w0": 1}).others == {}  # a new parent, empty: the replica connects again and republishes
            other = HostStore(str(path))
            assert sync.run_until_complete(other.sync("b", 1, {}, None)).others == {"n|w0": 1.0}
            sync.run_until_complete(other.close())
    finally:
        sync.run_until_complete(client.close())
        sync.close()


def test_a_store_that_does_not_answer_is_unavailable_and_its_late_answer_is_never_read(tmp_path):
    """A server that takes a step and does not answer it: the step times out and the connection is
    dropped, so an answer written there afterwards is never read as the next step's."""
    path = tmp_path / "store.sock"
    store = local()
    stalled: list[asyncio.StreamWriter] = []

    async def main() -> None:
        async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            stalled.append(writer)

        mute = await asyncio.start_unix_server(stall, sock=listener(path))
        client = HostStore(str(path))
        with pytest.raises(StoreUnavailable):
            await client.sync("a", 1, {"n|w0": 5}, None)
        mute.close()
        late = msgspec.msgpack.encode([{"n|w9": 7.0}, False, 0, 0.0])  # a sync's answer, as the store frames it
        stalled[0].write(struct.pack(">I", len(late)) + late)
        path.unlink()
        server = await serve_host_store(store, listener(path))
        assert (await client.sync("a", 2, {"n|w0": 1}, None)).others == {}  # its own answer: no other replica yet
        assert (await store.sync("b", 1, {}, None)).others == {"n|w0": 1.0}
        server.close()
        await client.close()

    asyncio.run(main())
