"""The one-host store: the ``coda serve --workers`` parent's ``LocalStore``, served to its worker
processes over a Unix domain socket.

The workers are replicas of one gateway, so each decision must read every worker's counts and
the session slots (``coda.gateway.store``). Without ``store.url`` there is no Redis to hold them;
the parent, which outlives every worker, holds them instead. Its one event loop runs each step to
the end before the next, so steps are atomic among workers as Redis's scripts are. A step is one
frame each way: a 4-byte length, then msgpack (msgspec: a few hundred bytes, decoded in C). The
socket lives in a directory only the gateway's user can enter, so no other user can reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Mapping, Sequence

import msgspec

from coda.gateway.store import STORE_TIMEOUT_S, LocalStore, Sessions, StoreUnavailable, Synced

#: how ``store.url`` names the one-host store (set by the parent for its workers; not a user setting)
HOST_STORE_SCHEME = "unix://"
#: the largest frame either side reads: a restore of every slot the ledger holds (200,000 sessions) is about 10 MB
MAX_FRAME_BYTES = 64 << 20
_LENGTH = struct.Struct(">I")


class _Sync(msgspec.Struct, tag="sync", array_like=True):
    replica: str
    seq: int
    counts: dict[str, float]
    session: str | None


class _Settle(msgspec.Struct, tag="settle", array_like=True):
    session: str
    stamp: float
    admitted: bool


class _Ended(msgspec.Struct, tag="ended", array_like=True):
    session: str


class _Restore(msgspec.Struct, tag="restore", array_like=True):
    ages: list[tuple[str, float]]


class _Drop(msgspec.Struct, tag="drop", array_like=True):
    replica: str


class _Reply(msgspec.Struct, array_like=True):
    """A sync's answer (the other steps answer an empty one)."""

    others: dict[str, float] = {}
    active: bool = False
    count: int = 0
    stamp: float = 0.0


_Step = _Sync | _Settle | _Ended | _Restore | _Drop
_encode = msgspec.msgpack.Encoder().encode
_steps = msgspec.msgpack.Decoder(_Step)
_replies = msgspec.msgpack.Decoder(_Reply)


async def _read(reader: asyncio.StreamReader) -> bytes:
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"a frame of {size} bytes is over {MAX_FRAME_BYTES}")
    return await reader.readexactly(size)


def _frame(payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload)) + payload


async def _apply(store: LocalStore, step: _Step) -> _Reply:
    if isinstance(step, _Sync):
        synced = await store.sync(step.replica, step.seq, step.counts, step.session)
        return _Reply(synced.others, synced.sessions.active, synced.sessions.count, synced.sessions.stamp)
    if isinstance(step, _Settle):
        await store.settle(step.session, step.stamp, step.admitted)
    elif isinstance(step, _Ended):
        await store.ended(step.session)
    elif isinstance(step, _Restore):
        await store.restore_sessions(step.ages)
    else:
        await store.drop(step.replica)
    return _Reply()


async def serve_host_store(store: LocalStore, sock: socket.socket) -> asyncio.Server:
    """Serve ``store`` on ``sock`` (a listening Unix socket) until the returned server is closed.
    A connection that sends what is not a step is closed: its worker sees the store unavailable."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, ValueError, msgspec.DecodeError):
            while True:
                writer.write(_frame(_encode(await _apply(store, _steps.decode(await _read(reader))))))
        writer.close()

    return await asyncio.start_unix_server(connection, sock=sock)


class HostStore:
    """The ``Store`` protocol on the parent's socket: one connection, one step at a time (a
    replica's decisions already go one at a time; the lock orders them with its publisher). A
    step that fails or takes longer than ``STORE_TIMEOUT_S`` drops the connection, so a late
    answer is never read as the next step's, and raises ``StoreUnavailable``; the next step
    connects again."""

    kind = "one-host"

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = asyncio.Lock()
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def _step(self, step: _Step) -> _Reply:
        async with self._lock:
            try:
                return await asyncio.wait_for(self._exchange(step), STORE_TIMEOUT_S)
            except (OSError, EOFError, TimeoutError, ValueError, msgspec.DecodeError) as err:
                self._disconnect()
                raise StoreUnavailable(f"{type(err).__name__}: {err}") from None

    async def _exchange(self, step: _Step) -> _Reply:
        if self._conn is None:
            self._conn = await asyncio.open_unix_connection(self.path)
        reader, writer = self._conn
        writer.write(_frame(_encode(step)))
        return _replies.decode(await _read(reader))

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None

    async def sync(self, replica: str, seq: int, counts: Mapping[str, float], session: str | None) -> Synced:
        r = await self._step(_Sync(replica, seq, {k: float(v) for k, v in counts.items() if v}, session))
        return Synced(r.others, Sessions(r.active, r.count, r.stamp))

    async def settle(self, session: str, stamp: float, admitted: bool) -> None:
        await self._step(_Settle(session, stamp, admitted))

    async def ended(self, session: str) -> None:
        await self._step(_Ended(session))

    async def restore_sessions(self, ages: Sequence[tuple[str, float]]) -> None:
        await self._step(_Restore(list(ages)))

    async def drop(self, replica: str) -> None:
        await self._step(_Drop(replica))

    async def close(self) -> None:
        self._disconnect()
