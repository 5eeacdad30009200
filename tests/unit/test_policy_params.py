"""A policy's parameters checked against the model built from its signature (``coda.policy.params``)."""

from __future__ import annotations

import pytest

from coda.errors import CodaError
from coda.policy.params import AtLeastOne, Positive, checked


def factory(window: AtLeastOne, tau_s: Positive = 5.0) -> None:
    """A policy with a parameter that has no default."""


def test_given_values_are_typed_and_only_they_are_returned():
    assert checked(factory, {"window": 3, "tau_s": 2}, "p") == {"window": 3, "tau_s": 2.0}


@pytest.mark.parametrize(("params", "line"), [
    ({"tau_s": 1.0}, "p: parameter window has no default; give it in params"),
    ({"window": 0}, "p: window must be >= 1, got 0"),
    ({"window": 2, "tau_s": 0}, "p: tau_s must be > 0, got 0"),
    ({"window": "x"}, "p: parameter window='x' must be an integer"),
    ({"window": 2, "tau": 1}, "p: unknown parameter(s) tau; valid: window, tau_s"),
])
def test_a_bad_block_is_one_line_naming_the_parameter(params, line):
    with pytest.raises(CodaError) as err:
        checked(factory, params, "p")
    assert str(err.value) == line


def test_a_configuration_checks_each_parameter_once_at_load_and_the_build_only_calls_the_factory(monkeypatch):
    """The checked arguments travel with the configuration: building from it never checks again,
    so a parameter's route ends at its policy (docs/architecture.md)."""
    from coda.cost.model import build_cost_model
    from coda.cost.profile import load_profile
    from coda.policy import spec as spec_module
    from coda.policy.state import TieredAging
    from coda.shell.build import build_policies
    from coda.sim.config import SimConfig

    calls: list[str] = []
    real = spec_module.checked
    monkeypatch.setattr(spec_module, "checked", lambda f, params, label: calls.append(label) or real(f, params, label))
    config = SimConfig(system="vllm", policies={"state": {"name": "tiered_aging", "params": {"tau_s": 3}}})
    assert calls == ["ingress policy admit_all", "router round_robin", "state admission policy tiered_aging", "execution policy full",
                     "eviction policy lru"]
    calls.clear()
    built = build_policies(config.policy_spec, kinds=("router", "state"), cost=build_cost_model(load_profile(config.profile)))
    assert calls == []
    assert isinstance(built.state, TieredAging) and built.state.tau_s == 3.0 and isinstance(built.state.tau_s, float)
