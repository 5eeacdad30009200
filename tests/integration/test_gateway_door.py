"""`coda serve` against hostile and careless clients, on loopback in front of a `coda fake-engine`:
session slots belong to their tenant, client identifiers cost bounded memory that is given back
after the session TTL, the logs reach their files while the gateway idles and record what each
client saw, and a drain keeps answering (503 + Retry-After) until the streams under way end."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from coda.engines.launch import FakeEngineProcess
from coda.serving.procs import Proc, running, spawn
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
MODEL = "coda-fake"
ADMIN = {"authorization": "Bearer admin"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def engine():
    with FakeEngineProcess("--speedup", "4") as e:
        yield e


def config(tmp: Path, engine: FakeEngineProcess, **cfg) -> str:
    path = tmp / "coda.yaml"
    base = {"backends": [engine.url], "auth": {"admin_key": "admin"}, "decision_log": str(tmp / "decisions.jsonl"),
            "access_log": {"path": str(tmp / "access.jsonl")}}
    path.write_text(yaml.safe_dump({**base, **cfg}))
    return str(path)


@contextlib.contextmanager
def gateway(tmp: Path, engine: FakeEngineProcess, **cfg) -> Iterator[Proc]:
    with running("serve", "--config", config(tmp, engine, **cfg), "--port", "0") as gw:
        yield gw


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def state(gw: Proc) -> dict:
    return httpx.get(gw.url + "/debug/state", headers=ADMIN).json()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def chat(url: str, tenant: str, session: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=CHAT, headers={"x-tenant-id": tenant, "x-session-id": session}, timeout=60)


def test_a_session_slot_belongs_to_its_tenant(tmp_path, engine):
    """With every session slot held by tenant alpha, tenant beta is deferred whether it names a new
    session or one of alpha's: reusing another tenant's id does not skip the deferral."""
    ingress = {"name": "session", "params": {"max_sessions": 2}, "defer": {"max_wait_s": 0.2}}
    with gateway(tmp_path, engine, policies={"ingress": ingress}) as gw:
        assert chat(gw.url, "alpha", "a1").status_code == 200
        assert chat(gw.url, "alpha", "a2").status_code == 200
        fresh = chat(gw.url, "beta", "b1")
        assert fresh.status_code == 503 and fresh.json()["error"]["code"] == "session_slots_full"
        hijack = chat(gw.url, "beta", "a1")
        assert hijack.status_code == 503 and hijack.json()["error"]["code"] == "session_slots_full"
        assert "retry-after" in hijack.headers
        assert chat(gw.url, "alpha", "a1").status_code == 200  # the owner's session continues


def test_unique_large_session_ids_cost_memory_only_until_the_session_ttl(tmp_path, engine):
    """Many requests, each with its own 64 KiB session id: the gateway keeps a fixed-size key per
    session, forgets idle sessions after the TTL (one second here), and its RSS comes back to
    about where it started; holding the ids would keep 60 MiB."""
    ingress = {"name": "session", "params": {"idle_ttl_s": 1.0}}
    n, size = 1000, 64 * 1024
    with gateway(tmp_path, engine, policies={"ingress": ingress}) as gw:
        with httpx.Client(timeout=60) as c:
            for i in range(20):  # warm: imports, connections, allocator pools
                assert c.post(gw.url + "/v1/chat/completions", json=CHAT, headers={"x-session-id": f"warm-{i}"}).status_code == 200
            wait_until(lambda: state(gw)["sessions_tracked"] == 0, "the warm-up sessions expire")
            baseline = rss_mib(gw.pid)
            for i in range(n):
                sid = f"{i:08d}".ljust(size, "x")
                assert c.post(gw.url + "/v1/chat/completions", json=CHAT, headers={"x-session-id": sid}).status_code == 200
        s = state(gw)
        assert s["active_sessions"] > 0 and all(len(x["session"]) == 32 for x in s["recent_sessions"])  # digests, not the ids
        wait_until(
            lambda: (lambda st: st["active_sessions"] == 0 and st["sessions_tracked"] == 0 and st["session_cache_mib"] == 0)(state(gw)),
            lambda: f"session tables after the TTL: {state(gw)}",
        )
        wait_until(lambda: rss_mib(gw.pid) < baseline + 24, lambda: f"RSS {rss_mib(gw.pid):.1f} MiB against {baseline:.1f} MiB before")
    logged = records(tmp_path / "access.jsonl") + records(tmp_path / "decisions.jsonl")
    assert logged and max(len(json.dumps(r)) for r in logged) < 4096  # no client string is logged whole


def test_an_overlong_tenant_name_is_refused_naming_the_limit(tmp_path, engine):
    with gateway(tmp_path, engine) as gw:
        r = chat(gw.url, "t" * 8192, "s")
        assert r.status_code == 400 and "at most 64" in r.json()["error"]["message"]
        assert chat(gw.url, "t" * 64, "s").status_code == 200


def test_logs_reach_their_files_while_the_gateway_idles(tmp_path, engine):
    """Records are flushed on a timer, not by the next request: after five requests and no more,
    both logs hold five records, so a kill -9 then loses none."""
    with gateway(tmp_path, engine) as gw:
        for i in range(5):
            assert chat(gw.url, "t", f"s{i}").status_code == 200
        for log in ("decisions.jsonl", "access.jsonl"):
            wait_until(
                lambda log=log: len(records(tmp_path / log)) == 5, lambda log=log: f"{log}: {len(records(tmp_path / log))} of 5 records"
            )
        gw.popen.kill()
        gw.popen.wait(60)
    assert [r["rid"] for r in records(tmp_path / "access.jsonl")] == [1, 2, 3, 4, 5]


def test_both_logs_record_the_status_the_client_saw(tmp_path, engine):
    """An engine's 400, passed through, is a 400 in both logs, and not an ``ok`` outcome."""
    with gateway(tmp_path, engine) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "n": 2}, timeout=60)
        assert r.status_code == 400
        wait_until(lambda: records(tmp_path / "access.jsonl") and records(tmp_path / "decisions.jsonl"))
    [access], [decision] = records(tmp_path / "access.jsonl"), records(tmp_path / "decisions.jsonl")
    assert access["status"] == 400 and access["outcome"] == "engine_error"
    assert decision["status"] == 400 and decision["action"] == "admit"


