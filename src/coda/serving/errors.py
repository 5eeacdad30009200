"""Errors answered in the caller's API format (OpenAI, or Anthropic on ``/v1/messages``), each
with a message that names the fix: the gateway's and the fake engine's. A client mistake is a 4xx,
never a 500."""

from __future__ import annotations

import math
from typing import Any

import msgspec
from starlette.responses import Response

ANTHROPIC_PATHS = frozenset({"/v1/messages"})
# OpenAI's error types by status; Anthropic names them differently
OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    529: "overloaded_error",
}
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "api_error",
    503: "api_error",
    529: "overloaded_error",
}
_encode = msgspec.json.Encoder().encode


class ApiError(Exception):
    """``code``: a short machine-readable reason (``model_not_found``, ``tenant_over_share`` ...);
    without one the body carries the status, as vLLM's errors do. ``kind``: the error type, when
    not the API's usual one for the status."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        retry_after_s: float = 0.0,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s
        self.kind = kind

    def openai_body(self) -> dict[str, Any]:
        kind = self.kind or OPENAI_TYPES.get(self.status, "api_error")
        return {
            "error": {
                "message": self.message,
                "type": kind,
                "param": self.param,
                "code": self.code if self.code is not None else self.status,
            }
        }

    def anthropic_body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.kind or ANTHROPIC_TYPES.get(self.status, "api_error"), "message": self.message}}

    def body(self, path: str) -> bytes:
        return _encode(self.anthropic_body() if path in ANTHROPIC_PATHS else self.openai_body())

    def sse_event(self, path: str) -> bytes:
        """The error as a final server-sent event, for a stream that already started."""
        return (b"event: error\n" if path in ANTHROPIC_PATHS else b"") + b"data: " + self.body(path) + b"\n\n"

    def headers(self) -> dict[str, str]:
        if self.retry_after_s <= 0:
            return {}
        # Retry-After takes whole seconds; the openai client also reads the exact retry-after-ms
        return {"retry-after": str(max(1, math.ceil(self.retry_after_s))), "retry-after-ms": str(int(self.retry_after_s * 1000))}

    def response(self, path: str) -> Response:
        return Response(self.body(path), status_code=self.status, headers=self.headers(), media_type="application/json")
