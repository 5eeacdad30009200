"""The ``policies`` block: one schema for every shell (``coda sim``, ``coda compare``, ``coda serve``,
``coda fake-engine`` and ``CODA_SCHEDULER_CONFIG``).

    policies:
      ingress:   {name: session+overload, params: {session: {max_sessions: 64}}, defer: {max_wait_s: 5}}
      router:    {name: coda, shadow: {name: smetric}}
      state:     {name: tiered_aging, params: {tau_s: 5.0}}
      execution: {name: cohort}
      eviction:  {name: tool_aware}

Each kind is ``{name, params}``, optionally with a ``shadow`` evaluated on the same snapshots and
logged, never enforced; a bare string is a name. A system preset is a named block; a block given
by the user is laid over the preset's kind by kind (``PoliciesOverride.then``).

A configuration's block is resolved and checked here, once, when the configuration loads
(``PoliciesConfig``): the layers merged over the preset, every name looked up, every parameter
typed and bounded (``coda.policy.params``). The checked block carries each kind's ``Recipe``, the
factories with their typed keyword arguments, so a shell's build (``coda.shell.build``) only calls
them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, PrivateAttr, field_validator, model_validator

from coda.errors import CodaError
from coda.policy.contracts import KINDS
from coda.policy.params import checked
from coda.policy.presets import DEFAULT_SYSTEM, system_preset
from coda.policy.registry import Entry, lookup
from coda.strict import StrictModel


class PolicySpec(StrictModel):
    """One policy by its registered name, with keyword parameters (defaults live in the policy)."""

    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    shadow: PolicySpec | None = Field(None, description="a policy of the same kind decided on the same snapshots, logged but not enforced")

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


class DeferSpec(StrictModel):
    """How a shell holds deferred requests: an event-driven queue (a request decides again whenever
    something that could free room happens) of at most ``max_queue`` requests, each held at most
    ``max_wait_s`` before a 503 with the policy's Retry-After."""

    max_queue: PositiveInt = Field(256, description="deferred requests held at once; past it, a defer is answered 503 at once")
    max_wait_s: NonNegativeFloat = Field(5.0, description="longest a deferred request waits before its 503")


class IngressSpec(PolicySpec):
    defer: DeferSpec = DeferSpec()


@dataclass(frozen=True, slots=True)
class Recipe:
    """One kind's policy as checked: each part's registry entry with its typed keyword arguments
    (an ingress ``a+b`` has two parts, composed in order), and the shadow's recipe."""

    kind: str
    parts: tuple[tuple[Entry, dict[str, Any]], ...]
    shadow: Recipe | None = None


def recipe(kind: str, spec: PolicySpec) -> Recipe:
    """A kind's recipe: its names looked up, its parameters checked; a ``CodaError`` naming the
    policy and the parameter for anything unknown or out of bounds."""
    parts = spec.name.split("+") if kind == "ingress" else [spec.name]
    if len(parts) == 1:
        given = [(lookup(kind, spec.name), spec.params)]
    else:
        unknown = sorted(set(spec.params) - set(parts))
        if unknown:
            raise CodaError(f"ingress policy {spec.name}: parameters for {', '.join(unknown)}, which is not part of it; "
                            "key them by part name")
        for key, value in spec.params.items():
            if not isinstance(value, dict):
                raise CodaError(f"ingress policy {spec.name}: params.{key} must be a mapping of {key}'s parameters, got {value!r}")
        given = [(lookup(kind, p), spec.params.get(p) or {}) for p in parts]
    shadow = None
    if spec.shadow is not None:
        if kind == "eviction":
            raise CodaError(
                "eviction.shadow: an eviction policy cannot run in shadow (its choice changes what the next one sees); drop the shadow"
            )
        shadow = recipe(kind, spec.shadow)
    return Recipe(kind, tuple((entry, checked(entry.factory, params, entry.label)) for entry, params in given), shadow)


class PoliciesSpec(StrictModel):
    """A complete block: every kind named, and checked as it is validated (its ``recipes``)."""

    ingress: IngressSpec
    router: PolicySpec
    state: PolicySpec
    execution: PolicySpec
    eviction: PolicySpec

    _recipes: dict[str, Recipe] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _checked(self) -> PoliciesSpec:
        self._recipes = {kind: recipe(kind, getattr(self, kind)) for kind in KINDS}
        return self

    @property
    def recipes(self) -> Mapping[str, Recipe]:
        """Each kind's checked recipe, by kind."""
        return self._recipes

    def describe(self) -> dict[str, Any]:
        """The block as plain data (for result files and decision logs)."""
        return self.model_dump(exclude_none=True)


