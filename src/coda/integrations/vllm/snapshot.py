"""The admission snapshot of vLLM's waiting queue, built from what the engine observes (no vLLM
import, so the snapshot contract can be checked against the other shells without vLLM).

Per candidate: its request id's position, the engine's arrival time, its tokens (prompt plus any
output already generated), its GPU prefix-cache hit, and whether the blocks it needs beyond the hit
fit in the free queue (free blocks and idle cached ones, its own idle hits excluded). vLLM's GPU
prefix cache is the only tier observed: DRAM and SSD hits, and the host link's backlog, are 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from coda.policy.snapshots import AdmissionSnapshot

HitFn = Callable[[Any], tuple[int, int]]
"""``hit(request) -> (GPU prefix-cache hit tokens, idle hit blocks)``."""


def admission_snapshot(now_s: float, front: Sequence[Any], hit: HitFn, block_size: int, free_blocks: int) -> AdmissionSnapshot:
    """``front``: the oldest waiting requests (vLLM ``Request`` objects: ``arrival_time``, ``num_tokens``)."""
    rows = []
    for i, req in enumerate(front):
        hit_tokens, idle = hit(req)
        extra = -(-(req.num_tokens + 1) // block_size) - hit_tokens // block_size
        rows.append((i, req.arrival_time, req.num_tokens, hit_tokens, 0, 0, extra, extra + idle <= free_blocks))
    return AdmissionSnapshot.from_rows(now_s, rows, free_blocks=free_blocks)