def test_clients_that_leave_after_the_headers_are_logged_once_each_without_flooding_stderr(tmp_path, engine):
    n = 50
    body = json.dumps({**CHAT, "max_tokens": 2000, "stream": True}).encode()
    with gateway(tmp_path, engine) as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        for _ in range(n):
            with socket.create_connection((host, int(port))) as s:
                s.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(body), body)
                )
                assert s.recv(12).startswith(b"HTTP/1.1 200")
        wait_until(
            lambda: len(records(tmp_path / "access.jsonl")) == n and state(gw)["inflight_requests"] == 0,
            lambda: f"{len(records(tmp_path / 'access.jsonl'))} of {n} records",
        )
        logged = records(tmp_path / "access.jsonl")
        assert {r["outcome"] for r in logged} == {"client_disconnected"} and {r["status"] for r in logged} == {200}
        assert gw.stop() == 0
        err = gw.stderr()
    assert "socket.send() raised exception" not in err and "Traceback" not in err, err[-2000:]


@contextlib.contextmanager
def draining(
    tmp: Path, engine: FakeEngineProcess, drain_timeout_s: float, max_tokens: int
) -> Iterator[tuple[Proc, openai.OpenAI, Iterator]]:
    """A gateway with one stream under way, sent SIGTERM; yields the gateway, a client and the
    stream's remaining chunks, then checks the gateway exited 0 without a traceback."""
    gw = spawn("serve", "--config", config(tmp, engine, drain_timeout_s=drain_timeout_s), "--port", "0")
    try:
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0, timeout=60)
        stream = iter(
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "long"}], max_tokens=max_tokens, stream=True)
        )
        assert next(stream).choices
        gw.popen.send_signal(signal.SIGTERM)
        yield gw, c, stream
        assert gw.popen.wait(60) == 0
        err = gw.stderr()
    finally:
        gw.stop()
    assert "Traceback" not in err and "Exception in ASGI application" not in err, err[-2000:]


def test_a_drain_answers_503_with_retry_after_until_the_stream_under_way_ends(tmp_path, engine):
    with draining(tmp_path, engine, drain_timeout_s=60, max_tokens=400) as (gw, c, stream):
        wait_until(lambda: httpx.get(gw.url + "/ready", timeout=10).status_code == 503)
        ready = httpx.get(gw.url + "/ready", timeout=10)
        assert ready.json()["draining"] is True and "retry-after" in ready.headers
        with pytest.raises(openai.APIStatusError) as refused:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "new"}], max_tokens=2)
        assert refused.value.status_code == 503 and "retry-after" in refused.value.response.headers
        chunks = list(stream)
        assert chunks[-1].choices[0].finish_reason == "length"  # finished, not cut
    outcomes = sorted((r["status"], r["outcome"]) for r in records(tmp_path / "access.jsonl"))
    assert outcomes == [(200, "ok"), (503, "draining")]


def test_a_stream_past_the_drain_timeout_is_cut_and_logged_once(tmp_path, engine):
    with draining(tmp_path, engine, drain_timeout_s=0.5, max_tokens=100_000) as (_, _, stream):
        with pytest.raises(openai.APIConnectionError):
            list(stream)
    [access], [decision] = records(tmp_path / "access.jsonl"), records(tmp_path / "decisions.jsonl")
    assert access["status"] == 200 and access["outcome"] == "drain_timeout" and decision["status"] == 200
