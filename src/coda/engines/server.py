"""The fake engine's HTTP server: OpenAI- and Anthropic-compatible routes on starlette + uvicorn.

Routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``, ``/v1/messages``
(streaming and not), ``/v1/models``, ``/health``, ``/tokenize`` (vLLM's), ``/metrics`` (vLLM's
names). A client mistake gets a 4xx with the API's error body, never a 500; a client that
disconnects mid-stream aborts its request, so the simulated worker frees its KV.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from coda.engines.fake import FakeEngine, FakeEngineConfig, LiveRequest
from coda.errors import CodaError
from coda.protocol import tokenizer as tok
from coda.protocol.dialects import DIALECTS, Generation, Json, Outcome
from coda.serving.errors import ApiError
from coda.serving.listen import listen

_decode = msgspec.json.Decoder()


async def _json_body(request: Request) -> Json:
    raw = await request.body()
    try:
        body = _decode.decode(raw)
    except msgspec.DecodeError as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def create_app(config: FakeEngineConfig) -> Starlette:
    """The ASGI app; the engine starts with the app's lifespan (inside uvicorn's event loop)."""
    engine = FakeEngine(config)
    model = config.model

    def outcome(req: LiveRequest, g: Generation) -> Outcome:
        return Outcome(req.out_words[: req.released], req.prompt_tokens, req.cached_tokens, g.max_tokens is not None)

    def generate(path: str) -> Callable[[Request], Any]:
        dialect = DIALECTS[path]

        async def handler(request: Request) -> Response:
            try:
                body = await _json_body(request)
                name = body.get("model", model)
                if name != model:
                    raise ApiError(404, f"The model `{name}` does not exist.", kind="NotFoundError", param="model")
                g = dialect.parse(body)
                out_tokens = g.max_tokens or min(config.default_max_tokens, engine.max_model_len - len(g.prompt))
                if len(g.prompt) + max(out_tokens, 1) > engine.max_model_len:
                    raise ApiError(
                        400,
                        f"This model's maximum context length is {engine.max_model_len} tokens. However, you requested "
                        f"{len(g.prompt) + out_tokens} tokens ({len(g.prompt)} in the messages, {out_tokens} in the completion). "
                        "Please reduce the length of the messages or completion.",
                    )
            except ApiError as err:
                return JSONResponse(dialect.error_body(err), status_code=err.status)
            req = engine.submit(g.prompt, out_tokens)
            words = engine.stream(req)
            if g.stream:
                return StreamingResponse(dialect.stream(g, model, words, lambda: outcome(req, g)), media_type="text/event-stream")
            async for _ in words:
                pass
            return JSONResponse(dialect.complete(g, model, outcome(req, g)))

        return handler

    async def models(_: Request) -> Response:
        card = {"id": model, "object": "model", "created": 0, "owned_by": "coda", "root": model, "parent": None,
                "max_model_len": engine.max_model_len, "coda": engine.describe()}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def tokenize(request: Request) -> Response:
        try:
            body = await _json_body(request)
            if isinstance(body.get("prompt"), str):
                words = body["prompt"].split()
            elif "messages" in body:
                words = DIALECTS["/v1/chat/completions"].parse({"messages": body["messages"]}).prompt
            else:
                raise ApiError(400, "tokenize needs a prompt (string) or messages (list)")
        except ApiError as err:
            return JSONResponse(err.openai_body(), status_code=err.status)
        return JSONResponse({"count": len(words), "max_model_len": engine.max_model_len, "tokens": tok.token_ids(words)})

    async def metrics(_: Request) -> Response:
        return Response(engine.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        err = ApiError(
            exc.status_code,
            f"{request.method} {request.url.path}: {exc.detail}",
            kind="NotFoundError" if exc.status_code == 404 else "invalid_request_error",
        )
        return JSONResponse(err.openai_body(), status_code=exc.status_code)

    async def server_error(request: Request, exc: Exception) -> Response:
        err = ApiError(500, f"internal error in the fake engine: {type(exc).__name__}: {exc}", kind="InternalServerError")
        return JSONResponse(err.openai_body(), status_code=500)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        engine.start()
        # Load anyio's asyncio backend now: streaming responses run in a task group, and its lazy
        # import would otherwise add ~10 ms to the first request's time to first token.
        async with anyio.create_task_group():
            pass
        try:
            yield
        finally:
            engine.close()

    routes = [Route(p, generate(p), methods=["POST"]) for p in DIALECTS]
    routes += [
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.engine = engine
    return app


async def serve(config: FakeEngineConfig, host: str, port: int, on_ready: Callable[[str, Json], None]) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's graceful shutdown); ``on_ready`` gets the base URL and
    the engine's description (configuration and cost-profile provenance).

    The engine starts and the socket binds before uvicorn runs, so a bad endpoint or a port in
    use is a one-line ``CodaError`` rather than a server log."""
    app = create_app(config)
    app.state.engine.start()
    try:
        sock = listen(host, port)
    except CodaError:
        app.state.engine.close()
        raise
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False, timeout_graceful_shutdown=5))
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if server.started:
        name = sock.getsockname()
        on_ready(f"http://{host if ':' not in host else f'[{host}]'}:{name[1]}", app.state.engine.describe())
    await task
