"""Subsample a workload to a target request rate, keeping whole sessions and their tool intervals."""

from __future__ import annotations

import numpy as np

from coda.errors import CodaError
from coda.workload.schema import Workload
from coda.workload.stats import workload_duration_s


def subsample(workload: Workload, *, rate: float | None = None, fraction: float | None = None, seed: int = 0) -> Workload:
    """Keep a random subset of whole sessions.

    ``rate``: target requests/s over the workload's arrival window (sessions are drawn in random
    order until their rounds reach ``rate * duration``). ``fraction``: share of sessions to keep
    (the Coda paper's single-worker M1-M3 keep about a quarter). Arrival times, rounds and tool
    intervals are unchanged, so the kept sessions' pacing is exactly the original's.
    """
    if (rate is None) == (fraction is None):
        raise CodaError("subsample: pass exactly one of --rate (requests/s) or --fraction (0-1]")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(workload.sessions))
    duration = workload_duration_s(workload)
    current = workload.num_requests / duration
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise CodaError(f"subsample: --fraction must be in (0, 1], got {fraction}")
        keep = order[: max(1, round(fraction * len(order)))]
    else:
        assert rate is not None
        if rate <= 0:
            raise CodaError(f"subsample: --rate must be > 0 requests/s, got {rate}")
        if rate > current * 1.0001:
            raise CodaError(
                f"subsample: target {rate:g} req/s exceeds the workload's {current:.3g} req/s; "
                "subsampling can only thin a workload (generate a denser one instead)"
            )
        target = rate * duration
        kept, total = [], 0
        for idx in order:  # random order; a session is kept when it brings the total closer to the target
            n = len(workload.sessions[idx].rounds)
            if abs(total + n - target) < abs(total - target):
                kept.append(idx)
                total += n
        keep = np.array(kept or order[:1])
    sessions = [workload.sessions[i] for i in sorted(keep.tolist())]
    meta = dict(workload.meta)
    meta["subsample"] = {"rate": rate, "fraction": fraction, "seed": seed, "from_sessions": len(workload.sessions)}
    return type(workload)(sessions=sessions, meta=meta, block_tokens=workload.block_tokens)
