"""This gateway as one replica among several: it publishes its count table to the shared store,
reads the others' sums back into ``GatewayState.others``, and tracks whether the store answers.

Decisions go through ``decide_lock`` one at a time per replica (atomic among replicas through the
store's own atomic steps, see ``coda.gateway.store``). With a shared store, a background loop
publishes the table when counts change, and every ``publish_interval_s`` regardless, which refreshes its TTL and brings the
other replicas' changes in (deferred requests then decide again). While the store is unreachable
the replica serves on its own state (``on_unreachable``: open admits by it, closed defers), only
the loop tries the store, and when it answers again the loop republishes the table and the session
slots this replica gave meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from coda.gateway.config import StoreConfig
from coda.gateway.host_store import HOST_STORE_SCHEME, HostStore
from coda.gateway.prometheus import GatewayMetrics
from coda.gateway.store import LocalStore, RedisStore, Store, StoreUnavailable, Synced
from coda.gateway.view import GatewayState
from coda.shell.sessions import SessionLedger

log = logging.getLogger("coda.gateway")
#: a table lives this many publish intervals without a refresh (assumed: a few, so one late publish does not drop a live replica)
TTL_INTERVALS = 4


def local_store(cfg: StoreConfig, ledger: SessionLedger, clock: Callable[[], float]) -> LocalStore:
    """A store in this process whose session slots live as long as ``ledger``'s, under its pause
    rule (the gateway's own ledger records admissions, the store's the claims, so each gets its own)."""
    return LocalStore(SessionLedger(ledger.ttl_s, ledger.limit, ledger.pause), clock, TTL_INTERVALS * cfg.publish_interval_s)


def open_store(state: GatewayState) -> Store:
    cfg = state.config.store
    if cfg.url is None:
        return local_store(cfg, state.ledger, state.clock)
    if cfg.url.startswith(HOST_STORE_SCHEME):
        return HostStore(cfg.url.removeprefix(HOST_STORE_SCHEME))
    return RedisStore(cfg.url, cfg.key_prefix, TTL_INTERVALS * cfg.publish_interval_s, state.ledger.ttl_s, state.ledger.pause)


def _shown(url: str | None) -> str:
    """The store's address without its password, for logs."""
    if url is None:
        return "in-process"
    if url.startswith(HOST_STORE_SCHEME):
        return url
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path}"


class Replica:
    """The gateway's link to the store: its id, whether the store answers, the decision lock, the publisher."""

    def __init__(self, state: GatewayState, store: Store, metrics: GatewayMetrics) -> None:
        self.state = state
        self.store = store
        self.cfg = state.config.store
        self.metrics = metrics
        self.id = self.cfg.replica_id or f"{socket.gethostname()}-{os.getpid()}"
        self.closed_when_down = self.cfg.on_unreachable == "closed"
        self.up = True
        self.decide_lock = asyncio.Lock()
        self.on_change: Callable[[], None] = lambda: None  # the other replicas' counts changed, or the store came back
        self._seq = 0
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._reports: set[asyncio.Task[None]] = set()  # ``ended`` steps under way
        state.changed = self._dirty.set
        state.session_idle = self.ended
        metrics.store_up.set(1)

    @property
    def detail(self) -> str:
        """``/ready``'s word on the store."""
        if self.store.kind == "in-process":
            return "in-process"
        return "ok" if self.up else f"unreachable (fail-{'closed' if self.closed_when_down else 'open'})"

    async def start(self) -> None:
        await self._publish(None, probe=True)
        if self.store.kind != "in-process":  # an in-process store has no other replica to publish to
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        await asyncio.gather(*self._reports)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.up:
            with contextlib.suppress(StoreUnavailable):
                await self.store.drop(self.id)
        await self.store.close()

    def expire(self) -> None:
        """Let an in-process store drop its expired session slots and claims (Redis expires its own)."""
        if isinstance(self.store, LocalStore):
            self.store.expire()

    async def publish(self, session: str | None = None) -> Synced | None:
        """Publish the table (and claim ``session``'s slot); ``None`` while the store is away."""
        return await self._publish(session)

    async def settle(self, session: str, stamp: float, admitted: bool) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.store.settle(session, stamp, admitted)

    def ended(self, session: str) -> None:
        """None of this replica's requests of ``session`` is in flight any more: tell the store, off
        the request's path. While the store is away its own ledger holds the pause (``_back``
        restores the slots, which then lapse by the TTL or their session's next end)."""
        if self.up:
            task = asyncio.get_running_loop().create_task(self._ended(session))
            self._reports.add(task)
            task.add_done_callback(self._reports.discard)

    async def _ended(self, session: str) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.store.ended(session)

    async def _publish(self, session: str | None, probe: bool = False) -> Synced | None:
        if not self.up and not probe:
            return None
        self._seq = max(self._seq + 1, time.time_ns() // 1000)
        try:
            synced = await self.store.sync(self.id, self._seq, self.state.published(), session)
        except StoreUnavailable as err:
            self._lost(err)
            return None
        if not self.up:
            await self._back()
        if synced.others != self.state.others:
            self.state.others = synced.others
            self.on_change()
        return synced

    def _lost(self, err: StoreUnavailable) -> None:
        self.metrics.store_errors.inc()
        if not self.up:
            return
        self.up = False
        self.metrics.store_up.set(0)
        self.state.others = {}
        log.warning("store %s unreachable (%s): this replica serves on its own state (on_unreachable: %s) until it answers again",
                    _shown(self.cfg.url), err, self.cfg.on_unreachable)

    async def _back(self) -> None:
        """The store answers again (it may have restarted empty): the table was just republished;
        the session slots this replica gave while it was away go back too."""
        ages = self.state.ledger.ages(self.state.clock())
        try:
            await self.store.restore_sessions(ages)
        except StoreUnavailable as err:
            self._lost(err)
            return
        self.up = True
        self.metrics.store_up.set(1)
        log.warning("store %s reachable again: republished this replica's counts and %d session slot(s)", _shown(self.cfg.url), len(ages))
        self.on_change()

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.cfg.publish_interval_s)
            self._dirty.clear()
            await self._publish(None, probe=True)
