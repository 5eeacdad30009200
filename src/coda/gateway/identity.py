"""Who a request is for: its tenant (from the API key, or ``x-tenant-id`` with auth off) and its
agent session, recognised from what agent clients already send (``session_of``: their own headers
and body fields, then Coda's ``x-session-id``, the Responses API's ``previous_response_id``, then
cache keys that several sessions may share, then a hash of how the conversation opens).

Tenants label metrics, so names outside the configuration are folded into ``other`` once
``MAX_TENANT_LABELS`` distinct ones have been seen (a header must not grow /metrics forever),
and an ``x-tenant-id`` longer than ``MAX_TENANT_CHARS`` is refused with a 400: a tenant name is
an operator's word that labels metrics and picks a configuration entry, so it stays readable
and is never rewritten.

A session id is the client's, of any length (the ``user`` field may even hold personal data),
and it only steers admission and routing. The gateway keeps and logs a fixed-size digest of the
tenant and the id instead (``session_key``): every session table costs the same per entry
whatever the client sends, no client string reaches a log, and a slot belongs to its tenant, so
one tenant cannot continue another tenant's session by sending its id.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec

from coda.gateway.config import GatewayConfig
from coda.serving.errors import ApiError

DEFAULT_TENANT = "default"
MAX_TENANT_LABELS = 64
#: longest ``x-tenant-id`` accepted (with auth off): as long as a label should be
MAX_TENANT_CHARS = 64
#: bytes of a session key's digest (BLAKE2b): 32 hex characters, collision-free among any number of live sessions
SESSION_KEY_BYTES = 16
_encode = msgspec.json.Encoder().encode


def bearer(headers: Any) -> str | None:
    """The key of an ``Authorization: Bearer`` header (or Anthropic's ``x-api-key``)."""
    auth = headers.get("authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key")


class Identities:
    def __init__(self, config: GatewayConfig) -> None:
        self.auth = config.auth
        self.known = set(config.tenants) | set(config.auth.api_keys.values())
        self._labels: set[str] = set(self.known)

    def tenant(self, headers: Any) -> str:
        """The tenant, or a 401 naming the fix when auth is on and the key is missing or unknown."""
        if not self.auth.enabled:
            tenant = headers.get("x-tenant-id") or DEFAULT_TENANT
            if len(tenant) > MAX_TENANT_CHARS:
                raise ApiError(400, f"x-tenant-id is {len(tenant)} characters long; the gateway accepts at most {MAX_TENANT_CHARS}: "
                               "send a shorter tenant name", "invalid_tenant")
            return tenant
        key = bearer(headers)
        if not key:
            raise ApiError(
                401, "missing API key: send 'Authorization: Bearer <key>' with a key from the gateway's auth.api_keys", "missing_api_key"
            )
        tenant = self.auth.api_keys.get(key)
        if tenant is None:
            raise ApiError(401, "invalid API key: it is not in the gateway's auth.api_keys; ask the operator for a key", "invalid_api_key")
        return tenant

    def is_admin(self, headers: Any) -> bool:
        key = bearer(headers)
        return bool(self.auth.admin_key and key and hmac.compare_digest(key, self.auth.admin_key))

    def label(self, tenant: str) -> str:
        """A bounded metrics label for ``tenant``."""
        if tenant in self._labels:
            return tenant
        if len(self._labels) < MAX_TENANT_LABELS:
            self._labels.add(tenant)
            return tenant
        return "other"


#: headers agent clients send on their own, each naming one conversation (sources in docs/gateway.md):
#: Claude Code (from v2.1.86), OpenCode (to its own gateway; to other providers ``x-session-affinity``),
#: OpenAI Codex (``session_id``; ``conversation_id`` in older releases; ``session-id`` where a proxy
#: rewrites underscores)
CLIENT_HEADERS = ("x-claude-code-session-id", "x-opencode-session", "x-session-affinity", "session_id", "session-id", "conversation_id")
#: Coda's own header, for clients that send none of their own
CODA_HEADER = "x-session-id"
#: characters of the conversation's opening that the prefix hash reads (a system prompt and the task)
PREFIX_CHARS = 4096
#: Responses API ids remembered with the session they answered (about 200 bytes each)
MAX_RESPONSE_IDS = 200_000


@dataclass(frozen=True, slots=True)
class ClientSession:
    """A session id as the client sent it, and which rule found it (``source``: the header or body
    field, ``previous_response_id``, or ``prefix``)."""

    id: str
    source: str


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def claude_code_session(metadata: Any) -> str | None:
    """The session of Claude Code's ``metadata.user_id``: ``user_<hash>_account_<uuid>_session_<uuid>``
    before v2.1.78, a JSON object with ``session_id`` encoded as a string since."""
    user_id = _text(metadata.get("user_id")) if isinstance(metadata, dict) else None
    if user_id is None:
        return None
    if user_id.startswith("{"):
        try:
            parsed = msgspec.json.decode(user_id)
        except msgspec.DecodeError:
            return None
        return _text(parsed.get("session_id")) if isinstance(parsed, dict) else None
    _, marker, sid = user_id.rpartition("_session_")
    return _text(sid) if marker else None


def client_session(headers: Any, body: dict[str, Any]) -> ClientSession | None:
    """An id that names one conversation and nothing wider: an agent client's own headers, Claude
    Code's ``metadata.user_id``, the Responses API's ``conversation``, then Coda's ``x-session-id``
    and the body's ``metadata.session_id``."""
    for h in CLIENT_HEADERS:
        if v := _text(headers.get(h)):
            return ClientSession(v, h)
    if sid := claude_code_session(body.get("metadata")):
        return ClientSession(sid, "metadata.user_id")
    conv = body.get("conversation")
    if v := _text(conv) or (_text(conv.get("id")) if isinstance(conv, dict) else None):
        return ClientSession(v, "conversation")
    if v := _text(headers.get(CODA_HEADER)):
        return ClientSession(v, CODA_HEADER)
    meta = body.get("metadata")
    if isinstance(meta, dict) and (v := _text(meta.get("session_id"))):
        return ClientSession(v, "metadata.session_id")
    return None


def shared_key(body: dict[str, Any]) -> ClientSession | None:
    """A field that may span sessions: ``prompt_cache_key`` (Codex sends its conversation id there,
    OpenCode its session id, but other clients share one key across sessions), then ``user``. Read
    only when nothing names the conversation, so two sessions a client marks distinct never merge."""
    for name in ("prompt_cache_key", "user"):
        if v := _text(body.get(name)):
            return ClientSession(v, name)
    return None


def prefix_session(path: str, body: dict[str, Any]) -> ClientSession | None:
    """A session named by how its conversation opens: the instructions or system prompt and the first
    message, which an agent re-sends unchanged every round. Two sessions that open alike (the same
    system prompt and the same task) are one to the gateway; clients that name their sessions avoid it."""
    parts: list[Any] = [path, body.get("system"), body.get("instructions")]
    if isinstance(msgs := body.get("messages"), list):
        head = [m for m in msgs[:8] if isinstance(m, dict)]
        first_user = next((i for i, m in enumerate(head) if m.get("role") == "user"), None)
        parts.append(head[: first_user + 1] if first_user is not None else head[:1])
    elif isinstance(inp := body.get("input"), list):
        parts.append(inp[:1])
    else:
        parts.append(_text(body.get("input")) or _text(body.get("prompt")))
    if all(p in (None, [], "") for p in parts[1:]):
        return None
    opening = _encode(parts)[:PREFIX_CHARS]
    return ClientSession(hashlib.blake2b(opening, digest_size=SESSION_KEY_BYTES).hexdigest(), "prefix")


class ResponseChains:
    """The session each Responses API answer belonged to, by its id, so that a request continuing it
    (``previous_response_id``) is recognised as that session, whatever else it sends. Bounded
    (least recently recorded dropped first); a response id is honoured for its own tenant only."""

    def __init__(self, limit: int = MAX_RESPONSE_IDS) -> None:
        self.limit = limit
        self._keys: OrderedDict[str, tuple[str, str]] = OrderedDict()

    def record(self, response_id: str, tenant: str, key: str) -> None:
        self._keys[response_id] = (tenant, key)
        self._keys.move_to_end(response_id)
        if len(self._keys) > self.limit:
            self._keys.popitem(last=False)

    def session(self, response_id: Any, tenant: str) -> str | None:
        """The session key of ``response_id``'s answer, when this tenant's request produced it."""
        entry = self._keys.get(response_id) if isinstance(response_id, str) else None
        return entry[1] if entry is not None and entry[0] == tenant else None


_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp[_-][A-Za-z0-9_-]{1,120})"')


def response_id(first_bytes: bytes) -> str | None:
    """The id of a Responses API answer from its first bytes (the ``response.created`` event of a
    stream, or the start of a JSON body)."""
    m = _RESPONSE_ID.search(first_bytes[:8192])
    return m.group(1).decode() if m else None


def session_of(tenant: str, path: str, headers: Any, body: dict[str, Any], chains: ResponseChains) -> tuple[str | None, str | None]:
    """The session key of a request and the rule that found it: an id that names one conversation
    (``client_session``), then the session of the response it continues (``previous_response_id``),
    then a key that may span sessions (``shared_key``), then the prefix hash; ``(None, None)`` for a
    request none of them names."""
    found = client_session(headers, body)
    if found is None and (key := chains.session(body.get("previous_response_id"), tenant)) is not None:
        return key, "previous_response_id"
    found = found or shared_key(body) or prefix_session(path, body)
    return (session_key(tenant, found.id), found.source) if found is not None else (None, None)


def session_key(tenant: str, sid: str | None) -> str | None:
    """What the gateway knows a session by: a digest of its tenant and its id (see the module docstring)."""
    if sid is None:
        return None
    return hashlib.blake2b(f"{tenant}\0{sid}".encode(errors="surrogatepass"), digest_size=SESSION_KEY_BYTES).hexdigest()


def with_cache_salt(raw: bytes, body: dict[str, Any], salt: str) -> bytes:
    """The body with the tenant's ``cache_salt``. A body without one gets the field prepended
    (every other byte unchanged); a client's own salt is kept as a suffix of the tenant's, so a
    tenant can partition its own cache but never reach another tenant's."""
    own = body.get("cache_salt")
    if own is None:
        return b'{"cache_salt":' + _encode(salt) + (b"," if body else b"") + raw.lstrip()[1:]
    return _encode({**body, "cache_salt": f"{salt}:{own}"})
