"""One registry for every policy and system preset; unknown names fail with the valid ones."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from coda.cost.model import CostModel
from coda.errors import CodaError
from coda.policy.execution import ExecutionPolicy, FullBatch
from coda.policy.routing import RoundRobin, Router
from coda.policy.state import Fifo, StatePolicy

StateFactory = Callable[[CostModel, dict[str, Any]], StatePolicy]
ExecutionFactory = Callable[[CostModel, dict[str, Any]], ExecutionPolicy]
RouterFactory = Callable[[dict[str, Any]], Router]

STATE_POLICIES: dict[str, StateFactory] = {"fifo": lambda cost, params: Fifo()}
EXECUTION_POLICIES: dict[str, ExecutionFactory] = {"full": lambda cost, params: FullBatch()}
ROUTERS: dict[str, RouterFactory] = {"round_robin": lambda params: RoundRobin()}
EVICTIONS = ("lru",)


@dataclass(frozen=True, slots=True)
class SystemPreset:
    """A named combination of router, state admission, execution admission, eviction and tiers."""

    name: str
    router: str
    state: str
    execution: str
    eviction: Literal["lru", "tool_aware"]
    dram: bool
    ssd: bool
    cpu_shadow: bool
    description: str

    def tiers_text(self) -> str:
        parts = ["HBM", "DRAM" if self.dram else None, "SSD" if self.ssd else None]
        tiers = " + ".join(p for p in parts if p)
        return f"{tiers}; CPU-shadow {'on' if self.cpu_shadow else 'off'}; eviction {self.eviction}"


SYSTEMS: dict[str, SystemPreset] = {
    "vllm": SystemPreset(
        name="vllm",
        router="round_robin",
        state="fifo",
        execution="full",
        eviction="lru",
        dram=True,
        ssd=False,
        cpu_shadow=True,
        description="vLLM with prefix caching and a CPU KV store written as blocks complete "
        "(as vLLM's offloading connector or LMCache do): round-robin routing, FCFS admission, one attention launch",
    ),
}


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
