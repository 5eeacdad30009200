"""Publish KV events as vLLM's ``ZmqEventPublisher`` does, from the fake engine's asyncio loop.

PUB binds when the endpoint has a wildcard (``tcp://*:5557``) or is ``ipc://``/``inproc://``,
and connects otherwise (vLLM's rule); messages are ``(topic, seq, payload)``. The last
``buffer_steps`` batches are kept for the optional ROUTER replay socket. PUB sends never block
(messages past the high-water mark are dropped, which subscribers detect by a sequence gap).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import zmq
import zmq.asyncio

from coda.errors import CodaError
from coda.protocol.kv_events import END_SEQ, KVCacheEvent, KVEventBatch, encode_frames


class KVEventPublisher:
    def __init__(
        self, endpoint: str, replay_endpoint: str | None = None, topic: str = "", buffer_steps: int = 10_000, hwm: int = 100_000
    ) -> None:
        self._ctx = zmq.Context()  # PUB sends synchronously (never blocks)
        self._actx = zmq.asyncio.Context()  # the replay ROUTER is served by an asyncio task
        self._topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        try:
            if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
                self._pub.bind(endpoint)
            else:
                self._pub.connect(endpoint)
            if replay_endpoint:
                self._replay = self._actx.socket(zmq.ROUTER)
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError as err:
            self.close()
            raise CodaError(f"KV events: cannot open {endpoint if self._replay is None else replay_endpoint}: {err}") from None
        if self._replay is not None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    def publish(self, events: list[KVCacheEvent]) -> None:
        """Send one batch (one engine step's events) with the next sequence number."""
        frames = encode_frames(self._topic, self._seq, KVEventBatch(ts=time.time(), events=events))
        try:
            self._pub.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # over the high-water mark: dropped, as vLLM's PUB drops; the gap shows in seq
        self._buffer.append((self._seq, frames[2]))
        self._seq += 1

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                continue  # vLLM ignores malformed replay requests too
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
            await self._replay.send_multipart((client, b"", END_SEQ, b""))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._ctx.term()
        self._actx.term()
