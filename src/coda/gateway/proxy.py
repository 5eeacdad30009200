"""Forwarding one admitted request to an engine and its response back, byte for byte.

``Exchange`` is the ASGI response of a generation request. It runs admission, routing and the
upstream call as one task while a second task watches for the client's disconnect, so a client
that goes away at any point (queued, waiting for the first byte, mid-stream) cancels the task,
which closes the upstream connection (the engine aborts the request and frees its KV). A
failure before the engine's first byte is retried once on another worker; a failure after it
ends an event stream with an error event. In-flight accounting ends in ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from coda.api_errors import ApiError
from coda.gateway.admission import Admission, DecisionLog
from coda.gateway.metrics import GatewayMetrics
from coda.gateway.state import GatewayState, Ticket, Worker

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"trailers",
                        b"transfer-encoding", b"upgrade", b"proxy-connection"})
# request headers the gateway sets itself (or consumes)
NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length"}
CREDENTIALS = frozenset({b"authorization", b"x-api-key"})
RETRY_STATUSES = frozenset({502, 503, 504})
TAIL_BYTES = 4096
UpstreamFailure = (httpx.TransportError, httpx.RemoteProtocolError)


def strip_hop_by_hop(raw: list[tuple[bytes, bytes]], drop: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """Headers without the hop-by-hop ones, including any that ``Connection`` names."""
    named = {t.strip().lower() for k, v in raw if k.lower() == b"connection" for t in v.split(b",")}
    return [(k, v) for k, v in raw if (lk := k.lower()) not in drop and lk not in named]


def usage_of(tail: bytes) -> tuple[int, int] | None:
    """(input, output) tokens from the last ``"usage"`` object in a response's tail, if any."""
    i = tail.rfind(b'"usage":')
    if i < 0:
        return None
    j = tail.find(b"{", i)
    depth = 0
    for k in range(j, len(tail)) if j >= 0 else ():
        depth += {123: 1, 125: -1}.get(tail[k], 0)
        if depth == 0:
            try:
                u = msgspec.json.decode(tail[j : k + 1])
            except msgspec.DecodeError:
                return None
            inp = u.get("prompt_tokens", u.get("input_tokens"))
            out = u.get("completion_tokens", u.get("output_tokens"))
            return (inp, out) if isinstance(inp, int) and isinstance(out, int) else None
    return None


