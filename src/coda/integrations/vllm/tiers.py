"""The external KV tiers of a waiting request: how much of its prefix a KV connector holds beyond
the GPU prefix cache, read from the connector's scheduler-side store without side effects.

vLLM asks a connector ``get_num_new_matched_tokens`` only for the request it is about to admit,
and that call is not a probe: it schedules loads, records lookup metrics and events, and (in
tiered stores) starts promotions. State admission must cost every candidate of its frontier, so
it reads the store directly, as it reads the GPU prefix cache with ``find_longest_cache_hit``
rather than ``get_computed_blocks``.

Supported: vLLM's ``OffloadingConnector`` whose scheduler-side manager is its
``CPUOffloadingManager`` (the ``CPUOffloadingSpec`` on a GPU, Coda's ``HostOffloadingSpec`` on
vLLM-CPU): host memory, so every hit is DRAM. Its lookup is a dictionary read of the store's
cache policy. Any other connector (LMCache, Mooncake, NIXL, the tiering spec, the example
connectors) is read as holding nothing, and the startup line says so: their lookups have side
effects or go to another process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol


class ExternalProbe(Protocol):
    #: what the startup line and the trace call it
    name: str

    def tokens(self, request: Any, hbm_tokens: int) -> tuple[int, int]:
        """(DRAM tokens, SSD tokens) of the request's prefix held beyond its first ``hbm_tokens``."""
        ...

    def still_valid(self, request: Any, hbm_tokens: int, dram_tokens: int) -> bool:
        """Whether a cached answer still holds: its last chunk is still there and the next one still is not."""
        ...


class NoTiers:
    """No connector, an unsupported one, or tiers switched off: nothing beyond HBM is observed."""

    def __init__(self, name: str) -> None:
        self.name = name

    def tokens(self, request: Any, hbm_tokens: int) -> tuple[int, int]:
        return 0, 0

    def still_valid(self, request: Any, hbm_tokens: int, dram_tokens: int) -> bool:
        return True


class ChunkGroup(NamedTuple):
    """A full-attention KV cache group as the offloading connector keys it."""

    group_idx: int
    tokens_per_chunk: int
    hashes_per_chunk: int


class OffloadedPrefix:
    """The leading run of a request's chunks in an ``OffloadingConnector``'s CPU store.

    Chunks are keyed as the connector keys them (``make_offload_key`` of the chunk's last block
    hash and its group); a chunk whose store is still in flight counts (the connector waits for
    it rather than recompute). With several full-attention groups the shortest run counts, as
    the connector loads only what every group holds.
    """

    def __init__(self, manager: Any, groups: Sequence[ChunkGroup], make_key: Any, hit_results: frozenset[Any]) -> None:
        self.name = f"OffloadingConnector ({type(manager).__name__}: DRAM)"
        self._lookup = manager.lookup
        self._groups = tuple(groups)
        self._key = make_key
        self._hit = hit_results

    def _held(self, hashes: Sequence[bytes], g: ChunkGroup, chunk: int) -> bool:
        return self._lookup(self._key(hashes[(chunk + 1) * g.hashes_per_chunk - 1], g.group_idx), None) in self._hit

    def tokens(self, request: Any, hbm_tokens: int) -> tuple[int, int]:
        hashes = request.block_hashes
        limit = request.num_tokens - 1  # the last token is always computed
        end = limit
        for g in self._groups:
            t = g.tokens_per_chunk
            last = min(limit // t, len(hashes) // g.hashes_per_chunk)
            chunk = hbm_tokens // t
            while chunk < last and self._held(hashes, g, chunk):
                chunk += 1
            end = min(end, chunk * t)
        return max(0, end - hbm_tokens), 0

    def still_valid(self, request: Any, hbm_tokens: int, dram_tokens: int) -> bool:
        hashes = request.block_hashes
        limit = request.num_tokens - 1
        end = hbm_tokens + dram_tokens
        for g in self._groups:
            t = g.tokens_per_chunk
            if end % t:
                return False
            n, last = end // t, min(limit // t, len(hashes) // g.hashes_per_chunk)
            if dram_tokens and not self._held(hashes, g, n - 1):
                return False
            if n < last and self._held(hashes, g, n):
                return False
        return True


def probe_for(connector: Any) -> ExternalProbe:
    """The probe of the scheduler's KV connector (``Scheduler.connector``; ``None`` without one)."""
    if connector is None:
        return NoTiers("none (no KV connector)")
    kind = type(connector).__name__
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
        from vllm.v1.kv_offload.base import LookupResult, make_offload_key
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    except ImportError:  # pragma: no cover - a vLLM without the offloading connector
        return NoTiers(f"{kind}: not observed (no offloading connector in this vLLM)")
    if not isinstance(connector, OffloadingConnector):
        return NoTiers(f"{kind}: not observed (no side-effect-free lookup)")
    sched = connector.connector_scheduler
    manager = getattr(sched, "manager", None)
    if not isinstance(manager, CPUOffloadingManager):
        return NoTiers(f"{kind} with {type(manager).__name__}: not observed (its lookup has side effects)")
    groups = [ChunkGroup(g.group_idx, g.tokens_per_chunk, g.hashes_per_chunk)
              for g in sched.config.kv_group_configs if g.sliding_window_size_in_chunks is None]
    if not groups:
        return NoTiers(f"{kind}: not observed (no full-attention group)")
    return OffloadedPrefix(manager, groups, make_offload_key, frozenset({LookupResult.HIT, LookupResult.HIT_PENDING}))
