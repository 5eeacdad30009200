"""``CODA_SCHEDULER_CONFIG``: what ``CodaScheduler`` runs, in the schema every shell reads.

A JSON object, or a path to a JSON or YAML file::

    {"system": "coda", "policies": {"state": {"name": "tiered_aging", "params": {"w_max_s": 30}}},
     "profile": "a100-qwen3coder30b-fp8-roofline", "trace": "/var/log/coda-scheduler.jsonl"}

``system`` and ``policies`` select the policies as ``coda sim`` and ``coda serve`` do; inside vLLM
only the state-admission policy acts (the other kinds are checked, so the same block moved here
from a simulation fails as it would there). ``profile`` is the cost model state admission ranks
by (by default the analytic roofline of the Coda paper's setup: the base install that vLLM loads has no
numba, which a profile with a kernel attention section, like the simulator's default, needs; install
``coda[sim]`` to use one); ``trace`` a JSONL file of every step's admissions and decisions (with the shadow's, if any, and the rule that decided).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import Field

from coda.config.load import read_config, validated
from coda.config.policies import PoliciesConfig

CONFIG_ENV = "CODA_SCHEDULER_CONFIG"
# A profile the base install can evaluate without numba (see the module docstring).
DEFAULT_PROFILE = "a100-qwen3coder30b-fp8-roofline"


class SchedulerSettings(PoliciesConfig):
    profile: str = Field(DEFAULT_PROFILE, description="the cost profile state admission ranks by")
    trace: str | None = Field(None, description="JSONL file of every step's admissions and decisions")


def load_settings(environ: Mapping[str, str] | None = None) -> SchedulerSettings:
    """Settings from ``CODA_SCHEDULER_CONFIG`` (inline JSON or a file path); the defaults when unset."""
    raw = (os.environ if environ is None else environ).get(CONFIG_ENV, "").strip()
    data = read_config(raw, CONFIG_ENV) if raw else {}
    return validated(SchedulerSettings, data, CONFIG_ENV, f"valid keys: {', '.join(SchedulerSettings.model_fields)}")
