"""``CODA_SCHEDULER_CONFIG``: what ``CodaScheduler`` runs, in the schema every shell reads.

A JSON object, or a path to a JSON or YAML file::

    {"system": "vllm+ta", "policies": {"state": {"name": "tiered_aging", "params": {"w_max_s": 30}}},
     "profile": "a100-qwen3coder30b-fp8-roofline", "trace": "/var/log/coda-scheduler.jsonl"}

``system`` and ``policies`` select the policies as ``coda sim`` and ``coda serve`` do; inside vLLM
only the state-admission policy acts (the other kinds are checked, so the same block moved here
from a simulation fails as it would there). ``profile`` is the cost model state admission ranks
by (by default the analytic roofline of the Coda paper's setup: the base install that vLLM loads has no
numba, which a profile with a kernel attention section, like the simulator's default, needs; install
``coda[sim]`` to use one); ``trace`` a JSONL file of every step's admissions and decisions (with the shadow's, if any, and the rule that decided).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from coda.errors import CodaError, invalid, reading
from coda.policy.spec import PoliciesOverride

CONFIG_ENV = "CODA_SCHEDULER_CONFIG"
# A profile the base install can evaluate without numba (see the module docstring).
DEFAULT_PROFILE = "a100-qwen3coder30b-fp8-roofline"


class SchedulerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str = "vllm+ta"
    policies: PoliciesOverride | None = None
    profile: str = DEFAULT_PROFILE
    trace: str | None = None


def load_settings(environ: dict[str, str] | None = None) -> SchedulerSettings:
    """Settings from ``CODA_SCHEDULER_CONFIG`` (inline JSON or a file path); the defaults when unset."""
    raw = (os.environ if environ is None else environ).get(CONFIG_ENV, "").strip()
    data: Any = {}
    if raw.startswith("{"):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as err:
            raise CodaError(f"{CONFIG_ENV}: not valid JSON ({err.msg} at column {err.colno}); pass a JSON object or a file path") from None
    elif raw:
        path = Path(raw)
        if not path.exists():
            raise CodaError(f"{CONFIG_ENV}={raw}: no such file; pass inline JSON or a path to a JSON/YAML file")
        with reading(path, CONFIG_ENV):
            text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
    try:
        return SchedulerSettings.model_validate(data)
    except ValidationError as err:
        raise invalid(CONFIG_ENV, err, f"valid keys: {', '.join(SchedulerSettings.model_fields)}") from None
