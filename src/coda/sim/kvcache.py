"""Chunk-granular KV bookkeeping: a per-worker HBM pool and LRU stores for DRAM and SSD.

Chunks are identified by integer ids of their content (a prefix-hash chain: a chunk's id is
the same only when its whole prefix is the same). An id's high bits name its *owner* (a
session, a prefix group or a trace's shared blocks); every residency change bumps the owner's
version so cached prefix matches of waiting requests are invalidated exactly when they change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from itertools import islice, takewhile

import numpy as np

#: a KV chunk id's bits above this name its owner (a session, a prefix group, a trace's shared blocks)
OWNER_SHIFT = 32

KVListener = Callable[[str, int, str, Sequence[int]], None]
"""Called as ``listener(event, where, tier, chunk_ids)``: event ``stored``/``removed``, tier
``hbm`` (``where`` = worker id) or ``dram``/``ssd`` (``where`` = store id)."""


def owner_of(chunk: int) -> int:
    return chunk >> OWNER_SHIFT


def owners_of(chunks: np.ndarray) -> np.ndarray:
    """``owner_of`` over an array of chunk ids (what an eviction policy groups chunks by)."""
    return chunks >> OWNER_SHIFT


def leading_run(held: Container[int], chain: Sequence[int], start: int = 0) -> int:
    """How many chunks of ``chain[start:]`` in a row ``held`` contains. The first chunk is tested
    on its own (most routing probes miss there); the rest of the scan runs in C."""
    if start >= len(chain) or chain[start] not in held:
        return 0
    return len(list(takewhile(held.__contains__, islice(chain, start, None))))


class Versions:
    """Residency version per owner; a prefix match cached under older versions is stale."""

    __slots__ = ("v",)

    def __init__(self) -> None:
        self.v: list[int] = []

    def new_owner(self) -> int:
        self.v.append(0)
        return len(self.v) - 1

    def bump(self, chunks: Iterable[int]) -> None:
        v = self.v
        last = -1
        for c in chunks:
            o = c >> OWNER_SHIFT
            if o != last:
                v[o] += 1
                last = o


class Residency:
    """Cluster-wide residency by owner, over every tier (HBM pools, DRAM and SSD stores) that
    reports to it: ``epochs`` counts, per owner, the changes to which of its chunks any tier holds
    (not to their references or order), and ``holders`` names the tiers holding some of its chunks.
    A routing match over one owner's chunks stays valid while that owner's epoch does, and only the
    workers of an owner's holders can hold any of its chunks."""

    __slots__ = ("epochs", "holders", "changes")

    def __init__(self) -> None:
        self.epochs: dict[int, int] = {}
        self.holders: dict[int, set[object]] = {}
        self.changes = 0  # every owner's epoch moves taken together: unchanged, no tier's residency changed


