"""The vLLM plugin plans cohorts only from gain bounds measured on the engine's own device, says once
why not otherwise, and never wraps an attention backend whose split is not shown correct (FlashInfer)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from coda.cost.profile import load_profile
from coda.integrations.vllm import cohort_backend, cohort_gate
from coda.integrations.vllm.cohort_gate import FIX, Device, cohort_switch, engine_device, profile_device, why_off

CPU = Device("CPU", "AMD EPYC", 2)  # what vllm-cpu-tiny's machine records
RTX4090 = Device("GPU", "NVIDIA GeForce RTX 4090")  # rtx4090-llama31-8b names it and carries fitted gain bounds


@pytest.fixture(scope="module")
def profiles():
    rtx = load_profile("rtx4090-llama31-8b")
    cpu = load_profile("vllm-cpu-tiny")
    return {
        "roofline": load_profile("a100-qwen3coder30b-fp8-roofline"),
        "calibrated": load_profile("a100-qwen3coder30b-fp8-calibrated"),  # its gain bounds are the RTX PRO 6000's, transferred
        "rtx4090": rtx,
        "cpu": cpu,
        "cpu+gain": cpu.model_copy(update={"cohort_gain": rtx.cohort_gain}),
        "remote": cpu.model_copy(update={"machine": None}),
    }


def test_a_profile_records_its_device_from_its_machine_else_the_gpu_it_names(profiles):
    assert profile_device(profiles["cpu"]) == CPU and str(CPU) == "CPU AMD EPYC x 2"
    assert profile_device(profiles["rtx4090"]) == RTX4090
    assert profile_device(profiles["roofline"]) == Device("GPU", "NVIDIA A100-SXM4-80GB")
    assert profile_device(profiles["remote"]) is None
    with_gpu = profiles["cpu"].model_copy(update={"machine": profiles["cpu"].machine.model_copy(update={"gpu": "NVIDIA H100"})})
    assert profile_device(with_gpu) == Device("GPU", "NVIDIA H100")


@pytest.mark.parametrize(
    ("profile", "device", "why"),
    [
        ("rtx4090", RTX4090, None),
        ("cpu+gain", CPU, None),
        ("roofline", CPU, "a100-qwen3coder30b-fp8-roofline is of GPU NVIDIA A100-SXM4-80GB, not of this engine's CPU AMD EPYC x 2"),
        ("rtx4090", Device("GPU", "NVIDIA H100 80GB HBM3"), "is of GPU NVIDIA GeForce RTX 4090, not of this engine's GPU NVIDIA H100"),
        ("cpu+gain", Device("CPU", "AMD EPYC", 16), "is of CPU AMD EPYC x 2, not of this engine's CPU AMD EPYC x 16"),
        ("cpu", CPU, "the profile vllm-cpu-tiny has no cohort gain bounds"),
        ("calibrated", Device("GPU", "NVIDIA A100-SXM4-80GB"), "gain bounds were transferred from rtxpro6000-qwen3-30b-a3b, not measured"),
        ("remote", CPU, "does not record the device it was measured on"),
    ],
)
def test_cohorts_are_planned_only_from_gain_bounds_fitted_on_the_engines_device(profiles, profile, device, why):
    got = why_off("cohort", profiles[profile], device)
    assert got == why if why is None else why in got


def test_split_always_plans_without_the_profile(profiles):
    assert why_off("split_always", profiles["roofline"], CPU) is None
    on, note = cohort_switch("split_always", profiles["roofline"], CPU)
    assert on and note == "cohorts on: split_always plans without gain bounds (checks only)"


def test_cohorts_off_is_one_warning_line_naming_why_and_the_fix(profiles, caplog):
    with caplog.at_level(logging.INFO, logger=cohort_gate.logger.name):
        on, note = cohort_switch("cohort", profiles["roofline"], CPU)
    assert not on and note.startswith("cohorts off: the profile a100-qwen3coder30b-fp8-roofline is of GPU")
    [record] = caplog.records
    line = record.getMessage()
    assert record.levelno == logging.WARNING and "\n" not in line
    assert line.startswith("Coda: cohorts off (execution cohort): the profile a100-qwen3coder30b-fp8-roofline") and line.endswith(FIX)
    assert "pass the engine's measured profile with cohort gain bounds" in FIX


def test_cohorts_on_logs_nothing_and_names_the_bounds(profiles, caplog):
    with caplog.at_level(logging.INFO, logger=cohort_gate.logger.name):
        on, note = cohort_switch("cohort", profiles["cpu+gain"], CPU)
    assert on and note == "cohorts on: the gain bounds of vllm-cpu-tiny, measured on CPU AMD EPYC x 2"
    assert caplog.records == []


def test_the_engines_device_is_its_gpu_or_the_hosts_cpus_as_profiles_record_them(monkeypatch):
    monkeypatch.setattr(cohort_gate, "machine", lambda: {"cpu": "AMD EPYC", "cpus": 2, "gpu": None})
    assert engine_device(SimpleNamespace(is_cpu=lambda: True)) == CPU
    gpu = SimpleNamespace(is_cpu=lambda: False, get_device_name=lambda: "NVIDIA GeForce RTX 4090")
    assert engine_device(gpu) == RTX4090


def backend(name: str) -> type:
    return type(name, (), {"get_name": staticmethod(lambda: name)})


def test_flashinfer_is_never_wrapped_and_its_steps_run_whole():
    assert "FLASHINFER" not in cohort_backend.WRAPPED and "FLASHINFER" in cohort_backend.REFUSED
    with pytest.raises(ValueError, match="FLASHINFER is not wrapped for cohorts: its metadata builder plans one decode wrapper"):
        cohort_backend.cohort_backend(backend("FLASHINFER"))
    note = cohort_backend.refusal([backend("FLASHINFER"), backend("FLASHINFER"), backend("FLASH_ATTN")])
    assert note is not None and "\n" not in note and note.count("FLASHINFER") == 1 and note.endswith("its steps run whole, unsplit")
    assert cohort_backend.refusal([backend("CPU_ATTN"), backend("FLASH_ATTN")]) is None
