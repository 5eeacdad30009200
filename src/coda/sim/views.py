"""What the simulated gateway sees of its workers: each worker's routing view and ingress load,
cached and rebuilt only for the workers whose events touched them, and the prompt's resident
prefix on each worker, from the pools themselves or through a KV indexer fed by their block events
(as the gateway's is)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import overload

import numpy as np

from coda.policy.routing import WorkerColumns
from coda.policy.snapshots import PrefixMatch, RouteRequest, RoutingSnapshot, WorkerLoad, WorkerView
from coda.shell.kvindex import KVIndexer, WorkerTiers
from coda.sim.ingress import SimIngress
from coda.sim.kvcache import OWNER_SHIFT, HbmPool, KVListener, Residency, leading_run
from coda.sim.worker import Worker

#: the match of a view placed with none (immutable, so one object serves every view)
NO_MATCH = PrefixMatch()


class ArrivalLoads(Sequence[WorkerLoad]):
    """The workers' ingress loads as an arriving request sees them (``IngressSnapshot.workers``):
    each worker's load (``load``) with what the request would newly occupy there (``new_tokens``),
    built when first read. ``load`` and ``match`` give each worker's load and match as they were when
    the snapshot was taken (nothing changes within the decision that reads it), so it reads as the
    tuple a fresh build gives, and a policy that reads no worker, or one, costs that much rather than
    one object (and one probe) per worker."""

    __slots__ = ("_n", "_load", "_match", "_prompt_tokens", "_C", "_built")

    def __init__(
        self, n: int, load: Callable[[int], WorkerLoad], match: Callable[[int], PrefixMatch | None], prompt_tokens: int, chunk_tokens: int
    ) -> None:
        self._n = n
        self._load = load
        self._match = match
        self._prompt_tokens = prompt_tokens
        self._C = chunk_tokens
        self._built: dict[int, WorkerLoad] = {}

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> WorkerLoad: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[WorkerLoad, ...]: ...

    def __getitem__(self, i: int | slice) -> WorkerLoad | tuple[WorkerLoad, ...]:
        if isinstance(i, slice):
            return tuple(self)[i]
        n = self._n
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("worker index out of range")
        w = self._built.get(i)
        if w is None:
            m = self._match(i)
            new_tokens = self._prompt_tokens - (m.hbm_blocks * self._C if m is not None else 0)
            w = self._built[i] = dataclasses.replace(self._load(i), new_tokens=new_tokens)
        return w

    def __iter__(self) -> Iterator[WorkerLoad]:
        return (self[i] for i in range(self._n))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


class RoutingViews(Sequence[WorkerView]):
    """The workers as a routing decision sees them (``RoutingSnapshot.workers``): each worker's view
    with its match, placed when read, and the columns routers read of all of them
    (``coda.policy.routing.WorkerColumns``), so a router that reads the columns and a few views
    costs that much rather than a step per worker. The views and columns are copies and ``match``
    gives the decision's matches (refusing one it would have to probe after the residency moved), so
    it reads as the tuple a fresh build gives; ``full`` gives every view at once from the kept
    placements while they are current (``None`` once they moved on)."""

    __slots__ = ("_views", "_match", "_place", "_full", "_all", "columns")

    def __init__(
        self,
        views: list[WorkerView],
        match: Callable[[int], PrefixMatch | None],
        place: Callable[[int, WorkerView, PrefixMatch | None], WorkerView],
        full: Callable[[], list[WorkerView] | None],
    ) -> None:
        self._views = views
        self._match = match
        self._place = place
        self._full = full
        self._all: tuple[WorkerView, ...] | None = None
        self.columns: WorkerColumns | None = None  # set where the decision is handed them

    def __len__(self) -> int:
        return len(self._views)

    @overload
    def __getitem__(self, i: int) -> WorkerView: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[WorkerView, ...]: ...

    def __getitem__(self, i: int | slice) -> WorkerView | tuple[WorkerView, ...]:
        if isinstance(i, slice):
            return self.every()[i]
        if self._all is not None:
            return self._all[i]
        if i < 0:
            i += len(self._views)
        return self._place(i, self._views[i], self._match(i))

    def every(self) -> tuple[WorkerView, ...]:
        """All the views, in worker order."""
        if self._all is None:
            full = self._full()
            self._all = tuple(full) if full is not None else tuple(self._place(i, v, self._match(i)) for i, v in enumerate(self._views))
        return self._all

    def __iter__(self) -> Iterator[WorkerView]:
        return iter(self.every())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return self.every() == tuple(other)

    def __hash__(self) -> int:
        return hash(self.every())

    def __repr__(self) -> str:
        return repr(self.every())


class _Lead:
    """What is kept of a chain's leading run (its first owner's chunks): the owner's residency epoch
    it was scanned at, the run (its length and last chunk), every worker's match over it, and the
    routing views placed with those matches, current up to ``pos`` in the refresh log, and their
    HBM runs as a column."""

    __slots__ = ("epoch", "k", "last", "base", "placed", "pos", "hbm")

    def __init__(self, epoch: int, k: int, last: int, base: dict[int, PrefixMatch]) -> None:
        self.epoch = epoch
        self.k = k
        self.last = last
        self.base = base
        self.placed: list[WorkerView] | None = None
        self.pos = 0
        self.hbm: np.ndarray | None = None  # every worker's HBM run over it, as routers read it (built when first read)


class _Parts:
    """A chain's matches at one state of the residency (``changes``): what is kept of its leading
    run, the HBM run of each worker whose pool holds a later owner's chunk (``runs``; every other
    worker's is its run over the leading run), and the nodes whose stores hold one (``nodes``).
    Only those workers can match past the leading run; each one's whole match (its node's stores
    after its HBM run) is probed when first read, so a decision that reads the HBM runs alone (a
    router's columns) probes no store."""

    __slots__ = ("views", "chain", "changes", "lead", "runs", "nodes", "over", "after")

    def __init__(self, views: ClusterViews, chain: Sequence[int], changes: int, lead: _Lead, runs: dict[int, int], nodes: set[int]) -> None:
        self.views = views
        self.chain = chain
        self.changes = changes
        self.lead = lead
        self.runs = runs
        self.nodes = nodes
        self.over: dict[int, PrefixMatch | None] = {}  # worker -> its match, once probed
        self.after: dict[tuple[int, int], PrefixMatch | None] = {}  # (node, HBM run) -> the match, the node's stores after it

    def holders(self) -> list[int]:
        """The workers that may match past the leading run."""
        nodes = self.views._nodes
        return [*self.runs, *(wid for n in self.nodes for wid, _ in nodes[n][1] if wid not in self.runs)]

    def match(self, wid: int) -> PrefixMatch | None:
        """Worker ``wid``'s match (``None``: it holds none of the prompt)."""
        if wid in self.over:
            return self.over[wid]
        base = self.lead.base.get(wid)
        n = self.views._node_of[wid]
        h = self.runs.get(wid)
        if h is None:
            if n not in self.nodes:
                return base
            h = base.hbm_blocks if base is not None else 0
        if self.views.residency is not None and self.views.residency.changes != self.changes:
            raise AssertionError("a worker's prefix match read after the residency it was taken at changed")
        key = (n, h)
        after = self.after
        m = after[key] if key in after else after.setdefault(key, self.views._match(self.views._nodes[n][0], self.chain, h))
        self.over[wid] = m
        return m


def _no_match(wid: int) -> None:
    """No worker's match: the router reads none."""


def _none() -> None:
    """No kept placements: each view is placed as it is read."""


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
        # what routers read of every view, as columns (``WorkerColumns``), kept with the views
        self._active = np.zeros(0, dtype=np.int64)
        self._kv_blocks = np.zeros(0, dtype=np.int64)
        self._contexts: list[tuple[int, ...]] = []
        self._no_hits = np.zeros(0, dtype=np.int64)
        self._loads: list[WorkerLoad | None] = []  # None: its worker was touched since it was built
        # workers grouped by the stores they share: (a worker of the node, [(worker id, its HBM pool), ...])
        self._nodes: list[tuple[Worker, list[tuple[int, HbmPool]]]] = []
        # per worker: the view last placed with a match, the view it was placed from and the match
        self._placed: list[tuple[WorkerView, WorkerView, PrefixMatch] | None] = []
        self._match_of: dict[tuple[int, int, int], PrefixMatch] = {}  # one object per match, so a repeat is an identity test
        # with a residency: which workers each tier (a pool or a node's store) serves, by the tier's id
        self.residency = residency
        # by the tier's id: (its node's index in ``_nodes``, the worker id of a pool or -1 for a node's store)
        self._tier_at: dict[int, tuple[int, int]] = {}
        self._node_of: list[int] = []  # worker id -> its node's index in ``_nodes``
        # first chunk of a chain -> what is kept of its leading run
        self._leading: dict[int, _Lead] = {}
        # the ids of the workers whose views were rebuilt, in order (``_log[i]`` is entry ``_log_start + i``),
        # so a kept placement catches up with only those
        self._log: list[int] = []
        self._log_start = 0
        self.log_max = 4096
        # from this many workers a decision is handed the columns (``RoutingViews``): below it, a
        # router reads a tuple of views faster than numpy reads the arrays (a few us a call)
        self.columns_from = 32
        # the last chain's parts and the residency changes they were found at
        self._last_parts: _Parts | None = None

    def attach(self, workers: list[Worker], tiers: list[WorkerTiers]) -> None:
        """The cluster's workers (and each one's tier locations, for the indexer), once built."""
        self.workers = workers
        self._tiers = tiers
        self._views = [self.view(w) for w in workers]
        self._active = np.array([v.active_requests for v in self._views], dtype=np.int64)
        self._kv_blocks = np.array([v.active_kv_blocks for v in self._views], dtype=np.int64)
        self._contexts = [v.decode_contexts for v in self._views]
        self._no_hits = np.zeros(len(workers), dtype=np.int64)
        self._no_hits.flags.writeable = False
        # built once each here, which also records every worker's KV capacity with the ingress (its session cap reads it)
        self._loads = [self.ingress.load(w) for w in workers] if self.ingress is not None else []
        nodes: dict[tuple[int, int], tuple[Worker, list[tuple[int, HbmPool]]]] = {}
        for w in workers:
            nodes.setdefault((id(w.dram), id(w.ssd)), (w, []))[1].append((w.id, w.hbm))
        self._nodes = list(nodes.values())
        self._placed = [None] * len(workers)
        self.log_max = 8 * len(workers) + 4096
        self._node_of = [0] * len(workers)
        for n, (node, pools) in enumerate(self._nodes):
            for wid, pool in pools:
                self._tier_at[id(pool)] = (n, wid)
                self._node_of[wid] = n
            for store in (node.dram, node.ssd):
                if store is not None:
                    self._tier_at[id(store)] = (n, -1)

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
            v = self._views[wid] = self.view(w)
            self._active[wid] = v.active_requests
            self._kv_blocks[wid] = v.active_kv_blocks
            self._contexts[wid] = v.decode_contexts
            if self.ingress is not None:  # built when read: most policies read none, or the chosen worker's
                self._loads[wid] = None
        log = self._log
        if len(log) > self.log_max:  # kept placements older than this are placed again in full
            self._log_start += len(log)
            log.clear()
        log.extend(touched)
        touched.clear()

    def load(self, wid: int) -> WorkerLoad:
        """Worker ``wid``'s ingress load as of the last refresh (nothing it reads moves without touching the worker)."""
        load = self._loads[wid]
        if load is None:
            assert self.ingress is not None
            load = self._loads[wid] = self.ingress.load(self.workers[wid])
        return load

    def loads(self) -> tuple[WorkerLoad, ...]:
        self.refresh()
        return tuple(map(self.load, range(len(self.workers))))

    def arrival_loads(self, match: Callable[[int], PrefixMatch | None], prompt_tokens: int) -> ArrivalLoads:
        """The loads an arriving request of ``prompt_tokens`` sees, ``match`` giving each worker's match."""
        self.refresh()
        return ArrivalLoads(len(self.workers), self.load, match, prompt_tokens, self.C)

    def view(self, w: Worker) -> WorkerView:
        """A worker's routing view with no prefix match."""
        return WorkerView(
            worker_id=w.id,
            active_requests=w.active_requests,
            active_kv_blocks=w.active_tokens // self.C,
            waiting_requests=len(w.waiting),
            decode_contexts=w.decode_contexts() if "decode_contexts" in self.worker_fields else (),
            match=NO_MATCH,
        )

    def routing_snapshot(
        self, now_s: float, request: RouteRequest, chain: Sequence[int], owners: Iterable[int] | None = None
    ) -> RoutingSnapshot:
        """Only the views of workers touched since the last decision are rebuilt, and only workers
        holding some of the prompt get a match; the views are placed with their matches as they
        are read (``RoutingViews``), beside the columns routers read. With a residency, the views
        placed with the matches over a chain's leading run are kept with it and catch up with the
        workers rebuilt since they were last used; only the workers matching past the run are
        placed anew, so a decision that reads every view costs what changed, and one that reads the
        columns a few array operations, not one step per worker (``tests/property`` checks every
        snapshot against a fresh build)."""
        self.refresh()
        views = self._views.copy()
        match: Callable[[int], PrefixMatch | None]
        parts: _Parts | None = None
        matches: Mapping[int, PrefixMatch] = {}
        if "match" not in self.worker_fields:
            match, full = _no_match, views.copy
        elif self.indexer is not None or self.residency is None or not chain:
            matches = self.matches(chain, owners)
            match, full = matches.get, _none
        else:
            parts = self._parts(chain, owners)
            match, full = parts.match, self._full(parts)
        placed = RoutingViews(views, match, self._place, full)
        if len(views) < self.columns_from:
            return RoutingSnapshot(now_s, request, placed.every())
        hbm = self._hbm(parts) if parts is not None else self._hits(matches) if matches else self._no_hits
        placed.columns = WorkerColumns(self._active.copy(), self._kv_blocks.copy(), hbm, self._contexts.copy())
        return RoutingSnapshot(now_s, request, placed)  # type: ignore[arg-type]

    def _hits(self, matches: Mapping[int, PrefixMatch]) -> np.ndarray:
        """Every worker's HBM run from a map of matches."""
        hbm = np.zeros(len(self.workers), dtype=np.int64)
        for wid, m in matches.items():
            hbm[wid] = m.hbm_blocks
        return hbm

    def _hbm(self, parts: _Parts) -> np.ndarray:
        """Every worker's HBM run: the lead's column, with the runs that go past it."""
        lead = parts.lead
        if lead.hbm is None:
            lead.hbm = np.zeros(len(self.workers), dtype=np.int64)
            for wid, m in lead.base.items():
                lead.hbm[wid] = m.hbm_blocks
            lead.hbm.flags.writeable = False
        if not parts.runs:
            return lead.hbm
        hbm = lead.hbm.copy()
        for wid, h in parts.runs.items():
            hbm[wid] = h
        return hbm

    def _full(self, parts: _Parts) -> Callable[[], list[WorkerView] | None]:
        """Every view of a decision from the kept placements, while no view was rebuilt since it."""
        at = self._log_start + len(self._log)

        def full() -> list[WorkerView] | None:
            if self._log_start + len(self._log) != at:
                return None
            placed = self._placement(parts.lead)
            holders = parts.holders()
            if holders:
                placed = placed.copy()
                for wid in holders:
                    placed[wid] = self._place(wid, self._views[wid], parts.match(wid))
            return placed

        return full

    def _place(self, wid: int, v: WorkerView, m: PrefixMatch | None) -> WorkerView:
        """Worker ``wid``'s view ``v`` with match ``m`` (the same object as last time when neither changed)."""
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
        base, place, views = lead.base, self._place, self._views
        if lead.placed is None or lead.pos < self._log_start:
            lead.placed = [place(wid, views[wid], base.get(wid)) for wid in range(len(self.workers))]
        elif lead.pos < end:
            placed = lead.placed
            for wid in self._log[lead.pos - self._log_start :]:
                placed[wid] = place(wid, views[wid], base.get(wid))
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
        parts = self._parts(chain, owners)
        holders = parts.holders()
        if not holders:
            return parts.lead.base
        out = dict(parts.lead.base)
        for wid in holders:
            m = parts.match(wid)
            if m is None:
                out.pop(wid, None)
            else:
                out[wid] = m
        return out

    def match_reader(self, chain: Sequence[int], owners: Iterable[int] | None = None) -> Callable[[int], PrefixMatch | None]:
        """Each worker's entry in ``matches(chain, owners)``, as it is now. With a residency (and no
        indexer) a worker is probed only when read, alone: its pool's run, then its node's stores
        after it; a worker that holds none of the prompt reads as ``None`` there too, because a
        match past the chain's first owner's run needs a later owner's chunk in one of the worker's
        tiers. A read after any tier's residency moved is refused: the simulator reads it within the
        decision that took it."""
        if self.indexer is not None or self.residency is None or not chain:
            return self.matches(chain, owners).get
        res = self.residency
        at = res.changes

        def match(wid: int) -> PrefixMatch | None:
            if res.changes != at:
                raise AssertionError("a worker's prefix match read after the residency it was taken at changed")
            last = self._last_parts
            if last is not None and last.chain is chain and last.changes == at:  # the routing snapshot's, kept
                return last.match(wid)
            w = self.workers[wid]
            return self._match(w, chain, w.hbm.leading(chain) if chain[0] in w.hbm.resident else 0)

        return match

    def _parts(self, chain: Sequence[int], owners: Iterable[int] | None) -> _Parts:
        """The chain's matches now (``_Parts``): its leading run's kept (scanned again when its owner's
        residency moved), and the workers that may match past it, with their HBM runs."""
        res = self.residency
        assert res is not None
        last = self._last_parts
        if last is not None and last.chain is chain and last.changes == res.changes:  # the same prompt again, nothing moved since
            return last
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
        runs: dict[int, int] = {}
        nodes: set[int] = set()
        if k < n:
            later = {c >> OWNER_SHIFT for c in chain[k:]} if owners is None else {o for o in owners if o != owner}
            base, tier_at = lead.base, self._tier_at
            for o in later:
                for tier in res.holders.get(o, ()):
                    node, wid = tier_at[id(tier)]
                    if wid < 0:
                        nodes.add(node)
                    elif wid not in runs:
                        m = base.get(wid)
                        h = m.hbm_blocks if m is not None else 0
                        if h == k:  # the pool holds the whole leading run: its run may go on past it
                            h += leading_run(self.workers[wid].hbm.resident, chain, k)
                        runs[wid] = h
        parts = self._last_parts = _Parts(self, chain, res.changes, lead, runs, nodes)
        return parts

    def _holding(self, res: Residency, owners: Iterable[int]) -> list[tuple[Worker, list[tuple[int, HbmPool]]]]:
        """The workers whose pools or node stores hold a chunk of one of ``owners``, by node (in node
        and worker order): every worker of a node whose store holds one, and the holders among the
        pools of the others."""
        whole: set[int] = set()  # nodes whose stores hold one
        pools: dict[int, set[int]] = {}  # node -> the workers whose pools hold one
        tier_at = self._tier_at
        for o in owners:
            for tier in res.holders.get(o, ()):
                n, wid = tier_at[id(tier)]
                if wid < 0:
                    whole.add(n)
                else:
                    pools.setdefault(n, set()).add(wid)
        nodes = self._nodes
        if len(whole) == len(nodes):
            return nodes
        return [
            nodes[n] if n in whole else (nodes[n][0], [(wid, self.workers[wid].hbm) for wid in sorted(pools[n])])
            for n in sorted(whole.union(pools))
        ]

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
        """A worker's match given its ``h`` leading HBM chunks: the DRAM run after them, then the SSD
        run after that; ``None`` when it holds none of the prompt. The same object for the same match
        (made only the first time: a decision probes several workers)."""
        d = w.dram.leading(chain, h) if w.dram is not None else 0
        s = w.ssd.leading(chain, h + d) if w.ssd is not None else 0
        if not (h or d or s):
            return None
        m = self._match_of.get((h, d, s))
        if m is None:
            m = self._match_of[(h, d, s)] = PrefixMatch(h, d, s)
        return m