class PrefixRuns:
    """A tier's remembered prefix runs. ``epochs`` counts, per owner, the changes to which of its
    chunks the tier holds (not to their references or order), so a run over one owner's chunks
    stays valid while that owner's epoch does: a prefix group's shared system prompt is scanned
    once per change on each tier, not once per routing probe. With a ``residency``, the tier also
    counts the chunks it holds per owner and reports its changes there (``tier`` names it)."""

    __slots__ = ("epochs", "runs", "residency", "tier", "held")

    def __init__(self, residency: Residency | None = None, tier: object = None) -> None:
        self.epochs: dict[int, int] = {}
        # first chunk of a probed chain -> (its owner's epoch, held run over that owner's chunks, the run's last chunk)
        self.runs: dict[int, tuple[int, int, int]] = {}
        self.residency = residency
        self.tier = tier
        self.held: dict[int, int] = {}  # owner -> chunks of it this tier holds (with a residency only)

    def moved(self, chunks: Iterable[int], sign: int = 0) -> None:
        """Chunks were added to (``sign`` 1) or removed from (-1) the tier: their owners' epochs move on."""
        ep = self.epochs
        res = self.residency
        last = -1
        n = 0
        for c in chunks:
            o = c >> OWNER_SHIFT
            if o != last:
                if n and res is not None:
                    self._count(res, last, sign * n)
                ep[o] = ep.get(o, 0) + 1
                last = o
                n = 0
            n += 1
        if n and res is not None:
            self._count(res, last, sign * n)

    def _count(self, res: Residency, owner: int, delta: int) -> None:
        res.epochs[owner] = res.epochs.get(owner, 0) + 1
        res.changes += 1
        held = self.held
        before = held.get(owner, 0)
        after = before + delta
        if after:
            held[owner] = after
        else:
            del held[owner]
        if not before:
            res.holders.setdefault(owner, set()).add(self.tier)
        elif not after:
            res.holders[owner].discard(self.tier)

    def leading(self, held: Container[int], chain: Sequence[int]) -> int:
        """``leading_run(held, chain)``, the part over the chain's first owner's chunks remembered.
        A remembered run of ``n`` chunks applies to any chain whose chunk ``n - 1`` is the run's
        last, since a chunk id is equal only when its whole prefix is."""
        if not chain:
            return 0
        first = chain[0]
        owner = first >> OWNER_SHIFT
        epoch = self.epochs.get(owner, 0)
        memo = self.runs.get(first)
        if memo is not None and memo[0] == epoch and memo[1] <= len(chain) and chain[memo[1] - 1] == memo[2]:
            run = memo[1]
        else:
            run = 0
            for c in chain:
                if c >> OWNER_SHIFT != owner or c not in held:
                    break
                run += 1
            if run == 0:
                return 0
            self.runs[first] = (epoch, run, chain[run - 1])
        return run + leading_run(held, chain, run)


Evictor = Callable[[OrderedDict[int, None], int], list[int]]
"""Called as ``evictor(lru, n)``: ``n`` idle chunks to evict (``lru`` is oldest first and holds at
least ``n``); the simulator binds its eviction policy (``coda.policy.eviction``) to its sessions."""


class IdleRuns:
    """A pool's idle chunks in LRU order, as runs of one owner's chunks: a released request's
    chain joins the LRU at once, so its session's chunks lie together, and a policy that reads the
    LRU by owner (tool-aware reclaim) walks a window run by run instead of chunk by chunk. The runs
    are kept as the LRU changes (chunks join at its tail, leave anywhere); a run is any stretch of
    one owner's chunks, not necessarily the longest."""

    __slots__ = ("runs", "run_of", "size", "_next")

    def __init__(self) -> None:
        # run id -> (owner, its chunks in LRU order); runs in LRU order
        self.runs: OrderedDict[int, tuple[int, dict[int, None]]] = OrderedDict()
        self.run_of: dict[int, int] = {}
        self.size = 0
        self._next = 0

    def extend(self, chunks: Sequence[int]) -> None:
        """Chunks joined the LRU's tail, in this order."""
        runs, run_of = self.runs, self.run_of
        if runs:
            rid = next(reversed(runs))
            owner, cur = runs[rid]
        else:
            rid, owner, cur = -1, -1, {}
        for c in chunks:
            o = c >> OWNER_SHIFT
            if o != owner:
                rid = self._next
                self._next += 1
                owner, cur = o, {}
                runs[rid] = (o, cur)
            cur[c] = None
            run_of[c] = rid
        self.size += len(chunks)

    def remove(self, chunks: Iterable[int]) -> None:
        """Chunks left the LRU."""
        runs, run_of = self.runs, self.run_of
        n = 0
        for c in chunks:
            rid = run_of.pop(c)
            cur = runs[rid][1]
            del cur[c]
            if not cur:
                del runs[rid]
            n += 1
        self.size -= n

    def __iter__(self) -> Iterator[tuple[int, dict[int, None]]]:
        """``(owner, its chunks)`` per run, in LRU order."""
        return iter(self.runs.values())

    def __len__(self) -> int:
        return self.size


