"""KV tier sizes of a simulated cluster: HBM per worker (a block count, vLLM's
``gpu_memory_utilization`` rule, a size, or the profile's), and the DRAM and SSD stores a node's
workers share (or each worker's own share), as the system preset and the configuration choose."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coda.cost.profile import GiB, Profile
from coda.errors import CodaError
from coda.policy.presets import SystemPreset
from coda.sim.config import SimConfig


@dataclass(frozen=True, slots=True)
class Tiers:
    dram: bool
    ssd: bool
    cpu_shadow: bool
    hbm_chunks: int
    dram_chunks: int
    ssd_chunks: int
    per_worker: bool

    def describe(self) -> dict[str, Any]:
        return {
            "dram": self.dram,
            "ssd": self.ssd,
            "cpu_shadow": self.cpu_shadow,
            "per_worker_stores": self.per_worker,
            "hbm_chunks_per_worker": self.hbm_chunks,
            "dram_chunks_per_store": self.dram_chunks,
            "ssd_chunks_per_store": self.ssd_chunks,
        }


def engine_kv_bytes(config: SimConfig, profile: Profile, chunk_bytes: int) -> float:
    """HBM KV bytes per worker: a block count, vLLM's gpu_memory_utilization rule, a size, or the profile's."""
    given = [k for k in ("num_gpu_blocks", "gpu_memory_utilization", "hbm_kv_gib") if getattr(config, k) is not None]
    if len(given) > 1:
        raise CodaError(f"{' and '.join(given)} both size the HBM KV; give one of them")
    if config.num_gpu_blocks is not None:  # vLLM counts its null block (block 0, never allocated) among them
        return float((config.num_gpu_blocks - 1) * chunk_bytes)
    if config.gpu_memory_utilization is not None:
        memory, weights = profile.device_memory_bytes(), profile.weight_bytes_per_rank()
        if memory is None or weights is None:
            raise CodaError(f"gpu_memory_utilization: profile {profile.name} states no GPU memory or weights; give num_gpu_blocks instead")
        kv = config.gpu_memory_utilization * memory - weights
        if kv <= 0:
            raise CodaError(
                f"gpu_memory_utilization={config.gpu_memory_utilization:g} leaves no KV memory "
                f"after {weights / GiB:.1f} GiB of weights; raise it"
            )
        return kv
    return config.hbm_kv_gib * GiB if config.hbm_kv_gib is not None else profile.tiers.hbm_kv_bytes


def resolve_tiers(config: SimConfig, preset: SystemPreset, profile: Profile, chunk_bytes: int) -> Tiers:
    """Tier sizes in chunks from the profile, the preset's tier choice and the config's overrides."""
    t = profile.tiers
    hbm = engine_kv_bytes(config, profile, chunk_bytes)
    dram_on = preset.dram if config.dram is None else config.dram
    ssd_on = preset.ssd if config.ssd is None else config.ssd
    dram = (config.dram_kv_gib * GiB) if config.dram_kv_gib is not None else t.dram_kv_bytes
    ssd = (config.ssd_kv_gib * GiB) if config.ssd_kv_gib is not None else t.ssd_kv_bytes
    per = config.per_worker_tiers
    if per:  # a node's store split among its workers
        dram /= t.workers_per_node
        ssd /= t.workers_per_node
    hbm_chunks = int(hbm // chunk_bytes)
    if hbm_chunks < 1:
        raise CodaError(
            f"HBM KV of {hbm / GiB:.3g} GiB holds no {chunk_bytes / 2**20:.3g} MiB chunk; raise hbm_kv_gib or lower chunk_tokens"
        )
    return Tiers(
        dram=dram_on,
        ssd=ssd_on and dram_on,
        cpu_shadow=(preset.cpu_shadow if config.cpu_shadow is None else config.cpu_shadow) and dram_on,
        hbm_chunks=hbm_chunks,
        dram_chunks=int(dram // chunk_bytes) if dram_on else 0,
        ssd_chunks=int(ssd // chunk_bytes) if ssd_on and dram_on else 0,
        per_worker=per,
    )
