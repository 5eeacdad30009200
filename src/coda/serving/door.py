"""Limits at the door of an HTTP server, enforced while a request's head and body arrive, before
anything grows or waits unbounded: uvicorn's httptools protocol with the limits uvicorn has no knob
for. A head past its size or header count (431), a request line past its length (414), a head or a
body that stalls (408), a connection beyond the cap (503 with Retry-After): each answered with an
error body in the caller's API format (``coda.serving.errors``), then the connection is closed.

Counting happens in the parser's callbacks and, for a head the parser has not split yet, over the
bytes fed to it: httptools gathers a header's value until the value ends, so without the byte
count one endless header would grow without bound.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from coda.serving.errors import ApiError

#: bytes a head may hold beyond its request line and headers before it is cut (the CRLFs, a method)
HEAD_SLACK_BYTES = 4096
#: the Retry-After of a refusal for too many open connections: one second, assumed (a connection ends quickly)
CONNECTIONS_RETRY_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class DoorLimits:
    max_headers: int
    max_header_bytes: int
    max_request_line_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int


class _Refused(Exception):
    """Raised in a parser callback to stop the parse; the refusal itself is on the protocol."""


class DoorProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ``DoorLimits`` (see the module docstring)."""

    def __init__(self, *args: Any, limits: DoorLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._timer: asyncio.TimerHandle | None = None
        self._refusal: ApiError | None = None
        self._in_head = True
        self._started = False  # some byte of the current request came
        self._head_bytes = self._line_bytes = self._header_bytes = self._header_count = 0

    @classmethod
    def factory(cls, limits: DoorLimits) -> Any:
        """What ``uvicorn.Config(http=...)`` takes: the protocol class with ``limits`` bound."""
        return functools.partial(cls, limits=limits)

    # --- connection --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with a refusal's own answer (uvicorn logs and answers any parse error as a bare 400)."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.handle_websocket_upgrade() if self._should_upgrade() else self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            self._refuse(self._refusal or ApiError(400, "the request is not valid HTTP/1.1; send a well-formed request", "invalid_http"))
            return
        if self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_request_line_bytes + self.limits.max_header_bytes + HEAD_SLACK_BYTES:
                self._refuse(self._too_large_head())

    # --- parser callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._started = True, True
        self._head_bytes = self._line_bytes = self._header_bytes = self._header_count = 0
        self._arm(self.limits.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._line_bytes += len(url)
        if self._line_bytes > self.limits.max_request_line_bytes:
            self._stop(
                ApiError(
                    414,
                    f"the request target is longer than the server's max_request_line_bytes={self.limits.max_request_line_bytes}; "
                    "send a shorter URL",
                    "uri_too_long",
                )
            )
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._header_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if self._header_count > self.limits.max_headers or self._header_bytes > self.limits.max_header_bytes:
            self._stop(self._too_large_head())
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if len(self.connections) > self.limits.max_connections:
            self._stop(
                ApiError(
                    503,
                    f"the server holds its max_connections={self.limits.max_connections} open connections; retry after the "
                    "Retry-After delay, or reuse a connection",
                    "too_many_connections",
                    retry_after_s=CONNECTIONS_RETRY_AFTER_S,
                )
            )
        self._in_head = False
        super().on_headers_complete()
        self._arm(self.limits.body_timeout_s)

    def on_body(self, body: bytes) -> None:
        self._arm(self.limits.body_timeout_s)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        self._started = False
        super().on_message_complete()

    # --- refusals -----------------------------------------------------------------------------
    def _too_large_head(self) -> ApiError:
        return ApiError(
            431,
            f"the request's headers exceed the server's limits (max_headers={self.limits.max_headers}, "
            f"max_header_bytes={self.limits.max_header_bytes}); send fewer or shorter headers",
            "headers_too_large",
        )

    def _stop(self, err: ApiError) -> None:
        self._refusal = err
        raise _Refused

    def _arm(self, delay_s: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay_s, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        """A head or a body stalled. A body the application is not reading yet (reads paused) is not
        the client's stall: wait again."""
        self._timer = None
        if self.transport.is_closing():
            return
        if not self._in_head and self.flow.read_paused:
            self._arm(self.limits.body_timeout_s)
            return
        if not self._started:  # a connection that never sent a byte of a request: nothing to answer
            self.transport.close()
            return
        what, limit = ("head", "header_timeout_s") if self._in_head else ("body", "body_timeout_s")
        seconds = self.limits.header_timeout_s if self._in_head else self.limits.body_timeout_s
        self._refuse(
            ApiError(408, f"the request's {what} stalled for {seconds:g} s (the server's {limit}); send the request at once", "timeout")
        )

    def _refuse(self, err: ApiError) -> None:
        """Answer ``err`` (unless the application already answered this request) and close the connection."""
        self._disarm()
        if self.transport.is_closing():
            return
        if self._in_head or self.cycle is None or not self.cycle.response_started:  # in a head, self.cycle is the last request's
            body = err.body(self.scope.get("path", "") if self.scope else "")
            head = [STATUS_LINE[err.status], b"content-type: application/json\r\n", b"connection: close\r\n"]
            head += [f"{k}: {v}\r\n".encode() for k, v in err.headers().items()]
            head.append(b"content-length: %d\r\n\r\n" % len(body))
            self.transport.write(b"".join(head) + body)
        if self.cycle is not None and not self.cycle.response_complete:  # the application sees a disconnect, its answer is dropped
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()
