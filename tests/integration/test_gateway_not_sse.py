"""An engine that answers a streamed request with something other than server-sent events: while
the client has received nothing, the gateway answers 502 with an error body in the caller's format;
a stream that ends in garbage is relayed (it has started) but logged as the engine's error, never `ok`."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from coda.serving.procs import running
from tests.integration.loopback import serve
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

GOOD = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
ANSWERS = {
    "garbage": (b"<html>502 Bad Gateway</html>\n", "text/event-stream"),
    "plain": (b"hello there\n", "text/plain"),
    "empty": (b"", "text/event-stream"),
    "ends-in-garbage": (GOOD + b"Traceback (most recent call last):\n", "text/event-stream"),
    "good": (GOOD + b"data: [DONE]\n\n", "text/event-stream"),
    "comment-first": (b": ping\n\n" + GOOD + b"data: [DONE]\n\n", "text/event-stream"),
}


def engine() -> Starlette:
    async def generate(request: Request) -> Response:
        body, media = ANSWERS[request.headers["x-answer"]]

        async def chunks():
            for i in range(0, len(body), 16):  # several reads, cut anywhere
                yield body[i:i + 16]
        return StreamingResponse(chunks(), media_type=media)

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "e", "object": "model", "max_model_len": 1000}]})

    return Starlette(routes=[Route("/v1/chat/completions", generate, methods=["POST"]), Route("/v1/models", models),
                             Route("/health", lambda _: Response())])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    folder = tmp_path_factory.mktemp("not-sse")
    with serve(engine()) as url:
        cfg = folder / "coda.yaml"
        log = folder / "access.jsonl"
        cfg.write_text(yaml.safe_dump({"backends": [{"url": url}], "access_log": {"path": str(log), "sample": 1.0}}))
        with running("serve", "--config", str(cfg), "--port", "0") as gw:
            yield gw.url, log


def ask(url: str, answer: str) -> httpx.Response:
    body = {"model": "e", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    return httpx.post(url + "/v1/chat/completions", json=body, headers={"x-answer": answer}, timeout=30)


def outcomes(log) -> list[str]:
    return [json.loads(line)["outcome"] for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("answer", ["garbage", "plain", "empty"])
def test_a_stream_that_is_not_sse_from_its_start_is_answered_as_the_engine_s_error(gateway, answer):
    url, log = gateway
    before = len(outcomes(log))
    r = ask(url, answer)
    assert r.status_code == 502
    err = r.json()["error"]
    assert "not server-sent events" in err["message"] and err["type"]
    wait_until(lambda: len(outcomes(log)) > before)
    assert outcomes(log)[before] == "engine_error"


def test_a_stream_that_ends_in_garbage_is_relayed_but_logged_as_the_engine_s_error(gateway):
    url, log = gateway
    before = len(outcomes(log))
    r = ask(url, "ends-in-garbage")
    assert r.status_code == 200 and r.content == ANSWERS["ends-in-garbage"][0]  # it had started: the bytes went through
    wait_until(lambda: len(outcomes(log)) > before)
    assert outcomes(log)[before] == "engine_error"


@pytest.mark.parametrize("answer", ["good", "comment-first"])
def test_a_proper_stream_cut_into_any_reads_is_ok(gateway, answer):
    url, log = gateway
    before = len(outcomes(log))
    r = ask(url, answer)
    assert r.status_code == 200 and r.content == ANSWERS[answer][0]
    wait_until(lambda: len(outcomes(log)) > before)
    assert outcomes(log)[before] == "ok"