RunEvictor = Callable[[IdleRuns, int], list[int]]
"""Called as ``evictor(runs, n)``: ``n`` idle chunks to evict, read from the LRU's runs."""


class HbmPool:
    """One worker's HBM KV: hashed chunks (refcounted; ref 0 = cached and evictable, kept in LRU
    order) plus private chunks (partial tails and decode growth not yet hashed). Without an
    evictor, the least recently used idle chunks go first."""

    __slots__ = ("worker", "capacity", "resident", "lru", "private", "versions", "listener", "evictor", "prefix_runs", "idle_runs",
                 "run_evictor")

    def __init__(
        self,
        worker: int,
        capacity: int,
        versions: Versions,
        listener: KVListener | None = None,
        evictor: Evictor | None = None,
        residency: Residency | None = None,
        run_evictor: RunEvictor | None = None,
    ) -> None:
        """``run_evictor``, where given, chooses instead of ``evictor`` from the LRU's runs, which the
        pool then keeps (``IdleRuns``)."""
        if capacity <= 0:
            raise ValueError("HBM capacity must be at least one chunk")
        self.worker = worker
        self.capacity = capacity
        self.resident: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.private = 0
        self.versions = versions
        self.listener = listener
        self.evictor = evictor
        self.prefix_runs = PrefixRuns(residency, self)
        self.run_evictor = run_evictor
        self.idle_runs = IdleRuns() if run_evictor is not None else None

    @property
    def used(self) -> int:
        return len(self.resident) + self.private

    @property
    def free(self) -> int:
        return self.capacity - len(self.resident) - self.private

    @property
    def reclaimable(self) -> int:
        return self.free + len(self.lru)

    def leading(self, chain: Sequence[int]) -> int:
        """Chunks of ``chain`` resident in a row (what a router's prefix match reads)."""
        return self.prefix_runs.leading(self.resident, chain)

    def leading_hits(self, chain: Sequence[int], start: int = 0) -> tuple[int, int]:
        """(chunks of ``chain[start:]`` resident in a row, how many of those are evictable)."""
        res = self.resident
        n = idle = 0
        for i in range(start, len(chain)):
            r = res.get(chain[i])
            if r is None:
                break
            n += 1
            idle += r == 0
        return n, idle

    def acquire(self, chunks: Sequence[int]) -> None:
        """Reference resident chunks (prefix hits); idle ones leave the LRU."""
        res, lru = self.resident, self.lru
        woke = []
        for c in chunks:
            r = res[c]
            if r == 0:
                del lru[c]
                woke.append(c)
            res[c] = r + 1
        if woke:
            self.versions.bump(woke)
            if self.idle_runs is not None:
                self.idle_runs.remove(woke)

    def evict(self, n: int) -> list[int]:
        """Evict ``n`` idle chunks (LRU order, or the evictor's choice); returns their ids."""
        res, lru = self.resident, self.lru
        n = min(n, len(lru))
        if n == 0 or (self.evictor is None and self.run_evictor is None):
            out = []
            for _ in range(n):
                c = lru.popitem(last=False)[0]
                del res[c]
                out.append(c)
        else:
            out = self.run_evictor(self.idle_runs, n) if self.run_evictor is not None else self.evictor(lru, n)  # type: ignore[arg-type,misc]
            for c in out:
                del lru[c]
                del res[c]
        if out and self.idle_runs is not None:
            self.idle_runs.remove(out)
        if out:
            self.versions.bump(out)
            self.prefix_runs.moved(out, -1)
            if self.listener:
                self.listener("removed", self.worker, "hbm", out)
        return out

    def make_room(self, n: int) -> list[int]:
        """Evict what it takes to have ``n`` free chunks (caller checked ``reclaimable``)."""
        short = n - self.free
        return self.evict(short) if short > 0 else []

    def insert(self, chunks: Sequence[int]) -> None:
        """Reference chunks being filled (room must have been made); ones already resident are shared."""
        res, lru = self.resident, self.lru
        new = []
        woke = []
        for c in chunks:
            r = res.get(c)
            if r is None:
                res[c] = 1
                new.append(c)
            else:
                if r == 0:
                    del lru[c]
                    woke.append(c)
                res[c] = r + 1
        if chunks:
            self.versions.bump(chunks)
        if woke and self.idle_runs is not None:
            self.idle_runs.remove(woke)
        if new:
            self.prefix_runs.moved(new, 1)
            if self.listener:
                self.listener("stored", self.worker, "hbm", new)
        assert self.used <= self.capacity, "HBM over capacity"

    def release(self, chunks: Sequence[int]) -> None:
        """Drop one reference per chunk; idle chunks join the LRU tail-first (evicted first)."""
        res, lru = self.resident, self.lru
        idle = []
        for c in reversed(chunks):
            r = res[c] - 1
            res[c] = r
            if r == 0:
                lru[c] = None
                idle.append(c)
        if idle:
            self.versions.bump(idle)
            if self.idle_runs is not None:
                self.idle_runs.extend(idle)

    def discard(self, chunks: Sequence[int]) -> None:
        """Release and remove chunks whose content was never computed (a preempted prefill)."""
        res = self.resident
        gone = []
        for c in chunks:
            r = res[c] - 1
            if r == 0:
                del res[c]
                gone.append(c)
            else:
                res[c] = r
        if gone:
            self.versions.bump(gone)
            self.prefix_runs.moved(gone, -1)
            if self.listener:
                self.listener("removed", self.worker, "hbm", gone)


