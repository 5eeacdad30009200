"""Immutable snapshots that policies read. They hold only what a real engine or gateway could
observe at that moment: never a round's future output length or tool duration.

Each field's docstring is its contract: every shell (the simulator, the gateway, the vLLM
plugin) fills it with exactly that meaning, or sends the documented estimate where it cannot
observe it; ``tests/unit/test_snapshot_parity.py`` holds the shells to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True, frozen=True)
class AdmissionCandidate:
    """One ready request waiting for KV-state preparation on a worker (a row of a snapshot)."""

    #: an id that is unique among the worker's waiting requests (opaque to policies)
    request_id: int
    #: when the request entered this engine's waiting queue the first time (the engine's arrival
    #: time; a preempted request keeps it)
    ready_s: float
    #: tokens to hold in KV before the first token: prompt plus any output already generated
    prompt_tokens: int
    #: the longest reusable prefix in this worker's HBM (prefix cache), in tokens
    hbm_tokens: int
    #: the prefix continuing in the DRAM store after the HBM part (0 where no store is observed)
    dram_tokens: int
    #: the prefix continuing on SSD after the DRAM part (0 where no store is observed)
    ssd_tokens: int
    #: KV blocks the request needs beyond its HBM hits
    extra_blocks: int
    #: those blocks are free or reclaimable (idle cached blocks) now, its own idle hits excluded
    fits: bool


@dataclass(slots=True, frozen=True, eq=False)
class AdmissionSnapshot:
    """One admission opportunity on one worker, column-wise (numpy arrays of the fields of
    ``AdmissionCandidate``, oldest-ready first) so that a policy can score a whole frontier in a
    few vector operations."""

    now_s: float
    request_ids: np.ndarray
    ready_s: np.ndarray
    prompt_tokens: np.ndarray
    hbm_tokens: np.ndarray
    dram_tokens: np.ndarray
    ssd_tokens: np.ndarray
    extra_blocks: np.ndarray
    fits: np.ndarray
    #: KV blocks admission may claim now: free ones and those holding only idle cached content
    free_blocks: int = 0
    #: seconds the worker's host-to-device link is already committed to (0 where not observed)
    h2d_outstanding_s: float = 0.0
    #: seconds the node's SSD read queue is already committed to (0 where not observed)
    ssd_outstanding_s: float = 0.0

    @classmethod
    def from_rows(cls, now_s: float, rows: Sequence[tuple[int, float, int, int, int, int, int, bool]], **kw: float) -> AdmissionSnapshot:
        """Rows as ``(request_id, ready_s, prompt, hbm, dram, ssd, extra_blocks, fits)``."""
        cols = list(zip(*rows)) if rows else [()] * 8
        ints = [np.array(c, dtype=np.int64) for c in cols]
        return cls(
            now_s=now_s,
            request_ids=ints[0],
            ready_s=np.array(cols[1], dtype=np.float64),
            prompt_tokens=ints[2],
            hbm_tokens=ints[3],
            dram_tokens=ints[4],
            ssd_tokens=ints[5],
            extra_blocks=ints[6],
            fits=np.array(cols[7], dtype=bool),
            **kw,  # type: ignore[arg-type]
        )

    @classmethod
    def from_candidates(cls, now_s: float, rows: Sequence[AdmissionCandidate], **kw: float) -> AdmissionSnapshot:
        return cls.from_rows(
            now_s,
            [(c.request_id, c.ready_s, c.prompt_tokens, c.hbm_tokens, c.dram_tokens, c.ssd_tokens, c.extra_blocks, c.fits) for c in rows],
            **kw,
        )

    def __len__(self) -> int:
        return len(self.request_ids)

    @property
    def cached_tokens(self) -> np.ndarray:
        return self.hbm_tokens + self.dram_tokens + self.ssd_tokens

    @property
    def compute_tokens(self) -> np.ndarray:
        """Tokens to prefill: the missing prefix plus the new input."""
        return self.prompt_tokens - self.cached_tokens

    def row(self, i: int) -> AdmissionCandidate:
        return AdmissionCandidate(
            int(self.request_ids[i]),
            float(self.ready_s[i]),
            int(self.prompt_tokens[i]),
            int(self.hbm_tokens[i]),
            int(self.dram_tokens[i]),
            int(self.ssd_tokens[i]),
            int(self.extra_blocks[i]),
            bool(self.fits[i]),
        )

    def rows(self) -> list[AdmissionCandidate]:
        return [self.row(i) for i in range(len(self))]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AdmissionSnapshot):
            return NotImplemented
        return (self.now_s, self.free_blocks, self.h2d_outstanding_s, self.ssd_outstanding_s, self.rows()) == (
            other.now_s,
            other.free_blocks,
            other.h2d_outstanding_s,
            other.ssd_outstanding_s,
            other.rows(),
        )


@dataclass(slots=True, frozen=True)
class PrefixMatch:
    """Blocks of a request's prompt already resident on a worker, by tier (a leading run: HBM
    first, then DRAM continuing it, then SSD)."""

    hbm_blocks: int = 0
    dram_blocks: int = 0
    ssd_blocks: int = 0


@dataclass(slots=True, frozen=True)
class WorkerView:
    """What a router knows of one worker."""

    worker_id: int
    #: requests the worker is serving or holds in its queue: running, restoring and waiting
    active_requests: int
    #: KV blocks of the active requests: their prompt and generated tokens, whether running or
    #: waiting, over the block size (what they hold or will hold once admitted)
    active_kv_blocks: int
    #: requests in the engine's waiting queue
    waiting_requests: int
    #: contexts (prompt + generated tokens so far) of the requests decoding now; () when the
    #: router does not read them
    decode_contexts: tuple[int, ...] = ()
    #: the arriving request's prompt resident on this worker (zero when the router does not read it)
    match: PrefixMatch = field(default_factory=PrefixMatch)
    healthy: bool = True


@dataclass(slots=True, frozen=True)
class RouteRequest:
    """The request to place."""

    #: the router's arrival counter (round-robin and sampled routers use it)
    seq: int
    session_id: str
    #: the session has a completed earlier round (its context may be resident somewhere)
    is_continuation: bool
    prompt_tokens: int
    #: the prompt's full KV blocks
    prompt_blocks: int
    #: the session's home worker where no KV events say where its context lives and replicas must
    #: agree without talking: the rendezvous hash of the session id over the healthy candidates
    #: (``coda.policy.routing.rendezvous``); ``None`` without a session, or where the shell knows residency
    home_worker: int | None = None


@dataclass(slots=True, frozen=True)
class RoutingSnapshot:
    now_s: float
    request: RouteRequest
    workers: tuple[WorkerView, ...]


# --- ingress -----------------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class WorkerLoad:
    """One worker's load as the shell observed it."""

    worker_id: int
    healthy: bool = True
    #: its telemetry is too old to trust (a stale worker counts as full)
    stale: bool = False
    #: requests in the engine's waiting queue (vLLM's ``vllm:num_requests_waiting``)
    queue_depth: int = 0
    #: seconds the oldest request the shell sent here and has seen no output of yet has waited
    #: (queued or prefilling; a response that is not streamed shows no output until its end); 0
    #: when there is none, and 0 where the policy does not read ``queue_age``
    queue_age_s: float = 0.0
    #: share of the engine's KV blocks held by its running requests (``vllm:kv_cache_usage_perc``)
    kv_usage: float = 0.0
    #: requests sent to the engine and not yet finished (running, restoring or waiting there)
    inflight_requests: int = 0
    #: KV tokens those requests newly occupy here: the sum of each one's ``new_tokens`` on this
    #: worker when it was sent. A prefix already resident (shared by agent prompts, or a session's
    #: earlier rounds) is not counted again: it was counted by the request that brought it, or it
    #: is idle cache the engine reuses (once that request ends, a prefix its successors still hold
    #: goes uncounted here; ``kv_usage`` observes it)
    inflight_tokens: int = 0
    #: the arriving request's prompt tokens beyond the leading run of its blocks that the shell's KV
    #: index shows resident in this worker's HBM (KV events, or else the blocks the shell itself sent
    #: there): what it would newly occupy if it went here (the whole prompt where the index shows none
    #: of it; 0 in a load that describes no request)
    new_tokens: int = 0
    #: requests the engine runs at once (vLLM's ``--max-num-seqs``); 0 when unknown
    max_num_seqs: int = 0
    #: tokens the engine's KV cache holds (vLLM: ``num_gpu_blocks`` x ``block_size`` of its
    #: ``vllm:cache_config_info``); 0 when unknown
    kv_capacity_tokens: int = 0
    #: KV tokens per second the requests this shell sent here released as they ended (each one's
    #: count in ``inflight_tokens``), exponentially averaged over the last
    #: ``coda.shell.estimates.DRAIN_TAU_S`` seconds up to the latest end; 0 before any ended, and 0
    #: where the policy does not read ``drain_rate``
    freed_tokens_per_s: float = 0.0
    #: requests per second that ended here, averaged the same way
    ended_per_s: float = 0.0

    def has_seat(self) -> bool:
        """A seat is free for one more request (an unknown seat count does not bind)."""
        return self.max_num_seqs <= 0 or self.inflight_requests < self.max_num_seqs

    def fits(self) -> bool:
        """What the arriving request newly occupies (``new_tokens``) fits in the KV cache beside what
        the requests in flight newly occupy (by the shell's own count, which has no scrape lag). An
        unknown capacity does not bind; the first request always fits an idle engine."""
        return (
            self.kv_capacity_tokens <= 0 or self.inflight_requests == 0 or self.inflight_tokens + self.new_tokens <= self.kv_capacity_tokens
        )

    def can_start(self) -> bool:
        """The arriving request sent here now would start at once: a seat is free and it fits."""
        return self.has_seat() and self.fits()


