"""What the simulated gateway sees of its workers: each worker's routing view and ingress load,
cached and rebuilt only for the workers whose events touched them, and the prompt's resident
prefix on each worker, from the pools themselves or through a KV indexer fed by their block events
(as the gateway's is)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import overload

from coda.policy.snapshots import PrefixMatch, RouteRequest, RoutingSnapshot, WorkerLoad, WorkerView
from coda.shell.kvindex import KVIndexer, WorkerTiers
from coda.sim.ingress import SimIngress
from coda.sim.kvcache import OWNER_SHIFT, HbmPool, KVListener, Residency
from coda.sim.worker import Worker


def store_match(w: Worker, chain: Sequence[int], h: int) -> PrefixMatch | None:
    """A worker's match given its ``h`` leading HBM chunks: the DRAM run after them, then the SSD
    run after that; ``None`` when it holds none of the prompt."""
    d = w.dram.leading(chain, h) if w.dram is not None else 0
    s = w.ssd.leading(chain, h + d) if w.ssd is not None else 0
    return PrefixMatch(h, d, s) if h or d or s else None


class ArrivalLoads(Sequence[WorkerLoad]):
    """The workers' ingress loads as an arriving request sees them (``IngressSnapshot.workers``):
    each worker's cached load with what the request would newly occupy there (``new_tokens``), built
    when first read. Everything it is built from is fixed when the snapshot is taken (the cached
    loads are immutable, and so is the match map), so it reads as the tuple a fresh build gives, and
    a policy that reads no worker, or one, costs that much rather than one object per worker."""

    __slots__ = ("_loads", "_matches", "_prompt_tokens", "_C", "_built")

    def __init__(self, loads: tuple[WorkerLoad, ...], matches: Mapping[int, PrefixMatch], prompt_tokens: int, chunk_tokens: int) -> None:
        self._loads = loads
        self._matches = matches
        self._prompt_tokens = prompt_tokens
        self._C = chunk_tokens
        self._built: dict[int, WorkerLoad] = {}

    def __len__(self) -> int:
        return len(self._loads)

    @overload
    def __getitem__(self, i: int) -> WorkerLoad: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[WorkerLoad, ...]: ...

    def __getitem__(self, i: int | slice) -> WorkerLoad | tuple[WorkerLoad, ...]:
        if isinstance(i, slice):
            return tuple(self)[i]
        n = len(self._loads)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("worker index out of range")
        w = self._built.get(i)
        if w is None:
            m = self._matches.get(i)
            new_tokens = self._prompt_tokens - (m.hbm_blocks * self._C if m is not None else 0)
            w = self._built[i] = dataclasses.replace(self._loads[i], new_tokens=new_tokens)
        return w

    def __iter__(self) -> Iterator[WorkerLoad]:
        return (self[i] for i in range(len(self._loads)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


class _Lead:
    """What is kept of a chain's leading run (its first owner's chunks): the owner's residency epoch
    it was scanned at, the run (its length and last chunk), every worker's match over it, and the
    routing views placed with those matches, current up to ``pos`` in the refresh log."""

    __slots__ = ("epoch", "k", "last", "base", "placed", "pos")

    def __init__(self, epoch: int, k: int, last: int, base: dict[int, PrefixMatch]) -> None:
        self.epoch = epoch
        self.k = k
        self.last = last
        self.base = base
        self.placed: list[WorkerView] | None = None
        self.pos = 0


class ClusterViews:
    """The cached views and the prefix matcher. ``touched`` holds the ids of workers whose events
    may have changed what a view reads (queues, active tokens, decode contexts, HBM use); the
    workers share it, and each decision first rebuilds only those."""

    def __init__(
        self,
        chunk_tokens: int,
        worker_fields: frozenset[str],
        ingress: SimIngress | None,
        indexer: KVIndexer | None,
        residency: Residency | None = None,
    ) -> None:
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
        # with a residency: which workers each tier (a pool or a node's store) serves, by the tier's id
        self.residency = residency
        self._tier_workers: dict[int, tuple[int, ...]] = {}
        self._node_of: list[int] = []  # worker id -> its node's index in ``_nodes``
        # first chunk of a chain -> what is kept of its leading run
        self._leading: dict[int, _Lead] = {}
        # the ids of the workers whose views were rebuilt, in order (``_log[i]`` is entry ``_log_start + i``),
        # so a kept placement catches up with only those
        self._log: list[int] = []
        self._log_start = 0
        self.log_max = 4096
        # the last chain's parts and the residency changes they were found at
        self._last_parts: tuple[Sequence[int], int, _Lead, dict[int, PrefixMatch | None]] | None = None

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
        self.log_max = 8 * len(workers) + 4096
        self._node_of = [0] * len(workers)
        for n, (node, pools) in enumerate(self._nodes):
            wids = tuple(wid for wid, _ in pools)
            for wid in wids:
                self._node_of[wid] = n
            for wid, pool in pools:
                self._tier_workers[id(pool)] = (wid,)
            for store in (node.dram, node.ssd):
                if store is not None:
                    self._tier_workers[id(store)] = wids

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
        touched = self.touched
        if not touched:
            return
        for wid in touched:
            w = self.workers[wid]
            self._views[wid] = self.view(w)
            if self.ingress is not None:
                self._loads[wid] = self.ingress.load(w)
        log = self._log
        if len(log) > self.log_max:  # kept placements older than this are placed again in full
            self._log_start += len(log)
            log.clear()
        log.extend(touched)
        touched.clear()

    def loads(self) -> tuple[WorkerLoad, ...]:
        self.refresh()
        return tuple(self._loads)

    def arrival_loads(self, matches: Mapping[int, PrefixMatch], prompt_tokens: int) -> ArrivalLoads:
        """The loads an arriving request of ``prompt_tokens`` with these ``matches`` sees."""
        return ArrivalLoads(self.loads(), matches, prompt_tokens, self.C)

    def view(self, w: Worker) -> WorkerView:
        """A worker's routing view with no prefix match."""
        return WorkerView(
            worker_id=w.id,
            active_requests=w.active_requests,
            active_kv_blocks=w.active_tokens // self.C,
            waiting_requests=len(w.waiting),
            decode_contexts=w.decode_contexts() if "decode_contexts" in self.worker_fields else (),
        )

    def routing_snapshot(
        self, now_s: float, request: RouteRequest, chain: Sequence[int], owners: Iterable[int] | None = None
    ) -> RoutingSnapshot:
        """Only the views of workers touched since the last decision are rebuilt, and only workers
        holding some of the prompt get a match. With a residency, the views placed with the matches
        over a chain's leading run are kept with it and catch up with the workers rebuilt since
        they were last used; only the workers matching past the run are placed anew, so a decision
        costs what changed, not one step per worker (``tests/property`` checks every snapshot
        against a fresh build)."""
        self.refresh()
        if "match" not in self.worker_fields:
            return RoutingSnapshot(now_s, request, tuple(self._views))
        if self.indexer is not None or self.residency is None or not chain:
            placed = list(self._views)
            for wid, m in self.matches(chain, owners).items():
                placed[wid] = self._place(wid, m)
            return RoutingSnapshot(now_s, request, tuple(placed))
        lead, over = self._parts(chain, owners)
        placed = self._placement(lead)
        if over:
            placed = placed.copy()
            for wid, m in over.items():
                placed[wid] = self._place(wid, m)
        return RoutingSnapshot(now_s, request, tuple(placed))

    def _place(self, wid: int, m: PrefixMatch | None) -> WorkerView:
        """Worker ``wid``'s view with match ``m`` (the same object as last time when neither changed)."""
        v = self._views[wid]
        if m is None:
            return v
        last = self._placed[wid]
        if last is not None and last[1] is v and last[2] is m:
            return last[0]
        view = WorkerView(v.worker_id, v.active_requests, v.active_kv_blocks, v.waiting_requests, v.decode_contexts, m, v.healthy)
        self._placed[wid] = (view, v, m)
        return view

    def _placement(self, lead: _Lead) -> list[WorkerView]:
        """Every worker's view placed with its match over ``lead``'s run, brought up to date."""
        end = self._log_start + len(self._log)
        base, place = lead.base, self._place
        if lead.placed is None or lead.pos < self._log_start:
            lead.placed = [place(wid, base.get(wid)) for wid in range(len(self.workers))]
        elif lead.pos < end:
            placed = lead.placed
            for wid in self._log[lead.pos - self._log_start :]:
                placed[wid] = place(wid, base.get(wid))
        lead.pos = end
        return lead.placed

    def matches(self, chain: Sequence[int], owners: Iterable[int] | None = None) -> Mapping[int, PrefixMatch]:
        """The prompt's resident prefix on each worker that holds some of it (a worker left out
        holds none), from the pools or through the indexer; ``owners`` names every owner of the
        chain's chunks (as ``ChunkChains`` gives them), found from the chain when not given. The
        map is the caller's to read, not to change.

        The chain is its first owner's leading run (a prefix group's shared system prompt, most of
        the time) and what follows it (the session's own chunks). Every worker's match over the
        leading run is kept per run and reused while no tier's residency of that owner changes
        (``Residency``); only the workers whose pools or stores hold a chunk of one of the later
        owners can match past it, so only those are probed with the whole chain. A probe reads a
        worker's pool (``HbmPool.leading``, its run over a shared prompt remembered) and its node's
        stores after that run, once per node and HBM run length."""
        if self.indexer is not None:
            return {w: m for w, m in self.indexer.match(chain, self._tiers).items() if m != PrefixMatch()}
        if not chain:
            return {}
        if self.residency is None:
            return self._scan(chain, self._nodes)
        lead, over = self._parts(chain, owners)
        if not over:
            return lead.base
        out = dict(lead.base)
        for wid, m in over.items():
            if m is None:
                out.pop(wid, None)
            else:
                out[wid] = m
        return out

    def _parts(self, chain: Sequence[int], owners: Iterable[int] | None) -> tuple[_Lead, dict[int, PrefixMatch | None]]:
        """What is kept of the chain's leading run (scanned again when its owner's residency moved),
        and the match of each worker that may match past it (``None``: it holds none of the prompt)."""
        res = self.residency
        assert res is not None
        last = self._last_parts
        if last is not None and last[0] is chain and last[1] == res.changes:  # the same prompt again, nothing moved since
            return last[2], last[3]
        first = chain[0]
        owner = first >> OWNER_SHIFT
        epoch = res.epochs.get(owner, 0)
        lead = self._leading.get(first)
        n = len(chain)
        if lead is not None and lead.k <= n and chain[lead.k - 1] == lead.last and (lead.k == n or chain[lead.k] >> OWNER_SHIFT != owner):
            k = lead.k
            if lead.epoch != epoch:
                lead = None
        else:
            k = 1
            while k < n and chain[k] >> OWNER_SHIFT == owner:
                k += 1
            lead = None
        if lead is None:
            if len(self._leading) >= 4096:  # runs of sessions long gone: keep the memory bounded
                self._leading.clear()
            run = chain if k == n else chain[:k]
            lead = self._leading[first] = _Lead(epoch, k, chain[k - 1], self._scan(run, self._holding(res, (owner,))))
        over: dict[int, PrefixMatch | None] = {}
        if k < n:
            later = {c >> OWNER_SHIFT for c in chain[k:]} if owners is None else {o for o in owners if o != owner}
            for node, pools in self._holding(res, later):
                after: dict[int, PrefixMatch | None] = {}  # HBM run -> the match, the node's stores after it
                for wid, pool in pools:
                    h = pool.leading(chain) if first in pool.resident else 0
                    over[wid] = after[h] if h in after else after.setdefault(h, self._match(node, chain, h))
        self._last_parts = (chain, res.changes, lead, over)
        return lead, over

    def _holding(self, res: Residency, owners: Iterable[int]) -> list[tuple[Worker, list[tuple[int, HbmPool]]]]:
        """The workers whose pools or node stores hold a chunk of one of ``owners``, by node (in node
        and worker order)."""
        wids: set[int] = set()
        tier_workers = self._tier_workers
        for o in owners:
            for tier in res.holders.get(o, ()):
                wids.update(tier_workers[id(tier)])
        if not wids:
            return []
        if len(wids) == len(self.workers):
            return self._nodes
        out: list[tuple[Worker, list[tuple[int, HbmPool]]]] = []
        last = -1
        for wid in sorted(wids):
            n = self._node_of[wid]
            if n != last:
                out.append((self._nodes[n][0], []))
                last = n
            out[-1][1].append((wid, self.workers[wid].hbm))
        return out

    def _scan(self, chain: Sequence[int], nodes: list[tuple[Worker, list[tuple[int, HbmPool]]]]) -> dict[int, PrefixMatch]:
        """Every listed worker's match: most miss on the chain's first chunk; a worker's run over a
        shared prompt is remembered by its pool; the workers of a node share their stores, so the
        stores' runs after an HBM run of a given length are looked up once per node."""
        first = chain[0]
        out = {}
        for node, pools in nodes:
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
