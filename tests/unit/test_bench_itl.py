"""ITL and TBT on a scripted stream with chunked tokens: the client keeps one gap per chunk and
zeros for the tokens a chunk carries together; ITL is per request ``(e2e - ttft) / (n - 1)``,
whatever the chunking."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.bench.client import Attempt, Endpoint
from coda.metrics.requests import Window, summarize


class ScriptedStream(httpx.AsyncByteStream):
    """SSE chunks released at scripted client times: ``clock()`` reads the time of the latest one."""

    def __init__(self, chunks: list[tuple[float, list[str]]]) -> None:
        self.chunks = chunks
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i, (t, words) in enumerate(self.chunks):
            self.now = t
            delta = {"content": ("" if i == 0 else " ") + " ".join(words)}
            yield b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}).encode() + b"\n\n"
        yield b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}\n\ndata: [DONE]\n\n'


def read(chunks: list[tuple[float, list[str]]]) -> Attempt:
    stream = ScriptedStream(chunks)
    endpoint = Endpoint("http://127.0.0.1:9", model="m", clock=stream.clock)
    attempt = Attempt(sent_s=0.0)
    resp = httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)
    asyncio.run(endpoint._read_stream(resp, attempt))
    return attempt


def record(a: Attempt, ready_s: float = 0.0) -> dict:
    """A completed round as the replay records it."""
    first, last = a.first_token_s, a.last_token_s
    return {"ready_s": ready_s, "first_token_s": first, "finish_s": last, "output_tokens": a.tokens, "prompt_tokens": 10,
            "new_input_tokens": 10, "round": 0, "gaps_s": a.gaps, "tbt_mean_s": (last - first) / (a.tokens - 1), "state": "completed"}


def test_chunked_tokens_are_zero_gaps_but_itl_spreads_the_decode_time_over_every_token():
    # 8 tokens in 4 chunks: 1 at 1.0 s, 3 at 1.3 s, 1 at 1.4 s, 3 at 2.0 s
    a = read([(1.0, ["a"]), (1.3, ["b", "c", "d"]), (1.4, ["e"]), (2.0, ["f", "g", "h"])])
    assert a.reason is None and a.tokens == 8 and a.text == "a b c d e f g h"
    assert a.gaps == [pytest.approx(0.3), 0.0, 0.0, pytest.approx(0.1), pytest.approx(0.6), 0.0, 0.0]
    s = summarize([record(a)], Window(0.0, 10.0), ttft_slo_s=5.0, tbt_slo_s=0.1)
    assert s["ttft_p50_s"] == 1.0 and s["e2e_p50_s"] == 2.0
    assert s["itl_p50_s"] == pytest.approx(1.0 / 7) == s["itl_mean_s"]  # (e2e - ttft) / (n - 1)
    assert s["tbt_p50_s"] == 0.0 and s["tbt_mean_s"] == pytest.approx(1.0 / 7)  # four of the seven gaps are zeros


@given(st.lists(st.tuples(st.floats(0.001, 0.5), st.integers(1, 5)), min_size=2, max_size=30))
def test_itl_is_the_decode_time_over_the_gaps_and_tbt_has_one_gap_per_token(plan):
    t, chunks, n = 0.5, [], 0
    for dt, k in plan:
        t += dt
        chunks.append((t, [f"w{n + i}" for i in range(k)]))
        n += k
    a = read(chunks)
    assert a.tokens == n and len(a.gaps) == n - 1 and a.gaps.count(0.0) >= n - len(plan)
    s = summarize([record(a)], Window(0.0, 1e6), ttft_slo_s=5.0, tbt_slo_s=0.1)
    assert s["itl_p50_s"] == pytest.approx((chunks[-1][0] - chunks[0][0]) / (n - 1))
    assert s["tbt_mean_s"] == pytest.approx(s["itl_p50_s"])  # one request: the pooled mean gap is its ITL


def test_itl_percentiles_are_over_requests_not_tokens():
    slow = read([(1.0, ["a"]), (2.0, ["b"])])  # 1 gap of 1 s
    fast = read([(1.0, ["a"])] + [(1.0 + 0.01 * i, [f"w{i}"]) for i in range(1, 11)])  # 10 gaps of 10 ms
    s = summarize([record(slow), record(fast)], Window(0.0, 10.0), ttft_slo_s=5.0, tbt_slo_s=0.1)
    assert s["itl_p50_s"] == pytest.approx((1.0 + 0.01) / 2)  # the median of two requests
    assert s["tbt_p50_s"] == pytest.approx(0.01)  # ten of the eleven pooled gaps are the fast request's
