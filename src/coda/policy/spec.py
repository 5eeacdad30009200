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
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from coda.strict import StrictModel

KINDS = ("ingress", "router", "state", "execution", "eviction")


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


class PoliciesSpec(StrictModel):
    """A complete block: every kind named. ``BASELINE`` is what an empty block means."""

    ingress: IngressSpec
    router: PolicySpec
    state: PolicySpec
    execution: PolicySpec
    eviction: PolicySpec

    def merged(self, over: PoliciesOverride | None) -> PoliciesSpec:
        """This block with ``over`` laid on top, kind by kind, with the rules of ``PoliciesOverride.then``."""
        if over is None:
            return self
        whole = PoliciesOverride.model_validate(self.model_dump(exclude_none=True))
        return PoliciesSpec.model_validate(whole.then(over).model_dump(exclude_none=True))

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


BASELINE = PoliciesSpec(
    ingress=IngressSpec(name="admit_all"),
    router=PolicySpec(name="round_robin"),
    state=PolicySpec(name="fifo"),
    execution=PolicySpec(name="full"),
    eviction=PolicySpec(name="lru"),
)
