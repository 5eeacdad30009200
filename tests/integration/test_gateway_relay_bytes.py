"""The relay moves the engine's bytes as they come: a client reads an event before the engine has
written the next one, an encoded body crosses undecoded with its encoding header, and the upstream
client adds no headers of its own (the engine sees what the client sent, less hop-by-hop ones)."""

from __future__ import annotations

import asyncio
import gzip
import threading

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from coda.serving.procs import running
from tests.integration.loopback import serve

pytestmark = pytest.mark.timeout(60)

FIRST, SECOND = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', b"data: [DONE]\n\n"
GZIPPED = gzip.compress(b'{"choices": []}')


class Engine:
    """Streams ``FIRST``, then ``SECOND`` only once ``go`` is set; answers gzip when asked; keeps each request's headers."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.headers: list[dict[str, str]] = []

    def app(self) -> Starlette:
        async def generate(request: Request) -> Response:
            self.headers.append(dict(request.headers))
            if request.headers.get("x-want") == "gzip":
                return Response(GZIPPED, media_type="application/json", headers={"content-encoding": "gzip"})

            async def events():
                yield FIRST
                while not self.go.is_set():
                    await asyncio.sleep(0.01)
                yield SECOND
            return StreamingResponse(events(), media_type="text/event-stream")

        async def models(_: Request) -> Response:
            return JSONResponse({"object": "list", "data": [{"id": "e", "object": "model", "max_model_len": 1000}]})

        async def health(_: Request) -> Response:
            return Response()

        return Starlette(routes=[Route("/v1/chat/completions", generate, methods=["POST"]), Route("/v1/models", models),
                                 Route("/health", health)])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    engine = Engine()
    with serve(engine.app()) as url:
        cfg = tmp_path_factory.mktemp("relay") / "coda.yaml"
        cfg.write_text(yaml.safe_dump({"backends": [{"url": url}]}))
        with running("serve", "--config", str(cfg), "--port", "0") as gw:
            yield gw, engine


def test_an_event_reaches_the_client_before_the_engine_writes_the_next(setup):
    gw, engine = setup
    engine.go.clear()
    body = {"model": "e", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=30) as r:
        chunks = r.iter_raw()
        first = next(chunks)
        assert first == FIRST  # the engine is still holding SECOND back
        engine.go.set()
        assert b"".join(chunks) == SECOND


def test_an_encoded_body_crosses_undecoded_and_no_header_is_added_upstream(setup):
    gw, engine = setup
    sent = {"content-type": "application/json", "x-want": "gzip", "accept-encoding": "gzip"}
    with httpx.stream("POST", gw.url + "/v1/chat/completions", content=b'{"model": "e", "messages": []}', headers=sent) as r:
        raw = b"".join(r.iter_raw())
    assert r.headers["content-encoding"] == "gzip" and raw == GZIPPED
    client = {k.lower(): v for k, v in r.request.headers.items() if k.lower() not in ("host", "connection")}
    engine_got = {k: v for k, v in engine.headers[-1].items() if k != "host"}
    assert engine_got == client  # the same user-agent, accept and accept-encoding, none added or replaced
