"""A validation error stays one line even when the offending key holds a line break (found by the
hardening property test: a YAML key ``"\\n"`` under ``slo`` split the message in two)."""

from __future__ import annotations

import pydantic

from coda.errors import invalid


class Slo(pydantic.BaseModel, extra="forbid"):
    ttft_s: float = 2.0


def test_a_key_with_a_line_break_is_shown_as_its_repr():
    try:
        Slo.model_validate({"\n": 0})
    except pydantic.ValidationError as err:
        message = str(invalid("config.yaml", err, at="slo"))
    assert "\n" not in message and "slo.'\\n'" in message
