"""Good-client primitives: Retry-After parsing, backoff bounds, the retry budget, AIMD per tenant."""

from __future__ import annotations

import asyncio
import email.utils
import random

from hypothesis import given
from hypothesis import strategies as st

from coda.bench.overload import RetryBudget, TenantLimiter, backoff_s, retry_after_s


def test_retry_after_forms():
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}) == 0.25  # the millisecond header wins
    assert retry_after_s({"retry-after": "1.5"}) == 1.5
    when = email.utils.formatdate(1_000_030.0, usegmt=True)
    assert retry_after_s({"retry-after": when}, now_epoch=1_000_000.0) == 30.0
    assert retry_after_s({"retry-after": "soon"}) is None and retry_after_s({}) is None
    assert retry_after_s({"retry-after": "-3"}) == 0.0


@given(st.integers(1, 12), st.none() | st.floats(0, 100), st.integers(0, 2**32))
def test_backoff_waits_at_least_retry_after_and_jitters_within_the_cap(attempt, retry_after, seed):
    wait = backoff_s(attempt, retry_after, 0.5, 8.0, random.Random(seed))
    low = retry_after or 0.0
    assert low <= wait <= low + min(8.0, 0.5 * 2 ** (attempt - 1))


def test_retry_budget_refills_at_its_rate_up_to_its_burst():
    now = [0.0]
    budget = RetryBudget(rate_per_s=2.0, burst=3.0, clock=lambda: now[0])
    assert [budget.try_spend() for _ in range(4)] == [True, True, True, False]
    now[0] = 0.5  # one token back
    assert budget.try_spend() and not budget.try_spend()
    now[0] = 100.0  # capped at the burst
    assert sum(budget.try_spend() for _ in range(10)) == 3
    assert (budget.spent, budget.denied) == (7, 9)


def test_a_429_halves_the_limit_and_only_fresh_successes_grow_it_back():
    async def main():
        lim = TenantLimiter(ceiling=None)
        epochs = [await lim.acquire() for _ in range(8)]
        lim.release("429", epochs[0])  # 7 in flight: limit 4
        assert lim.limit == 4
        for e in epochs[1:4]:
            lim.release("ok", e)  # started before the decrease: no growth
        assert lim.limit == 4 and lim.inflight == 4
        waiter = asyncio.ensure_future(lim.acquire())
        await asyncio.sleep(0)
        assert not waiter.done()  # 4 in flight, 4 slots
        lim.release("error", epochs[4])
        fresh = await waiter
        lim.release("ok", fresh)
        return lim

    lim = asyncio.run(main())
    assert lim.limit == 4.25 and lim.peak == 8 and lim.inflight == 3
