"""How the bench behaves under overload, like a good client: honour Retry-After, back off with
full jitter, retry a bounded number of times within a global budget, and slow down a tenant
that is told it is over its share (429).
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import time
from collections import deque
from collections.abc import Callable, Mapping


def retry_after_s(headers: Mapping[str, str], now_epoch: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` (preferred) or ``Retry-After`` (seconds or an HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now_epoch is None else now_epoch))


def backoff_s(attempt: int, retry_after: float | None, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Wait before retry number ``attempt`` (1, 2, ...): Retry-After, if given, plus full jitter
    U(0, min(cap, base * 2^(attempt-1))); without Retry-After the jitter alone."""
    jitter = rng.uniform(0.0, min(cap_s, base_s * 2 ** (attempt - 1)))
    return (retry_after or 0.0) + jitter


class RetryBudget:
    """A global token bucket for retries (first attempts never wait on it): ``rate_per_s`` tokens
    refill per second up to ``burst``; a retry spends one. When it is empty, the client gives up
    instead of adding load to an overloaded server."""

    def __init__(self, rate_per_s: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate_per_s
        self.burst = burst
        self.tokens = burst
        self._clock = clock
        self._t = clock()
        self.spent = 0
        self.denied = 0

    def try_spend(self) -> bool:
        now = self._clock()
        self.tokens = min(self.burst, self.tokens + (now - self._t) * self.rate)
        self._t = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            self.spent += 1
            return True
        self.denied += 1
        return False


class TenantLimiter:
    """Per-tenant concurrency with additive increase / multiplicative decrease: a 429 halves the
    tenant's limit (to at least 1); each success of a request started under the current limit
    adds 1/limit (about one slot per round trip, as TCP grows its window), up to ``ceiling``.
    Requests wait for one of the ``floor(limit)`` slots."""

    def __init__(self, ceiling: int | None) -> None:
        self.ceiling = ceiling if ceiling is not None else math.inf
        self.limit = self.ceiling
        self.inflight = 0
        self.peak = 0
        self.epoch = 0  # bumped by each decrease: successes from before it say nothing of the new limit
        self._waiters: deque[asyncio.Future[None]] = deque()

    def _slots(self) -> float:
        return max(1, math.floor(self.limit)) if math.isfinite(self.limit) else math.inf

    async def acquire(self) -> int:
        """Wait for a slot; returns the epoch to hand back to ``release``."""
        while self.inflight >= self._slots():
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        return self.epoch

    def release(self, outcome: str, epoch: int) -> None:
        """``outcome``: "ok" (additive increase), "429" (multiplicative decrease) or anything else."""
        self.inflight -= 1
        if outcome == "429":
            current = self.limit if math.isfinite(self.limit) else self.inflight + 1
            self.limit = max(1.0, math.floor(current / 2))
            self.epoch += 1
        elif outcome == "ok" and epoch == self.epoch and self.limit < self.ceiling:
            self.limit = min(self.ceiling, self.limit + 1.0 / self.limit)
        free = self._slots() - self.inflight
        while self._waiters and free > 0:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                free -= 1
