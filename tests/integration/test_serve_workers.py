"""`coda serve --workers 2` in front of two `coda fake-engine` workers, driven over fresh
connections (so the kernel hands them to both processes) with the official openai client: the two
processes decide as one through the store their parent serves (a session's rounds all reach its
home engine whichever process takes them; two session slots hold over both processes), the parent
passes SIGTERM on and the workers drain, a worker that dies stops the server (exit 1), a worker
that cannot start stops it with its one-line error (exit 2), and workers whose parent is killed
exit; a port already in use is one error line. Which process served a request is read from each
worker's own access log."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from coda.engines.launch import FakeEngineProcess
from coda.gateway.identity import DEFAULT_TENANT, session_key
from coda.policy.routing import rendezvous
from coda.serving.procs import Proc, running
from tests.integration.redis_server import redis_server  # noqa: F401  (a fixture)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
MODEL = "coda-fake"
LABELS = ["w0", "w1"]
WORKERS = 2


@pytest.fixture(scope="module")
def engines():
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(FakeEngineProcess("--speedup", "10")) for _ in LABELS]


@contextlib.contextmanager
def gateway(tmp: Path, engines, env: dict[str, str] | None = None, **cfg) -> Iterator[Proc]:
    """``coda serve --workers 2`` with an access log per worker (``access.0.jsonl``, ``access.1.jsonl``)."""
    path = tmp / "coda.yaml"
    path.write_text(yaml.safe_dump({"backends": [{"url": e.url, "name": label} for e, label in zip(engines, LABELS)],
                                    "access_log": {"path": str(tmp / "access.jsonl")},
                                    "telemetry": {"scrape_interval_s": 0.05, "health_interval_s": 0.2}, **cfg}))
    with running("serve", "--config", str(path), "--port", "0", "--workers", str(WORKERS), env=env) as gw:
        yield gw


def records(tmp: Path) -> list[list[dict]]:
    """Each worker's access-log records (flushed twice a second)."""
    return [[json.loads(line) for line in p.read_text().splitlines()] if p.exists() else [] for p in
            (tmp / f"access.{i}.jsonl" for i in range(WORKERS))]


def logged(tmp: Path, n: int) -> list[list[dict]]:
    """The workers' records once they hold all ``n`` requests sent."""
    wait_until(lambda: sum(map(len, records(tmp))) == n, lambda: f"{n} requests in the access logs, found {list(map(len, records(tmp)))}")
    return records(tmp)


def client(gw: Proc) -> openai.OpenAI:
    """No connection is kept alive, so each request is a new connection for either process to accept."""
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0, timeout=60,
                         http_client=httpx.Client(limits=httpx.Limits(max_keepalive_connections=0)))


def ask(gw: Proc, session: str, text: str) -> str:
    """One round of a session; the engine that served it."""
    raw = client(gw).chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=2,
                                                             extra_headers={"x-session-id": session})
    assert raw.parse().choices[0].finish_reason == "length"
    return raw.headers["x-coda-worker"]


def home(session: str) -> str:
    """The engine a session belongs to: the rendezvous hash of its key over the engines."""
    return LABELS[rendezvous(session_key(DEFAULT_TENANT, session), LABELS)]


