"""Strict JSON for everything Coda writes: NaN and infinities become ``null``.

Python's ``json`` writes ``NaN`` and ``Infinity``, which are not JSON: ``JSON.parse``, Go's
``encoding/json`` and ``jq`` reject them. msgspec writes ``null`` for them, and is faster on the
hot paths that use this (the gateway's decision log, per-request records).
"""

from __future__ import annotations

from typing import Any

import msgspec


def _fallback(obj: Any) -> Any:
    tolist = getattr(obj, "tolist", None)  # numpy scalars and arrays, without importing numpy here
    if callable(tolist):
        return tolist()
    return str(obj)  # paths and the like, as ``json.dumps(default=str)`` wrote them


_ENCODER = msgspec.json.Encoder(enc_hook=_fallback)


def dumps(obj: Any, indent: int = 0) -> str:
    """``obj`` as strict JSON text; ``indent`` > 0 pretty-prints."""
    raw = _ENCODER.encode(obj)
    return (msgspec.json.format(raw, indent=indent) if indent else raw).decode()
