"""Simulator configuration (pydantic): CLI flags and YAML/TOML config files map onto it."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError

from coda.errors import CodaError, invalid, reading
from coda.policy.spec import PoliciesOverride, TenantSpec


class SloConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ttft_s: PositiveFloat = Field(5.0, description="time-to-first-token SLO per request")
    tbt_s: PositiveFloat = Field(0.1, description="SLO on each request's mean inter-token gap")


class SimConfig(BaseModel):
    """Everything that defines a simulation besides the workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str = "vllm"
    workers: PositiveInt = Field(1, le=4096, description="simulated engines (at most 4,096: each holds its KV tiers' arrays)")
    seed: int = 0
    profile: str = "a100-qwen3coder30b-fp8-calibrated"
    chunk_tokens: PositiveInt = Field(256, description="KV bookkeeping granularity in tokens (an engine's block_size)")
    max_num_seqs: PositiveInt = 256
    max_num_batched_tokens: PositiveInt = 8192
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
    hbm_kv_gib: PositiveFloat | None = None
    dram_kv_gib: float | None = Field(None, ge=0)
    ssd_kv_gib: float | None = Field(None, ge=0)
    decode_run_max: PositiveInt = Field(1024, description="longest run of pure-decode steps advanced at once")
    sample_every_s: PositiveFloat = Field(10.0, description="occupancy time-series sampling period")
    policies: PoliciesOverride | None = Field(None, description="the system's policies block with these kinds laid over it "
                                              "(ingress, router, state, execution, eviction; each {name, params, shadow})")
    indexer: bool = Field(False, description="routers match prefixes through a KV indexer fed by the pools' block events (as the gateway does)")
    tenants: dict[str, TenantSpec] = Field(default_factory=dict, description="tenant weights and deadlines for the ingress policies")

    def with_overrides(self, **kw: Any) -> SimConfig:
        """A copy with the given non-None fields replaced (CLI flags over a config file); a
        ``policies`` override is laid over this config's own, kind by kind."""
        data = self.model_dump(exclude_unset=True)
        policies = kw.pop("policies", None)
        data.update({k: v for k, v in kw.items() if v is not None})
        cfg = validate_config(data, "command line")
        if policies is not None:
            over = policies if isinstance(policies, PoliciesOverride) else PoliciesOverride.model_validate(policies)
            cfg = cfg.model_copy(update={"policies": (cfg.policies or PoliciesOverride()).then(over)})
        return cfg


def validate_config(data: dict[str, Any], source: str) -> SimConfig:
    try:
        return SimConfig.model_validate(data)
    except ValidationError as err:
        raise invalid(source, err, show_input=True) from None


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or TOML config file into a dict (validated by the caller)."""
    path = Path(path)
    if not path.exists():
        raise CodaError(f"config {path}: no such file")
    with reading(path, "config"):
        text = path.read_text()
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as err:
        raise CodaError(f"config {path}: not valid {'TOML' if path.suffix == '.toml' else 'YAML'}: {err}".splitlines()[0]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CodaError(f"config {path}: the top level must be a mapping of option names to values")
    return data
