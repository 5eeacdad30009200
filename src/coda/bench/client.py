"""One streamed request to an OpenAI-compatible endpoint, timed on the client (httpx).

``Endpoint.send`` never raises for what the server or the network does: every attempt comes
back as an ``Attempt`` holding either the streamed answer (text, token times) or the HTTP status
and a one-line reason (unreachable endpoint, a non-OpenAI response, a stream cut mid-way).
The stream is parsed by httpx-sse. Token counts per chunk use the shared word tokenizer (one
word = one token; a non-empty chunk is at least one token), and the final ``usage`` block, when
the server sends one, is kept.

A round followed by tool calls can ask the engine to emit them (``Endpoint.body``'s ``tools``): structured
output forces the Hermes-style calls an agent's model writes, and the answer ends on the
grammar's end rather than at a length, as a model's turn that calls tools does, so an engine
that reads tool calls from its own output (the vLLM scheduler's retention) sees them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
from httpx_sse import EventSource

from coda.bench.overload import retry_after_s
from coda.bench.prompts import Message
from coda.protocol import tokenizer as tok

RETRYABLE = (429, 503, 529)
KEEPALIVE_EXPIRY_S = 3.0  # assumed: well below the 5 s keep-alive timeout of uvicorn (coda serve, coda fake-engine) and most servers
_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()


class EndpointDown(Exception):
    """The endpoint did not answer at all: nothing listening, an unknown host, TLS, a timeout."""


def tool_call_text(name: str) -> str:
    """One call in the Hermes format (``<tool_call>{"name": ...}</tool_call>``) with no arguments."""
    return f'<tool_call>{{"name": "{name}"}}</tool_call>'


#: regex metacharacters; a space stays as it is (``re.escape`` puts a backslash before it, an escape
#: not every structured-output engine's regex dialect reads)
_META = re.compile(r"([\\.^$|?*+()\[\]{}])")


def tool_call_regex(names: Sequence[str]) -> str:
    """The structured-output regex whose only match is the calls of ``names``, in order."""
    return "".join(_META.sub(r"\\\1", tool_call_text(n)) for n in names)


#: why an answer whose stream ended properly but carried no text fails
NO_TOKENS = "bad_response: the stream carried no tokens"


@dataclass(slots=True)
class Attempt:
    """One HTTP attempt. ``status`` None: no response (``reason`` says why)."""

    sent_s: float
    status: int | None = None
    reason: str | None = None
    retry_after_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    end_s: float | None = None
    text: str = ""
    tokens: int = 0
    gaps: list[float] = field(default_factory=list)
    usage: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None and self.status == 200


def _error_message(body: bytes) -> str:
    """The message of an OpenAI/Anthropic error body, else the start of the body."""
    try:
        obj = _decode.decode(body)
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
    except msgspec.DecodeError:
        pass
    return body[:120].decode(errors="replace").strip() or "(empty body)"


class Endpoint:
    """An OpenAI-compatible base URL (with or without ``/v1``) and how to call it.

    Requests go straight to httpx transports (``httpx.AsyncHTTPTransport``): a load generator needs
    none of the client layer's cookies, auth flows, redirects or hooks, and skipping them saves a
    sixth of the CPU per streamed request. They are spread over ``shards`` transports by a key (the
    session): httpx's pool scans every pooled connection on each request, so small pools keep the
    client's overhead flat as concurrency grows, and a session keeps reusing its own connections,
    as an agent does."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None,
        api: str = "chat",
        api_key: str | None = None,
        ignore_eos: bool = True,
        timeout_s: float = 600.0,
        shards: int = 1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if api not in ("chat", "completions"):
            raise ValueError(f"api must be chat or completions, got {api!r}")
        base = base_url.rstrip("/")
        self.base = base[: -len("/v1")] if base.endswith("/v1") else base
        self.model = model
        self.api = api
        self.url = httpx.URL(self.base + ("/v1/chat/completions" if api == "chat" else "/v1/completions"))
        self.ignore_eos = ignore_eos
        self.clock = clock
        self.auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.headers = {"accept": "text/event-stream", "content-type": "application/json", **self.auth}
        self.timeout = {"connect": min(timeout_s, 10.0), "read": timeout_s, "write": timeout_s, "pool": timeout_s}
        self.tls = httpx.create_ssl_context()  # built once: loading the CA bundle costs ~20 ms
        # An idle connection is dropped before the server's keep-alive timeout ends (uvicorn's: 5 s, httpx's
        # default expiry too): a request sent on one the server is closing at that moment fails
        # before any response, which is the client's race, not the server's failure.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_EXPIRY_S)
        self.transports = [httpx.AsyncHTTPTransport(verify=self.tls, limits=limits) for _ in range(max(1, shards))]

    async def close(self) -> None:
        for t in self.transports:
            await t.aclose()

    async def served_models(self) -> list[str]:
        """The models the endpoint lists (none when it answers without a list). Raises
        ``EndpointDown`` when nothing answers, so a run against a dead server ends before it starts."""
        try:
            async with httpx.AsyncClient(base_url=self.base, headers=self.auth, verify=self.tls, timeout=10.0) as client:
                resp = await client.get("/v1/models")
        except httpx.TransportError as err:
            raise EndpointDown(f"GET {self.base}/v1/models: {err or type(err).__name__}") from None
        try:
            return [str(card["id"]) for card in resp.json()["data"]]
        except (ValueError, KeyError, TypeError):
            return []

    def body(self, messages: Sequence[Message], max_tokens: int, tools: Sequence[str] = ()) -> bytes:
        """A streamed request for ``max_tokens`` tokens; with ``tools``, for those calls instead
        (structured output, ended by the grammar: ``ignore_eos`` would run past it)."""
        req: dict[str, Any] = {"max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
        if self.model is not None:
            req["model"] = self.model
        if tools:
            # no tokenization is longer than the text's bytes (the end of sequence aside)
            req["max_tokens"] = max(max_tokens, sum(len(tool_call_text(n).encode()) for n in tools) + 1)
            req["structured_outputs"] = {"regex": tool_call_regex(tools)}
        elif self.ignore_eos:
            req["ignore_eos"] = True
        if self.api == "chat":
            req["messages"] = [m.as_json() for m in messages]
        else:
            req["prompt"] = " ".join(tok.render((m.role, m.text) for m in messages))
        return _encode.encode(req)

    async def send(self, body: bytes, headers: dict[str, str], shard: int = 0, into: Attempt | None = None) -> Attempt:
        """One attempt; ``into``: the attempt to fill, so that a caller whose send is cancelled still
        reads what had come (a request cut off by the run's end keeps its first token's time)."""
        clock = self.clock
        a = into if into is not None else Attempt(sent_s=clock())
        request = httpx.Request("POST", self.url, headers={**self.headers, **headers}, content=body, extensions={"timeout": self.timeout})
        try:
            resp = await self.transports[shard % len(self.transports)].handle_async_request(request)
            try:
                a.status = resp.status_code
                ctype = resp.headers.get("content-type", "")
                if resp.status_code != 200:
                    a.retry_after_s = retry_after_s(resp.headers)
                    a.reason = f"http_{resp.status_code}: {_error_message(await resp.aread())}"
                elif "text/event-stream" not in ctype:
                    a.reason = f"bad_response: expected an SSE stream, got content-type {ctype or '(none)'!r}"
                else:
                    await self._read_stream(resp, a)
            finally:
                await resp.aclose()
        except httpx.TimeoutException as err:
            a.reason = f"timeout: {type(err).__name__}"
        except httpx.ConnectError as err:
            a.reason = f"connect_error: {err}" if str(err) else "connect_error: cannot connect"
        except (httpx.RemoteProtocolError, httpx.ReadError) as err:
            a.reason = f"stream_cut: {err}" if str(err) else "stream_cut: connection closed"
        except httpx.HTTPError as err:
            a.reason = f"http_error: {type(err).__name__}: {err}"
        finally:
            a.end_s = clock()
        return a

    async def _read_stream(self, resp: httpx.Response, a: Attempt) -> None:
        """Read the SSE stream through httpx-sse (multi-line ``data:`` fields joined, comments and
        other fields skipped); each event's JSON is one chunk, and the last ``usage`` block seen (the
        final event's, with ``stream_options.include_usage``) is the answer's."""
        clock = self.clock
        chat = self.api == "chat"
        pieces: list[str] = []
        finished = done = False
        first_choice_s: float | None = None  # when the first chunk with a choice came (it carries the first token)
        async for event in EventSource(resp).aiter_sse():
            now = clock()
            if event.data == "[DONE]":
                done = True
                continue
            if not event.data:
                continue  # an event with no data field (a bare `event:` or `id:`)
            try:
                obj = _decode.decode(event.data)
            except msgspec.DecodeError:
                a.reason = f"bad_response: SSE data is not JSON: {event.data[:60]!r}"
                return
            if not isinstance(obj, dict):
                a.reason = "bad_response: SSE data is not a JSON object"
                return
            if "error" in obj:
                a.reason = f"stream_error: {_error_message(event.data.encode())}"
                return
            if isinstance(obj.get("usage"), dict):
                a.usage = obj["usage"]
            choices = obj.get("choices")
            if not isinstance(choices, list):
                a.reason = "bad_response: a chunk without choices (not an OpenAI stream)"
                return
            if not choices:
                continue
            choice = choices[0]
            first_choice_s = now if first_choice_s is None else first_choice_s
            piece = _piece(choice, chat)
            if piece:
                k = max(1, tok.count_tokens(piece))
                if a.first_token_s is not None:
                    a.gaps.append(now - a.last_token_s)  # type: ignore[operator]
                else:
                    a.first_token_s = now
                a.gaps.extend([0.0] * (k - 1))  # tokens that arrived in one chunk arrive together
                a.last_token_s = now
                a.tokens += k
                pieces.append(piece)
            if choice.get("finish_reason"):
                finished = True
        a.text = "".join(pieces)
        if not (done or finished):
            a.reason = "stream_cut: the stream ended before [DONE] or a finish_reason"
        elif a.first_token_s is None:
            produced = (a.usage or {}).get("completion_tokens")
            if isinstance(produced, int) and produced > 0 and first_choice_s is not None:
                # every token decoded to no text (a special token, for one): the usage block counts them, and they
                # came with the first chunk that carried a choice
                a.first_token_s = a.last_token_s = first_choice_s
                a.tokens = produced
            else:
                a.reason = NO_TOKENS


def _piece(choice: dict[str, Any], chat: bool) -> str:
    """The text a chunk adds: content (or tool-call arguments) for chat, text for completions."""
    if not chat:
        text = choice.get("text")
        return text if isinstance(text, str) else ""
    delta = choice.get("delta") or {}
    content = delta.get("content")
    if isinstance(content, str) and content:
        return content
    out = ""
    for call in delta.get("tool_calls") or ():
        fn = call.get("function") or {}
        if isinstance(fn.get("arguments"), str):
            out += fn["arguments"]
    return out
