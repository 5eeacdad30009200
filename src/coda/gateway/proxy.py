"""Forwarding one admitted request to an engine and its response back, byte for byte.

``Exchange`` is the ASGI response of a generation request. It runs admission, routing and the
upstream call as one task while a second task watches for the client's disconnect, so a client
that goes away at any point (queued, waiting for the first byte, mid-stream) cancels the task,
which closes the upstream connection (the engine aborts the request and frees its KV). A
failure before the engine's first byte is retried once on another worker. A failure after it
aborts the client's connection, as a dead server's would, so clients see a transport error and
retry (the ``openai`` client raises ``APIConnectionError``); ``midstream_failure: error_event``
ends an event stream with an SSE error event instead. In-flight accounting ends in ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import httpx
import msgspec

from coda.gateway.admission import Admission, JsonlLog
from coda.gateway.identity import response_id
from coda.gateway.prometheus import GatewayMetrics
from coda.gateway.view import GatewayState, Ticket, Worker
from coda.serving.errors import ApiError

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"trailers",
                        b"transfer-encoding", b"upgrade", b"proxy-connection"})
# request headers the gateway sets itself (or consumes)
NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length"}
CREDENTIALS = frozenset({b"authorization", b"x-api-key"})
RETRY_STATUSES = frozenset({502, 503, 504})
TAIL_BYTES = 4096
#: an engine that failed to connect, answer or finish: aiohttp's errors, and a read that timed out
UpstreamFailure = (aiohttp.ClientError, TimeoutError)
#: a failure to reach the engine at all, which counts toward ejecting it
ConnectFailure = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
#: headers aiohttp would add on its own; the client's request goes to the engine as it came
NO_AUTO_HEADERS = frozenset({"User-Agent", "Accept", "Accept-Encoding", "Content-Type"})
#: the message uvicorn logs when a response ends without its last body message: how a relay aborts
ABORT_MESSAGE = "ASGI callable returned without completing response."
#: what asyncio logs for every write to a connection its client has closed
LOST_WRITE_MESSAGE = "socket.send() raised exception."
log = logging.getLogger("coda.gateway")


def strip_hop_by_hop(raw: list[tuple[bytes, bytes]], drop: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """Headers without the hop-by-hop ones, including any that ``Connection`` names."""
    named = {t.strip().lower() for k, v in raw if k.lower() == b"connection" for t in v.split(b",")}
    return [(k, v) for k, v in raw if (lk := k.lower()) not in drop and lk not in named]


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    input_tokens: int | None = None  # Anthropic's names
    output_tokens: int | None = None


class _WithUsage(msgspec.Struct):
    usage: _Usage | None = None


_usage = msgspec.json.Decoder(_WithUsage)


def usage_of(body: bytes) -> tuple[int, int] | None:
    """(input, output) tokens of a whole JSON response body, decoded with msgspec (other fields skipped)."""
    try:
        u = _usage.decode(body).usage
    except msgspec.DecodeError:
        return None
    if u is None:
        return None
    inp = u.prompt_tokens if u.prompt_tokens is not None else u.input_tokens
    out = u.completion_tokens if u.completion_tokens is not None else u.output_tokens
    return (inp, out) if inp is not None and out is not None else None


def stream_usage(tail: bytes) -> tuple[int, int] | None:
    """(input, output) tokens of the last complete server-sent event in ``tail`` that carries usage
    (OpenAI's final chunk with ``include_usage``, Anthropic's ``message_delta``)."""
    for ev in reversed(tail.replace(b"\r\n", b"\n").split(b"\n\n")):  # a piece cut at the tail's start fails to decode
        data = b"\n".join(line[5:].lstrip(b" ") for line in ev.split(b"\n") if line.startswith(b"data:"))
        if data.startswith(b"{") and (u := usage_of(data)) is not None:
            return u
    return None


#: what every line of a server-sent event starts with (a blank line ends an event)
SSE_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")


def opens_as_sse(first: bytes) -> bool:
    """Whether a stream's first bytes read as server-sent events: its first line a field or a
    comment (the read may end anywhere, so the lines after it may be cut)."""
    line = next((x.strip() for x in first.splitlines() if x.strip()), b"")
    return line.startswith(SSE_FIELDS)


def closes_as_sse(tail: bytes, cut: bool) -> bool:
    """Whether a stream's last line is a field or a comment; ``cut``: the tail kept is only the end of
    the stream, so a last line as long as the whole tail cannot be judged (and passes)."""
    lines = [x.strip() for x in tail.splitlines() if x.strip()]
    if not lines:
        return not cut
    return lines[-1].startswith(SSE_FIELDS) or (cut and len(lines) == 1)


def draining_error() -> ApiError:
    return ApiError(503, "the gateway is shutting down; retry (another gateway replica will answer)", "draining", retry_after_s=1.0)


def _quiet_aborts(record: logging.LogRecord) -> bool:
    return record.getMessage() != ABORT_MESSAGE


def _quiet_lost_writes(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(LOST_WRITE_MESSAGE)


logging.getLogger("uvicorn.error").addFilter(_quiet_aborts)  # the gateway logs each abort itself, naming the backend
# a client that leaves while its response is being written is expected: the access log records it, once
logging.getLogger("asyncio").addFilter(_quiet_lost_writes)


class Upstream:
    """The pooled HTTP connections to every engine. Proxied requests go through aiohttp, whose
    response parser is in C: against httpx over httpcore and h11 it costs the relay a fraction of
    the CPU per streamed chunk (``benchmarks/bench_upstream_client.py``; docs/gateway.md). It reads
    bodies as they come, undecoded, so the client gets the engine's bytes. Side calls
    (``/tokenize``) use ``client``, an httpx client, off the streaming path."""

    def __init__(self, connect_s: float, first_byte_s: float) -> None:
        # httpx's read timeout is per read, as aiohttp's sock_read is: a stream may last longer
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=first_byte_s)
        self._session: aiohttp.ClientSession | None = None  # made on the serving loop, at the first request
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=connect_s, read=first_byte_s, write=60.0, pool=None), trust_env=False
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60.0)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self.timeout, auto_decompress=False, skip_auto_headers=NO_AUTO_HEADERS
            )
        return self._session

    async def open(self, w: Worker, path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> aiohttp.ClientResponse:
        """The engine's response, once its status line and headers are in; the body is read after."""
        sent = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        sent.extend(w.auth().items())
        return await self.session.post(w.cfg.url + path, data=body, headers=sent, allow_redirects=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        await self.client.aclose()


@dataclass(frozen=True, slots=True)
class Relay:
    """What every exchange works with: the gateway's state, admission, upstream client, metrics
    and decision log, and how a tenant is labelled in metrics."""

    state: GatewayState
    admission: Admission
    upstream: Upstream
    metrics: GatewayMetrics
    decisions: JsonlLog
    access: JsonlLog
    tenant_label: Callable[[str], str]
    #: what a client sees when its engine fails mid-response: its connection aborted, or an SSE error event
    midstream_failure: Literal["abort", "error_event"] = "abort"
    #: the exchanges under way (a drain waits for them, then cuts those left)
    live: set[Exchange] = field(default_factory=set)


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
        self.started = False  # the response's status line went out
        self.cut_by_drain = False
        self.work: asyncio.Future[None] | None = None
        #: an admitted request's decision record, written when the exchange ends
        self.decision: dict[str, Any] | None = None
        # for the access log
        self.worker: str | None = None
        self.tries = 0
        self.ttft_s: float | None = None
        self.e2e_s: float | None = None
        self.usage: tuple[int, int] | None = None
        self.outcome = "ok"

    async def __call__(self, scope: Any, receive: Callable[[], Any], send: Callable[[Any], Any]) -> None:
        relay = self.relay
        self.work = work = asyncio.ensure_future(self._run(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        relay.live.add(self)
        left = False
        try:
            await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
            left = watch.done() and not work.done()
            if work.done() and work.cancelled() and self.cut_by_drain and not self.started:
                await self._error(send, draining_error())
        finally:
            relay.live.discard(self)
            for task in (work, watch):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await work  # re-raises a bug in _run; a client that left is not an error
            if self.cut_by_drain:
                self.outcome = "drain_timeout"
            elif left:
                self.outcome = "client_disconnected"
            self._log()

    def cut(self) -> None:
        """The drain timeout passed: end the exchange now (a response not yet started gets a 503;
        one under way is cut off, as a dead server's would be)."""
        self.cut_by_drain = True
        assert self.work is not None
        self.work.cancel()

    @property
    def client_status(self) -> int:
        """What the client saw: the status sent, or 499 (nginx's "client closed request") when none was."""
        return self.status if self.started else 499

    def _log(self) -> None:
        """One access-log record, and the decision record of an admitted request, each with the status the client saw."""
        relay = self.relay
        status = self.client_status
        relay.metrics.requests.labels(self.t.path, str(status)).inc()
        if self.decision is not None:
            self.decision["status"] = status
            relay.decisions.write(self.decision)
        if relay.access.enabled:
            relay.access.write(self.access_record())

    def access_record(self) -> dict[str, Any]:
        """One access-log line: who, where, how it ended and how long it took; never prompt text."""
        t = self.t
        return {
            "ts": round(time.time(), 6),
            "rid": t.rid,
            "path": t.path,
            "status": self.client_status,
            "outcome": self.outcome,
            "tenant": t.tenant,
            "session": t.session_id,
            "session_source": t.session_source,
            "model": t.model,
            "stream": self.stream,
            "worker": self.worker,
            "tries": self.tries,
            "prompt_tokens": t.prompt_tokens,
            "usage": list(self.usage) if self.usage else None,
            "prefix_hit": round(t.prefix_hit, 4),
            "ttft_s": _ms(self.ttft_s),
            "e2e_s": _ms(self.e2e_s),
            "total_s": _ms(time.perf_counter() - self.t0),
        }

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
        if self.outcome == "ok":
            self.outcome = err.code or "error"
        headers = [(b"content-type", b"application/json"), *((k.encode(), v.encode()) for k, v in err.headers().items())]
        self.started = True
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": err.body(self.t.path), "more_body": False})

    async def _proxy(self, send: Callable[[Any], Any], rec: dict[str, Any]) -> None:
        relay, t = self.relay, self.t
        state, metrics = relay.state, relay.metrics
        tried: set[int] = set()
        error = "no healthy worker serves this model"
        while len(tried) < 2:
            # the first attempt goes where admission counted it (other replicas see it there)
            plan, t.plan = t.plan, None
            w, shadow_worker = plan if plan is not None and not tried and plan[0].healthy else state.route(t, tried)
            if w is None:
                break
            if not tried:
                rec["worker"] = w.label
                if shadow_worker is not None:
                    rec["shadow_worker"] = state.workers[shadow_worker].label
                    metrics.shadow.labels(state.router.shadow.name, str(shadow_worker == w.id).lower()).inc()
                self.decision = rec
            else:
                metrics.retries.labels(w.label).inc()
            tried.add(w.id)
            self.worker, self.tries = w.label, len(tried)
            state.begin(t, w)
            sent = time.perf_counter()
            metrics.overhead.observe(sent - self.t0)
            try:
                resp = await relay.upstream.open(w, t.path, self.body, self.headers)
            except UpstreamFailure as err:
                state.end(t)
                metrics.upstream_errors.labels(w.label, type(err).__name__).inc()
                if isinstance(err, ConnectFailure) and state.failed(w):
                    log.warning("backend %s ejected: connections to it failing", w.label)
                error = f"backend {w.label} failed before responding ({type(err).__name__})"
                continue
            try:
                chunks = resp.content.iter_any()  # each chunk as it arrives, whatever its framing
                first = await anext(chunks, b"")
            except UpstreamFailure as err:
                resp.close()
                state.end(t)
                metrics.upstream_errors.labels(w.label, type(err).__name__).inc()
                error = f"backend {w.label} failed before its first byte ({type(err).__name__})"
                continue
            state.answered(t)
            relay.admission.kick()  # its engine's queue got younger
            if resp.status in RETRY_STATUSES and len(tried) < 2:
                resp.close()
                state.end(t)
                metrics.upstream_errors.labels(w.label, f"http_{resp.status}").inc()
                error = f"backend {w.label} answered {resp.status}"
                continue
            if resp.status < 500:
                w.answered_s = state.clock()  # alive: its next health check may be skipped
            ttft = time.perf_counter() - sent if self.stream else None
            if ttft is not None:
                metrics.backend_ttft.labels(w.label).observe(ttft)
                self.ttft_s = ttft
            completed = False
            try:
                completed = await self._relay(send, w, resp.status, resp.raw_headers, first, chunks)
            finally:
                resp.release()  # to the pool when read to its end; one cut short closes its connection, which aborts it
                state.end(t, ttft, completed)
            if completed:
                self.e2e_s = time.perf_counter() - sent
                metrics.backend_e2e.labels(w.label).observe(self.e2e_s)
            return
        self.outcome = "upstream_failed"
        await self._error(
            send, ApiError(502, f"{error}; tried {len(tried)} worker(s); check the engines (GET /debug/state)", "upstream_failed")
        )

    async def _relay(self, send: Callable[[Any], Any], w: Worker, status: int, raw_headers: tuple[tuple[bytes, bytes], ...],
                     first: bytes, chunks: AsyncIterator[bytes]) -> bool:
        """Relay the response, each chunk as it came; ``True`` when it ended normally with a 200.
        Only the event count and a tail of the stream are read (for usage), never its events one by one."""
        relay, t = self.relay, self.t
        headers = strip_hop_by_hop(list(raw_headers), HOP_BY_HOP)
        headers.append((b"x-coda-worker", w.label.encode()))
        self.status = status
        if status >= 400:
            self.outcome = "engine_error"
        sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in raw_headers)
        if self.stream and status == 200 and not (sse and opens_as_sse(first)):
            # nothing has reached the client yet: answer the engine's failure as one
            relay.metrics.upstream_errors.labels(w.label, "not_sse").inc()
            self.outcome = "engine_error"
            log.warning("backend %s answered a stream that is not server-sent events: answered 502", w.label)
            msg = f"backend {w.label} answered a stream that is not server-sent events; check the engine, then retry the request"
            await self._error(send, ApiError(502, msg, "engine_error"))
            return False
        self.started = True
        await send({"type": "http.response.start", "status": status, "headers": headers})
        # usage: from the last events of a stream, or from the whole body of a JSON answer
        tail, body = first[-TAIL_BYTES:], [first]
        if t.path == "/v1/responses" and t.session_id is not None and status == 200 and (rid := response_id(first)):
            relay.state.chains.record(rid, t.tenant, t.session_id)  # a request continuing this answer is its session
        await send({"type": "http.response.body", "body": first, "more_body": True})
        if sse:
            relay.state.streamed(t, first.count(b"data:"))
        clock = relay.state.clock if status < 500 else None
        try:
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if clock is not None:  # a worker streaming its answer needs no health check meanwhile
                    w.answered_s = clock()
                if sse:
                    tail = (tail + chunk)[-TAIL_BYTES:]
                    relay.state.streamed(t, chunk.count(b"data:"))
                else:
                    body.append(chunk)
        except UpstreamFailure as err:
            relay.metrics.upstream_errors.labels(w.label, type(err).__name__).inc()
            self.outcome = "upstream_failed_midstream"
            if sse and relay.midstream_failure == "error_event":
                msg = f"backend {w.label} failed mid-stream ({type(err).__name__}); the response is incomplete, retry the request"
                await send(
                    {"type": "http.response.body", "body": ApiError(502, msg, "upstream_failed").sse_event(t.path), "more_body": True}
                )
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:  # returning without the last body message makes the server close the connection unfinished
                self.outcome = "aborted"
                log.warning("backend %s failed mid-response (%s): aborted the client's connection", w.label, type(err).__name__)
            return False
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if sse and status == 200 and not closes_as_sse(tail, len(tail) >= TAIL_BYTES):
            # relayed already: logged and counted as the engine's error, not as a good answer
            relay.metrics.upstream_errors.labels(w.label, "not_sse").inc()
            self.outcome = "engine_error"
            log.warning("backend %s ended a stream with lines that are not server-sent events", w.label)
            return False
        if status == 200:
            self._usage(stream_usage(tail) if sse else usage_of(b"".join(body)))
        return status == 200

    def _usage(self, usage: tuple[int, int] | None) -> None:
        relay, t = self.relay, self.t
        self.usage = usage
        metrics, label = relay.metrics, relay.tenant_label(t.tenant)
        if usage is None:
            metrics.tenant_input.labels(label).inc(t.prompt_tokens)
            metrics.tenant_unreported.labels(label).inc()
        else:
            metrics.tenant_input.labels(label).inc(usage[0])
            metrics.tenant_output.labels(label).inc(usage[1])


def _ms(seconds: float | None) -> float | None:
    return round(seconds, 6) if seconds is not None else None


async def _disconnected(receive: Callable[[], Any]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
