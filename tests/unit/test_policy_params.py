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