def in_threads(n: int, one: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


def rounds(gw: Proc, sessions: list[str], served: dict[str, list[str]]) -> None:
    """Three rounds of each session, two sessions at a time: no engine is ever more than two
    requests busier than the other, so the router's load bound never overrides a session's home."""

    def one(i: int) -> None:
        for s in sessions[i::2]:
            served[s] = [ask(gw, s, f"round {r} of {s}") for r in range(3)]

    in_threads(2, one)


def at_once(gw: Proc, sessions: list[str]) -> list[str]:
    """A first request of each session, all sent together: ``ok`` or the status and error code of each."""
    go = threading.Barrier(len(sessions))
    outcomes: list[str] = []

    def one(i: int) -> None:
        go.wait()
        try:
            ask(gw, sessions[i], "hello")
            outcomes.append("ok")
        except openai.APIStatusError as err:
            outcomes.append(f"{err.status_code} {err.body['code']}")

    in_threads(len(sessions), one)
    return outcomes


def children(gw: Proc) -> list[int]:
    return [int(pid) for pid in Path(f"/proc/{gw.pid}/task/{gw.pid}/children").read_text().split()]


def alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's new parent may be slow to reap it, or never do)."""
    with contextlib.suppress(FileNotFoundError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    return False


def test_a_session_keeps_its_engine_whichever_process_takes_its_rounds(tmp_path, engines):
    """Batches of eight sessions until both processes have served requests and some session has had
    rounds through both."""
    with gateway(tmp_path, engines) as gw:
        served: dict[str, list[str]] = {}
        for batch in range(20):
            rounds(gw, [f"agent-{batch}-{i}" for i in range(8)], served)
            logs = logged(tmp_path, 3 * len(served))
            keys = [{r["session"] for r in log} for log in logs]
            if all(logs) and keys[0] & keys[1]:
                break
        assert all(logs) and keys[0] & keys[1], f"the kernel gave every session's connections to one process: {list(map(len, logs))}"
        assert served == {s: [home(s)] * 3 for s in served}  # every round at its session's home engine
        assert {home(s) for s in served} == set(LABELS)  # and the sessions spread over both engines
        assert all(r["status"] == 200 for log in logs for r in log)


@pytest.mark.parametrize("store", ["one-host", "redis"])
def test_session_slots_hold_over_both_processes(tmp_path, engines, store, request):
    """Two slots in all, in the store the parent serves or in Redis: batches of six new sessions at
    once until both processes have decided some, and over every batch exactly two sessions are admitted."""
    ingress = {"name": "session", "params": {"max_sessions": 2}, "defer": {"max_wait_s": 0.5}}
    shared = {"store": {"url": request.getfixturevalue("redis_server").url}} if store == "redis" else {}
    with gateway(tmp_path, engines, policies={"ingress": ingress}, **shared) as gw:
        outcomes: list[str] = []
        for batch in range(20):
            outcomes += at_once(gw, [f"s{batch}-{i}" for i in range(6)])
            logs = logged(tmp_path, len(outcomes))
            if all(logs):
                break
        assert all(logs), f"the kernel gave every connection to one process: {list(map(len, logs))}"
        assert sorted(outcomes) == ["503 session_slots_full"] * (len(outcomes) - 2) + ["ok"] * 2, outcomes
        assert len({r["session"] for log in logs for r in log if r["status"] == 200}) == 2


def test_sigterm_to_the_parent_drains_every_worker(tmp_path, engines):
    with gateway(tmp_path, engines) as gw:
        workers = children(gw)
        assert len(workers) == WORKERS
        stream = client(gw).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a long task"}], max_tokens=400,
                                                  stream=True)
        chunks = [next(iter(stream))]
        gw.popen.send_signal(signal.SIGTERM)
        chunks += list(stream)  # the stream under way finishes
        assert chunks[-1].choices[0].finish_reason == "length"
        assert gw.popen.wait(60) == 0
        assert not any(map(alive, workers))


def test_a_worker_that_dies_stops_the_server(tmp_path, engines):
    with gateway(tmp_path, engines) as gw:
        dead, other = children(gw)
        os.kill(dead, signal.SIGKILL)
        assert gw.popen.wait(60) == 1
        lines = [line for line in gw.stderr().splitlines() if "ERROR" in line]
        assert len(lines) == 1 and f"pid {dead}) was killed by SIGKILL; stopping the other gateway processes" in lines[0], gw.stderr()
        assert not alive(other)  # stopped (it drained) before the parent exited


def test_workers_whose_parent_is_killed_exit(tmp_path, engines):
    """A parent killed cannot remove its store's directory: it makes it in a TMPDIR the test removes
    (under /tmp, as a Unix socket's path must be short)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as short, gateway(tmp_path, engines, env={"TMPDIR": short}) as gw:
        workers = children(gw)
        gw.popen.kill()
        gw.popen.wait(10)
        wait_until(lambda: not any(map(alive, workers)), "the orphaned workers exit")


def test_usage_and_startup_errors_are_one_line(tmp_path):
    def coda(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "coda.cli", "serve", *args], capture_output=True, text=True, timeout=120)

    zero = coda("--backend", "http://127.0.0.1:9", "--workers", "0")
    assert zero.returncode == 2
    assert zero.stderr.strip() == "error: --workers 0: the gateway runs at least one process; pass --workers 1 or more"
    with socket.socket() as held:  # a server that shares its port (SO_REUSEPORT): the gateway must not join it
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = coda("--backend", "http://127.0.0.1:9", "--port", str(held.getsockname()[1]), "--workers", "2")
    assert taken.returncode == 2 and taken.stderr.count("\n") == 1 and "Address already in use" in taken.stderr, taken.stderr
    cfg = tmp_path / "coda.yaml"
    cfg.write_text(yaml.safe_dump({"backends": ["http://127.0.0.1:9"], "telemetry": {"startup_timeout_s": 0.2}}))
    down = coda("--config", str(cfg), "--port", "0", "--workers", "2")
    assert down.returncode == 2, down.stderr
    assert down.stderr.count("error:") == 1 and "did not answer GET /v1/models" in down.stderr, down.stderr  # once, not once per worker
