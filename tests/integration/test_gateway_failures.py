"""`coda serve` when things go wrong: an engine killed mid-stream (no request hangs, in-flight
counts return to zero, the worker is ejected and re-admitted), SIGTERM (in-flight streams finish),
and the KV-event path (engine events reach the gateway's indexer)."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from coda.engines.launch import FakeEngineProcess
from coda.serving.procs import running, spawn
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
MODEL = "coda-fake"
ADMIN = {"authorization": "Bearer admin"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(tmp: Path, **cfg) -> str:
    path = tmp / "coda.yaml"
    path.write_text(yaml.safe_dump({"auth": {"admin_key": "admin"}, **cfg}))
    return str(path)


def state(url: str) -> dict:
    return httpx.get(url + "/debug/state", headers=ADMIN).json()


@pytest.mark.parametrize("midstream", ["abort", "error_event"])
def test_engine_killed_mid_stream(tmp_path, midstream):
    port = free_port()
    with contextlib.ExitStack() as stack:
        # streams long enough (2,000 tokens, several seconds) that all six are still running when the engine dies
        e0 = stack.enter_context(FakeEngineProcess("--speedup", "2"))
        e1 = FakeEngineProcess("--speedup", "2", "--port", str(port))
        stack.enter_context(e1)
        cfg = write_config(tmp_path, backends=[e0.url, e1.url], policies={"router": "round_robin"}, midstream_failure=midstream,
                           telemetry={"health_interval_s": 0.2, "eject_after": 2, "readmit_after": 1})
        gw = stack.enter_context(running("serve", "--config", cfg, "--port", "0"))
        outcomes: list[str] = []
        streaming = threading.Semaphore(0)  # released once per stream that has its first chunk

        def one(i: int) -> None:
            c = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0, timeout=60)
            try:
                stream = iter(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"task {i}"}], max_tokens=2000,
                                                        stream=True))
                chunks = [next(stream)]
                streaming.release()
                chunks += list(stream)
                outcomes.append("ok" if chunks[-1].choices[0].finish_reason else "truncated")
            except openai.APIError as err:
                outcomes.append(f"{type(err).__name__}: {err}")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for _ in threads:  # every stream has started
            assert streaming.acquire(timeout=120), f"a stream never started: {outcomes}"
        assert state(gw.url)["inflight_requests"] == 6  # none has finished yet
        e1.proc.kill()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a request hung"
        assert outcomes.count("ok") == 3, outcomes  # round-robin put three on the surviving engine
        cut = [o for o in outcomes if o != "ok"]
        # by default the client's connection is aborted, a transport error the openai client raises as APIConnectionError
        # (retryable); with error_event the stream ends with the gateway's error event, naming the backend
        expect = "APIConnectionError" if midstream == "abort" else "failed mid-stream"
        assert len(cut) == 3 and all(expect in o for o in cut), cut
        # new requests are served: retried away from the dead engine, then it is ejected
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0, timeout=60)
        for i in range(4):
            assert c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"after {i}"}], max_tokens=2).choices
        wait_until(lambda: not state(gw.url)["workers"][1]["healthy"])
        s = state(gw.url)
        assert s["inflight_requests"] == 0 and s["tenant_inflight_tokens"] == {}
        assert all(w["inflight_requests"] == 0 and w["inflight_tokens"] == 0 for w in s["workers"])
        assert 'coda_upstream_retries_total' in httpx.get(gw.url + "/metrics").text
        # the engine comes back on its address: health checks re-admit it
        e1b = stack.enter_context(FakeEngineProcess("--speedup", "2", "--port", str(port)))
        assert e1b.url == e1.url
        wait_until(lambda: state(gw.url)["workers"][1]["healthy"])
        label = e1.url.removeprefix("http://")
        log = gw.stderr()
        assert f"backend {label} ejected" in log and log.index(f"backend {label} ejected") < log.index(f"backend {label} re-admitted")
        workers = {c.chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=1)
                   .headers["x-coda-worker"] for _ in range(4)}
        assert len(workers) == 2


def test_sigterm_drains_in_flight_streams(tmp_path):
    with FakeEngineProcess("--speedup", "4") as engine:
        gw = spawn("serve", "--config", write_config(tmp_path, backends=[engine.url], drain_timeout_s=20), "--port", "0")
        try:
            c = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0, timeout=60)
            stream = iter(
                c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "long"}], max_tokens=500, stream=True)
            )
            assert next(stream).choices
            gw.popen.send_signal(signal.SIGTERM)
            chunks = list(stream)
            assert chunks[-1].choices[0].finish_reason == "length"  # the gateway waited for the stream: it finished, not cut
            assert gw.popen.wait(60) == 0
            with pytest.raises(httpx.ConnectError):
                httpx.get(gw.url + "/health", timeout=2)
        finally:
            gw.stop()


def test_kv_events_reach_the_indexer(tmp_path):
    pub, replay = free_port(), free_port()
    with FakeEngineProcess(
        "--speedup", "50", "--chunk-tokens", "16", "--kv-events", f"tcp://*:{pub}", "--kv-events-replay", f"tcp://*:{replay}"
    ) as engine:
        backend = {"url": engine.url, "kv_events": f"tcp://127.0.0.1:{pub}", "kv_events_replay": f"tcp://127.0.0.1:{replay}"}
        log = tmp_path / "decisions.jsonl"
        cfg = write_config(tmp_path, backends=[backend], indexer={"tokenizer": "words", "block_tokens": 16}, decision_log=str(log))
        # a request served before the gateway starts: its blocks arrive through the replay socket
        httpx.post(
            engine.url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "early " * 64}], "max_tokens": 2},
        )
        context = " ".join(f"w{i}" for i in range(120))
        with running("serve", "--config", cfg, "--port", "0") as gw:
            wait_until(lambda: state(gw.url)["workers"][0]["indexed_blocks"]["hbm:0"] >= 4, lambda: state(gw.url)["workers"][0])
            c = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0, timeout=60)
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": context}], max_tokens=2)
            wait_until(lambda: state(gw.url)["workers"][0]["kv_events"]["batches"] >= 2)
            # another session with the same context: the indexer knows the engine holds its prefix
            c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": context + " and more"}],
                max_tokens=2,
                extra_headers={"x-session-id": "other"},
            )
            ev = state(gw.url)["workers"][0]["kv_events"]
            assert ev["replays"] >= 1 and ev["bad_messages"] == 0
        records = [json.loads(line) for line in log.read_text().splitlines()]
        assert records[0]["prefix_hit"] == 0.0 and records[1]["prefix_hit"] > 0.8


def test_kv_events_that_never_arrive_are_flagged_and_routing_uses_the_gateway_s_own_index(tmp_path):
    silent = free_port()  # nothing publishes here: the engine runs without --kv-events, as a misconfigured endpoint delivers nothing
    with FakeEngineProcess("--speedup", "50", "--chunk-tokens", "16") as engine:
        backend = {"url": engine.url, "name": "w0", "kv_events": f"tcp://127.0.0.1:{silent}"}
        log = tmp_path / "decisions.jsonl"
        cfg = write_config(
            tmp_path,
            backends=[backend],
            indexer={"tokenizer": "words", "block_tokens": 16},
            decision_log=str(log),
            kv_events={"expect_within_s": 0.5},
            telemetry={"health_interval_s": 0.2},
        )
        with running("serve", "--config", cfg, "--port", "0") as gw:
            ready = httpx.get(gw.url + "/ready").json()
            assert ready["kv_events_missing"] == []  # no request yet: nothing is expected
            c = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0, timeout=60)
            context = " ".join(f"w{i}" for i in range(120))
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": context}], max_tokens=2)
            wait_until(lambda: httpx.get(gw.url + "/ready").json()["kv_events_missing"], "the worker is flagged in /ready")
            ready = httpx.get(gw.url + "/ready")
            assert ready.status_code == 200 and ready.json()["kv_events_missing"] == [{"worker": "w0", "endpoint": backend["kv_events"]}]
            assert 'coda_worker_kv_events_missing{worker="w0"} 1.0' in httpx.get(gw.url + "/metrics").text
            # meanwhile the gateway indexes what it sends: another session with the same context finds its prefix
            c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": context + " and more"}],
                max_tokens=2,
                extra_headers={"x-session-id": "other"},
            )
            c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": context + " and other"}],
                max_tokens=2,
                extra_headers={"x-session-id": "third"},
            )
            stderr = gw.stderr()
        records = [json.loads(line) for line in log.read_text().splitlines()]
        # the first request went out while events were expected, so nothing indexed it; the second, after the flag, was indexed
        assert [r["prefix_hit"] > 0.8 for r in records] == [False, False, True]
        assert stderr.count("no KV event batch from " + backend["kv_events"]) == 1  # one log line, naming the endpoint