class Upstream:
    """The pooled HTTP client to every engine."""

    def __init__(self, connect_s: float, first_byte_s: float) -> None:
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=connect_s, read=first_byte_s, write=60.0, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512),
            trust_env=False,
        )

    async def open(self, w: Worker, path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> httpx.Response:
        headers = [*headers, *((k.encode(), v.encode()) for k, v in w.auth().items())]
        req = self.client.build_request("POST", w.cfg.url + path, content=body, headers=headers)
        return await self.client.send(req, stream=True)

    async def close(self) -> None:
        await self.client.aclose()


@dataclass(frozen=True, slots=True)
class Relay:
    """What every exchange works with: the gateway's state, admission, upstream client, metrics
    and decision log, and how a tenant is labelled in metrics."""

    state: GatewayState
    admission: Admission
    upstream: Upstream
    metrics: GatewayMetrics
    decisions: DecisionLog
    tenant_label: Callable[[str], str]


class Exchange:
    """The ASGI response of one generation request (see the module docstring)."""

    def __init__(self, relay: Relay, t: Ticket, body: bytes, headers: list[tuple[bytes, bytes]], stream: bool, t0: float) -> None:
        self.relay = relay
        self.t = t
        self.body = body
        self.headers = headers
        self.stream = stream
        self.t0 = t0
        self.status = 0

    async def __call__(self, scope: Any, receive: Callable[[], Any], send: Callable[[Any], Any]) -> None:
        work = asyncio.ensure_future(self._run(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, watch):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await work  # re-raises a bug in _run; a client that left is not an error
        if not watch.cancelled() and watch.done() and not work.done():
            self.status = 499
        self.relay.metrics.requests.labels(self.t.path, str(self.status or 499)).inc()

    async def _run(self, send: Callable[[Any], Any]) -> None:
        relay, t = self.relay, self.t
        try:
            rec = await relay.admission.admit(t)
        except ApiError as err:
            await self._error(send, err)
            return
        relay.metrics.tenant_requests.labels(relay.tenant_label(t.tenant)).inc()
        try:
            await self._proxy(send, rec)
        finally:
            relay.state.end(t)
            relay.admission.kick()

    async def _error(self, send: Callable[[Any], Any], err: ApiError) -> None:
        self.status = err.status
        headers = [(b"content-type", b"application/json"), *((k.encode(), v.encode()) for k, v in err.headers().items())]
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": err.body(self.t.path), "more_body": False})

    async def _proxy(self, send: Callable[[Any], Any], rec: dict[str, Any]) -> None:
        relay, t = self.relay, self.t
        state, metrics = relay.state, relay.metrics
        tried: set[int] = set()
        error = "no healthy worker serves this model"
        while len(tried) < 2:
            w, shadow_worker = state.route(t, tried)
            if w is None:
                break
            if not tried:
                rec["worker"] = w.label
                if shadow_worker is not None:
                    rec["shadow_worker"] = state.workers[shadow_worker].label
                    metrics.shadow.labels(state.router.shadow.name, str(shadow_worker == w.id).lower()).inc()
                relay.decisions.write(rec)
            else:
                metrics.retries.labels(w.label).inc()
            tried.add(w.id)
            state.begin(t, w)
            sent = time.perf_counter()
            metrics.overhead.observe(sent - self.t0)
            try:
                resp = await relay.upstream.open(w, t.path, self.body, self.headers)
            except UpstreamFailure as err:
                state.end(t)
                metrics.upstream_errors.labels(w.label, type(err).__name__).inc()
                if isinstance(err, httpx.ConnectError | httpx.ConnectTimeout):
                    state.failed(w)
                error = f"backend {w.label} failed before responding ({type(err).__name__})"
                continue
            try:
                chunks = resp.aiter_raw()
                first = await anext(chunks, b"")
            except UpstreamFailure as err:
                await resp.aclose()
                state.end(t)
                metrics.upstream_errors.labels(w.label, type(err).__name__).inc()
                error = f"backend {w.label} failed before its first byte ({type(err).__name__})"
                continue
            if resp.status_code in RETRY_STATUSES and len(tried) < 2:
                await resp.aclose()
                state.end(t)
                metrics.upstream_errors.labels(w.label, f"http_{resp.status_code}").inc()
                error = f"backend {w.label} answered {resp.status_code}"
                continue
            ttft = time.perf_counter() - sent if self.stream else None
            completed = False
            try:
                completed = await self._relay(send, w, resp, first, chunks)
            finally:
                await resp.aclose()
                state.end(t, ttft, completed)
            return
        await self._error(send, ApiError(502, f"{error}; tried {len(tried)} worker(s); check the engines (GET /debug/state)", "upstream_failed"))

    async def _relay(self, send: Callable[[Any], Any], w: Worker, resp: httpx.Response, first: bytes, chunks: AsyncIterator[bytes]) -> bool:
        """Relay the response; ``True`` when it ended normally with a 200."""
        relay, t = self.relay, self.t
        headers = strip_hop_by_hop(resp.headers.raw, HOP_BY_HOP)
        headers.append((b"x-coda-worker", w.label.encode()))
        self.status = resp.status_code
        sse = resp.headers.get("content-type", "").startswith("text/event-stream")
        await send({"type": "http.response.start", "status": resp.status_code, "headers": headers})
        tail = first[-TAIL_BYTES:]
        await send({"type": "http.response.body", "body": first, "more_body": True})
        if sse:
            relay.state.streamed(t, first.count(b"data:"))
        try:
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                tail = (tail + chunk)[-TAIL_BYTES:]
                if sse:
                    relay.state.streamed(t, chunk.count(b"data:"))
        except UpstreamFailure as err:
            relay.metrics.upstream_errors.labels(w.label, type(err).__name__).inc()
            if sse:
                msg = f"backend {w.label} failed mid-stream ({type(err).__name__}); the response is incomplete, retry the request"
                await send({"type": "http.response.body", "body": ApiError(502, msg, "upstream_failed").sse_event(t.path), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return False
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if resp.status_code == 200:
            self._usage(tail)
        return resp.status_code == 200

    def _usage(self, tail: bytes) -> None:
        relay, t = self.relay, self.t
        metrics, label = relay.metrics, relay.tenant_label(t.tenant)
        usage = usage_of(tail)
        if usage is None:
            metrics.tenant_input.labels(label).inc(t.prompt_tokens)
            metrics.tenant_unreported.labels(label).inc()
        else:
            metrics.tenant_input.labels(label).inc(usage[0])
            metrics.tenant_output.labels(label).inc(usage[1])


async def _disconnected(receive: Callable[[], Any]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass

