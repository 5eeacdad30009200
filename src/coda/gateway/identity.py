"""Who a request is for: its tenant (from the API key, or ``x-tenant-id`` with auth off) and its
agent session (headers first, then the body's ``user`` / ``metadata.session_id``).

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
from typing import Any

import msgspec

from coda.gateway.config import GatewayConfig
from coda.serving.errors import ApiError

SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id", "session-id")
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
            raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>' with a key from the gateway's auth.api_keys", "missing_api_key")
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


def session_id(headers: Any, body: dict[str, Any]) -> str | None:
    """The client's own session id, as it sent it."""
    for h in SESSION_HEADERS:
        v = headers.get(h)
        if v:
            return v
    user = body.get("user")
    if isinstance(user, str) and user:
        return user
    meta = body.get("metadata")
    if isinstance(meta, dict):
        sid = meta.get("session_id")
        if isinstance(sid, str) and sid:
            return sid
    return None


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
