"""Running a policy in shadow: the primary decides, a second policy of the same kind decides on the
same snapshot, and how often they differ is counted (never inferred from two diverged runs).

One wrapper per kind (``ShadowedIngress``, ``ShadowedRouter``, ``ShadowedState``,
``ShadowedExecution``) fulfils that kind's contract, so a shell calls it exactly as it calls the
primary: its members are the primary's, except what the shell must build for both policies (an
ingress policy's ``signals``, a router's ``worker_fields``, a state policy's ``frontier``).
Eviction has none: its choice changes what the next decision sees. Comparisons count only inside
``window`` (the simulator sets its measurement window); ``listeners`` see each comparison (an
analysis that needs more than the counts, such as the context distance of both routing choices).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from coda.cost.cohorts import CohortPlan
from coda.policy.contracts import (
    Admission,
    Choice,
    Decision,
    ExecutionPolicy,
    IngressPolicy,
    RouteChoice,
    Router,
    StatePolicy,
)
from coda.policy.snapshots import AdmissionSnapshot, IngressSnapshot, RoutingSnapshot

Listener = Callable[[Any, Any, Any], None]
"""Called as ``listener(snapshot, primary_decision, shadow_decision)``."""


class Shadowed:
    """The counts every shadow keeps; a kind's wrapper adds its contract's members."""

    def __init__(self, primary: Any, shadow: Any) -> None:
        self.primary = primary
        self.shadow = shadow
        self.name: str = primary.name
        self.window = (-math.inf, math.inf)
        self.decisions = 0
        self.differs = 0
        self.last_shadow: Any = None
        self.listeners: list[Listener] = []

    def __eq__(self, other: object) -> bool:
        """The same primary with the same shadow (the counts are not the policy)."""
        return type(other) is type(self) and (self.primary, self.shadow) == (other.primary, other.shadow)  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def counting(self, now_s: float) -> bool:
        return self.window[0] <= now_s <= self.window[1]

    def count(self, snap: Any, mine: Any, theirs: Any, same: bool) -> None:
        self.last_shadow = theirs
        self.decisions += 1
        self.differs += not same
        for listener in self.listeners:
            listener(snap, mine, theirs)

    def report(self) -> dict[str, Any]:
        return {"policy": self.shadow.name, "decisions": self.decisions, "differs": self.differs,
                "differs_frac": self.differs / self.decisions if self.decisions else None}


class ShadowedIngress(Shadowed, IngressPolicy):
    """Counted over ingress decisions (the shadow taking another action)."""

    def __init__(self, primary: IngressPolicy, shadow: IngressPolicy) -> None:
        super().__init__(primary, shadow)
        self.signals = primary.signals | shadow.signals
        self.session_ttl_s = primary.session_ttl_s

    def decide(self, snap: IngressSnapshot) -> Decision:
        d = self.primary.decide(snap)
        if self.counting(snap.now_s):
            theirs = self.shadow.decide(snap)
            self.count(snap, d, theirs, theirs.action == d.action)
        return d


class ShadowedRouter(Shadowed, Router):
    """Counted over routing decisions (the shadow choosing another worker)."""

    def __init__(self, primary: Router, shadow: Router) -> None:
        super().__init__(primary, shadow)
        self.worker_fields = primary.worker_fields | shadow.worker_fields

    def route(self, snap: RoutingSnapshot) -> int:
        wid = self.primary.route(snap)
        if self.counting(snap.now_s):
            theirs = self.shadow.route(snap)
            self.count(snap, wid, theirs, theirs == wid)
        return wid

    def explain(self, snap: RoutingSnapshot) -> RouteChoice:
        return self.primary.explain(snap)


class ShadowedState(Shadowed, StatePolicy):
    """Counted over admission choices (the shadow admitting another request or none); the snapshot
    holds what either policy looks at."""

    def __init__(self, primary: StatePolicy, shadow: StatePolicy) -> None:
        super().__init__(primary, shadow)
        self.frontier = max(primary.frontier, shadow.frontier)
        self.admission: Admission = primary.admission

    def choose(self, snap: AdmissionSnapshot) -> int | None:
        idx = self.primary.choose(snap)
        if idx is not None and self.counting(snap.now_s):
            theirs = self.shadow.choose(snap)
            self.count(snap, idx, theirs, theirs is not None and int(snap.request_ids[theirs]) == int(snap.request_ids[idx]))
        return idx

    def explain(self, snap: AdmissionSnapshot) -> Choice:
        return self.primary.explain(snap)


class ShadowedExecution(Shadowed, ExecutionPolicy):
    """Counted over decode-batch plans (the shadow choosing another cut, or none)."""

    def plan(self, contexts: np.ndarray) -> CohortPlan | None:
        mine = self.primary.plan(contexts)
        theirs = self.shadow.plan(contexts)
        self.count(contexts, mine, theirs, (mine.cut if mine else None) == (theirs.cut if theirs else None))
        return mine


SHADOWS: dict[str, type[Shadowed]] = {"ingress": ShadowedIngress, "router": ShadowedRouter, "state": ShadowedState,
                                      "execution": ShadowedExecution}
