"""System presets: a named ``policies`` block plus the KV tiers the system runs with.

Any router combines with any admission policy from config (``policies: {router: ...}`` over a
preset), so a mix needs no new preset; these name the systems the evaluation compares. A preset's
block is data written as a user would write it; ``coda.policy.spec`` checks it with the user's
block laid over it, when a configuration loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coda.errors import CodaError

#: what a block means where it names nothing: vLLM's own behaviour, kind by kind
BASELINE: dict[str, Any] = {"ingress": "admit_all", "router": "round_robin", "state": "fifo", "execution": "full", "eviction": "lru"}


@dataclass(frozen=True, slots=True)
class SystemPreset:
    name: str
    description: str
    policies: dict[str, Any]
    # the Coda paper's serving setup: a DRAM KV store written as blocks complete (CPU-shadow), no SSD
    dram: bool = True
    ssd: bool = False
    cpu_shadow: bool = True

    def tiers_text(self) -> str:
        parts = ["HBM", "DRAM" if self.dram else None, "SSD" if self.ssd else None]
        return f"{' + '.join(p for p in parts if p)}; CPU-shadow {'on' if self.cpu_shadow else 'off'}"


def _preset(name: str, router: str, state: str, execution: str, eviction: str, description: str,
            state_params: dict[str, Any] | None = None) -> SystemPreset:
    block = {**BASELINE, "router": router, "state": {"name": state, "params": state_params or {}}, "execution": execution,
             "eviction": eviction}
    return SystemPreset(name, description, block)


SYSTEMS: dict[str, SystemPreset] = {
    p.name: p
    for p in (
        _preset(
            "vllm",
            "round_robin",
            "fifo",
            "full",
            "lru",
            "vLLM with prefix caching and a CPU KV store written as blocks complete (as vLLM's offloading connector or LMCache do): "
            "round-robin routing, FCFS admission, one attention launch",
        ),
        _preset(
            "vllm+ta",
            "round_robin",
            "tiered_aging",
            "full",
            "lru",
            "vLLM with Coda's Tiered-Aging order of its waiting queue and nothing else changed "
            "(what --scheduler-cls coda.integrations.vllm.scheduler.CodaScheduler runs)",
        ),
        _preset("smetric", "smetric", "fifo", "full", "lru", "session affinity with a load guard (SMetric) in front of vLLM-like workers"),
        _preset(
            "dynamo",
            "dynamo_kv",
            "fifo",
            "full",
            "lru",
            "NVIDIA Dynamo's KV-aware router (w * prefill_blocks + decode_blocks, host/disk hit credits) in front of vLLM-like workers",
        ),
        _preset(
            "cachewise",
            "least_loaded",
            "fewest_blocks",
            "full",
            "tool_aware",
            "CacheWise-style: least-loaded routing, fewest-additional-blocks admission, tool-aware HBM reclaim with CPU-shadow",
        ),
        _preset(
            "cachewise+ta",
            "least_loaded",
            "tiered_aging",
            "full",
            "tool_aware",
            "CacheWise with Coda's Tiered-Aging state admission instead of fewest-blocks",
        ),
        _preset(
            "coda",
            "context_compatible",
            "tiered_aging",
            "cohort",
            "tool_aware",
            "Coda: compatibility-aware routing over SMetric affinity, Tiered-Aging, cohorts, tool-aware reclaim",
        ),
        # tau and W_max chosen on one M3 seed, evaluated on others (docs/evaluation.md, "Throughput against the tail")
        _preset(
            "coda-tail",
            "context_compatible",
            "tiered_aging",
            "cohort",
            "tool_aware",
            "Coda with Tiered-Aging set for throughput and the tail: the state cost aged with tau 60 s, asked for every admission "
            "slot, the oldest feasible request first after 1,800 s",
            state_params={"tau_s": 60.0, "w_max_s": 1800.0, "admission": "every_slot"},
        ),
        _preset(
            "coda-route-only",
            "context_compatible",
            "fifo",
            "full",
            "lru",
            "ablation: Coda's router with vLLM's engine (FCFS, one launch, LRU)",
        ),
        _preset(
            "coda-admit-only",
            "smetric",
            "tiered_aging",
            "cohort",
            "tool_aware",
            "ablation: Coda's engine admission behind the SMetric router",
        ),
    )
}


#: the system every shell starts from when a configuration names none: Coda's own mechanisms
DEFAULT_SYSTEM = "coda"


def system_preset(name: str) -> SystemPreset:
    preset = SYSTEMS.get(name)
    if preset is None:
        raise CodaError(f"unknown system {name!r}; valid: {', '.join(sorted(SYSTEMS))}")
    return preset

