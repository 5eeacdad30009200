"""Simulator configuration: CLI flags and YAML/TOML config files map onto it (``coda.config``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, PositiveFloat, PositiveInt

from coda.config.load import layered, validated
from coda.policy.spec import PoliciesConfig, TenantSpec
from coda.strict import StrictModel


class SloConfig(StrictModel):
    ttft_s: PositiveFloat = Field(5.0, description="time-to-first-token SLO per request")
    tbt_s: PositiveFloat = Field(0.1, description="SLO on each request's mean inter-token gap")


class SimConfig(PoliciesConfig):
    """Everything that defines a simulation besides the workload."""

    workers: PositiveInt = Field(1, le=4096, description="simulated engines (at most 4,096: each holds its KV tiers' arrays)")
    seed: int = 0
    profile: str = "a100-qwen3coder30b-fp8-calibrated"
    chunk_tokens: PositiveInt = Field(256, description="KV bookkeeping granularity in tokens (an engine's block_size)")
    max_num_seqs: PositiveInt = 256
    max_num_batched_tokens: PositiveInt = 8192
    data_parallel_size: PositiveInt = Field(
        1, description="ranks per data-parallel group: consecutive workers form a group (workers must be a multiple)"
    )
    enable_expert_parallel: bool = Field(
        False, description="a group's ranks hold experts / ranks whole experts each and step in lockstep (an MoE profile at TP 1)"
    )
    # Engine KV capacity (None = the profile's): a block count as vLLM logs it, or vLLM's
    # gpu_memory_utilization share of the profile GPU's memory less the weights on a rank.
    num_gpu_blocks: PositiveInt | None = Field(None, description="HBM KV blocks of chunk_tokens tokens per worker, as the engine reports")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="HBM KV = this share of GPU memory minus the weights")
    warmup_s: float | None = Field(None, ge=0, description="excluded from metrics; default a third of the arrival window")
    drain_s: float | None = Field(None, ge=0, description="time allowed after the window for its requests to finish; default the window")
    slo: SloConfig = SloConfig()
    # Tier overrides (None = the system preset's choice).
    dram: bool | None = None
    ssd: bool | None = None
    cpu_shadow: bool | None = None
    per_worker_tiers: bool = Field(False, description="each worker gets its own DRAM/SSD store instead of sharing a node's")
    # sizes are finite: each sizes a tier's arrays
    hbm_kv_gib: PositiveFloat | None = Field(None, allow_inf_nan=False)
    dram_kv_gib: float | None = Field(None, ge=0, allow_inf_nan=False)
    ssd_kv_gib: float | None = Field(None, ge=0, allow_inf_nan=False)
    decode_run_max: PositiveInt = Field(1024, description="longest run of pure-decode steps advanced at once")
    sample_every_s: PositiveFloat = Field(10.0, description="occupancy time-series sampling period")
    indexer: bool = Field(
        False, description="routers match prefixes through a KV indexer fed by the pools' block events (as the gateway does)"
    )
    tenants: dict[str, TenantSpec] = Field(default_factory=dict, description="tenant weights and deadlines for the ingress policies")

    def with_overrides(self, **kw: Any) -> SimConfig:
        """A copy with the given non-None fields laid over this one (CLI flags over a config file,
        with the layering rules of ``coda.config.load``)."""
        given = {k: v for k, v in kw.items() if v is not None}
        return validated(SimConfig, layered(self.model_dump(exclude_unset=True), given), "command line", show_input=True)
