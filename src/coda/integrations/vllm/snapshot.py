"""The admission snapshot of vLLM's waiting queue, built from what the engine observes (no vLLM
import, so the snapshot contract can be checked against the other shells without vLLM).

Per candidate: its request id's position, the engine's arrival time, its tokens (prompt plus any
output already generated), its reusable prefix by tier (the GPU prefix cache, then what the KV
connector holds beyond it, in DRAM or on SSD, where the connector can tell; 0 without one), and
whether the blocks it needs beyond its HBM hit fit in what admission may claim (free blocks, idle
cached ones and those Coda holds for sessions out on a tool call, its own idle hits excluded). The
host link's and the SSD's backlogs are not observed: 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from coda.policy.snapshots import AdmissionSnapshot


class Hits(NamedTuple):
    """A candidate's reusable prefix, in tokens, by tier (a leading run: HBM, then DRAM, then SSD)."""

    hbm_tokens: int
    #: of its HBM hit, the blocks nobody holds (in vLLM's free queue): admitting it takes them out
    idle_blocks: int
    dram_tokens: int = 0
    ssd_tokens: int = 0


HitFn = Callable[[Any], Hits]


def admission_snapshot(now_s: float, front: Sequence[Any], hit: HitFn, block_size: int, free_blocks: int) -> AdmissionSnapshot:
    """``front``: the oldest waiting requests (vLLM ``Request`` objects: ``arrival_time``, ``num_tokens``)."""
    rows = []
    for i, req in enumerate(front):
        h = hit(req)
        # the blocks of the prompt vLLM must fit to admit it (scheduler_reserve_full_isl), less the HBM hit
        extra = -(-req.num_tokens // block_size) - h.hbm_tokens // block_size
        rows.append(
            (i, req.arrival_time, req.num_tokens, h.hbm_tokens, h.dram_tokens, h.ssd_tokens, extra, extra + h.idle_blocks <= free_blocks)
        )
    return AdmissionSnapshot.from_rows(now_s, rows, free_blocks=free_blocks)
