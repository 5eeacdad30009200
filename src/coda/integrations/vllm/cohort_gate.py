"""Cohorts only from gain bounds measured on the engine's own device.

A split pays only where the engine's attention kernel costs a skewed decode batch more than its
two cohorts, which depends on the kernel and the device it runs on. A profile's paired gain bounds
(``cohort_gain``, fitted by ``coda profile fit-gain`` on full-versus-cohort launches measured on
one device) answer that for that device and no other. So the execution policies that plan from the
profile (``cohort``) plan only when the profile was measured on this engine's device and carries a
``cohort_gain`` section fitted for it, not transferred from another profile. The device a profile
records is its ``machine`` (what ``coda profile measure`` writes: the host's CPU model and count,
and its GPU if it has one), else the GPU a datasheet profile names (``gpu.name``); the engine's is
what vLLM's platform reports (vLLM-CPU's attention runs on the host's CPUs). Otherwise cohorts are
off: the scheduler logs one line at startup saying why, and the worker wraps no attention backend
(a wrapped one runs outside CUDA graphs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from coda.cost.profile import Profile
from coda.machine import machine

logger = logging.getLogger("vllm.coda.scheduler")
#: execution policies that plan without the profile's gain bounds (``split_always``: checks only)
PROFILE_FREE = frozenset({"split_always"})
FIX = ("pass the engine's measured profile with cohort gain bounds as the profile in CODA_SCHEDULER_CONFIG "
       "(`coda profile measure` against this engine, then `coda profile fit-gain` on launches measured on its device)")


@dataclass(frozen=True, slots=True)
class Device:
    """Where attention runs: a GPU by name, or a host's CPUs by model and count (vLLM-CPU)."""

    kind: Literal["CPU", "GPU"]
    name: str
    cpus: int | None = None

    def __str__(self) -> str:
        return f"{self.kind} {self.name}" + (f" x {self.cpus}" if self.cpus is not None else "")


def profile_device(profile: Profile) -> Device | None:
    """The device a profile's timings belong to, or None where it records none (a profile measured
    through a remote endpoint)."""
    m = profile.machine
    if m is not None:
        return Device("GPU", m.gpu) if m.gpu else Device("CPU", m.cpu, m.cpus)
    return Device("GPU", profile.gpu.name) if profile.gpu is not None else None


def engine_device(platform: Any) -> Device:
    """The device of this vLLM process (``platform``: ``vllm.platforms.current_platform``), named as
    ``coda profile measure`` records one (vLLM-CPU's platform names itself only "cpu")."""
    if platform.is_cpu():
        host = machine()
        return Device("CPU", host["cpu"], host["cpus"])
    return Device("GPU", platform.get_device_name())


def why_off(execution: str, profile: Profile, device: Device) -> str | None:
    """Why the execution policy (any but ``full``) plans no cohorts with ``profile`` on ``device``;
    None where it plans them."""
    if execution in PROFILE_FREE:
        return None
    recorded = profile_device(profile)
    if recorded is None:
        return f"the profile {profile.name} does not record the device it was measured on"
    if recorded != device:
        return f"the profile {profile.name} is of {recorded}, not of this engine's {device}"
    gain = profile.cohort_gain
    if gain is None:
        return f"the profile {profile.name} has no cohort gain bounds"
    if gain.transferred_from is not None:
        return f"the profile {profile.name}'s cohort gain bounds were transferred from {gain.transferred_from}, not measured on this engine"
    return None


def cohort_switch(execution: str, profile: Profile, device: Device) -> tuple[bool, str]:
    """Whether the scheduler plans cohorts, and the note its startup line and trace carry; where a
    policy that plans from the profile cannot, one warning line says why and names the fix (the
    scheduler calls this once, at startup)."""
    why = why_off(execution, profile, device)
    if why is not None:
        logger.warning("Coda: cohorts off (execution %s): %s; %s", execution, why, FIX)
        return False, f"cohorts off: {why}"
    if execution in PROFILE_FREE:
        return True, f"cohorts on: {execution} plans without gain bounds (checks only)"
    return True, f"cohorts on: the gain bounds of {profile.name}, measured on {device}"
