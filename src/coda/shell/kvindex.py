"""KV indexer: which prefix-hash blocks are resident where, fed by block stored/removed events.

Used by routers in the simulator (events from the simulated pools) and in the gateway (events
from vLLM or the fake engine). A *location* is one KV tier instance: ``hbm:<worker>``,
``dram:<store>``, ``ssd:<store>``. Each block hash maps to a bitmask of the locations holding
it (a Python int, so any number of locations), so matching a request costs one dictionary lookup
per block of its resident prefix (in C, stopping at the first block resident nowhere), whatever
the number of workers; one numpy pass over the masks as 64-bit words then turns them into a
bitset per location, and a run from any offset is a trailing-ones count.

``BlockHasher`` computes a session's block hashes incrementally: a prompt that extends the
previous one only hashes its new blocks.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat, takewhile

import numpy as np

from coda.policy.snapshots import PrefixMatch

MASK63 = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class WorkerTiers:
    """The locations a worker can load a prefix from: its HBM, then its node's DRAM and SSD stores."""

    worker: int
    hbm: str
    dram: str | None = None
    ssd: str | None = None


class KVIndexer:
    """Block residency by location, with bounded memory: locations that stop reporting are dropped."""

    def __init__(self, max_locations: int = 62) -> None:
        self._mask: dict[int, int] = {}
        self._bit: dict[str, int] = {}
        self._blocks: dict[str, set[int]] = {}
        self._last_seen: dict[str, float] = {}
        self._free_bits = list(range(max_locations - 1, -1, -1))
        self._mask_bytes = 8  # whole 64-bit words covering every bit handed out so far

    # --- events ----------------------------------------------------------------------------
    def _location(self, loc: str, now: float | None) -> int:
        bit = self._bit.get(loc)
        if bit is None:
            if not self._free_bits:
                raise RuntimeError(f"KV indexer: more than {len(self._bit)} locations; raise max_locations")
            bit = self._bit[loc] = self._free_bits.pop()
            self._blocks[loc] = set()
            self._mask_bytes = max(self._mask_bytes, 8 * (bit // 64 + 1))
        if now is not None:
            self._last_seen[loc] = now
        return 1 << bit

    def stored(self, loc: str, hashes: Iterable[int], now: float | None = None) -> None:
        flag = self._location(loc, now)
        mask = self._mask
        blocks = self._blocks[loc]
        for h in hashes:
            mask[h] = mask.get(h, 0) | flag
            blocks.add(h)

    def removed(self, loc: str, hashes: Iterable[int], now: float | None = None) -> None:
        flag = self._location(loc, now)
        mask = self._mask
        blocks = self._blocks[loc]
        for h in hashes:
            m = mask.get(h, 0) & ~flag
            if m:
                mask[h] = m
            else:
                mask.pop(h, None)
            blocks.discard(h)

    def cleared(self, loc: str) -> None:
        """Forget a location (``AllBlocksCleared``, a restarted engine, a stale worker)."""
        if loc not in self._bit:
            return
        self.removed(loc, list(self._blocks[loc]))
        self._free_bits.append(self._bit.pop(loc))
        del self._blocks[loc]
        self._last_seen.pop(loc, None)

    def evict_stale(self, now: float, max_age_s: float) -> list[str]:
        """Drop locations with no event for ``max_age_s``; returns their names."""
        stale = [loc for loc, t in self._last_seen.items() if now - t > max_age_s]
        for loc in stale:
            self.cleared(loc)
        return stale

    def blocks(self, loc: str) -> int:
        return len(self._blocks.get(loc, ()))

    @property
    def locations(self) -> list[str]:
        return sorted(self._bit)

    # --- queries ---------------------------------------------------------------------------
    def match(self, hashes: Sequence[int], workers: Sequence[WorkerTiers]) -> dict[int, PrefixMatch]:
        """For each worker: the request's leading blocks in its HBM, then continuing in its DRAM
        store, then on its SSD store."""
        get = self._mask.get
        masks = list(takewhile(bool, map(get, hashes, repeat(0))))
        locs = sorted({loc for w in workers for loc in (w.hbm, w.dram, w.ssd) if loc is not None and loc in self._bit})
        # per location, the request's blocks it holds as one Python int (bit i = block i), so a
        # run from any offset is a trailing-ones count on a shifted int
        held_by: dict[str | None, int] = {}
        if locs and masks:
            size = self._mask_bytes
            words = np.frombuffer(b"".join(m.to_bytes(size, "little") for m in masks), dtype="<u8").reshape(len(masks), size // 8)
            bits = np.array([self._bit[loc] for loc in locs], dtype=np.uint64)
            held = ((words[:, bits // np.uint64(64)] >> (bits % np.uint64(64))) & np.uint64(1)).astype(np.uint8)
            packed = np.packbits(held.T, axis=1, bitorder="little")
            held_by = {loc: int.from_bytes(row.tobytes(), "little") for loc, row in zip(locs, packed)}

        def run(loc: str | None, start: int) -> int:
            x = held_by.get(loc, 0) >> start
            return (x ^ (x + 1)).bit_length() - 1

        out: dict[int, PrefixMatch] = {}
        for w in workers:
            h = run(w.hbm, 0)
            d = run(w.dram, h)
            out[w.worker] = PrefixMatch(h, d, run(w.ssd, h + d))
        return out


class BlockHasher:
    """Chained block hashes of one session's token stream, computed incrementally.

    The hash of a full block depends on its parent's hash and its tokens, so equal hashes mean
    equal prefixes. ``update(tokens)`` reuses the hashes of the longest previously hashed prefix
    that ``tokens`` still starts with (the agent loop re-sends its context, so that is usually
    all of it) and hashes only the new full blocks.
    """

    __slots__ = ("block_size", "_tokens", "_hashes", "_seed")

    def __init__(self, block_size: int, seed: int = 0) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self._tokens: Sequence[int] = array("q")
        self._hashes = array("q")
        self._seed = seed

    @property
    def nbytes(self) -> int:
        """Memory held for the session (its last prompt and block hashes), for the gateway's budget."""
        return sys.getsizeof(self._tokens) + sys.getsizeof(self._hashes)

    def update(self, tokens: Sequence[int]) -> list[int]:
        B = self.block_size
        keep = min(len(self._hashes), len(tokens) // B)
        old, new = self._tokens, _packed(tokens)
        # longest reusable block prefix: compare whole blocks at C speed (a packing mismatch reads as different)
        if keep and new[: keep * B] != old[: keep * B]:
            lo, hi = 0, keep
            while lo < hi:  # binary search the first differing block
                mid = (lo + hi + 1) // 2
                if new[: mid * B] == old[: mid * B]:
                    lo = mid
                else:
                    hi = mid - 1
            keep = lo
        hashes = self._hashes[:keep]
        parent = hashes[-1] if hashes else self._seed
        for i in range(keep, len(tokens) // B):
            parent = hash((parent, *tokens[i * B : (i + 1) * B])) & MASK63
            hashes.append(parent)
        self._tokens = new
        self._hashes = hashes
        return list(hashes)


def _packed(tokens: Sequence[int]) -> Sequence[int]:
    """Token ids as 8-byte machine integers (a Python int in a list costs about 36 bytes): what a
    session keeps between requests. Values outside 64 bits stay a list."""
    for code in ("q", "Q"):
        try:
            return array(code, tokens)
        except OverflowError:
            continue
    return list(tokens)
