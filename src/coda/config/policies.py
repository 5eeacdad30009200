"""The ``system`` and ``policies`` fields every shell's schema shares, with the one default system.

A configuration names a system preset (``coda systems``) and lays a ``policies`` block over it.
Both are checked when the configuration is loaded, against the registered policies and their
parameter classes, so a misspelt name or an ill-typed parameter is reported with the file it
came from, before anything is built.
"""

from __future__ import annotations

from pydantic import Field, PrivateAttr, model_validator

from coda.policy.presets import DEFAULT_SYSTEM, resolve_policies
from coda.policy.spec import PoliciesOverride, PoliciesSpec
from coda.shell.build import check_policies
from coda.strict import StrictModel


class PoliciesConfig(StrictModel):
    system: str = Field(DEFAULT_SYSTEM, description="the system preset whose policies block this starts from (see `coda systems`)")
    policies: PoliciesOverride | None = Field(None, description="kinds laid over the system's block (ingress, router, state, execution, "
                                              "eviction; each {name, params, shadow}; ingress also {defer})")

    _resolved: tuple[str, PoliciesOverride | None, PoliciesSpec] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _resolve_policies(self) -> PoliciesConfig:
        """Resolved and checked when the configuration is loaded; an unknown system, policy or
        parameter is a ``CodaError`` (``coda.config.load.validated`` names the source)."""
        _ = self.policy_spec
        return self

    @property
    def policy_spec(self) -> PoliciesSpec:
        """The system's block with ``policies`` laid over it, checked against the registry (once;
        again only for a copy whose system or policies changed)."""
        if self._resolved is None or self._resolved[:2] != (self.system, self.policies):
            spec = resolve_policies(self.system, self.policies)
            check_policies(spec)
            self._resolved = (self.system, self.policies, spec)
        return self._resolved[2]