class PolicyOverride(StrictModel):
    """A kind as a user writes it: every field optional (see ``PoliciesSpec.merged``)."""

    name: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    shadow: PolicySpec | None = None
    defer: DeferSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


class PoliciesOverride(StrictModel):
    ingress: PolicyOverride | None = None
    router: PolicyOverride | None = None
    state: PolicyOverride | None = None
    execution: PolicyOverride | None = None
    eviction: PolicyOverride | None = None

    def then(self, later: PoliciesOverride | None) -> PoliciesOverride:
        """``later`` laid over this one, kind by kind: a new name replaces the policy (and its
        parameters, and its shadow unless ``later`` gives one); the same name (or none) merges
        parameters key by key and keeps the shadow unless ``later`` sets it."""
        if later is None:
            return self
        out: dict[str, Any] = {}
        for kind in KINDS:
            first, second = getattr(self, kind), getattr(later, kind)
            if first is None or second is None:
                out[kind] = second or first
                continue
            same = second.name in (None, first.name)
            merged: dict[str, Any] = {"name": second.name or first.name, "defer": second.defer or first.defer,
                                      "params": {**first.params, **second.params} if same else dict(second.params)}
            if "shadow" in second.model_fields_set:
                merged["shadow"] = second.shadow
            elif same and "shadow" in first.model_fields_set:
                merged["shadow"] = first.shadow
            out[kind] = PolicyOverride.model_validate(merged)
        return PoliciesOverride.model_validate(out)

    @model_validator(mode="after")
    def _defer_only_for_ingress(self) -> PoliciesOverride:
        for kind in KINDS[1:]:
            given = getattr(self, kind)
            if given is not None and given.defer is not None:
                raise ValueError(f"{kind}.defer: only the ingress policy defers requests")
        return self


class TenantSpec(StrictModel):
    """What ingress policies know of a tenant (shared by the gateway and the simulator)."""

    weight: PositiveFloat = Field(1.0, description="share of in-flight tokens under saturation, relative to other active tenants")
    deadline_ms: PositiveFloat | None = Field(
        None, description="time-to-first-token deadline of the tenant's requests (the deadline policy)"
    )



class Layers(tuple):
    """A policies block given in layers (a file, the environment, flags; ``coda.config.load.layered``),
    merged in order by ``PoliciesConfig``."""


class PoliciesConfig(StrictModel):
    """The ``system`` and ``policies`` fields every shell's schema shares (``coda sim``, ``coda
    serve``, ``coda fake-engine``, ``CODA_SCHEDULER_CONFIG``), resolved and checked when the
    configuration is validated: an unknown system, policy or parameter is a ``CodaError``, which
    ``coda.config.load.validated`` reports with the file it came from, before anything is built."""

    system: str = Field(DEFAULT_SYSTEM, description="the system preset whose policies block this starts from (see `coda systems`)")
    policies: PoliciesOverride | None = Field(None, description="kinds laid over the system's block (ingress, router, state, execution, "
                                              "eviction; each {name, params, shadow}; ingress also {defer})")

    _resolved: tuple[str, PoliciesOverride | None, PoliciesSpec] | None = PrivateAttr(None)

    @field_validator("policies", mode="before")
    @classmethod
    def _layers(cls, value: Any) -> Any:
        """``Layers`` merged in order, each a mapping or a ``PoliciesOverride``."""
        if not isinstance(value, Layers):
            return value
        given = [v if isinstance(v, PoliciesOverride) else PoliciesOverride.model_validate(v) for v in value if v is not None]
        return functools.reduce(PoliciesOverride.then, given) if given else None

    @model_validator(mode="after")
    def _resolve(self) -> PoliciesConfig:
        _ = self.policy_spec
        return self

    @property
    def policy_spec(self) -> PoliciesSpec:
        """The system's block with ``policies`` laid over it, checked (once; again only for a copy
        whose system or policies changed)."""
        if self._resolved is None or self._resolved[:2] != (self.system, self.policies):
            preset = PoliciesOverride.model_validate(system_preset(self.system).policies)
            spec = PoliciesSpec.model_validate(preset.then(self.policies).model_dump(exclude_none=True))
            self._resolved = (self.system, self.policies, spec)
        return self._resolved[2]
