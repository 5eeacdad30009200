"""The gateway's HTTP surface (starlette on uvicorn) and its lifecycle.

Routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``, ``/v1/messages``
(admitted, routed and proxied by ``Exchange``), ``/v1/models`` (merged from the engines),
``/health`` (the process is up), ``/ready`` (not draining and some engine is healthy),
``/metrics`` (Prometheus) and ``/debug/state`` (admin key). Everything a client can get wrong
is answered here with a 4xx naming the fix, before any engine sees the request.

``serve`` checks the engines before it listens (a missing signal or an unreachable engine is a
one-line error). On SIGTERM it drains: it keeps listening and answers ``/ready`` and new requests
with 503 and Retry-After (so a load balancer sees a draining replica, not a dead one), lets the
requests under way finish for up to ``drain_timeout_s``, cuts those left, then closes its
listener and exits 0.

Every second the gateway flushes its logs and forgets the sessions idle past their TTL
(``housekeeping``), so a killed gateway loses at most the last second of records and an idle one
gives back what its clients made it hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from coda.errors import CodaError
from coda.gateway.admission import Admission, JsonlLog
from coda.gateway.config import GatewayConfig
from coda.gateway.identity import Identities, session_of, with_cache_salt
from coda.gateway.kv_consumer import KVEventConsumer
from coda.gateway.prometheus import GatewayMetrics
from coda.gateway.prompt import EngineTokenizer, Prompt, make_tokenizer, max_tokens
from coda.gateway.proxy import CREDENTIALS, NOT_FORWARDED, Exchange, Relay, Upstream, draining_error, strip_hop_by_hop
from coda.gateway.replica import Replica, open_store
from coda.gateway.telemetry import Telemetry
from coda.gateway.view import GatewayState, Ticket, Worker
from coda.serving.door import DoorLimits, DoorProtocol
from coda.serving.errors import ApiError
from coda.serving.listen import listen

log = logging.getLogger("coda.gateway")
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
DEADLINE_HEADER = "x-coda-deadline-ms"
SESSION_LIST_MAX = 100
IDLE_TICK_S = 1.0  # the server's own check for exit, beside the signal's wake-up
#: period of the logs' flush and the session tables' expiry: at most this much of the logs is lost on kill -9
HOUSEKEEPING_S = 0.5
#: how often a drain checks whether the requests under way have finished
DRAIN_POLL_S = 0.05
#: after the drain, how long uvicorn waits for what is not a generation request (a body still uploading)
SHUTDOWN_GRACE_S = 2.0
#: the most open client connections by default, whatever the open-file limit: assumed (an agent
#: holds one; each stalled head may hold up to the header limits, ~270 KiB, until its timeout)
MAX_CONNECTIONS = 8192
_decode = msgspec.json.Decoder()
#: prompts tokenized both ways at startup to check the local tokenizer against the engine's
PROBES = (
    (
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "You are a coding agent.\nUse the tools."},
                {"role": "user", "content": "Fix the failing test in src/main.py:\n  def main():\n      return 1"},
            ]
        },
    ),
    ("/v1/completions", {"prompt": "def main():\n    return 0\n\nif __name__ == '__main__':\n    main()\n"}),
)


class Gateway:
    """Everything one gateway process holds; built before the event loop serves requests."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        ix = config.indexer
        if ix.tokenizer_path is not None and ix.tokenizer != "engine":
            raise CodaError(
                f"indexer.tokenizer_path is set but indexer.tokenizer is {ix.tokenizer!r}; set indexer.tokenizer: engine "
                "to tokenize with the engine's own tokenizer, or drop tokenizer_path"
            )
        self.state = GatewayState(config, make_tokenizer(ix.tokenizer, ix.tokenizer_path, ix.session_cache_mib))
        self.ids = Identities(config)
        self.metrics = GatewayMetrics()
        self.decisions = JsonlLog(config.decision_log)
        self.access = JsonlLog(config.access_log.path, config.access_log.sample)
        self.replica = Replica(self.state, open_store(self.state), self.metrics)
        self.admission = Admission(self.state, self.metrics, self.decisions, self.replica)
        self.upstream = Upstream(config.connect_timeout_s, config.first_byte_timeout_s)
        self.relay = Relay(
            self.state, self.admission, self.upstream, self.metrics, self.decisions, self.access, self.ids.label, config.midstream_failure
        )
        self.telemetry = Telemetry(self.state, self.admission.kick, self._readmitted)
        self.consumers = {
            w.id: KVEventConsumer(w, self.state.indexer, self.state.block_tokens, self.admission.kick, self.state.kv_batch)
            for w in self.state.workers
            if self.state.expects_events(w)
        }
        self.drop_credentials = config.auth.enabled
        if any(w.cfg.kv_events for w in self.state.workers) and not self.state.tokenizer.exact:
            log.warning(
                "kv_events ignored: the %s tokenizer cannot name prompt blocks as the engine does, so the gateway indexes "
                "the prompts it routes instead (indexer.tokenizer: words is exact for coda fake-engine)",
                config.indexer.tokenizer,
            )

        self._housekeeping: asyncio.Task[None] | None = None
        #: when a drain cuts the requests still under way (the event loop's clock)
        self.drain_until = math.inf

    async def start(self) -> None:
        await self.telemetry.startup()
        await self._check_local_tokenizer()
        await self.replica.start()
        self.telemetry.start()
        for c in self.consumers.values():
            c.start()
        self._housekeeping = asyncio.create_task(self._keep_house())

    async def _keep_house(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(HOUSEKEEPING_S)
            # how late the loop woke this timer: the gateway's own CPU saturation, which delays every
            # decision, relay and scrape alike (old telemetry under load is often this, not the engine)
            self.metrics.loop_lag.observe(max(0.0, loop.time() - asked - HOUSEKEEPING_S))
            self.housekeeping()

    def housekeeping(self) -> None:
        """Flush the logs; forget the sessions (and expired slots) idle past the session TTL."""
        self.decisions.flush()
        self.access.flush()
        self.state.expire_sessions()
        self.replica.expire()

    async def drain(self) -> None:
        """Refuse new requests (``draining``), wait for those under way for up to ``drain_timeout_s``
        (or until ``drain_until`` is moved earlier), cut the rest."""
        self.state.draining = True
        loop = asyncio.get_running_loop()
        self.drain_until = min(self.drain_until, loop.time() + self.config.drain_timeout_s)
        live = self.relay.live
        while live and loop.time() < self.drain_until:
            await asyncio.sleep(DRAIN_POLL_S)
        for ex in list(live):
            ex.cut()
        while live:
            await asyncio.sleep(DRAIN_POLL_S)

    async def close(self) -> None:
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        await self.telemetry.close()
        await self.replica.close()
        for c in self.consumers.values():
            await c.close()
        await self.upstream.close()
        self.decisions.close()
        self.access.close()

    def _readmitted(self, w: Worker) -> None:
        if w.id in self.consumers:
            self.consumers[w.id].resync()

    # --- generation ------------------------------------------------------------------------
    async def _body(self, request: Request) -> bytes:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(
                413,
                f"request body of {declared} bytes exceeds the gateway's max_body_bytes={limit}; shorten the prompt "
                "or ask the operator to raise max_body_bytes",
                "request_too_large",
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(
                    413,
                    f"request body exceeds the gateway's max_body_bytes={limit}; shorten the prompt or ask the operator "
                    "to raise max_body_bytes",
                    "request_too_large",
                )
            chunks.append(chunk)
        return b"".join(chunks)

    async def generate(self, request: Request) -> Any:
        t0 = time.perf_counter()
        path = request.url.path
        try:
            if self.state.draining:
                raise draining_error()
            tenant = self.ids.tenant(request.headers)
            await self.telemetry.fresh()
            raw = await self._body(request)
            body = self._json(raw)
            sid, source = session_of(tenant, path, request.headers, body, self.state.chains)
            ticket = self._plan(path, request, tenant, body, sid, await self._engine_tokens(path, body, sid))
            ticket.session_source = source
        except ApiError as err:
            self._refused(path, err.status, err.code or "error", t0)
            return err.response(path)
        except ClientDisconnect:
            self._refused(path, 499, "client_disconnected", t0)
            return Response(status_code=499)
        salt = self.config.tenant(tenant).cache_salt
        if salt is not None:
            raw = with_cache_salt(raw, body, salt)
        drop = NOT_FORWARDED | CREDENTIALS if self.drop_credentials else NOT_FORWARDED
        headers = strip_hop_by_hop(request.headers.raw, drop)
        return Exchange(self.relay, ticket, raw, headers, body.get("stream") is True, t0)

    def _refused(self, path: str, status: int, outcome: str, t0: float) -> None:
        """Count and log a request answered before admission."""
        self.metrics.requests.labels(path, str(status)).inc()
        if self.access.enabled:
            self.access.write(
                {
                    "ts": round(time.time(), 6),
                    "rid": None,
                    "path": path,
                    "status": status,
                    "outcome": outcome,
                    "total_s": round(time.perf_counter() - t0, 6),
                }
            )

    def _json(self, raw: bytes) -> dict[str, Any]:
        limit = self.config.limits.max_json_depth
        too_deep = ApiError(
            400,
            f"the request body nests arrays and objects deeper than the gateway's limits.max_json_depth={limit}; "
            "send a flatter body",
            "json_too_deep",
        )
        try:
            body = _decode.decode(raw)
        except msgspec.DecodeError as err:
            raise ApiError(400, f"the request body is not valid JSON ({err}); send a JSON object", "invalid_json") from None
        except RecursionError:  # deeper than the decoder's own stack allows
            raise too_deep from None
        if not isinstance(body, dict):
            raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}", "invalid_json")
        if raw.count(b"[") + raw.count(b"{") > limit and nests_deeper(body, limit):
            raise too_deep
        return body

    async def _engine_tokens(self, path: str, body: dict[str, Any], session: str | None) -> Prompt | None:
        """With the ``engine`` tokenizer: the prompt's token ids, locally when the gateway has the
        model's tokenizer, else from a serving engine's /tokenize (bounded by tokenize_timeout_s)."""
        tok = self.state.tokenizer
        if not isinstance(tok, EngineTokenizer):
            return None
        local = tok.local_prompt(path, body, session)
        if local is not None:
            self.metrics.tokenized.labels("local").inc()
            return local
        req = tok.request(path, body)
        if req is None:
            return None
        ids = await self._tokenize(req, body.get("model") if isinstance(body.get("model"), str) else None)
        self.metrics.tokenized.labels("engine" if ids is not None else "text").inc()
        return tok.from_response(ids) if ids is not None else None

    async def _tokenize(self, req: dict[str, Any], model: str | None) -> dict[str, Any] | None:
        """A serving engine's /tokenize answer, or ``None`` when none answers in time."""
        for w in self.state.serving(model):
            if not w.healthy:
                continue
            try:
                resp = await self.upstream.client.post(
                    w.cfg.url + "/tokenize", json=req, headers=w.auth(), timeout=self.config.indexer.tokenize_timeout_s
                )
            except httpx.HTTPError:
                continue
            if resp.status_code == 400:  # the engine rejects the prompt itself: the client's mistake
                raise ApiError(400, f"the engine could not tokenize the prompt: {resp.text[:300]}", "invalid_request")
            if resp.status_code == 200:
                return resp.json()
        return None

    async def _check_local_tokenizer(self) -> None:
        """The local tokenizer must name tokens as the engine does: a probe chat and completion,
        tokenized both ways, must agree, else the gateway asks the engine for every prompt."""
        tok = self.state.tokenizer
        if not isinstance(tok, EngineTokenizer) or tok.local is None:
            return
        model = next(iter(self.state.model_cards()), {}).get("id")
        for path, body in PROBES:
            body = {"model": model, **body}
            mine = tok.local_prompt(path, body, None)
            req = tok.request(path, body)
            theirs = await self._tokenize(req, model) if req is not None else None
            if theirs is None:
                log.warning("indexer.tokenizer_path: no engine answered /tokenize, so the local tokenizer is used unchecked")
                return
            if mine is None or list(mine.units) != theirs.get("tokens"):
                tok.local = None
                log.warning(
                    "indexer.tokenizer_path: the local tokenizer disagrees with the engine's /tokenize on a probe %s prompt; "
                    "point tokenizer_path at the served model's folder. The gateway asks the engine's /tokenize meanwhile",
                    path,
                )
                return

    def _plan(
        self, path: str, request: Request, tenant: str, body: dict[str, Any], sid: str | None, tokens: Prompt | None = None
    ) -> Ticket:
        state = self.state
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise ApiError(400, "model must be a string", "invalid_model", "model")
        candidates = state.serving(model)
        if not candidates:
            known = ", ".join(sorted(c["id"] for c in state.model_cards()))
            raise ApiError(404, f"The model `{model}` does not exist: the gateway's engines serve {known}", "model_not_found", "model")
        prompt = tokens or state.tokenizer.prompt(path, body)
        out = max_tokens(path, body)
        lens = [w.max_model_len for w in candidates if w.max_model_len is not None]
        if lens and prompt.min_tokens + max(out, 1) > max(lens):
            est = "" if prompt.min_tokens == prompt.tokens else "at least "
            raise ApiError(
                400,
                f"This model's maximum context length is {max(lens)} tokens. However, you requested {est}"
                f"{prompt.min_tokens + max(out, 1)} tokens ({est}{prompt.min_tokens} in the prompt, {max(out, 1)} for the "
                "completion; checked by the gateway). Please reduce the length of the messages or completion.",
                "context_length_exceeded",
                "messages",
            )
        hashes = state.block_hashes(sid, prompt.units)
        deadline_ms = request.headers.get(DEADLINE_HEADER)
        deadline_s = self.config.tenant(tenant).deadline_ms
        if deadline_ms is not None:
            try:
                deadline_s = float(deadline_ms)
            except ValueError:
                raise ApiError(
                    400, f"{DEADLINE_HEADER} must be a number of milliseconds, got {deadline_ms!r}", "invalid_deadline"
                ) from None
        return Ticket(
            state.next_rid(),
            path,
            tenant,
            sid,
            model,
            prompt.tokens,
            out,
            hashes,
            candidates,
            state.match(hashes, candidates),
            deadline_s / 1000 if deadline_s is not None else None,
        )

    # --- other routes ----------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        try:
            self.ids.tenant(request.headers)
        except ApiError as err:
            return err.response(request.url.path)
        return JSONResponse({"object": "list", "data": self.state.model_cards()})

    async def health(self, _: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, _: Request) -> Response:
        """Ready while some engine is healthy and the replica can admit: not draining, and not
        deferring everything for a store that does not answer (``store.on_unreachable: closed``).
        Details name what degrades routing (KV events that never came, a fail-open store that does
        not answer: the replica serves on its own state)."""
        healthy = sum(w.healthy for w in self.state.workers)
        store_blocks = self.replica.closed_when_down and not self.replica.up
        ok = healthy > 0 and not self.state.draining and not store_blocks
        missing = [{"worker": w.label, "endpoint": w.cfg.kv_events} for w in self.state.workers if w.kv_missing]
        return JSONResponse(
            {
                "ready": ok,
                "draining": self.state.draining,
                "healthy_workers": healthy,
                "kv_events_missing": missing,
                "store": self.replica.detail,
            },
            status_code=200 if ok else 503,
            headers=None if ok else draining_error().headers(),
        )

    async def prometheus(self, _: Request) -> Response:
        stats = {i: (c.stats.batches, c.stats.gaps, c.w.kv_missing) for i, c in self.consumers.items()}
        return Response(self.metrics.render(self.state, stats), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def debug_state(self, request: Request) -> Response:
        if not self.config.auth.admin_key:
            return ApiError(404, "/debug/state is off: set auth.admin_key in the gateway config to enable it", "not_found").response("")
        if not self.ids.is_admin(request.headers):
            return ApiError(401, "/debug/state needs 'Authorization: Bearer <auth.admin_key>'", "invalid_admin_key").response("")
        return JSONResponse(self.debug_snapshot())

    def debug_snapshot(self) -> dict[str, Any]:
        s = self.state
        now = s.clock()
        workers = []
        for w in s.workers:
            c = self.consumers.get(w.id)
            workers.append(
                {
                    "id": w.id,
                    "label": w.label,
                    "url": w.cfg.url,
                    "healthy": w.healthy,
                    "stale": s.telemetry_old(w, now),
                    "telemetry_age_s": round(now - w.scraped_at, 3) if w.scraped_at > -1e308 else None,
                    "queue_depth": w.queue_depth,
                    "running": w.running,
                    "kv_usage": w.kv_usage,
                    "inflight_requests": len(w.inflight),
                    "inflight_tokens": w.inflight_tokens,
                    "inflight_new_tokens": w.inflight_new_tokens,
                    "ttft_ewma_s": w.ttft_s,
                    "models": sorted(w.models),
                    "max_model_len": w.max_model_len,
                    "indexed_blocks": {loc: s.indexer.blocks(loc) for loc in (w.tiers.hbm, w.tiers.dram, w.tiers.ssd) if loc},
                    "kv_events": vars(c.stats) | {"last_seq": c.last_seq, "missing": w.kv_missing} if c is not None else None,
                }
            )
        sessions = list(s.sessions.items())[-SESSION_LIST_MAX:]
        return {
            "policies": s.policies.spec.describe(),
            "policy": s.ingress.name,
            "router": s.router.name,
            "draining": s.draining,
            "queued": s.queued,
            "inflight_requests": s.inflight_total(),
            "tenant_inflight_tokens": dict(s.tenant_inflight),
            "replica": {"id": self.replica.id, "store": self.replica.detail, "others": dict(s.others)},
            "active_sessions": s.ledger.count(now),
            "sessions_tracked": len(s.sessions),
            "ingress_liveness": self.admission.liveness.report(),
            "session_cache_mib": round(s.session_bytes / 2**20, 3),
            "recent_sessions": [{"session": sid, "last_worker": x.last_worker} for sid, x in reversed(sessions)],
            "workers": workers,
        }


def nests_deeper(body: Any, limit: int) -> bool:
    """Whether a decoded JSON value nests arrays and objects deeper than ``limit`` (the top level is
    depth 1); iterative, so the check itself cannot overflow the stack."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def create_app(gw: Gateway) -> Starlette:
    async def not_found(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            err = ApiError(
                404,
                f"{request.method} {request.url.path}: no such route; the gateway serves {', '.join(GENERATION_ROUTES)}, "
                "/v1/models, /health, /ready, /metrics",
                "route_not_found",
            )
        else:
            err = ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", "method_not_allowed")
        return err.response(request.url.path)

    async def crashed(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s", request.url.path, exc_info=exc)
        return ApiError(
            500, f"internal gateway error ({type(exc).__name__}); this is a bug in Coda, please report it", "internal_error"
        ).response(request.url.path)

    routes = [Route(p, gw.generate, methods=["POST"]) for p in GENERATION_ROUTES]
    routes += [
        Route("/v1/models", gw.models, methods=["GET"]),
        Route("/health", gw.health, methods=["GET"]),
        Route("/ready", gw.ready, methods=["GET"]),
        Route("/metrics", gw.prometheus, methods=["GET"]),
        Route("/debug/state", gw.debug_state, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: not_found, Exception: crashed})


class _DrainingServer(uvicorn.Server):
    """uvicorn with the gateway's drain before its shutdown: on the first SIGTERM/SIGINT the
    listener stays open while the gateway drains (``Gateway.drain``); a second signal cuts what is
    left at once. Then uvicorn closes the listener and the idle connections. Unlike uvicorn, the
    signal is not raised again: the gateway closes its telemetry, KV-event sockets and logs, and
    exits 0."""

    def __init__(self, config: uvicorn.Config, gw: Gateway) -> None:
        super().__init__(config)
        self.gw = gw
        self._exit: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signalled = False

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._signalled:
            self.gw.drain_until = -math.inf
        self._signalled = True
        if self._loop is not None and self._exit is not None:
            self._loop.call_soon_threadsafe(self._exit.set)  # a signal handler: wake the loop through its self-pipe
        else:  # before serving: uvicorn's own exit
            super().handle_exit(sig, frame)

    async def main_loop(self) -> None:
        """Wait for the exit signal instead of uvicorn's 10 Hz tick (which updates a date header
        the gateway does not send), so an idle gateway costs next to no CPU; then drain."""
        self._loop, self._exit = asyncio.get_running_loop(), asyncio.Event()
        while not self.should_exit and not self._signalled:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit.wait(), IDLE_TICK_S)
        await self.gw.drain()
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def door_limits(config: GatewayConfig) -> DoorLimits:
    """The door's limits from ``config.limits``; ``max_connections`` defaults to half the open-file limit."""
    lim = config.limits
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    default = min(files // 2 if files != resource.RLIM_INFINITY else MAX_CONNECTIONS, MAX_CONNECTIONS)
    return DoorLimits(
        max_headers=lim.max_headers,
        max_header_bytes=lim.max_header_bytes,
        max_request_line_bytes=lim.max_request_line_bytes,
        header_timeout_s=lim.header_timeout_s,
        body_timeout_s=lim.body_timeout_s,
        max_connections=lim.max_connections or max(default, 1),
    )


async def serve(config: GatewayConfig, on_ready: Callable[[str, Gateway], None], sock: socket.socket | None = None) -> None:
    """Take the address (a bad host or a port in use fails at once), check the engines, serve
    until SIGTERM/SIGINT, drain, clean up. ``sock``: a listening socket bound already (a worker of
    ``coda serve --workers`` inherits its parent's) instead of the address."""
    gw = Gateway(config)
    sock = sock if sock is not None else listen(config.host, config.port)
    try:
        await gw.start()
        server = _DrainingServer(
            uvicorn.Config(
                create_app(gw),
                log_level="warning",
                lifespan="off",
                access_log=False,
                server_header=False,
                date_header=False,
                timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
                timeout_keep_alive=config.limits.keep_alive_timeout_s,  # type: ignore[arg-type]
                http=DoorProtocol.factory(door_limits(config)),
            ),
            gw,
        )  # type: ignore[arg-type]
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            port = sock.getsockname()[1]
            on_ready(f"http://{config.host if ':' not in config.host else f'[{config.host}]'}:{port}", gw)
        await task
    finally:
        sock.close()
        await gw.close()
