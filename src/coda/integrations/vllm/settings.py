"""``CODA_SCHEDULER_CONFIG``: what ``CodaScheduler`` runs, in the schema every shell reads.

A JSON object, or a path to a JSON or YAML file::

    {"system": "coda", "policies": {"state": {"name": "tiered_aging", "params": {"w_max_s": 30}}},
     "tiers": true, "retention": {"prior_s": 30}, "profile": "a100-qwen3coder30b-fp8-roofline",
     "trace": "/var/log/coda-scheduler.jsonl"}

``system`` and ``policies`` select the policies as ``coda sim`` and ``coda serve`` do. Inside vLLM
three kinds act, one per mechanism, each switched by its policy: ``state`` orders the waiting
queue (``tiered_aging``; ``fifo`` is vLLM's order); ``execution`` splits pure-decode attention into
context cohorts (``cohort``, or ``split_always`` to check exactness; ``full`` is one launch; it
needs ``--worker-cls coda.integrations.vllm.worker.CodaWorker``); ``eviction`` holds a finished
request's blocks through its tool call (``tool_aware``; ``lru`` frees them at once, as vLLM does).
``tiers`` switches the fourth mechanism, the external KV tiers in the state cost: with a supported
KV connector, each waiting request's DRAM/SSD hit is read from it (``false``: they read 0). The
other kinds (ingress, router) are checked, so the same block moved here from a simulation fails
as it would there.

``retention`` tunes the holds (see ``RetentionSettings``); ``profile`` is the cost model the
policies rank by (by default the analytic roofline of the Coda paper's setup: the base install that
vLLM loads has no numba, which a profile with a kernel attention section, like the simulator's
default, needs; install ``coda[sim]`` to use one). The ``cohort`` policy plans only from the
engine's own measured profile (``coda profile measure``) with cohort gain bounds fitted on its
device (``coda profile fit-gain``); with any other, the default included, cohorts are off and the
scheduler says why at startup (``coda.integrations.vllm.cohort_gate``). ``trace`` is a JSONL file
of every step's decisions, each with the rule that made it (admissions with the shadow's choice,
if any, cohort plans with their predicted gain, holds and releases).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from pydantic import Field, PositiveFloat, PositiveInt, StrictBool, field_validator

from coda.config.load import read_config, validated
from coda.policy.spec import PoliciesConfig
from coda.strict import StrictModel

CONFIG_ENV = "CODA_SCHEDULER_CONFIG"
#: the policy kinds that act inside vLLM (the others are checked only)
ENFORCED = ("state", "execution", "eviction")
# A profile the base install can evaluate without numba (see the module docstring).
DEFAULT_PROFILE = "a100-qwen3coder30b-fp8-roofline"
#: tool calls as Hermes-style models (Qwen2.5, Qwen3) write them, and as Qwen3-Coder's XML format does
DEFAULT_TOOL_CALL_PATTERN = r'<tool_call>\s*\{\s*"name"\s*:\s*"(?P<name>[^"]+)"|<function=(?P<function>[^>\s]+)>'


class RetentionSettings(StrictModel):
    """How long a request that ended with tool calls keeps its blocks (with ``eviction: tool_aware``).

    The hold lasts ``hold_factor`` times the predicted tool time (the policy's online predictor,
    per tool identity), or ``prior_s`` while that tool has fewer observed calls than the policy's
    ``min_samples``, and at most ``max_hold_s``. The three defaults are assumed, not measured: a
    coding agent's tool calls take seconds to about a minute, and a call twice its tool's mean still
    finds its blocks. Tool calls are read from the end of the request's output (its last
    ``tail_tokens`` tokens, decoded with the model's tokenizer) with ``tool_call_pattern``, a
    regular expression whose named groups capture tool names.
    """

    prior_s: PositiveFloat = Field(30.0, description="hold of a tool without enough observed calls, in seconds (assumed)")
    hold_factor: PositiveFloat = Field(2.0, description="a hold lasts this times the predicted tool time (assumed)")
    max_hold_s: PositiveFloat = Field(300.0, description="longest hold, in seconds (assumed)")
    tool_call_pattern: str = Field(DEFAULT_TOOL_CALL_PATTERN, description="regular expression whose named groups capture tool names")
    tail_tokens: PositiveInt = Field(512, description="output tokens decoded to look for tool calls")

    @field_validator("tool_call_pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            compiled = re.compile(value)
        except re.error as err:
            raise ValueError(f"not a regular expression ({err})") from None
        if not compiled.groupindex:
            raise ValueError("needs a named group that captures the tool name, e.g. (?P<name>[^\"]+)")
        return value


class SchedulerSettings(PoliciesConfig):
    tiers: StrictBool = Field(True, description="read the KV connector's DRAM/SSD hits into the state cost (a supported connector only)")
    retention: RetentionSettings = Field(RetentionSettings(), description="how long tool-aware retention holds a finished request's blocks")
    profile: str = Field(DEFAULT_PROFILE, description="the cost profile the policies rank by")
    trace: str | None = Field(None, description="JSONL file of every step's decisions, each with its rule")


def load_settings(environ: Mapping[str, str] | None = None) -> SchedulerSettings:
    """Settings from ``CODA_SCHEDULER_CONFIG`` (inline JSON or a file path); the defaults when unset."""
    raw = (os.environ if environ is None else environ).get(CONFIG_ENV, "").strip()
    data = read_config(raw, CONFIG_ENV) if raw else {}
    return validated(SchedulerSettings, data, CONFIG_ENV, f"valid keys: {', '.join(SchedulerSettings.model_fields)}")
