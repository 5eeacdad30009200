"""One registry for every policy and system preset; unknown names fail with the valid ones."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from coda.cost.model import CostModel
from coda.errors import CodaError
from coda.policy.execution import Cohort, ExecutionPolicy, FullBatch
from coda.policy.routing import CodaRouter, DynamoKV, LeastLoaded, RoundRobin, Router, SMetric
from coda.policy.state import FewestBlocks, Fifo, StatePolicy, TieredAging

StateFactory = Callable[[CostModel, dict[str, Any]], StatePolicy]
ExecutionFactory = Callable[[CostModel, dict[str, Any]], ExecutionPolicy]
RouterFactory = Callable[[dict[str, Any]], Router]




def with_params(cls: type, params: dict[str, Any], kind: str, **fixed: Any) -> Any:
    """Build a policy dataclass from user parameters; unknown or ill-typed ones name the valid fields.

    ``fixed`` are arguments Coda supplies itself (the cost model), not user parameters.
    """
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in ("name", "needs", *fixed)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise CodaError(f"{kind}: unknown parameter(s) {', '.join(unknown)}; valid: {', '.join(fields) or '(none)'}")
    for key, value in params.items():
        default = fields[key].default
        if isinstance(default, (int, float)) and not isinstance(value, (int, float)) or isinstance(value, bool) != isinstance(default, bool):
            raise CodaError(f"{kind}: parameter {key}={value!r} must be a {type(default).__name__}")
    try:
        return cls(**fixed, **params)
    except ValueError as err:
        raise CodaError(f"{kind}: {err}") from None


STATE_POLICIES: dict[str, StateFactory] = {
    "fifo": lambda cost, params: with_params(Fifo, params, "state policy fifo"),
    "fewest_blocks": lambda cost, params: with_params(FewestBlocks, params, "state policy fewest_blocks"),
    "tiered_aging": lambda cost, params: with_params(TieredAging, params, "state policy tiered_aging", cost=cost),
}
EXECUTION_POLICIES: dict[str, ExecutionFactory] = {
    "full": lambda cost, params: with_params(FullBatch, params, "execution policy full"),
    "cohort": lambda cost, params: with_params(Cohort, params, "execution policy cohort", cost=cost),
}


def _coda_router(params: dict[str, Any]) -> Router:
    params = dict(params)
    parent = with_params(SMetric, params.pop("parent", None) or {}, "router coda.parent")
    return dataclasses.replace(with_params(CodaRouter, params, "router coda"), parent=parent)


ROUTERS: dict[str, RouterFactory] = {
    "round_robin": lambda params: with_params(RoundRobin, params, "router round_robin"),
    "least_loaded": lambda params: with_params(LeastLoaded, params, "router least_loaded"),
    "smetric": lambda params: with_params(SMetric, params, "router smetric"),
    "dynamo_kv": lambda params: with_params(DynamoKV, params, "router dynamo_kv"),
    "coda": _coda_router,
}
EVICTIONS = ("lru", "tool_aware")


@dataclass(frozen=True, slots=True)
class SystemPreset:
    """A named combination of router, state admission, execution admission, eviction and tiers."""

    name: str
    router: str
    state: str
    execution: str
    eviction: Literal["lru", "tool_aware"]
    description: str
    # the paper's serving setup: a DRAM KV store written as blocks complete (CPU-shadow), no SSD
    dram: bool = True
    ssd: bool = False
    cpu_shadow: bool = True

    def tiers_text(self) -> str:
        parts = ["HBM", "DRAM" if self.dram else None, "SSD" if self.ssd else None]
        tiers = " + ".join(p for p in parts if p)
        return f"{tiers}; CPU-shadow {'on' if self.cpu_shadow else 'off'}; eviction {self.eviction}"


SYSTEMS: dict[str, SystemPreset] = {p.name: p for p in (
    SystemPreset("vllm", "round_robin", "fifo", "full", "lru",
                 "vLLM with prefix caching and a CPU KV store written as blocks complete (as vLLM's offloading connector "
                 "or LMCache do): round-robin routing, FCFS admission, one attention launch"),
    SystemPreset("smetric", "smetric", "fifo", "full", "lru",
                 "session affinity with a load guard (SMetric) in front of vLLM-like workers"),
    SystemPreset("dynamo", "dynamo_kv", "fifo", "full", "lru",
                 "NVIDIA Dynamo's KV-aware router (w * prefill_blocks + decode_blocks, host/disk hit credits) in front of vLLM-like workers"),
    SystemPreset("cachewise", "least_loaded", "fewest_blocks", "full", "tool_aware",
                 "CacheWise-style: least-loaded routing, fewest-additional-blocks admission, tool-aware HBM reclaim with CPU-shadow"),
    SystemPreset("cachewise+ta", "least_loaded", "tiered_aging", "full", "tool_aware",
                 "CacheWise with Coda's Tiered-Aging state admission instead of fewest-blocks"),
    SystemPreset("coda-single", "coda", "tiered_aging", "cohort", "tool_aware",
                 "Coda's single-worker admission layer: Tiered-Aging, Compatibility-Aware cohorts, tool-aware reclaim"),
    SystemPreset("coda", "coda", "tiered_aging", "cohort", "tool_aware",
                 "Coda: compatibility-aware routing over SMetric affinity, Tiered-Aging, cohorts, tool-aware reclaim"),
    SystemPreset("coda-route-only", "coda", "fifo", "full", "lru",
                 "ablation: Coda's router with vLLM's engine (FCFS, one launch, LRU)"),
    SystemPreset("coda-admit-only", "smetric", "tiered_aging", "cohort", "tool_aware",
                 "ablation: Coda's engine admission behind the SMetric router"),
)}


def _lookup(kind: str, name: str, table: dict[str, Any]) -> Any:
    if name not in table:
        raise CodaError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(table))}")
    return table[name]


def system_preset(name: str) -> SystemPreset:
    return _lookup("system", name, SYSTEMS)


def make_state_policy(name: str, cost: CostModel, params: dict[str, Any] | None = None) -> StatePolicy:
    return _lookup("state admission policy", name, STATE_POLICIES)(cost, params or {})


def make_execution_policy(name: str, cost: CostModel, params: dict[str, Any] | None = None) -> ExecutionPolicy:
    return _lookup("execution policy", name, EXECUTION_POLICIES)(cost, params or {})


def make_router(name: str, params: dict[str, Any] | None = None) -> Router:
    return _lookup("router", name, ROUTERS)(params or {})


# --- ingress admission ---------------------------------------------------------------------
from coda.policy import ingress as _ingress  # noqa: E402  (appended section; the table above stays untouched)

IngressFactory = Callable[[dict[str, Any]], _ingress.IngressPolicy]
INGRESS_POLICIES: dict[str, IngressFactory] = {
    "admit_all": lambda params: with_params(_ingress.AdmitAll, params, "ingress policy admit_all"),
    "queue_limit": lambda params: with_params(_ingress.QueueLimit, params, "ingress policy queue_limit"),
    "kv_headroom": lambda params: with_params(_ingress.KVHeadroom, params, "ingress policy kv_headroom"),
    "tenant_share": lambda params: with_params(_ingress.TenantShare, params, "ingress policy tenant_share"),
    "overload": lambda params: with_params(_ingress.Overload, params, "ingress policy overload"),
    "session": lambda params: with_params(_ingress.SessionAdmission, params, "ingress policy session"),
    "deadline": lambda params: with_params(_ingress.Deadline, params, "ingress policy deadline"),
}


def make_ingress_policy(name: str, params: dict[str, Any] | None = None) -> _ingress.IngressPolicy:
    """An ingress policy by name; ``a+b`` composes several (the most severe decision wins), and
    then ``params`` maps each part's name to its parameters."""
    parts = name.split("+")
    params = params or {}
    if len(parts) == 1:
        return _lookup("ingress policy", name, INGRESS_POLICIES)(params)
    unknown = sorted(set(params) - set(parts))
    if unknown:
        raise CodaError(f"ingress policy {name}: parameters for {', '.join(unknown)}, which is not part of it; key them by part name")
    return _ingress.compose([_lookup("ingress policy", p, INGRESS_POLICIES)(params.get(p) or {}) for p in parts])


# --- appended presets ----------------------------------------------------------------------
SYSTEMS["vllm+ta"] = SystemPreset(
    name="vllm+ta",
    router="round_robin",
    state="tiered_aging",
    execution="full",
    eviction="lru",
    dram=True,
    ssd=False,
    cpu_shadow=True,
    description="vLLM with Coda's Tiered-Aging order of its waiting queue and nothing else changed "
    "(what --scheduler-cls coda.integrations.vllm.scheduler.CodaScheduler runs)",
)
