"""The gateway's view of its workers, sessions and tenants, and the snapshots its policies read.

Nothing here does I/O: telemetry and KV-event tasks write into ``Worker`` and the indexer; the
HTTP layer asks ``GatewayState`` to plan, decide, route, and to ``begin`` / ``end`` each
upstream attempt (``end`` runs in a ``finally``, so in-flight counts always return to zero).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from coda.gateway.config import BackendConfig, GatewayConfig
from coda.gateway.identity import ResponseChains
from coda.gateway.prompt import Tokenizer
from coda.gateway.store import Sessions
from coda.gateway.watch import IdleWatch
from coda.policy.contracts import SIGNALS, Decision, IngressPolicy, Router
from coda.policy.routing import rendezvous
from coda.policy.snapshots import IngressSnapshot, PrefixMatch, RouteRequest, RoutingSnapshot, WorkerLoad, WorkerView
from coda.shell.build import build_policies
from coda.shell.estimates import DrainRate, deadline_slack_s, ttft_estimate
from coda.shell.ingress_view import ingress_snapshot
from coda.shell.kvindex import BlockHasher, KVIndexer, WorkerTiers
from coda.shell.sessions import SessionCap, ledger_of
from coda.shell.shadow import Shadowed

#: signals read from an engine's /metrics, with the vLLM metric names that carry them
SCRAPED_SIGNALS: dict[str, tuple[str, ...]] = {
    "queue_depth": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
#: session slots held at most (the least recently admitted session loses its slot past it): about
#: 200 bytes each, since a session is known by a fixed-size key (``identity.session_key``), so
#: about 40 MiB whatever the clients send (assumed: far more live agent sessions than one gateway serves)
MAX_SESSION_SLOTS = 200_000
#: signals the gateway computes itself, so every backend supplies them
OWN_SIGNALS = frozenset(SIGNALS) - frozenset(SCRAPED_SIGNALS)


@dataclass(slots=True)
class Worker:
    """One engine. Telemetry fields come from its /metrics; ``inflight`` is the gateway's own count."""

    id: int
    cfg: BackendConfig
    tiers: WorkerTiers
    healthy: bool = True
    fails: int = 0
    passes: int = 0
    queue_depth: int = 0
    running: int = 0
    kv_usage: float = 0.0
    scraped_at: float = -math.inf
    metric_names: frozenset[str] = frozenset()
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_model_len: int | None = None
    kv_capacity_tokens: int = 0  # from its /metrics (vllm:cache_config_info) or the config; 0 when unknown
    inflight: dict[int, int] = field(default_factory=dict)  # request id -> prompt tokens
    inflight_tokens: int = 0
    #: what the in-flight requests newly occupy here (``WorkerLoad.inflight_tokens``): each one's ``Ticket.new_tokens``
    inflight_new_tokens: int = 0
    #: in-flight requests without a byte of response yet: request id -> when sent (oldest first)
    unanswered: OrderedDict[int, float] = field(default_factory=OrderedDict)
    decoding: dict[int, Ticket] = field(default_factory=dict)  # in-flight requests whose first token has come
    streamed_tokens: int = 0  # output tokens relayed so far for the in-flight requests
    ttft_s: float | None = None
    first_sent_s: float | None = None  # when the gateway first sent this worker a request
    kv_batches: int = 0  # KV event batches applied
    # when it last answered a proxied request or relayed a chunk of one (below 500): as good as a health check
    answered_s: float = -math.inf
    #: configured KV events that have not come (``GatewayState.check_kv_events``): its blocks come from the gateway's own index
    kv_missing: bool = False
    #: the most requests in flight here at once through every replica (``inflight_of`` at each send):
    #: with ``cfg.max_num_seqs`` and a door that counts seats, never above it
    inflight_peak: int = 0
    #: what this replica's requests here freed as they ended (``WorkerLoad.freed_tokens_per_s``)
    drain: DrainRate = field(default_factory=DrainRate)

    @property
    def label(self) -> str:
        return self.cfg.label

    def auth(self) -> dict[str, str]:
        """Headers that authenticate the gateway to this engine."""
        return {"authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}

    def supplies(self, signal: str) -> bool:
        return signal in OWN_SIGNALS or any(n in self.metric_names for n in SCRAPED_SIGNALS.get(signal, ()))


@dataclass(slots=True)
class Session:
    hasher: BlockHasher
    seen_s: float  # when it last sent a request: idle past the session TTL, it is forgotten
    last_worker: int | None = None
    completed_rounds: int = 0


@dataclass(slots=True)
class Ticket:
    """One client request as the gateway plans it: sizes and block hashes, not the prompt's units,
    which would otherwise stay in memory for every request waiting on an engine."""

    rid: int
    path: str
    tenant: str
    session_id: str | None
    model: str | None
    prompt_tokens: int
    max_tokens: int
    hashes: list[int]
    candidates: list[Worker]
    matches: dict[int, PrefixMatch]
    deadline_s: float | None = None
    worker: Worker | None = None  # while an upstream attempt is in flight
    streamed: int = 0  # output tokens relayed (SSE data events: an estimate of the tokens generated)
    session_seen: bool = False  # the store says the session held a slot: an earlier round went somewhere
    plan: tuple[Worker, int | None] | None = None  # the worker (and shadow router's choice) its admission counted it on
    new_tokens: int = 0  # what it newly occupies on the worker it was sent to (``WorkerLoad.new_tokens``), while in flight
    sent_s: float = 0.0  # when its attempt in flight was sent
    session_source: str | None = None  # the rule that recognised its session (``identity.session_of``)

    @property
    def prefix_hit(self) -> float:
        """Share of the prompt's blocks resident, in any tier, on the worker that holds most of them."""
        best = max((m.hbm_blocks + m.dram_blocks + m.ssd_blocks for m in self.matches.values()), default=0)
        return best / max(len(self.hashes), 1)


#: blocks the approximate index remembers for a worker whose KV capacity is unknown (assumed: 16.8M
#: tokens in 256-token blocks, more than one engine holds, so no prefix an engine still has is forgotten)
APPROX_BLOCKS_UNKNOWN = 65536


class ApproxIndex:
    """Without KV events: the blocks the gateway itself sent to each worker, LRU-bounded, fed to
    the indexer as if the engine had stored them (and evicted them in LRU order)."""

    def __init__(self, indexer: KVIndexer) -> None:
        self.indexer = indexer
        self._lru: dict[str, OrderedDict[int, None]] = {}

    def sent(self, loc: str, hashes: Sequence[int], capacity: int) -> None:
        """``hashes`` sent to ``loc``, which keeps the ``capacity`` most recently sent blocks."""
        lru = self._lru.setdefault(loc, OrderedDict())
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
        self.indexer.stored(loc, hashes)
        over = len(lru) - capacity
        if over > 0:
            self.indexer.removed(loc, [lru.popitem(last=False)[0] for _ in range(over)])

    def forget(self, loc: str) -> None:
        self._lru.pop(loc, None)
        self.indexer.cleared(loc)


class GatewayState:
    def __init__(self, config: GatewayConfig, tokenizer: Tokenizer, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.clock = clock
        self.units_per_block = max(1, config.indexer.block_tokens // tokenizer.tokens_per_unit)
        self.block_tokens = self.units_per_block * tokenizer.tokens_per_unit
        events = tokenizer.exact
        self.workers = [
            Worker(
                i,
                b,
                WorkerTiers(i, f"hbm:{i}", f"dram:{i}" if b.kv_events and events else None, f"ssd:{i}" if b.kv_events and events else None),
            )
            for i, b in enumerate(config.backends)
        ]
        self.indexer = KVIndexer(max_locations=max(62, 3 * len(self.workers)))
        self.approx = ApproxIndex(self.indexer)
        self.policies = build_policies(config.policy_spec, kinds=("ingress", "router"))
        self.defer = self.policies.spec.ingress.defer
        self.ingress: IngressPolicy = self.policies.ingress
        self.router: Router = self.policies.router
        self.ledger = ledger_of(self.ingress, MAX_SESSION_SLOTS)
        self.cap = SessionCap.of(self.ingress)
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.chains = ResponseChains()  # Responses API answers -> their session, for ``previous_response_id``
        self.session_bytes = 0  # held by the sessions' hashers, bounded by indexer.session_cache_mib
        self.tenant_inflight: dict[str, int] = {}
        self.queued = 0
        self.held_continuations = 0  # of those, requests of sessions holding a slot (``IngressSnapshot.held_continuations``)
        #: time a healthy worker had nothing in flight while requests were held here (``watch``)
        self.idle_watch = IdleWatch()
        #: replicas share a store: each one's own view (the approximate index) would diverge, so
        #: sessions go to their rendezvous home where no KV events say where their context lives
        self.shared = config.store.url is not None
        #: the other live replicas' count tables, summed (``published`` names the entries)
        self.others: dict[str, float] = {}
        #: the request being decided and the worker it would go to, counted in ``published`` only
        self.pending: tuple[Ticket, Worker] | None = None
        #: called when in-flight counts change (the replica publishes them)
        self.changed: Callable[[], None] = lambda: None
        #: called when none of this replica's requests of a session is in flight any more (the replica tells the store)
        self.session_idle: Callable[[str], None] = lambda session: None
        self.draining = False
        self.last_active_s = -math.inf  # when a request last began or ended
        self._seq = 0

    def expects_events(self, w: Worker) -> bool:
        """KV events name blocks by token ids: usable only when prompts are tokenized exactly."""
        return bool(w.cfg.kv_events) and self.tokenizer.exact

    def uses_events(self, w: Worker) -> bool:
        """The worker's blocks come from its KV events (else from what the gateway sent it)."""
        return self.expects_events(w) and not w.kv_missing

    def check_kv_events(self, w: Worker) -> bool:
        """Flag a worker whose KV events have not come within ``kv_events.expect_within_s`` of its
        first request (a misconfigured endpoint delivers nothing and says nothing); returns True
        when this flags it. Until a batch comes, routing indexes what the gateway sends it."""
        if w.kv_missing or not self.expects_events(w) or w.kv_batches or w.first_sent_s is None:
            return False
        w.kv_missing = self.clock() - w.first_sent_s > self.config.kv_events.expect_within_s
        return w.kv_missing

    def kv_batch(self, w: Worker) -> bool:
        """A KV event batch from ``w`` is about to be applied; returns True when it ends the
        worker's flag (the gateway's own entries for it are dropped: its events take over)."""
        w.kv_batches += 1
        if not w.kv_missing:
            return False
        w.kv_missing = False
        self.approx.forget(w.tiers.hbm)
        return True

    # --- signals ---------------------------------------------------------------------------
    @property
    def needed_signals(self) -> frozenset[str]:
        """What the ingress policy (and its shadow) reads."""
        return frozenset(self.ingress.signals)

    @property
    def reads_scraped(self) -> bool:
        """Whether a decision reads what an engine's /metrics says: an ingress signal scraped from
        it, or, with a shared store, the engine's own count of the requests it runs and queues
        (``inflight_of``). Otherwise telemetry serves only /metrics, /debug/state and the KV
        capacity, and a scrape every ``idle_interval_s`` is enough."""
        return bool(self.needed_signals & SCRAPED_SIGNALS.keys()) or self.shared

    def missing_signals(self, w: Worker) -> list[str]:
        return sorted(s for s in self.needed_signals if not w.supplies(s))

    def idle(self, now: float) -> bool:
        """No request in flight and none for ``telemetry.idle_interval_s``: telemetry may slow down."""
        return now - self.last_active_s > self.config.telemetry.idle_interval_s and not any(w.inflight for w in self.workers)

    def telemetry_old(self, w: Worker, now: float) -> bool:
        """The worker's last scrape is older than ``telemetry.stale_after_s`` (or it has none)."""
        return now - w.scraped_at > self.config.telemetry.stale_after_s

    def needs_scrape(self, w: Worker, now: float) -> bool:
        """A decision reads a scraped signal of ``w`` and its scrape is old: scrape before deciding."""
        return bool(self.needed_signals & SCRAPED_SIGNALS.keys()) and self.telemetry_old(w, now)

    def stale(self, w: Worker, now: float) -> bool:
        """Admission counts ``w`` as full for its old telemetry (``telemetry.stale: saturated``);
        with ``last_value`` its scraped signals keep their last value."""
        return self.config.telemetry.stale == "saturated" and self.needs_scrape(w, now)

    # --- planning --------------------------------------------------------------------------
    def next_rid(self) -> int:
        self._seq += 1
        return self._seq

    def serving(self, model: str | None) -> list[Worker]:
        return [w for w in self.workers if model is None or model in w.models]

    def model_cards(self) -> list[dict[str, Any]]:
        cards: dict[str, dict[str, Any]] = {}
        for w in self.workers:
            for mid, card in w.models.items():
                cards.setdefault(mid, card)
        return list(cards.values())

    def block_hashes(self, session_id: str | None, units: Sequence[int]) -> list[int]:
        """The prompt's block hashes; a session's hasher only hashes what its context appended."""
        if session_id is None:
            return BlockHasher(self.units_per_block).update(units)
        now = self.clock()
        s = self.sessions.get(session_id)
        if s is None:
            s = self.sessions[session_id] = Session(BlockHasher(self.units_per_block), now)
        else:
            self.sessions.move_to_end(session_id)
            self.session_bytes -= s.hasher.nbytes
            s.seen_s = now
        hashes = s.hasher.update(units)
        self.session_bytes += s.hasher.nbytes
        # Least recently seen sessions go first; a dropped session is re-hashed in full on its next request.
        cfg = self.config.indexer
        while len(self.sessions) > 1 and (len(self.sessions) > cfg.max_sessions or self.session_bytes > cfg.session_cache_mib * 2**20):
            self._forget_oldest()
        return hashes

    def expire_sessions(self) -> None:
        """Forget the sessions idle for longer than the session TTL (their hashes and their
        tokenizer checkpoints), and let the slot ledger drop its expired slots."""
        now = self.clock()
        while self.sessions and now - next(iter(self.sessions.values())).seen_s > self.ledger.ttl_s:
            self._forget_oldest()
        self.ledger.count(now)

    def _forget_oldest(self) -> None:
        sid, s = self.sessions.popitem(last=False)
        self.session_bytes -= s.hasher.nbytes
        self.tokenizer.forget(sid)

    def match(self, hashes: Sequence[int], candidates: Sequence[Worker]) -> dict[int, PrefixMatch]:
        return self.indexer.match(hashes, [w.tiers for w in candidates])

    def new_tokens(self, t: Ticket, w: Worker) -> int:
        """``WorkerLoad.new_tokens``: ``t``'s prompt beyond its leading run of blocks in ``w``'s HBM, by the KV index."""
        m = t.matches.get(w.id)
        return max(0, t.prompt_tokens - (m.hbm_blocks * self.block_tokens if m is not None else 0))

    # --- what replicas share ----------------------------------------------------------------
    def published(self) -> dict[str, float]:
        """This replica's count table for the store: per worker ``n|`` in-flight requests, ``tok|``
        their prompt tokens, ``new|`` the KV tokens they newly occupy (``WorkerLoad.inflight_tokens``),
        ``kv|`` prompt tokens plus the output relayed, ``ttft|`` the TTFT estimate (``ttftn|`` 1
        beside it, so summing gives a mean); per tenant ``t|`` the KV tokens it newly occupies; ``q``
        deferred requests, ``qc`` those of sessions holding a slot. The request being decided is
        counted on the worker it would go to."""
        out: dict[str, float] = {"q": self.queued, "qc": self.held_continuations}
        for w in self.workers:
            out[f"n|{w.label}"] = len(w.inflight)
            out[f"tok|{w.label}"] = w.inflight_tokens
            out[f"new|{w.label}"] = w.inflight_new_tokens
            out[f"kv|{w.label}"] = w.inflight_tokens + w.streamed_tokens
            if w.ttft_s is not None:
                out[f"ttft|{w.label}"], out[f"ttftn|{w.label}"] = w.ttft_s, 1
        for tenant, n in self.tenant_inflight.items():
            out[f"t|{tenant}"] = n
        if self.pending is not None:
            t, w = self.pending
            new = self.new_tokens(t, w)
            for key, n in (
                (f"n|{w.label}", 1),
                (f"tok|{w.label}", t.prompt_tokens),
                (f"new|{w.label}", new),
                (f"kv|{w.label}", t.prompt_tokens),
                (f"t|{t.tenant}", new),
            ):
                out[key] = out.get(key, 0) + n
        return out

    def other(self, kind: str, name: str) -> int:
        """The other replicas' sum of one entry of ``published`` (0 without a shared store)."""
        return round(self.others.get(f"{kind}|{name}", 0.0))

    def inflight_of(self, w: Worker) -> int:
        """Requests in flight on ``w`` through every replica; with a shared store, at least what
        the engine's fresh /metrics says it runs and queues (which counts the other replicas'
        requests even while the store is away)."""
        n = len(w.inflight) + self.other("n", w.label)
        if self.shared and not self.telemetry_old(w, self.clock()):
            return max(n, w.running + w.queue_depth)
        return n

    def ttft_of(self, w: Worker) -> float | None:
        """The worker's TTFT estimate: the mean of every replica's that has one."""
        own = (w.ttft_s, 1) if w.ttft_s is not None else (0.0, 0)
        total, n = own[0] + self.others.get(f"ttft|{w.label}", 0.0), own[1] + self.others.get(f"ttftn|{w.label}", 0.0)
        return total / n if n else None

    def tenants_inflight(self) -> dict[str, int]:
        """In-flight KV tokens per tenant (as ``WorkerLoad.inflight_tokens`` counts them) over every replica."""
        out = dict(self.tenant_inflight)
        for key, v in self.others.items():
            if key.startswith("t|") and round(v) > 0:
                out[key[2:]] = out.get(key[2:], 0) + round(v)
        return out

    # --- ingress ---------------------------------------------------------------------------
    def queue_age_s(self, w: Worker, now: float) -> float:
        """``WorkerLoad.queue_age_s`` of this replica's requests (its first byte counts as output)."""
        return now - next(iter(w.unanswered.values())) if w.unanswered else 0.0

    def ingress_snapshot(self, t: Ticket, sessions: Sessions | None = None) -> IngressSnapshot:
        """``sessions``: the slots as the store found them (absent: this replica's own ledger)."""
        now = self.clock()
        ages = "queue_age" in self.needed_signals
        drains = "drain_rate" in self.needed_signals
        loads = tuple(
            WorkerLoad(
                w.id,
                w.healthy,
                self.stale(w, now),
                w.queue_depth,
                self.queue_age_s(w, now) if ages else 0.0,
                w.kv_usage,
                self.inflight_of(w),
                w.inflight_new_tokens + self.other("new", w.label),
                self.new_tokens(t, w),
                w.cfg.max_num_seqs or 0,
                w.kv_capacity_tokens,
                *(w.drain.rates() if drains else (0.0, 0.0)),
            )
            for w in t.candidates
        )
        hit = t.prefix_hit if "prefix_hit" in self.needed_signals else 0.0
        slack = deadline_slack_s(t.deadline_s, [self.ttft_of(w) for w in t.candidates if w.healthy])
        return ingress_snapshot(
            now=now,
            tenant=t.tenant,
            prompt_tokens=t.prompt_tokens,
            workers=loads,
            session_id=t.session_id,
            ledger=self.ledger,
            prefix_hit=hit,
            tenant_tokens=self.tenants_inflight(),
            tenant_spec=self.config.tenant,
            deadline_slack_s=slack,
            queued=self.queued + round(self.others.get("q", 0.0)),
            held_continuations=self.held_continuations + round(self.others.get("qc", 0.0)),
            slots=(sessions.active, sessions.count) if sessions is not None else None,
            cap=self.cap,
        )

    def decide(self, t: Ticket, sessions: Sessions | None = None) -> tuple[Decision, IngressSnapshot, Decision | None]:
        """The enforced decision, its snapshot, and the shadow policy's decision on it (if any)."""
        snap = self.ingress_snapshot(t, sessions)
        d = self.ingress.decide(snap)
        if d.status == 503:  # held, or asked back at once: either spends the session's deferral budget
            self.ledger.defer(t.session_id, snap.now_s)
        return d, snap, self.ingress.last_shadow if isinstance(self.ingress, Shadowed) else None

    # --- routing ---------------------------------------------------------------------------
    @property
    def counts_seats(self) -> bool:
        """The ingress policy admits by free seats (it reads ``inflight_requests``)."""
        return "inflight_requests" in self.needed_signals

    def has_seat(self, w: Worker) -> bool:
        """``WorkerLoad.has_seat`` of ``w``: a seat free for one more request (unknown seats do not bind)."""
        return not w.cfg.max_num_seqs or self.inflight_of(w) < w.cfg.max_num_seqs

    def routing_snapshot(self, t: Ticket, exclude: set[int]) -> RoutingSnapshot:
        """The candidates ``t`` may go to. Under a policy that counts seats, the healthy ones with a
        free seat where there are any: the policy admitted ``t`` because some worker has room, and the
        router, which weighs affinity and load but not seats, must not send it to one without (so no
        engine is sent more requests than its seats while the policy holds the rest back)."""
        ws = [w for w in t.candidates if w.id not in exclude]
        if self.counts_seats:
            ws = [w for w in ws if w.healthy and self.has_seat(w)] or ws
        session = self.sessions.get(t.session_id) if t.session_id is not None else None
        req = RouteRequest(
            seq=t.rid,
            session_id=t.session_id or "",
            is_continuation=t.session_seen or (session is not None and session.completed_rounds > 0),
            prompt_tokens=t.prompt_tokens,
            prompt_blocks=len(t.hashes) or -(-t.prompt_tokens // self.block_tokens),
            home_worker=self.home_worker(t.session_id, ws),
        )
        views = tuple(self.worker_view(w, t.matches.get(w.id, PrefixMatch())) for w in ws)
        return RoutingSnapshot(self.clock(), req, views)

    def home_worker(self, session_id: str | None, ws: Sequence[Worker]) -> int | None:
        """With a shared store, a session's rendezvous home among the healthy workers, unless every
        one's blocks come from KV events (which every replica reads alike)."""
        if not self.shared or session_id is None or not ws or all(self.uses_events(w) for w in ws):
            return None
        pool = [w for w in ws if w.healthy] or list(ws)
        return pool[rendezvous(session_id, [w.label for w in pool])].id

    def worker_view(self, w: Worker, match: PrefixMatch) -> WorkerView:
        """What a router knows of a worker, from the in-flight requests of every replica
        (``inflight_of``; the engine's queue depth from its /metrics): a request decodes from its first relayed token,
        its context growing by each relayed token (non-streamed responses are not seen decoding:
        their first byte is their end; other replicas' decoders are counted in the KV blocks
        only)."""
        return WorkerView(
            worker_id=w.id,
            active_requests=self.inflight_of(w),
            active_kv_blocks=(w.inflight_tokens + w.streamed_tokens + self.other("kv", w.label)) // self.block_tokens,
            waiting_requests=w.queue_depth,
            decode_contexts=tuple(d.prompt_tokens + d.streamed for d in w.decoding.values()),
            match=match,
            healthy=w.healthy,
        )

    def route(self, t: Ticket, exclude: set[int]) -> tuple[Worker | None, int | None]:
        """The chosen worker (``None`` when every candidate is excluded) and the shadow router's choice."""
        snap = self.routing_snapshot(t, exclude)
        if not snap.workers:
            return None, None
        wid = self.router.route(snap)
        return self.workers[wid], self.router.last_shadow if isinstance(self.router, Shadowed) else None

    def answered(self, t: Ticket) -> None:
        """The first byte of ``t``'s response came: it no longer waits in its engine's queue."""
        if t.worker is not None:
            t.worker.unanswered.pop(t.rid, None)

    def streamed(self, t: Ticket, tokens: int) -> None:
        """``tokens`` more output tokens relayed for ``t``; the first makes it a decoding request."""
        w = t.worker
        if w is None or tokens <= 0:
            return
        w.decoding[t.rid] = t
        t.streamed += tokens
        w.streamed_tokens += tokens

    # --- accounting ------------------------------------------------------------------------
    def begin(self, t: Ticket, w: Worker) -> None:
        """``t`` is about to be sent to ``w``: count it in flight there and record its blocks."""
        assert t.worker is None
        t.worker = w
        self.last_active_s = self.clock()
        if w.first_sent_s is None:
            w.first_sent_s = self.last_active_s
        w.inflight[t.rid] = t.prompt_tokens
        w.unanswered[t.rid] = t.sent_s = self.last_active_s
        w.drain.sent(self.last_active_s)
        w.inflight_tokens += t.prompt_tokens
        t.new_tokens = new = self.new_tokens(t, w)
        w.inflight_new_tokens += new
        self.tenant_inflight[t.tenant] = self.tenant_inflight.get(t.tenant, 0) + new
        if t.session_id is not None:
            self.ledger.touch(t.session_id, self.clock())
            s = self.sessions.get(t.session_id)
            if s is not None:
                s.last_worker = w.id
        if not self.uses_events(w) and not self.shared:
            self.approx.sent(w.tiers.hbm, t.hashes, self.approx_blocks(w))
        w.inflight_peak = max(w.inflight_peak, self.inflight_of(w))
        self.watch()
        self.changed()

    def approx_blocks(self, w: Worker) -> int:
        """Blocks the approximate index remembers for ``w``: as configured, else as many as its
        engine holds, so the gateway does not route to a prefix the engine has long evicted (nor
        keep memory for it)."""
        configured = self.config.indexer.approx_blocks_per_worker
        if configured is not None:
            return configured
        return max(1, w.kv_capacity_tokens // self.block_tokens) if w.kv_capacity_tokens else APPROX_BLOCKS_UNKNOWN

    def end(self, t: Ticket, ttft_s: float | None = None, completed: bool = False) -> None:
        """The attempt is over (``completed``: the response ended normally; else it failed or was
        aborted): idempotent."""
        w, t.worker = t.worker, None
        if w is None:
            return
        self.last_active_s = self.clock()
        if completed and t.session_id is not None and (s := self.sessions.get(t.session_id)) is not None:
            s.completed_rounds += 1
        if ttft_s is not None and self.cap is not None:
            capacity = w.kv_capacity_tokens
            pressure = (w.inflight_new_tokens + self.other("new", w.label)) / capacity if capacity else 0.0
            self.cap.observe(ttft_s, t.sent_s, pressure, self.last_active_s, self.ledger.count(self.last_active_s))
        w.drain.ended(t.new_tokens, self.last_active_s)
        if t.session_id is not None and self.ledger.ended(t.session_id, self.last_active_s):
            self.session_idle(t.session_id)
        w.inflight_tokens -= w.inflight.pop(t.rid, 0)
        w.unanswered.pop(t.rid, None)
        w.inflight_new_tokens -= t.new_tokens
        if w.decoding.pop(t.rid, None) is not None:
            w.streamed_tokens -= t.streamed
        t.streamed = 0
        left = self.tenant_inflight.get(t.tenant, 0) - t.new_tokens
        t.new_tokens = 0
        if left > 0:
            self.tenant_inflight[t.tenant] = left
        else:
            self.tenant_inflight.pop(t.tenant, None)
        if ttft_s is not None:
            w.ttft_s = ttft_estimate(w.ttft_s, ttft_s)
        self.watch()
        self.changed()

    # --- health ----------------------------------------------------------------------------
    def failed(self, w: Worker) -> bool:
        """A failed health check or connection; returns True when this ejects the worker."""
        w.passes = 0
        w.fails += 1
        if w.healthy and w.fails >= self.config.telemetry.eject_after:
            w.healthy = False
            for loc in (w.tiers.hbm, w.tiers.dram, w.tiers.ssd):
                if loc is not None:
                    self.approx.forget(loc)
            return True
        return False

    def passed(self, w: Worker) -> bool:
        """A passing health check; returns True when this re-admits the worker."""
        w.fails = 0
        w.passes += 1
        if not w.healthy and w.passes >= self.config.telemetry.readmit_after:
            w.healthy = True
            return True
        return False

    def some_idle(self) -> bool:
        """A healthy worker has no request in flight through any replica."""
        return any(w.healthy and self.inflight_of(w) == 0 for w in self.workers)

    def watch(self) -> None:
        """Called on every change of the held requests or of what is in flight (``IdleWatch``)."""
        self.idle_watch.update(self.clock(), self.queued > 0, self.queued > 0 and self.some_idle())

    def inflight_total(self) -> int:
        return sum(len(w.inflight) for w in self.workers)
