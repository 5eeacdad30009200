"""State admission: which waiting request prepares its KV state next on a worker.

Every policy reads an ``AdmissionSnapshot`` (oldest-ready first) and returns the index of the
request to admit now, or ``None`` to admit nothing at this opportunity (the contract is
``coda.policy.contracts.StatePolicy``). ``explain`` says which rule decided and the scores it
compared, for decision logs and analyses (they never repeat a policy's branches).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

from coda.cost.model import CostModel
from coda.policy.contracts import Admission, Choice, StatePolicy
from coda.policy.params import AtLeastOne, NonNegative, Positive
from coda.policy.snapshots import AdmissionSnapshot


@dataclass(frozen=True, slots=True)
class Fifo(StatePolicy):
    """vLLM's first-come-first-served: the oldest ready request, and nothing while it does not fit."""

    name: str = "fifo"
    frontier: AtLeastOne = 1
    admission: ClassVar[Admission] = "every_slot"  # the oldest each time: both integrations admit the same

    def choose(self, snap: AdmissionSnapshot) -> int | None:
        if len(snap) and snap.fits[0]:
            return 0
        return None


@dataclass(slots=True)
class StateCost:
    """State-preparation cost C = T_restore + T_load + T_prefill of each candidate, per the cost model.

    T_restore: DRAM->HBM bytes through the H2D curve plus the time the link is already committed;
    T_load: SSD->DRAM bytes through the SSD curve plus the SSD queue; T_prefill: the missing
    prefix and new tokens over the cached ones. The link curves and the prefill time depend only
    on token counts, so they are memoized per count (a bounded table).
    """

    cost: CostModel
    _restore: dict[int, float] = field(default_factory=dict)
    _load: dict[int, float] = field(default_factory=dict)
    _prefill: dict[tuple[int, int], float] = field(default_factory=dict)

    def seconds(self, snap: AdmissionSnapshot, rows: np.ndarray | None = None) -> np.ndarray:
        """C of each candidate (or of ``rows`` only)."""
        def pick(a: np.ndarray) -> list[int]:
            return (a if rows is None else a[rows]).tolist()

        dram, ssd, hbm, prompt = pick(snap.dram_tokens), pick(snap.ssd_tokens), pick(snap.hbm_tokens), pick(snap.prompt_tokens)
        kv = self.cost.kv_bytes(1)
        restore_t, load_t, prefill_t = self._restore, self._load, self._prefill
        if len(prefill_t) > 200_000:  # bounded memo
            for table in (restore_t, load_t, prefill_t):
                table.clear()
        out = []
        for d, s, h, p in zip(dram, ssd, hbm, prompt):
            cached = h + d + s
            key = (p - cached, cached)
            t = prefill_t.get(key)
            if t is None:
                t = prefill_t[key] = self.cost.prefill_only_s(p - cached, cached)
            if d or s:
                r = restore_t.get(d + s)
                if r is None:
                    r = restore_t[d + s] = self.cost.h2d_s((d + s) * kv)
                t += r + snap.h2d_outstanding_s
            if s:
                lo = load_t.get(s)
                if lo is None:
                    lo = load_t[s] = self.cost.ssd_read_s(s * kv)
                t += lo + snap.ssd_outstanding_s
            out.append(t)
        return np.array(out)


@dataclass(frozen=True, slots=True)
class FewestBlocks(StatePolicy):
    """CacheWise-style prefix-aware order: among requests that fit, the one needing the fewest
    additional KV blocks (ties: oldest), chosen for every admission slot."""

    frontier: AtLeastOne = 64
    admission: Admission = "every_slot"
    name: str = "fewest_blocks"

    def choose(self, snap: AdmissionSnapshot) -> int | None:
        feasible = np.flatnonzero(snap.fits)
        if not feasible.size:
            return None
        return int(feasible[np.argmin(snap.extra_blocks[feasible])])  # argmin keeps the first (oldest) tie