@dataclass(slots=True, frozen=True)
class IngressSnapshot:
    """What an admission decision may read about one arriving request and the cluster."""

    now_s: float
    tenant: str
    prompt_tokens: int
    workers: tuple[WorkerLoad, ...]
    session_id: str | None = None
    #: the request's session holds an admission slot (it was admitted within the session TTL)
    session_active: bool = False
    #: how many sessions hold a slot
    active_sessions: int = 0
    #: seconds since a request of this session was first deferred, while none of its requests has
    #: been admitted since (0 when none was deferred; the ledger forgets a deferral after the
    #: session TTL without a request)
    session_deferred_s: float = 0.0
    #: share of the prompt's blocks resident, in any tier, on the worker that holds most of them
    #: (0 when the policy does not read it)
    prefix_hit: float = 0.0
    #: KV tokens this request's tenant has in flight, counted as ``WorkerLoad.inflight_tokens`` counts them
    tenant_inflight_tokens: int = 0
    #: the tenant's weight, and the sum of the weights of the tenants with work in flight (this one
    #: included): its entitlement is their ratio
    tenant_weight: float = 1.0
    active_weight: float = 1.0
    #: the request's time-to-first-token deadline minus the lowest predicted TTFT among healthy
    #: workers (``deadline_slack_s``); ``inf`` without a deadline
    deadline_slack_s: float = math.inf
    #: requests the shell holds deferred right now
    queued: int = 0
    #: of those, requests of sessions that hold a slot (continuations held for room on an engine)
    held_continuations: int = 0
    #: the shell's adaptive limit on sessions holding a slot (``coda.shell.sessions.SessionCap``,
    #: under the rule the policy gives); 0 where the policy gives none
    session_cap: int = 0

    @property
    def inflight_tokens(self) -> int:
        return sum(w.inflight_tokens for w in self.workers)

    @property
    def inflight_requests(self) -> int:
        return sum(w.inflight_requests for w in self.workers)

    @property
    def new_tokens(self) -> int:
        """The least this request would newly occupy on a healthy worker (``WorkerLoad.new_tokens``;
        the whole prompt when none is healthy)."""
        return min((w.new_tokens for w in self.workers if w.healthy), default=self.prompt_tokens)

    @property
    def tenant_share(self) -> float:
        """The tenant's share of in-flight KV tokens if this request were admitted."""
        total = self.inflight_tokens + self.new_tokens
        return (self.tenant_inflight_tokens + self.new_tokens) / total if total else 0.0

    @property
    def entitlement(self) -> float:
        return self.tenant_weight / self.active_weight if self.active_weight > 0 else 1.0

    def signals(self) -> dict[str, float]:
        """Cluster-level values of every signal, for decision logs."""
        live = [w for w in self.workers if w.healthy]
        return {
            "queue_depth": sum(w.queue_depth for w in live),
            "kv_usage": max((w.kv_usage for w in live), default=0.0),
            "kv_usage_min": min((w.kv_usage for w in live), default=1.0),
            "inflight_requests": self.inflight_requests,
            "inflight_tokens": self.inflight_tokens,
            "prefix_hit": self.prefix_hit,
            "tenant_share": round(self.tenant_share, 4),
            "entitlement": round(self.entitlement, 4),
            "deadline_slack_s": self.deadline_slack_s,
            "stale_workers": sum(w.stale for w in live),
            "healthy_workers": len(live),
            "queue_age_s": max((w.queue_age_s for w in live), default=0.0),
            "active_sessions": self.active_sessions,
            "queued": self.queued,
            "held_continuations": self.held_continuations,
        }
