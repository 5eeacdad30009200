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
