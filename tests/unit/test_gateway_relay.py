"""The relay of an engine's answer: a worker streaming to the gateway shows it is alive, so its
next health check is skipped (``Worker.answered_s``), unless what it streams is a 5xx."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest

from coda.gateway.admission import JsonlLog
from coda.gateway.prometheus import GatewayMetrics
from coda.gateway.proxy import Exchange, Relay
from tests.conftest import ManualClock
from tests.unit.test_gateway_state import make_state, ticket

EVENT = b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'


async def relay_stream(status: int, chunks: int) -> tuple[float, list[float], bool]:
    """Relay ``chunks`` SSE events, one clock second apart; returns the worker's ``answered_s``,
    the clock at each chunk, and whether the relay reports a completed answer."""
    clock = ManualClock()
    state = make_state(clock)
    t = ticket(state, "a", "s", 256)
    w = state.workers[0]
    state.begin(t, w)
    relay = Relay(state, None, None, GatewayMetrics(), JsonlLog(None), JsonlLog(None), str)  # type: ignore[arg-type]
    seen: list[float] = []

    async def body() -> AsyncIterator[bytes]:
        for _ in range(chunks):
            clock.t += 1.0
            seen.append(clock.t)
            yield EVENT

    async def send(message: dict[str, Any]) -> None:
        pass

    headers = ((b"Content-Type", b"text/event-stream"),)
    done = await Exchange(relay, t, b"", [], True, 0.0)._relay(send, w, status, headers, EVENT, body())
    return w.answered_s, seen, done


def test_a_streaming_worker_counts_as_answering_until_its_last_chunk():
    answered, seen, done = asyncio.run(relay_stream(200, 5))
    assert done
    assert answered == pytest.approx(seen[-1])


def test_a_worker_streaming_a_server_error_does_not_count_as_answering():
    answered, _, done = asyncio.run(relay_stream(503, 3))
    assert not done
    assert answered == -math.inf
