"""Estimates a shell keeps from what it observed, to fill snapshot fields policies read: a worker's
predicted time to first token, and a request's slack against its deadline."""

from __future__ import annotations

import math
from collections.abc import Sequence

#: weight of the newest first-token time in a worker's TTFT estimate (assumed, not fitted)
TTFT_EWMA_WEIGHT = 0.2


def ttft_estimate(previous_s: float | None, sample_s: float) -> float:
    """A worker's predicted TTFT after one more observed first token (an exponential average)."""
    return sample_s if previous_s is None else (1 - TTFT_EWMA_WEIGHT) * previous_s + TTFT_EWMA_WEIGHT * sample_s


def deadline_slack_s(deadline_s: float | None, predicted_ttft_s: Sequence[float | None]) -> float:
    """A request's deadline minus the lowest predicted TTFT of the healthy workers it may go to (a
    worker that has served nothing yet predicts 0); ``inf`` without a deadline."""
    if deadline_s is None:
        return math.inf
    return deadline_s - min((t or 0.0 for t in predicted_ttft_s), default=math.inf)


#: the time constant of a worker's drain rates (``WorkerLoad.freed_tokens_per_s``): several request
#: ends at an agent workload's pace, yet short enough to follow a change of load within a minute (assumed)
DRAIN_TAU_S = 10.0


class DrainRate:
    """What the requests a shell sent to one worker freed as they ended: KV tokens and requests per
    second, exponentially averaged over ``DRAIN_TAU_S`` up to the latest end. Sums decayed at each
    end, divided by what a steady rate would have summed since the first send, so the average is
    unbiased from the start; between ends it does not move, so it reads the same whenever asked."""

    __slots__ = ("start_s", "last_s", "tokens", "requests")

    def __init__(self) -> None:
        self.start_s: float | None = None
        self.last_s = 0.0
        self.tokens = 0.0
        self.requests = 0.0

    def sent(self, now_s: float) -> None:
        if self.start_s is None:
            self.start_s = self.last_s = now_s

    def ended(self, tokens: int, now_s: float) -> None:
        """A request sent here ended at ``now_s``, releasing ``tokens`` of the shell's in-flight count."""
        self.sent(now_s)
        decay = math.exp(-(now_s - self.last_s) / DRAIN_TAU_S)
        self.tokens = self.tokens * decay + tokens
        self.requests = self.requests * decay + 1.0
        self.last_s = now_s

    def rates(self) -> tuple[float, float]:
        """(tokens, requests) freed per second; zeros before the first end after the first send."""
        span = self.last_s - (self.start_s if self.start_s is not None else self.last_s)
        if span <= 0:
            return 0.0, 0.0
        steady = DRAIN_TAU_S * -math.expm1(-span / DRAIN_TAU_S)
        return self.tokens / steady, self.requests / steady
