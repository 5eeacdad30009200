"""One builder for every shell: ``build_policies(spec, cost) -> PolicySet``.

A shell calls it once and enforces the kinds it can (the simulator all five; the gateway ingress
and routing; the vLLM plugin state admission). The kinds it does not enforce are still checked
(their names are registered, their parameters valid), so a block moved between shells fails in
the same place, with the same message, wherever it is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from coda.errors import CodaError
from coda.policy import ingress
from coda.policy.contracts import EvictionPolicy, ExecutionPolicy, IngressPolicy, Router, StatePolicy
from coda.policy.registry import KIND_NAMES, Entry, lookup
from coda.policy.spec import KINDS, PoliciesSpec, PolicySpec
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


def _entries(kind: str, spec: PolicySpec) -> list[tuple[Entry, dict[str, Any]]]:
    """The registry entries a spec names with their parameters; ``a+b`` composes ingress policies,
    and then ``params`` maps each part's name to its parameters."""
    parts = spec.name.split("+") if kind == "ingress" else [spec.name]
    if len(parts) == 1:
        return [(lookup(kind, spec.name), spec.params)]
    unknown = sorted(set(spec.params) - set(parts))
    if unknown:
        raise CodaError(f"ingress policy {spec.name}: parameters for {', '.join(unknown)}, which is not part of it; key them by part name")
    for key, value in spec.params.items():
        if not isinstance(value, dict):
            raise CodaError(f"ingress policy {spec.name}: params.{key} must be a mapping of {key}'s parameters, got {value!r}")
    return [(lookup(kind, p), spec.params.get(p) or {}) for p in parts]


def check_policy(kind: str, spec: PolicySpec) -> None:
    """Raise ``CodaError`` for an unknown name or parameter, without building anything."""
    for entry, params in _entries(kind, spec):
        entry.check(params)
    if spec.shadow is not None:
        _no_eviction_shadow(kind)
        check_policy(kind, spec.shadow)


def check_policies(spec: PoliciesSpec) -> None:
    """Raise ``CodaError`` for an unknown name or parameter of any kind, without building anything."""
    for kind in KINDS:
        check_policy(kind, getattr(spec, kind))


def build_policy(kind: str, spec: PolicySpec, cost: Any = None) -> Any:
    """One policy (wrapped in ``Shadowed`` when the spec names a shadow)."""
    parts = [entry.build(params, cost) for entry, params in _entries(kind, spec)]
    policy = ingress.compose(parts) if kind == "ingress" else parts[0]
    if spec.shadow is None:
        return policy
    _no_eviction_shadow(kind)
    return SHADOWS[kind](policy, build_policy(kind, spec.shadow, cost))


def make_policy(kind: str, name: str, params: dict[str, Any] | None = None, cost: Any = None) -> Any:
    """One policy by name (a shorthand of ``build_policy`` for code and tests)."""
    return build_policy(kind, PolicySpec(name=name, params=params or {}), cost)


def _no_eviction_shadow(kind: str) -> None:
    if kind == "eviction":
        raise CodaError(
            "eviction.shadow: an eviction policy cannot run in shadow (its choice changes what the next one sees); drop the shadow"
        )


def build_policies(spec: PoliciesSpec, cost: Any = None, kinds: Iterable[str] = KINDS) -> PolicySet:
    """Build the ``kinds`` a shell enforces; check the rest."""
    wanted = set(kinds)
    unknown = wanted - set(KINDS)
    if unknown:
        raise CodaError(f"unknown policy kind(s) {', '.join(sorted(unknown))}; valid: {', '.join(KINDS)}")
    built: dict[str, Any] = {}
    for kind in KINDS:
        sub = getattr(spec, kind)
        if kind in wanted:
            built[kind] = build_policy(kind, sub, cost)
        else:
            check_policy(kind, sub)
    return PolicySet(spec=spec, **built)


def describe(kind: str, policy: Any) -> str:
    """A policy's name as logs print it, with its shadow."""
    if isinstance(policy, Shadowed):
        return f"{policy.primary.name} (shadow {policy.shadow.name})"
    return policy.name if policy is not None else f"({KIND_NAMES[kind]} not enforced here)"
