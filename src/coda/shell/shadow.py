"""Running a policy in shadow: the primary decides, a second policy of the same kind decides on the
same snapshot, and how often they differ is counted (never inferred from two diverged runs).

``Shadowed`` has the methods of every kind (``choose``, ``route``, ``decide``, ``plan``) and
forwards everything else (``name``, ``needs``, ``frontier``, ...) to the primary, so a shell calls
it exactly as it calls the primary. Comparisons count only inside ``window`` (the simulator sets
its measurement window); ``listeners`` see each comparison (an analysis that needs more than the
counts, such as the context distance of both routing choices).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from coda.policy.ingress import Decision

Listener = Callable[[Any, Any, Any], None]
"""Called as ``listener(snapshot, primary_decision, shadow_decision)``."""


class Shadowed:
    def __init__(self, primary: Any, shadow: Any) -> None:
        self.primary = primary
        self.shadow = shadow
        self.window = (-math.inf, math.inf)
        self.decisions = 0
        self.differs = 0
        self.last_shadow: Any = None
        self.listeners: list[Listener] = []

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.primary, attr)

    def __eq__(self, other: object) -> bool:
        """The same primary with the same shadow (the counts are not the policy)."""
        return isinstance(other, Shadowed) and (self.primary, self.shadow) == (other.primary, other.shadow)

    __hash__ = None  # type: ignore[assignment]

    @property
    def needs(self) -> frozenset[str]:
        return frozenset(getattr(self.primary, "needs", ())) | frozenset(getattr(self.shadow, "needs", ()))

    @property
    def frontier(self) -> int:
        """A state policy's frontier: the snapshot must hold what either policy looks at."""
        return max(self.primary.frontier, self.shadow.frontier)

    def _counting(self, now_s: float) -> bool:
        return self.window[0] <= now_s <= self.window[1]

    def _count(self, snap: Any, mine: Any, theirs: Any, same: bool) -> None:
        self.last_shadow = theirs
        self.decisions += 1
        self.differs += not same
        for listener in self.listeners:
            listener(snap, mine, theirs)

    # --- the kinds (the shadow decides only when its decision is counted) ---------------------
    def choose(self, snap: Any) -> int | None:
        """State admission: counted over admission choices (the shadow admitting another request or none)."""
        idx = self.primary.choose(snap)
        if idx is not None and self._counting(snap.now_s):
            theirs = self.shadow.choose(snap)
            self._count(snap, idx, theirs, theirs is not None and int(snap.request_ids[theirs]) == int(snap.request_ids[idx]))
        return idx

    def route(self, snap: Any) -> int:
        wid = self.primary.route(snap)
        if self._counting(snap.now_s):
            theirs = self.shadow.route(snap)
            self._count(snap, wid, theirs, theirs == wid)
        return wid

    def decide(self, snap: Any) -> Decision:
        d = self.primary.decide(snap)
        if self._counting(snap.now_s):
            theirs = self.shadow.decide(snap)
            self._count(snap, d, theirs, theirs.action == d.action)
        return d

    def plan(self, contexts: np.ndarray) -> Any:
        mine = self.primary.plan(contexts)
        theirs = self.shadow.plan(contexts)
        self._count(contexts, mine, theirs, getattr(mine, "cut", None) == getattr(theirs, "cut", None))
        return mine

    def report(self) -> dict[str, Any]:
        return {"policy": self.shadow.name, "decisions": self.decisions, "differs": self.differs,
                "differs_frac": self.differs / self.decisions if self.decisions else None}
