"""What exactly crosses `coda serve`: against a recording backend (a real loopback server that
keeps every request it receives), the body arrives byte for byte, hop-by-hop headers and the
client's key do not, the tenant's cache_salt does, response bytes come back unchanged, and a
client that disconnects aborts the upstream request."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from coda.serving.procs import running, spawn
from tests.integration.loopback import serve

pytestmark = pytest.mark.timeout(60)


class Recorder:
    """An OpenAI-shaped backend that records requests; ``"hold": true`` streams until the client leaves."""

    def __init__(self) -> None:
        self.requests: list[tuple[bytes, dict[str, str]]] = []
        self.aborted = threading.Event()

    def app(self) -> Starlette:
        async def generate(request: Request) -> Response:
            raw = await request.body()
            self.requests.append((raw, dict(request.headers)))
            body = json.loads(raw)
            if body.get("hold"):
                async def forever():
                    try:
                        while True:
                            yield b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
                            await asyncio.sleep(0.05)
                    finally:
                        self.aborted.set()
                return StreamingResponse(forever(), media_type="text/event-stream")
            if body.get("stream"):
                chunks = [b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n', b"data: [DONE]\n\n"]

                async def gen():
                    for c in chunks:
                        yield c
                return StreamingResponse(gen(), media_type="text/event-stream", headers={"x-backend": "rec"})
            return Response(
                b'{"echo":  true,"n":1.50}', media_type="application/json", headers={"x-backend": "rec", "keep-alive": "timeout=5"}
            )

        async def models(_: Request) -> Response:
            return JSONResponse({"object": "list", "data": [{"id": "rec", "object": "model", "max_model_len": 1000}]})

        async def health(_: Request) -> Response:
            return Response()

        routes = [Route(p, generate, methods=["POST"]) for p in ("/v1/chat/completions", "/v1/messages")]
        return Starlette(routes=[*routes, Route("/v1/models", models), Route("/health", health)])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    rec = Recorder()
    with serve(rec.app()) as url:
        cfg = tmp_path_factory.mktemp("pt") / "coda.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "backends": [{"url": url, "api_key": "backend-secret"}],
                    "max_body_bytes": 50_000,
                    "auth": {"api_keys": {"key-a": "a", "key-b": "b"}},
                    "tenants": {"a": {"cache_salt": "salt-a"}},
                }
            )
        )
        with running("serve", "--config", str(cfg), "--port", "0") as gw:
            gw.backend_url = url
            yield gw, rec


RAW = (
    b'{ "model":"rec",\n  "messages":[{"role":"user","content":"caf\\u00e9 \xe2\x9c\x93"}], '
    b'"temperature": 0.50, "x_vendor": {"k": [1, 2.0]}}'
)


def test_body_and_response_bytes_cross_unchanged(setup):
    gw, rec = setup
    r = httpx.post(
        gw.url + "/v1/chat/completions", content=RAW, headers={"authorization": "Bearer key-b", "content-type": "application/json"}
    )
    assert r.status_code == 200 and r.content == b'{"echo":  true,"n":1.50}'
    assert r.headers["x-backend"] == "rec" and r.headers["x-coda-worker"] and "keep-alive" not in r.headers
    raw, headers = rec.requests[-1]
    assert raw == RAW
    stream = httpx.post(
        gw.url + "/v1/chat/completions", json={"model": "rec", "messages": [], "stream": True}, headers={"authorization": "Bearer key-b"}
    )
    assert stream.content == b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'


def test_hop_by_hop_headers_and_the_clients_key_stay_behind(setup):
    gw, rec = setup
    headers = {
        "authorization": "Bearer key-b",
        "connection": "keep-alive, x-hop",
        "x-hop": "1",
        "te": "trailers",
        "x-session-id": "s-1",
        "x-custom": "kept",
    }
    assert httpx.post(gw.url + "/v1/chat/completions", content=RAW, headers=headers).status_code == 200
    _, got = rec.requests[-1]
    assert got["authorization"] == "Bearer backend-secret"  # the backend's key, not the client's
    assert "x-hop" not in got and "te" not in got and got["x-session-id"] == "s-1" and got["x-custom"] == "kept"


def test_tenant_cache_salt_is_injected(setup):
    gw, rec = setup
    assert httpx.post(gw.url + "/v1/chat/completions", content=RAW, headers={"authorization": "Bearer key-a"}).status_code == 200
    raw, _ = rec.requests[-1]
    assert raw == b'{"cache_salt":"salt-a",' + RAW[1:]
    assert json.loads(raw)["cache_salt"] == "salt-a"


def test_refused_requests_never_reach_the_backend(setup):
    gw, rec = setup
    before = len(rec.requests)
    key = {"authorization": "Bearer key-b"}
    long = httpx.post(
        gw.url + "/v1/chat/completions", json={"model": "rec", "messages": [{"role": "user", "content": "y" * 20_000}]}, headers=key
    )
    assert long.status_code == 400 and "maximum context length is 1000" in long.json()["error"]["message"]
    big = httpx.post(gw.url + "/v1/chat/completions", content=b"{" + b" " * 60_000 + b"}", headers=key)
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    anthropic = httpx.post(gw.url + "/v1/messages", json={"model": "nope", "max_tokens": 1, "messages": []}, headers=key)
    assert anthropic.status_code == 404 and anthropic.json()["type"] == "error" and anthropic.json()["error"]["type"] == "not_found_error"
    assert len(rec.requests) == before


def test_client_disconnect_aborts_the_upstream_request(setup):
    gw, rec = setup
    rec.aborted.clear()
    with httpx.stream(
        "POST",
        gw.url + "/v1/chat/completions",
        json={"model": "rec", "messages": [], "stream": True, "hold": True},
        headers={"authorization": "Bearer key-b"},
    ) as r:
        next(r.iter_raw())
    assert rec.aborted.wait(5), "the backend kept streaming after the client left"


def test_a_policy_needing_a_signal_the_backend_lacks_refuses_to_start(setup):
    gw, _ = setup  # the recording backend serves no /metrics
    with pytest.raises(RuntimeError) as exc:
        spawn("serve", "--port", "0", "--backend", gw.backend_url, "--ingress", "queue_limit+admit_all", timeout_s=20)
    assert "cannot supply signal(s) queue_depth (vllm:num_requests_waiting)" in str(exc.value)
    assert "Traceback" not in str(exc.value)
