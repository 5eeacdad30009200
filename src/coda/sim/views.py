"""What the simulated gateway sees of its workers: each worker's routing view and ingress load,
cached and rebuilt only for the workers whose events touched them, and the prompt's resident
prefix on each worker, from the pools themselves or through a KV indexer fed by their block events
(as the gateway's is)."""

from __future__ import annotations

from collections.abc import Sequence

from coda.policy.snapshots import PrefixMatch, RouteRequest, RoutingSnapshot, WorkerLoad, WorkerView
from coda.shell.kvindex import KVIndexer, WorkerTiers
from coda.sim.ingress import SimIngress
from coda.sim.kvcache import KVListener, KVStore
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

    def attach(self, workers: list[Worker], tiers: list[WorkerTiers]) -> None:
        """The cluster's workers (and each one's tier locations, for the indexer), once built."""
        self.workers = workers
        self._tiers = tiers
        self._views = [self.view(w) for w in workers]
        self._loads = [self.ingress.load(w) for w in workers] if self.ingress is not None else []

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
            for wid, m in self.matches(chain).items():
                v = placed[wid]
                placed[wid] = WorkerView(v.worker_id, v.active_requests, v.active_kv_blocks, v.waiting_requests, v.decode_contexts, m, v.healthy)
        return RoutingSnapshot(now_s, request, tuple(placed))

    def matches(self, chain: Sequence[int]) -> dict[int, PrefixMatch]:
        """The prompt's resident prefix on each worker that holds some of it (a worker left out
        holds none), from the pools or through the indexer. Most workers miss on the prompt's first
        chunk, and the workers of a node share their stores, so a worker without it in HBM costs a
        membership test and its stores' runs are looked up once per node."""
        if self.indexer is not None:
            return {w: m for w, m in self.indexer.match(chain, self._tiers).items() if m != PrefixMatch()}
        if not chain:
            return {}
        first = chain[0]
        from_stores: dict[KVStore | None, PrefixMatch | None] = {}  # a node's match from its stores alone
        out = {}
        for w in self.workers:
            if first in w.hbm.resident:
                m = store_match(w, chain, w.hbm.leading(chain))
            elif w.dram in from_stores:
                m = from_stores[w.dram]
            else:
                m = from_stores[w.dram] = store_match(w, chain, 0)
            if m is not None:
                out[w.id] = m
        return out
