"""Immutable snapshots that policies read. They hold only what a real engine or gateway could
observe at that moment: never a round's future output length or tool duration."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class AdmissionCandidate:
    """A ready request waiting for KV-state preparation on one worker.

    ``hbm_tokens`` / ``dram_tokens`` / ``ssd_tokens``: the longest reusable prefix found in
    this worker's HBM, then continuing in the DRAM store, then on SSD. ``extra_blocks``: HBM
    chunks the request needs beyond its HBM hits. ``fits``: those chunks are free or reclaimable now.
    """

    request_id: int
    ready_s: float
    prompt_tokens: int
    hbm_tokens: int
    dram_tokens: int
    ssd_tokens: int
    extra_blocks: int
    fits: bool

    @property
    def compute_tokens(self) -> int:
        """Tokens to prefill: the missing prefix plus the new input."""
        return self.prompt_tokens - self.hbm_tokens - self.dram_tokens - self.ssd_tokens

    @property
    def cached_tokens(self) -> int:
        return self.hbm_tokens + self.dram_tokens + self.ssd_tokens


@dataclass(slots=True, frozen=True)
class AdmissionSnapshot:
    """One admission opportunity on one worker; candidates are ordered oldest-ready first."""

    now_s: float
    candidates: tuple[AdmissionCandidate, ...]
    free_blocks: int
    h2d_outstanding_s: float = 0.0
    ssd_outstanding_s: float = 0.0


@dataclass(slots=True, frozen=True)
class PrefixMatch:
    """Blocks of a request's prompt already resident on a worker, by tier."""

    hbm_blocks: int = 0
    dram_blocks: int = 0
    ssd_blocks: int = 0


@dataclass(slots=True, frozen=True)
class WorkerView:
    """What a router knows of one worker."""

    worker_id: int
    active_requests: int
    active_kv_blocks: int
    waiting_requests: int
    decode_contexts: tuple[int, ...] = ()
    match: PrefixMatch = field(default_factory=PrefixMatch)
    healthy: bool = True


@dataclass(slots=True, frozen=True)
class RouteRequest:
    """A request to place: ``seq`` is the router's arrival counter (round-robin uses it)."""

    seq: int
    session_id: str
    is_continuation: bool
    prompt_tokens: int
    prompt_blocks: int
    reusable_tokens: int = 0
    new_tokens: int = 0
    last_worker: int | None = None


@dataclass(slots=True, frozen=True)
class RoutingSnapshot:
    now_s: float
    request: RouteRequest
    workers: tuple[WorkerView, ...]
