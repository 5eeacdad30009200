"""What the simulated gateway sees of its workers: each worker's routing view and ingress load,
cached and rebuilt only for the workers whose events touched them, and the prompt's resident
prefix on each worker, from the pools themselves or through a KV indexer fed by their block events
(as the gateway's is)."""

from __future__ import annotations

from collections.abc import Sequence

from coda.policy.snapshots import PrefixMatch, RouteRequest, RoutingSnapshot, WorkerLoad, WorkerView
from coda.shell.kvindex import KVIndexer, WorkerTiers
from coda.sim.ingress import SimIngress
from coda.sim.kvcache import HbmPool, KVListener
from coda.sim.worker import Worker


def store_match(w: Worker, chain: Sequence[int], h: int) -> PrefixMatch | None:
    """A worker's match given its ``h`` leading HBM chunks: the DRAM run after them, then the SSD
    run after that; ``None`` when it holds none of the prompt."""
    d = w.dram.leading(chain, h) if w.dram is not None else 0
    s = w.ssd.leading(chain, h + d) if w.ssd is not None else 0
    return PrefixMatch(h, d, s) if h or d or s else None


class ClusterViews:
    """The cached views and the prefix matcher. ``touched`` holds the ids of workers whose events
    may have changed what a view reads (queues, active tokens, decode contexts, HBM use); the
    workers share it, and each decision first rebuilds only those."""

    def __init__(self, chunk_tokens: int, worker_fields: frozenset[str], ingress: SimIngress | None, indexer: KVIndexer | None) -> None:
        self.C = chunk_tokens
        self.worker_fields = worker_fields
        self.ingress = ingress
        self.indexer = indexer
        self.touched: set[int] = set()
        self.workers: list[Worker] = []
        self._tiers: list[WorkerTiers] = []
        self._views: list[WorkerView] = []
        self._loads: list[WorkerLoad] = []
        # workers grouped by the stores they share: (a worker of the node, [(worker id, its HBM pool), ...])
        self._nodes: list[tuple[Worker, list[tuple[int, HbmPool]]]] = []
        # per worker: the view last placed with a match, the view it was placed from and the match
        self._placed: list[tuple[WorkerView, WorkerView, PrefixMatch] | None] = []
        self._match_of: dict[tuple[int, int, int], PrefixMatch] = {}  # one object per match, so a repeat is an identity test

    def attach(self, workers: list[Worker], tiers: list[WorkerTiers]) -> None:
        """The cluster's workers (and each one's tier locations, for the indexer), once built."""
        self.workers = workers
        self._tiers = tiers
        self._views = [self.view(w) for w in workers]
        self._loads = [self.ingress.load(w) for w in workers] if self.ingress is not None else []
        nodes: dict[tuple[int, int], tuple[Worker, list[tuple[int, HbmPool]]]] = {}
        for w in workers:
            nodes.setdefault((id(w.dram), id(w.ssd)), (w, []))[1].append((w.id, w.hbm))
        self._nodes = list(nodes.values())
        self._placed = [None] * len(workers)

    def indexing(self, downstream: KVListener | None) -> KVListener:
        """A block-event listener that feeds the indexer, then ``downstream``."""
        indexer = self.indexer
        assert indexer is not None

        def listener(event: str, where: int, tier: str, chunks: Sequence[int]) -> None:
            (indexer.stored if event == "stored" else indexer.removed)(f"{tier}:{where}", chunks)
            if downstream is not None:
                downstream(event, where, tier, chunks)

        return listener

    def refresh(self) -> None:
        """Rebuild the cached routing view and ingress load of each worker touched since the last decision."""
        for wid in self.touched:
            w = self.workers[wid]
            self._views[wid] = self.view(w)
            if self.ingress is not None:
                self._loads[wid] = self.ingress.load(w)
        self.touched.clear()

    def loads(self) -> tuple[WorkerLoad, ...]:
        self.refresh()
        return tuple(self._loads)

    def view(self, w: Worker) -> WorkerView:
        """A worker's routing view with no prefix match."""
        return WorkerView(
            worker_id=w.id,
            active_requests=w.active_requests,
            active_kv_blocks=w.active_tokens // self.C,
            waiting_requests=len(w.waiting),
            decode_contexts=w.decode_contexts() if "decode_contexts" in self.worker_fields else (),
        )

    def routing_snapshot(self, now_s: float, request: RouteRequest, chain: Sequence[int]) -> RoutingSnapshot:
        """Only the views of workers touched since the last decision are rebuilt, and only workers
        holding some of the prompt get a match, so an unchanged worker costs nothing but its
        prefix probe (``tests/property`` checks every snapshot against a fresh build)."""
        self.refresh()
        placed = list(self._views)
        if "match" in self.worker_fields:
            memo = self._placed
            for wid, m in self.matches(chain).items():
                v = placed[wid]
                last = memo[wid]
                if last is not None and last[1] is v and last[2] is m:
                    placed[wid] = last[0]
                else:
                    view = WorkerView(v.worker_id, v.active_requests, v.active_kv_blocks, v.waiting_requests, v.decode_contexts, m,
                                      v.healthy)
                    placed[wid] = view
                    memo[wid] = (view, v, m)
        return RoutingSnapshot(now_s, request, tuple(placed))

    def matches(self, chain: Sequence[int]) -> dict[int, PrefixMatch]:
        """The prompt's resident prefix on each worker that holds some of it (a worker left out
        holds none), from the pools or through the indexer. Most workers miss on the prompt's first
        chunk; a worker's run over a shared prompt is remembered by its pool (``HbmPool.leading``);
        and the workers of a node share their stores, so the stores' runs after an HBM run of a
        given length are looked up once per node."""
        if self.indexer is not None:
            return {w: m for w, m in self.indexer.match(chain, self._tiers).items() if m != PrefixMatch()}
        if not chain:
            return {}
        first = chain[0]
        out = {}
        for node, pools in self._nodes:
            after: dict[int, PrefixMatch | None] = {}  # HBM run -> the match, the node's stores after it
            for wid, pool in pools:
                h = pool.leading(chain) if first in pool.resident else 0
                m = after[h] if h in after else after.setdefault(h, self._match(node, chain, h))
                if m is not None:
                    out[wid] = m
        return out

    def _match(self, w: Worker, chain: Sequence[int], h: int) -> PrefixMatch | None:
        """``store_match``, the same object for the same match."""
        m = store_match(w, chain, h)
        return None if m is None else self._match_of.setdefault((m.hbm_blocks, m.dram_blocks, m.ssd_blocks), m)
