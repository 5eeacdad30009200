"""The profile prober's API-under-load probes against a real HTTP server on loopback whose answers
end in milliseconds: the requests streaming beside the probes are sent again as they end, so
every load yields its probes however fast the engine is, and a probe counts only while every
stream decodes and the engine's histograms count it alone."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from coda.errors import CodaError
from coda.profiling.api_measure import ENGINE_TTFT_PARTS, Prober
from tests.integration.loopback import serve

ENGINE_S = 1e-6  # the engine's queue and prefill time the server reports per finished request
OFF_LOAD_S = 1000.0  # what it reports for a probe that arrived while other than ``load`` answers streamed
READS = 3  # every streamed answer ends at every third read of /metrics


class Engine:
    """An OpenAI completions server with vLLM's queue and prefill histograms, counted as each
    request finishes (as vLLM does). Every streamed answer ends at each ``READS``-th read of
    ``/metrics``: the answers end while the probes go on, whatever the machine's pace."""

    def __init__(self, load: int) -> None:
        self.load = load
        self.status = 200  # the answer to a request streaming beside the probes
        self.seconds = 0.0
        self.finished = 0
        self.ended = 0
        self.streaming = 0
        self.reads = 0

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        if body["max_tokens"] == 1:
            return self.probe()
        if self.status != 200:
            return JSONResponse({"error": {"message": "refused"}}, status_code=self.status)
        return StreamingResponse(self.answer(), media_type="text/event-stream")

    def probe(self) -> Response:
        self.seconds += ENGINE_S if self.streaming == self.load else OFF_LOAD_S
        self.finished += 1
        return StreamingResponse(iter([_chunk(" w", "length"), _usage(1), b"data: [DONE]\n\n"]), media_type="text/event-stream")

    async def answer(self):
        end = (self.reads // READS + 1) * READS
        self.streaming += 1
        try:
            yield _chunk(" w", None)
            while self.reads < end:
                await asyncio.sleep(0.001)
                yield _chunk(" w", None)
            yield _chunk(" w", "length")
        finally:  # counted as the engine finishes it (the finish chunk is on its way)
            self.streaming -= 1
            self.seconds += ENGINE_S
            self.finished += 1
            self.ended += 1
        yield b"data: [DONE]\n\n"

    async def metrics(self, request: Request) -> Response:
        self.reads += 1
        values = {"sum": self.seconds / len(ENGINE_TTFT_PARTS), "count": self.finished}
        return PlainTextResponse("".join(f"{m}_{part} {v}\n" for m in ENGINE_TTFT_PARTS for part, v in values.items()))


def _chunk(text: str, reason: str | None) -> bytes:
    return f"data: {json.dumps({'choices': [{'index': 0, 'text': text, 'finish_reason': reason}]})}\n\n".encode()


def _usage(tokens: int) -> bytes:
    return f"data: {json.dumps({'choices': [], 'usage': {'prompt_tokens': 9, 'completion_tokens': tokens}})}\n\n".encode()


@pytest.fixture
def engine(request):
    state = Engine(request.param)
    app = Starlette(routes=[Route("/v1/completions", state.completions, methods=["POST"]), Route("/metrics", state.metrics)])
    with serve(app) as url:
        yield url, state


async def probe(url: str, streams: int, probes: int) -> list[tuple[int, int, float]]:
    prober = Prober(url)
    prober.model = "m"
    try:
        return await prober.api_under_load(streams, probes, 3, (8,))
    finally:
        await prober.close()


@pytest.mark.parametrize("engine", [1, 2, 3], indirect=True)
def test_every_probe_is_taken_under_its_load_though_the_answers_beside_it_end(engine):
    url, state = engine
    out = asyncio.run(probe(url, streams=state.load, probes=4))
    assert len(out) == 4 and all(words == 8 and tokens == 9 for words, tokens, _ in out)
    assert state.ended >= 3 * state.load  # the answers beside the probes ended, and were sent again
    # a probe counts only while every answer streamed: one taken under another load would be OFF_LOAD_S short
    assert all(seconds > -OFF_LOAD_S / 2 for _, _, seconds in out)


@pytest.mark.parametrize("engine", [1], indirect=True)
def test_a_stream_the_engine_refuses_is_one_clear_error(engine):
    url, state = engine
    state.status = 500
    with pytest.raises(CodaError, match="streaming beside the probes.*HTTP 500"):
        asyncio.run(probe(url, streams=1, probes=1))
