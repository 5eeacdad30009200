"""Cohorts plan only from the engine's own gain bounds, in real vLLM-CPU engines.

Two engines with ``CodaScheduler``, ``CodaWorker`` and the ``cohort`` policy differ only in the
profile: the default (an A100 roofline, no gain bounds) and one recorded on this machine's CPU with
a fitted ``cohort_gain`` section (the RTX 4090 profile's, copied for the test: the rule reads where
bounds were measured, not what they say). Four requests of different lengths then decode on each.
The first engine says once, at startup, that cohorts are off and why, plans no step and wraps no
attention backend; the second plans its pure-decode steps.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from openai import AsyncOpenAI

from coda.cost.profile import profile_data
from coda.machine import machine
from tests.integration.vllm.support import build_tiny_model, vllm_servers

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

ARGS = ["--dtype", "float32", "--block-size", "32", "--num-gpu-blocks-override", "96", "--max-model-len", "3000", "--max-num-seqs", "4",
        "--scheduler-cls", "coda.integrations.vllm.scheduler.CodaScheduler", "--worker-cls", "coda.integrations.vllm.worker.CodaWorker"]
COHORT = {"system": "coda", "policies": {"execution": "cohort"}}
OFF_LINE = "Coda: cohorts off (execution cohort): the profile a100-qwen3coder30b-fp8-roofline is of GPU NVIDIA A100-SXM4-80GB, not of"


def this_cpu_with_gain_bounds() -> dict:
    data = profile_data("vllm-cpu-tiny") | {"name": "vllm-cpu-tiny-here", "machine": machine()}
    return data | {"cohort_gain": profile_data("rtx4090-llama31-8b")["cohort_gain"]}


async def decode_together(url: str) -> None:
    c = AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
    body = {"ignore_eos": True}
    await asyncio.gather(*(c.completions.create(model="tiny", prompt=[7 + i] * n, max_tokens=16, temperature=0, extra_body=body)
                           for i, n in enumerate((40, 90, 600, 1200))))


def test_cohorts_are_off_with_another_devices_profile_and_say_so_once(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cohort_profile")
    model = build_tiny_model(tmp / "model")
    profile = tmp / "here.json"
    profile.write_text(json.dumps(this_cpu_with_gain_bounds()))
    traces, logs = [tmp / "default.jsonl", tmp / "here.jsonl"], [tmp / "default.log", tmp / "here.log"]
    envs = [{"CODA_SCHEDULER_CONFIG": json.dumps(COHORT | {"trace": str(traces[0])})},
            {"CODA_SCHEDULER_CONFIG": json.dumps(COHORT | {"trace": str(traces[1]), "profile": str(profile)})}]
    with vllm_servers(model, [ARGS, ARGS], envs=envs, logs=logs) as urls:
        for url in urls:
            asyncio.run(decode_together(url))
    default, here = ([json.loads(line) for line in t.read_text().splitlines()] for t in traces)
    log = logs[0].read_text()
    assert log.count(OFF_LINE) == 1, log[-3000:]
    assert "pass the engine's measured profile with cohort gain bounds" in log.split(OFF_LINE, 1)[1].splitlines()[0]
    assert "execution cohort (cohorts off: the profile a100-qwen3coder30b-fp8-roofline is of GPU" in log
    assert "cohort attention wraps nothing (cohorts off)" in log
    assert default[0]["cohorts"].startswith("cohorts off: the profile a100-qwen3coder30b-fp8-roofline")
    assert len(default) > 10 and all(r["cohort"] is None and r["split_steps"] == 0 for r in default[1:])
    log = logs[1].read_text()
    assert "cohorts off" not in log and "cohort attention wraps CPU_ATTN" in log
    assert here[0]["cohorts"].startswith("cohorts on: the gain bounds of vllm-cpu-tiny-here, measured on CPU ")
    assert any(r["cohort"] is not None for r in here[1:])  # its pure-decode steps are planned
