"""Whether an ingress policy acted: per gate (each part of a composed policy), how often it fired
(decided other than admit), on which signal, and the share of requests it touched.

A policy whose gate never fires during a run behaves as ``admit_all``, and a table of goodputs does
not say so; the verdict does, in one line. The simulator and the gateway keep one ``Liveness``
each and feed it every decision (a held request is decided again, so a request counts as touched
once however often a gate fires on it); ``coda bench`` reads the gateway's counters back from its
``/metrics`` (``from_metrics``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coda.policy.contracts import Decision, IngressPolicy
from coda.policy.ingress import AllOf
from coda.policy.snapshots import IngressSnapshot


def gates(policy: IngressPolicy) -> tuple[IngressPolicy, ...]:
    """The parts that decide: a composition's parts, else the policy itself (a shadowed policy's primary)."""
    primary = getattr(policy, "primary", policy)
    return primary.parts if isinstance(primary, AllOf) else (primary,)


def gate_decisions(policy: IngressPolicy, snap: IngressSnapshot) -> tuple[Decision, ...]:
    """Each gate's own decision on ``snap`` (asked again: a shell may enforce another decision, such
    as a defer while the replicas' store is away, and a shadowed policy's decide also runs its shadow)."""
    return tuple(p.decide(snap) for p in gates(policy))


@dataclass(slots=True)
class GateCounts:
    fired: int = 0
    by_action: Counter[str] = field(default_factory=Counter)
    by_signal: Counter[str] = field(default_factory=Counter)
    touched: int = 0


class Liveness:
    """Fire counts per gate over the requests a shell decided."""

    def __init__(self, gate_names: Sequence[str]) -> None:
        self.gates = {name: GateCounts() for name in gate_names}
        self.requests = 0
        self._open: dict[Any, set[str]] = {}  # request -> gates that fired on it, until it is done

    @classmethod
    def of(cls, policy: IngressPolicy) -> Liveness:
        return cls([g.name for g in gates(policy)])

    def observe(self, request: Any, decisions: Iterable[Decision]) -> list[Decision]:
        """One decision on ``request``; returns the gates' decisions that fired."""
        fired = [d for d in decisions if d.action != "admit"]
        touched = self._open.setdefault(request, set())
        for d in fired:
            g = self.gates.setdefault(d.policy, GateCounts())
            g.fired += 1
            g.by_action[d.action] += 1
            g.by_signal[d.signal or d.reason] += 1
            touched.add(d.policy)
        return fired

    def done(self, request: Any) -> set[str]:
        """``request`` is decided for good (admitted, or refused); returns the gates that touched it."""
        self.requests += 1
        touched = self._open.pop(request, set())
        for name in touched:
            self.gates[name].touched += 1
        return touched

    @property
    def undecided(self) -> int:
        """Requests observed and not yet decided for good (held now)."""
        return len(self._open)

    def forget(self, request: Any) -> None:
        """``request`` left before it was decided for good (its client gave up while it was held):
        counted nowhere, and nothing of it kept."""
        self._open.pop(request, None)

    def report(self) -> dict[str, Any]:
        return {"requests": self.requests, "gates": {
            name: {"fired": g.fired, "by_action": dict(g.by_action), "by_signal": dict(g.by_signal), "requests_touched": g.touched,
                   "touched_share": g.touched / self.requests if self.requests else None}
            for name, g in self.gates.items()}}


def verdict(report: Mapping[str, Any]) -> list[str]:
    """One line per gate that never fired over a run that decided requests (``admit_all`` excepted:
    it has nothing to fire)."""
    n = report.get("requests") or 0
    return [f"ingress gate {name} never fired over {n} requests: it behaved as admit_all"
            for name, g in report.get("gates", {}).items() if n and name != "admit_all" and not g["fired"]]


def summary_line(report: Mapping[str, Any]) -> str:
    """The gates' fire counts in one line, e.g. ``session fired 120x on kv_usage+queue_depth (8% of 1500 requests)``."""
    n = report.get("requests") or 0
    parts = []
    for name, g in report.get("gates", {}).items():
        if not g["fired"]:
            parts.append(f"{name} never fired")
            continue
        signals = ", ".join(f"{s} {c}" for s, c in sorted(g["by_signal"].items(), key=lambda kv: -kv[1]))
        share = f"{g['touched_share']:.1%}" if g.get("touched_share") is not None else "n/a"
        parts.append(f"{name} fired {g['fired']}x ({signals}; {share} of {n} requests)")
    return "; ".join(parts)


# --- read back from the gateway's /metrics -------------------------------------------------------
FIRES = "coda_ingress_gate_fires_total"
TOUCHED = "coda_ingress_gate_requests_touched_total"
DECIDED = "coda_ingress_requests_decided_total"


def from_metrics(samples: Iterable[tuple[str, Mapping[str, str], float]], before: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A ``Liveness.report`` from the gateway's counters (``(name, labels, value)`` samples), less
    the counts in ``before`` (a report read at the start of the run)."""
    gates: dict[str, dict[str, Any]] = {}
    requests = 0.0

    def gate(name: str) -> dict[str, Any]:
        return gates.setdefault(name, {"fired": 0, "by_action": {}, "by_signal": {}, "requests_touched": 0})

    for name, labels, value in samples:
        if name == FIRES:
            g = gate(labels["gate"])
            g["fired"] += int(value)
            g["by_action"][labels["action"]] = g["by_action"].get(labels["action"], 0) + int(value)
            g["by_signal"][labels["signal"]] = g["by_signal"].get(labels["signal"], 0) + int(value)
        elif name == TOUCHED:
            gate(labels["gate"])["requests_touched"] += int(value)
        elif name == DECIDED:
            requests += value
    report: dict[str, Any] = {"requests": int(requests), "gates": gates}
    if before:
        report["requests"] -= before["requests"]
        for name, g in gates.items():
            b = before["gates"].get(name)
            if b is None:
                continue
            g["fired"] -= b["fired"]
            g["requests_touched"] -= b["requests_touched"]
            for key in ("by_action", "by_signal"):
                g[key] = {k: v - b[key].get(k, 0) for k, v in g[key].items() if v - b[key].get(k, 0)}
    for g in gates.values():
        g["touched_share"] = g["requests_touched"] / report["requests"] if report["requests"] else None
    return report
