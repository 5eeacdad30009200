"""The base of every configuration schema: unknown keys are errors (a misspelt option must not
be ignored) and a validated configuration is immutable."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