@dataclass(slots=True)
class TieredAging(StatePolicy):
    """Coda's Tiered-Aging state admission.

    Among ready requests that fit in HBM now (the feasible set), admit the one with the least
    age-adjusted cost ``C / (1 + wait / tau)`` (wait: time since the request reached the engine;
    tool time is not in it); ties by raw cost, then extra KV blocks, then ready time. The progress
    guard: once the oldest *feasible* request has waited ``w_max_s`` it goes first (the Coda paper's
    Eq. 4: the guard overrides the efficiency preference, never HBM feasibility).

    ``hold_queue`` (beyond the Coda paper, off by default): once the oldest request of all has waited
    ``w_max_s`` but does not fit, admit nothing until it fits, so memory drains for it.
    ``preempt`` (beyond the Coda paper, off by default): W_max bounds every request. Once the oldest
    request (the earliest ready, wherever preemptions put it in the queue) has waited ``w_max_s``, it
    goes first if it fits; if it does not, nothing else is admitted and the shell preempts running
    requests for it (``overdue``, ``preemption_victims``).
    ``cost_unit``: ``seconds`` is the Coda paper's C (restore, load and prefill time per the cost
    model); ``blocks`` ranks by the extra KV blocks instead (an ablation: with ``tau_s`` = inf it
    is fewest-blocks with the W_max rules). ``admission``: see ``Admission``.
    """

    cost: CostModel = field(compare=False)
    tau_s: Positive = 5.0
    w_max_s: NonNegative = 20.0
    frontier: AtLeastOne = 64
    hold_queue: bool = False
    preempt: bool = False
    cost_unit: Literal["seconds", "blocks"] = "seconds"
    admission: Admission = "promote_one"
    name: str = "tiered_aging"
    _costs: StateCost = field(init=False, compare=False)

    def __post_init__(self) -> None:
        self._costs = StateCost(self.cost)

    def choose(self, snap: AdmissionSnapshot) -> int | None:
        return self._decide(snap)[0]

    def explain(self, snap: AdmissionSnapshot) -> Choice:
        idx, rule, scores = self._decide(snap)
        return Choice(idx, rule, scores or {})

    def _decide(self, snap: AdmissionSnapshot) -> tuple[int | None, str, dict[str, np.ndarray] | None]:
        """(index or None, the rule that decided, the scores it compared): one path for ``choose`` and ``explain``."""
        if not len(snap):
            return None, "empty", None
        wait = snap.now_s - snap.ready_s
        if self.preempt:
            oldest = int(np.argmin(snap.ready_s))
            if wait[oldest] >= self.w_max_s:
                return (oldest, "W_max: oldest first", None) if snap.fits[oldest] else (None, "W_max: oldest does not fit, preempt", None)
        if self.hold_queue and wait[0] >= self.w_max_s:
            return (0, "hold: oldest first", None) if snap.fits[0] else (None, "hold: oldest does not fit, admit nothing", None)
        feasible = np.flatnonzero(snap.fits)
        if not feasible.size:
            return None, "nothing fits", None
        if wait[feasible[0]] >= self.w_max_s:
            return int(feasible[0]), "W_max: oldest feasible", None
        raw = self._costs.seconds(snap, feasible) if self.cost_unit == "seconds" else snap.extra_blocks[feasible].astype(np.float64)
        aged = raw / (1.0 + wait[feasible] / self.tau_s)
        best = np.lexsort((snap.ready_s[feasible], snap.extra_blocks[feasible], raw, aged))[0]
        return int(feasible[best]), "age-adjusted cost", {"feasible": feasible, "raw_cost": raw, "aged_cost": aged}


# --- W_max preemption: what both shells run when ``TieredAging.preempt`` is on ---------------------


def w_max_of(policy: StatePolicy) -> tuple[float | None, bool]:
    """(W_max in seconds, whether shells enforce it by preemption) of a policy or a shadowed policy's
    primary; ``(None, False)`` for a policy without W_max. Shells count the admissions of requests
    that had waited W_max (the W_max rule's) and the preemptions made for them."""
    primary = getattr(policy, "primary", policy)
    return (primary.w_max_s, primary.preempt) if isinstance(primary, TieredAging) else (None, False)


def overdue(now_s: float, ready_s: Sequence[float], w_max_s: float) -> int | None:
    """Of waiting requests ready since ``ready_s`` (in queue order), the one W_max preemption serves:
    the oldest (the first of ties) once it has waited ``w_max_s``, or ``None``. With ``preempt`` it
    is also the one the engine's order admits next after the policy's promotion (``promote_one``)."""
    if not len(ready_s):
        return None
    oldest = int(np.argmin(ready_s))
    return oldest if now_s - ready_s[oldest] >= w_max_s else None


def preemption_victims(ready_s: float, deficit_blocks: int, seat_needed: bool, running: Sequence[tuple[float, int]]) -> list[int]:
    """Which running requests to preempt, in order, for a waiting request ready since ``ready_s`` that
    lacks ``deficit_blocks`` KV blocks (and a seat, with ``seat_needed``).

    ``running``: per running request, ``(ready_s, blocks its preemption would free)``. Only requests
    ready after the one served are victims (one ready at the same instant is not), the youngest first (vLLM's own victim order: the
    ``PRIORITY`` policy preempts the latest arrival among equals, FCFS the last scheduled), until
    the blocks they free cover the deficit. So preemption follows one total order and never cycles:
    a victim, once overdue itself, can only preempt requests younger than it. ``[]`` when all of
    them together would not free enough: preempting then would only waste their work.
    """
    order = sorted((i for i, (r, _) in enumerate(running) if r > ready_s), key=lambda i: (-running[i][0], -i))
    victims: list[int] = []
    freed = 0
    for i in order:
        if freed >= deficit_blocks and (victims or not seat_needed):
            break
        victims.append(i)
        freed += running[i][1]
    return victims if freed >= deficit_blocks and (victims or not seat_needed) else []