class KVStore:
    """An LRU chunk store (DRAM or SSD) with a capacity in chunks; evictions spill to ``lower``."""

    __slots__ = ("name", "node", "capacity", "chunks", "lower", "versions", "listener", "prefix_runs")

    def __init__(
        self,
        name: str,
        node: int,
        capacity: int,
        versions: Versions,
        lower: KVStore | None = None,
        listener: KVListener | None = None,
        residency: Residency | None = None,
    ) -> None:
        self.name = name
        self.node = node
        self.capacity = capacity
        self.chunks: OrderedDict[int, None] = OrderedDict()
        self.lower = lower
        self.versions = versions
        self.listener = listener
        self.prefix_runs = PrefixRuns(residency, self)

    def __contains__(self, c: int) -> bool:
        return c in self.chunks

    def __len__(self) -> int:
        return len(self.chunks)

    def leading(self, chain: Sequence[int], start: int) -> int:
        """Chunks of ``chain[start:]`` held in a row; from the start, with its shared prefix remembered."""
        return self.prefix_runs.leading(self.chunks, chain) if start == 0 else leading_run(self.chunks, chain, start)

    def touch(self, chain: Sequence[int]) -> None:
        move = self.chunks.move_to_end
        for c in chain:
            move(c)

    def put(self, chain: Sequence[int]) -> None:
        """Store chunks (already-present ones are refreshed); LRU chunks spill to the lower tier."""
        if self.capacity <= 0:
            return
        chunks = self.chunks
        new = []
        for c in chain:
            if c in chunks:
                chunks.move_to_end(c)
            else:
                chunks[c] = None
                new.append(c)
        if not new:
            return
        self.versions.bump(new)
        self.prefix_runs.moved(new, 1)
        if self.listener:
            self.listener("stored", self.node, self.name, new)
        over = len(chunks) - self.capacity
        if over > 0:
            evicted = [chunks.popitem(last=False)[0] for _ in range(over)]
            self.versions.bump(evicted)
            self.prefix_runs.moved(evicted, -1)
            if self.listener:
                self.listener("removed", self.node, self.name, evicted)
            if self.lower is not None:
                self.lower.put(evicted)
