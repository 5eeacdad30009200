"""The contract of each policy kind: every member a shell reads, declared once.

A policy subclasses the contract of its kind (``IngressPolicy``, ``Router``, ``StatePolicy``,
``ExecutionPolicy``, ``EvictionPolicy``). The shells (the simulator, the gateway, the vLLM
plugin) read these members and nothing else, so a policy registered from another package runs
exactly as a built-in one does; ``coda.policy.registry.register`` refuses a class that lacks a
member (``missing_members``). What a kind reads from the shell is declared under one name per
kind: an ingress policy's ``signals``, a router's ``worker_fields``, an eviction policy's
``session_status``.

The decisions each kind returns are here too, so that a policy module and a shell agree on them
without importing each other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from coda.cost.cohorts import CohortPlan
from coda.errors import CodaError
from coda.policy.snapshots import AdmissionSnapshot, IngressSnapshot, RoutingSnapshot

# --- ingress --------------------------------------------------------------------------------------

#: every signal an ingress policy may read; the gateway maps each to a source (an engine's /metrics
#: or its own count) and refuses to start when one is missing, the simulator fills them all
SIGNALS = ("queue_depth", "queue_age", "kv_usage", "inflight_requests", "inflight_tokens", "prefix_hit", "tenant_share", "deadline_slack",
           "drain_rate")

Action = Literal["admit", "defer", "reject"]
SEVERITY: dict[str, int] = {"admit": 0, "defer": 1, "reject": 2}


@dataclass(slots=True, frozen=True)
class Decision:
    """An ingress decision. ``status``: the HTTP status the shell answers with when not admitting
    (503 defer; 429 / 529 reject, or 503 for a reject that asks the client back without being
    held); ``reason``: one of a fixed set per policy (it labels metrics);
    ``signal``: what bound when not admitting, names from ``SIGNALS`` joined by ``+`` (``telemetry``
    for workers that are stale or unhealthy; a policy's own state, such as ``session_slots``),
    which the shells' liveness counts read (``coda.shell.liveness``)."""

    action: Action
    policy: str
    reason: str = "ok"
    status: int = 200
    retry_after_s: float = 0.0
    signal: str = ""


class IngressPolicy(ABC):
    """Admit, defer or reject a request before it reaches an engine (``coda.policy.ingress``)."""

    name: str
    #: names from ``SIGNALS`` the policy reads (a shell that cannot supply one refuses to start)
    signals: frozenset[str]
    #: seconds without a request after which the shell's session ledger releases a session's slot;
    #: ``None`` when the policy reads no session state (the shell then keeps its default TTL)
    session_ttl_s: float | None = None

    @abstractmethod
    def decide(self, snap: IngressSnapshot) -> Decision: ...


# --- routing --------------------------------------------------------------------------------------

#: optional ``WorkerView`` fields a router (or a simulator observer) may ask the shell to fill;
#: the counts are always filled
WORKER_FIELDS = ("match", "decode_contexts")


@dataclass(frozen=True, slots=True)
class RouteChoice:
    """A routing decision explained: the worker, the rule that chose it, and the per-worker scores
    it compared (by name, each a mapping of worker id to score)."""

    worker_id: int
    rule: str
    scores: Mapping[str, Mapping[int, float]] = field(default_factory=dict)


class Router(ABC):
    """Which worker serves a request (``coda.policy.routing``)."""

    name: str
    #: names from ``WORKER_FIELDS`` the router reads beyond the counts
    worker_fields: frozenset[str]

    @abstractmethod
    def route(self, snap: RoutingSnapshot) -> int:
        """The chosen ``worker_id`` (one of ``snap.workers``)."""

    def explain(self, snap: RoutingSnapshot) -> RouteChoice:
        """The choice with the rule that made it and the scores compared (for decision logs);
        a router without rules of its own reports ``chosen``."""
        return RouteChoice(self.route(snap), "chosen")


# --- state admission ------------------------------------------------------------------------------

Admission = Literal["promote_one", "every_slot"]
"""How an engine integrates a state policy: ``promote_one`` asks it once per scheduling step and
moves its choice to the head of the waiting queue, after which the engine's own FCFS order admits
what else fits (the Coda paper's integration, one remove-and-prepend per step); ``every_slot`` asks
it again for every request the step admits."""


@dataclass(frozen=True, slots=True)
class Choice:
    """A state-admission decision explained: the chosen index (or ``None``), the rule that decided,
    and the scores it compared (arrays over the snapshot's rows, by name)."""

    index: int | None
    rule: str
    scores: Mapping[str, Any] = field(default_factory=dict)


class StatePolicy(ABC):
    """Which waiting request prepares its KV state next on a worker (``coda.policy.state``)."""

    name: str
    #: how many oldest-ready candidates the policy looks at per decision
    frontier: int
    #: how the engine asks it (see ``Admission``)
    admission: Admission

    @abstractmethod
    def choose(self, snap: AdmissionSnapshot) -> int | None:
        """Index of the candidate to admit now, or ``None`` to admit nothing at this opportunity."""

    def explain(self, snap: AdmissionSnapshot) -> Choice:
        """The choice with the rule that made it (for decision traces); a policy without rules of
        its own reports ``chosen`` or ``none``."""
        idx = self.choose(snap)
        return Choice(idx, "none" if idx is None else "chosen")


# --- execution admission --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanChoice:
    """An execution decision explained: the plan (``None``: one launch) and the rule that decided."""

    plan: CohortPlan | None
    rule: str


class ExecutionPolicy(ABC):
    """How a pure-decode batch's attention is launched (``coda.policy.execution``)."""

    name: str

    @abstractmethod
    def plan(self, contexts: np.ndarray) -> CohortPlan | None:
        """A cohort split for this pure-decode batch, or ``None`` to run it as one batch."""

    def explain(self, contexts: np.ndarray) -> PlanChoice:
        """The plan with the rule that made it (for decision traces); a policy without rules of its
        own reports ``split`` or ``one launch``."""
        plan = self.plan(contexts)
        return PlanChoice(plan, "one launch" if plan is None else "split")


# --- eviction -------------------------------------------------------------------------------------

OutStatus = Callable[[int], "tuple[tuple[str, ...], float] | None"]
"""``out(owner)``: what the shell observes of the session owning a chunk: ``(tools, elapsed_s)``
while it waits on its tool calls (``()``: on its user), ``None`` while it is not out."""
Owners = Callable[[np.ndarray], np.ndarray]
"""``owners(chunk_ids)``: the owner (a session, a shared prefix) of each chunk id, as the shell
lays them out."""


class EvictionPolicy(ABC):
    """Which idle (cached, unreferenced) KV chunks a worker evicts when it needs room
    (``coda.policy.eviction``)."""

    name: str
    #: whether the policy reads ``out`` (a shell that sees requests, not sessions, cannot supply it)
    session_status: bool

    @abstractmethod
    def victims(self, lru: OrderedDict[int, None], n: int, out: OutStatus, owners: Owners) -> list[int]:
        """``n`` chunk ids of ``lru`` (idle chunks, least recently used first) to evict."""

    def observe(self, tools: Sequence[str], duration_s: float) -> None:
        """An ended tool call (its duration became observable when the session's next request
        arrived); a policy that learns nothing ignores it."""
        return None

    def remaining_s(self, tools: Sequence[str], elapsed_s: float) -> float | None:
        """Predicted seconds until a session out on ``tools`` (``()``: on its user) for ``elapsed_s``
        returns; ``None`` while the policy predicts nothing for them. An engine that holds a
        session's KV through its tool call (the vLLM plugin's retention) reads it; the base class
        predicts nothing."""
        return None


# --- conformance ----------------------------------------------------------------------------------

CONTRACTS: dict[str, type] = {"ingress": IngressPolicy, "router": Router, "state": StatePolicy, "execution": ExecutionPolicy,
                              "eviction": EvictionPolicy}
#: what each kind must provide: its data members, then its methods
MEMBERS: dict[str, tuple[str, ...]] = {
    "ingress": ("name", "signals", "session_ttl_s", "decide"),
    "router": ("name", "worker_fields", "route", "explain"),
    "state": ("name", "frontier", "admission", "choose", "explain"),
    "execution": ("name", "plan", "explain"),
    "eviction": ("name", "session_status", "victims", "observe", "remaining_s"),
}


#: the kinds of policy, in the order a policies block lists them
KINDS = tuple(CONTRACTS)
KIND_NAMES = {"ingress": "ingress policy", "router": "router", "state": "state admission policy",
              "execution": "execution policy", "eviction": "eviction policy"}


def missing_members(kind: str, obj: Any) -> list[str]:
    """The members of ``kind``'s contract that ``obj`` (a policy, or a policy class whose data
    members are class attributes or dataclass fields) does not have."""
    fields = getattr(obj, "__dataclass_fields__", {})
    return [m for m in MEMBERS[kind] if not hasattr(obj, m) and m not in fields]


def conform(kind: str, name: str, obj: Any) -> None:
    """Raise ``CodaError`` when ``obj`` (a policy class when registered, a policy when built) lacks
    a member of its kind's contract."""
    missing = missing_members(kind, obj)
    if missing:
        what = obj.__qualname__ if isinstance(obj, type) else type(obj).__qualname__
        raise CodaError(f"{KIND_NAMES[kind]} {name} ({what}) lacks {', '.join(missing)} of its contract "
                        f"({', '.join(MEMBERS[kind])}); subclass coda.policy.contracts.{CONTRACTS[kind].__name__} and declare them")
