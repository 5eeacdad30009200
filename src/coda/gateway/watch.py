"""What says whether the door wasted capacity: time during which an engine sat idle while the
door held requests back. Admission control exists to keep engines at their best operating point;
an idle engine beside a held request is its plainest failure (a gate on a stale or wrong signal),
and one the engines' own metrics cannot show."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class IdleWatch:
    """Accumulates the time during which ``update`` last saw both a held request and an idle worker.

    The caller reports each change of either (a request held or released, a request begun or
    ended); between two reports the condition is constant, so the sum is exact to the events."""

    seconds: float = 0.0
    longest_s: float = 0.0
    #: when the open interval began (``None``: none is open)
    since: float | None = None

    def update(self, now: float, holding: bool, some_idle: bool) -> None:
        on = holding and some_idle
        if self.since is not None and not on:
            self.seconds += now - self.since
            self.longest_s = max(self.longest_s, now - self.since)
            self.since = None
        elif self.since is None and on:
            self.since = now

    def total_s(self, now: float) -> float:
        """Seconds so far, the open interval included."""
        return self.seconds + (now - self.since if self.since is not None else 0.0)

    def longest(self, now: float) -> float:
        """The longest interval so far, the open one included."""
        return max(self.longest_s, now - self.since if self.since is not None else 0.0)
