"""One builder for every shell: ``build_policies(spec, cost) -> PolicySet``.

A shell calls it once and enforces the kinds it can (the simulator all five; the gateway ingress
and routing; the vLLM plugin state admission). Every kind was checked when the configuration
loaded (``coda.policy.spec.PoliciesSpec`` carries each kind's recipe: factories with typed keyword
arguments), so a block moved between shells fails in the same place, with the same message,
wherever it is wrong, and building only calls the factories.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from coda.errors import CodaError
from coda.policy import ingress
from coda.policy.contracts import KIND_NAMES, KINDS, EvictionPolicy, ExecutionPolicy, IngressPolicy, Router, StatePolicy, conform
from coda.policy.spec import PoliciesSpec, PolicySpec, Recipe, recipe
from coda.shell.shadow import SHADOWS, Shadowed


@dataclass(frozen=True, slots=True)
class PolicySet:
    """The built policies (``None`` for a kind the shell does not enforce) and the block they came from."""

    spec: PoliciesSpec
    ingress: IngressPolicy | None = None
    router: Router | None = None
    state: StatePolicy | None = None
    execution: ExecutionPolicy | None = None
    eviction: EvictionPolicy | None = None

    def shadows(self) -> dict[str, Shadowed]:
        """The kinds that run a shadow, by kind."""
        return {k: p for k in KINDS if isinstance(p := getattr(self, k), Shadowed)}


def _build(planned: Recipe, cost: Any) -> Any:
    """The recipe's policy: each part's factory called with its checked arguments (and the
    shell's cost model where it asks for one), composed, wrapped with its shadow."""
    parts = []
    for entry, kwargs in planned.parts:
        if entry.needs_cost:
            if cost is None:
                raise CodaError(f"{entry.label} needs a cost model, which this shell does not have; give it a profile")
            kwargs = {**kwargs, "cost": cost}
        try:
            policy = entry.factory(**kwargs)
        except ValueError as err:
            raise CodaError(f"{entry.label}: {err}") from None
        conform(entry.kind, entry.name, policy)
        parts.append(policy)
    policy = ingress.compose(parts) if planned.kind == "ingress" else parts[0]
    return policy if planned.shadow is None else SHADOWS[planned.kind](policy, _build(planned.shadow, cost))


def make_policy(kind: str, name: str, params: dict[str, Any] | None = None, cost: Any = None) -> Any:
    """One policy by name, checked and built (a shorthand for code and tests)."""
    return _build(recipe(kind, PolicySpec(name=name, params=params or {})), cost)


def build_policies(spec: PoliciesSpec, cost: Any = None, kinds: Iterable[str] = KINDS) -> PolicySet:
    """Build the ``kinds`` a shell enforces (the others were checked when ``spec`` was validated)."""
    wanted = set(kinds)
    unknown = wanted - set(KINDS)
    if unknown:
        raise CodaError(f"unknown policy kind(s) {', '.join(sorted(unknown))}; valid: {', '.join(KINDS)}")
    return PolicySet(spec=spec, **{kind: _build(spec.recipes[kind], cost) for kind in KINDS if kind in wanted})


def describe(kind: str, policy: Any) -> str:
    """A policy's name as logs print it, with its shadow."""
    if isinstance(policy, Shadowed):
        return f"{policy.primary.name} (shadow {policy.shadow.name})"
    return policy.name if policy is not None else f"({KIND_NAMES[kind]} not enforced here)"
