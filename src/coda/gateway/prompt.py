"""What the gateway reads from a request body: the model, the requested output length, and the
prompt as *units* for block hashing and token counting.

Two tokenizers:

- ``chars`` (default): the prompt's text (messages, tools, system, as JSON, in request order) cut
  into 256-byte units (about 64 tokens of code or English at 4 bytes a token), each named by a
  multiply-sum mix of its 64-bit words (numpy; units only need to differ, the block chain
  hashes them). No tokenizer file is needed, hashing a 64K-token prompt takes tens of
  microseconds, and an agent's re-sent context keeps its units, so per-session block hashes
  stay a prefix chain. Counts are estimates: the length check uses a lower bound (no real
  tokenizer averages more than ``MAX_BYTES_PER_TOKEN`` bytes a token), so it never refuses a
  prompt the engine accepts.
- ``words``: the fake engine's whitespace tokenizer and chat template (``coda.engines``), exact
  for ``coda fake-engine``: counts are exact and block hashes equal the ones its KV events
  carry, so the gateway can consume them.
- ``engine``: the engine's own tokenizer and chat template, so the gateway names prompt blocks
  exactly as vLLM's KV events do (by their token ids) whatever the model. With
  ``indexer.tokenizer_path`` (the model's folder or its ``tokenizer.json``) they run in the
  gateway (``coda.gateway.local_tokenizer``: incremental per session); otherwise, or for a prompt
  they cannot render, the engine's ``/tokenize`` answers, one loopback round trip bounded by
  ``indexer.tokenize_timeout_s``. A completions prompt given as token ids needs neither. Routes
  neither can render (responses, messages), and a ``/tokenize`` that times out, fall back to
  ``chars`` units, which never match an engine's blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import numpy as np

from coda.serving.errors import ApiError

if TYPE_CHECKING:
    from coda.gateway.local_tokenizer import LocalTokenizer

BYTES_PER_TOKEN = 4
UNIT_BYTES = 256
MAX_BYTES_PER_TOKEN = 10
_MIX = np.random.default_rng(0x5EED).integers(1, 2**63, UNIT_BYTES // 8, dtype=np.uint64) | np.uint64(1)
_encode = msgspec.json.Encoder().encode
# output-length fields by route, first present wins
MAX_TOKENS_KEYS = {
    "/v1/chat/completions": ("max_completion_tokens", "max_tokens"),
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
    "/v1/messages": ("max_tokens",),
}
# prompt-bearing fields by route, in the order a chat template renders them
PROMPT_KEYS = {
    "/v1/chat/completions": ("tools", "messages"),
    "/v1/completions": ("prompt",),
    "/v1/responses": ("tools", "instructions", "input"),
    "/v1/messages": ("tools", "system", "messages"),
}


@dataclass(slots=True, frozen=True)
class Prompt:
    units: Sequence[int]
    tokens: int  # best estimate (exact with an exact tokenizer)
    min_tokens: int  # a lower bound, for the length check


class Tokenizer(Protocol):
    name: str
    tokens_per_unit: int
    #: units are the engine's token ids, so block hashes can be matched with the engine's KV events
    exact: bool

    def prompt(self, path: str, body: dict[str, Any]) -> Prompt: ...

    def forget(self, session: str) -> None:
        """Drop what is kept for ``session`` (its idle time passed the session TTL)."""
        ...


def max_tokens(path: str, body: dict[str, Any]) -> int:
    for key in MAX_TOKENS_KEYS.get(path, ()):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


def prompt_text(path: str, body: dict[str, Any]) -> bytes:
    """The prompt-bearing fields as JSON, concatenated: a request that re-sends its session's
    context (and appends to it) yields a text that extends the previous one."""
    parts = []
    for key in PROMPT_KEYS.get(path, ()):
        v = body.get(key)
        if v is None:
            continue
        raw = v.encode() if isinstance(v, str) else _encode(v)
        # a JSON list loses its closing bracket, so appending a message keeps the earlier text a prefix
        parts.append(raw[:-1] if raw[-1:] == b"]" else raw)
    return b"\x1e".join(parts)


class CharTokenizer:
    name = "chars"
    tokens_per_unit = UNIT_BYTES // BYTES_PER_TOKEN
    exact = False

    def prompt(self, path: str, body: dict[str, Any]) -> Prompt:
        text = prompt_text(path, body)
        n = len(text) // UNIT_BYTES * UNIT_BYTES
        words = np.frombuffer(text, dtype=np.uint64, count=n // 8).reshape(-1, UNIT_BYTES // 8)
        units = (words * _MIX).sum(axis=1).tolist()
        return Prompt(units, len(text) // BYTES_PER_TOKEN, len(text) // MAX_BYTES_PER_TOKEN)

    def forget(self, session: str) -> None:
        """Nothing is kept per session."""


class WordTokenizer:
    name = "words"
    tokens_per_unit = 1
    exact = True

    def __init__(self) -> None:
        from coda.protocol import dialects as api
        from coda.protocol import tokenizer

        self._dialects = api.DIALECTS
        self._api_error = api.ApiError
        self._token_ids = tokenizer.token_ids

    def prompt(self, path: str, body: dict[str, Any]) -> Prompt:
        try:
            words = self._dialects[path].parse(body).prompt
        except self._api_error as err:
            raise ApiError(400, err.message, "invalid_request", err.param) from None
        return Prompt(self._token_ids(words), len(words), len(words))

    def forget(self, session: str) -> None:
        """Nothing is kept per session."""


class EngineTokenizer:
    name = "engine"
    tokens_per_unit = 1
    exact = True

    def __init__(self, local: LocalTokenizer | None = None) -> None:
        self._fallback = CharTokenizer()
        self.local = local

    def local_prompt(self, path: str, body: dict[str, Any], session: str | None) -> Prompt | None:
        """The prompt's token ids from the local tokenizer, or ``None`` when it cannot render it."""
        if self.local is None:
            return None
        ids: Sequence[int] | None = None
        if path == "/v1/completions" and isinstance(body.get("prompt"), str):
            ids = self.local.encode(body["prompt"], special=True, session=session)
        elif path == "/v1/chat/completions" and isinstance(body.get("messages"), list):
            tools = body.get("tools") if isinstance(body.get("tools"), list) else None
            text = self.local.render_chat(body["messages"], tools)
            ids = self.local.encode(text, special=False, session=session) if text is not None else None
        return Prompt(ids, len(ids), len(ids)) if ids is not None else None

    def forget(self, session: str) -> None:
        if self.local is not None:
            self.local.forget(session)

    def prompt(self, path: str, body: dict[str, Any]) -> Prompt:
        """Without a round trip: token-id prompts only (others use ``tokenize``)."""
        ids = _token_ids(path, body)
        if ids is None:
            return self._fallback.prompt(path, body)
        return Prompt(ids, len(ids), len(ids))

    def request(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The ``/tokenize`` body for this prompt, or ``None`` when no round trip is needed or possible."""
        if _token_ids(path, body) is not None:
            return None
        if path == "/v1/completions" and isinstance(body.get("prompt"), str):
            return {"model": body.get("model"), "prompt": body["prompt"]}
        if path == "/v1/chat/completions" and isinstance(body.get("messages"), list):
            req = {"model": body.get("model"), "messages": body["messages"], "add_generation_prompt": True}
            if body.get("tools"):
                req["tools"] = body["tools"]
            return req
        return None

    @staticmethod
    def from_response(data: dict[str, Any]) -> Prompt:
        ids = data.get("tokens")
        if not isinstance(ids, list):
            raise ApiError(502, "the engine's /tokenize answer has no token list; check the backend is vLLM", "bad_gateway")
        return Prompt(ids, len(ids), len(ids))


def _token_ids(path: str, body: dict[str, Any]) -> list[int] | None:
    p = body.get("prompt") if path == "/v1/completions" else None
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return p
    return None


def make_tokenizer(name: str, path: str | None = None, cache_mib: int = 64) -> Tokenizer:
    """``path``: the model's tokenizer for ``engine`` (a folder with ``tokenizer.json``, or the file)."""
    if name == "words":
        return WordTokenizer()
    if name == "engine":
        if path is None:
            return EngineTokenizer()
        from coda.gateway.local_tokenizer import LocalTokenizer

        return EngineTokenizer(LocalTokenizer(path, cache_mib * 2**20))
    return CharTokenizer()
