"""Three `coda serve` replicas sharing a real redis-server, in front of two `coda fake-engine`
workers, driven by the official openai client: they decide as one (a session lands on one worker
whichever replica it goes through; session slots and a tenant's share hold over all three), a
replica killed mid-stream fails only its own streams, and a store that dies is served through
(fail-open or fail-closed) and caught up when it returns. Every test ends with every count at
zero, in the gateways and in the store."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from coda.engines.launch import FakeEngineProcess
from coda.gateway.identity import DEFAULT_TENANT, session_key
from coda.policy.routing import rendezvous
from coda.serving.procs import Proc, running
from tests.integration.redis_server import RedisServer, free_port, redis_server  # noqa: F401  (a fixture)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
MODEL = "coda-fake"
ADMIN = {"authorization": "Bearer admin"}
LABELS = ["w0", "w1"]
PREFIX = "coda"


@pytest.fixture(scope="module")
def engines():
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(FakeEngineProcess("--speedup", "2")) for _ in LABELS]


@contextlib.contextmanager
def replicas(tmp: Path, engines, server: RedisServer, n: int = 3, store: dict | None = None, **cfg) -> Iterator[list[Proc]]:
    """``n`` replicas with one config but their own replica id, all on ``server``."""
    backend = cfg.pop("backend", {})
    base = {"backends": [{"url": e.url, "name": label, **backend} for e, label in zip(engines, LABELS)],
            "auth": {"admin_key": "admin"}, "telemetry": {"scrape_interval_s": 0.05, "health_interval_s": 0.2}, **cfg}
    with contextlib.ExitStack() as stack:
        procs = []
        for i in range(n):
            path = tmp / f"replica{i}.yaml"
            path.write_text(yaml.safe_dump({**base, "store": {"url": server.url, "replica_id": f"r{i}", **(store or {})}}))
            procs.append(stack.enter_context(running("serve", "--config", str(path), "--port", "0")))
        yield procs


def state(gw: Proc) -> dict:
    return httpx.get(gw.url + "/debug/state", headers=ADMIN, timeout=10).json()


def client(url: str, retries: int = 0, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=retries, timeout=60, **kw)


class RoundRobin(httpx.HTTPTransport):
    """Each attempt (the openai client's retries included) goes to the next replica."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__()
        self.urls = [httpx.URL(u) for u in urls]
        self.next = 0
        self.lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            target, self.next = self.urls[self.next % len(self.urls)], self.next + 1
        request.url = request.url.copy_with(host=target.host, port=target.port)
        return super().handle_request(request)


def home(session: str, tenant: str = DEFAULT_TENANT) -> str:
    """The worker a session of ``tenant`` belongs to: the gateway hashes the tenant and the id into
    its session key, and rendezvous-hashes that key over the workers."""
    return LABELS[rendezvous(session_key(tenant, session), LABELS)]


def tables(server: RedisServer) -> dict[str, dict[str, str]]:
    """Each replica's count table in the store, without its sequence number."""
    r = server.client()
    return {k.rsplit(":", 1)[1]: {f: v for f, v in r.hgetall(k).items() if f != "_seq"} for k in r.scan_iter(f"{PREFIX}:replica:*")}


def counts(table: dict) -> dict:
    """The in-flight counts of a table: not the TTFT estimates (``ttft|``), which are not counters."""
    return {k: v for k, v in table.items() if not k.startswith("ttft")}


def all_zero(procs: list[Proc], server: RedisServer) -> bool:
    for gw in procs:
        s = state(gw)
        if s["inflight_requests"] or s["tenant_inflight_tokens"] or counts(s["replica"]["others"]):
            return False
        if any(line.startswith("coda_worker_inflight_requests{") and not line.endswith(" 0.0")
               for line in httpx.get(gw.url + "/metrics").text.splitlines()):
            return False
    # entries are written only when not zero: an idle replica's table holds no count
    return all(not counts(t) for t in tables(server).values())


def assert_counts_return_to_zero(procs: list[Proc], server: RedisServer) -> None:
    wait_until(lambda: all_zero(procs, server), lambda: f"tables {tables(server)}; gateways {[state(g)['replica'] for g in procs]}")


def ask(c: openai.OpenAI, session: str, text: str, max_tokens: int = 2) -> str:
    """One round of a session; the worker that served it."""
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=max_tokens,
                                                      extra_headers={"x-session-id": session})
    assert raw.parse().choices[0].finish_reason == "length"
    return raw.headers["x-coda-worker"]


def test_a_session_lands_on_one_worker_whichever_replica_it_goes_through(tmp_path, engines, redis_server):  # noqa: F811
    with replicas(tmp_path, engines, redis_server) as procs:
        clients = [client(gw.url) for gw in procs]
        sessions = [f"agent-{i}" for i in range(8)]
        served: dict[str, set[str]] = {s: set() for s in sessions}
        for rnd in range(3):
            for i, s in enumerate(sessions):
                served[s].add(ask(clients[(i + rnd) % 3], s, f"round {rnd} of {s}"))
        assert served == {s: {home(s)} for s in sessions}  # one worker each: its rendezvous home
        assert {home(s) for s in sessions} == set(LABELS)  # and the sessions spread over both
        assert_counts_return_to_zero(procs, redis_server)


def test_session_slots_hold_over_all_replicas(tmp_path, engines, redis_server):  # noqa: F811
    ingress = {"name": "session", "params": {"max_sessions": 2}, "defer": {"max_wait_s": 0.5}}
    with replicas(tmp_path, engines, redis_server, policies={"ingress": ingress}) as procs:
        outcomes: list[str] = []

        def one(i: int) -> None:
            try:
                ask(client(procs[i % 3].url), f"s{i}", "hello")
                outcomes.append("ok")
            except openai.APIStatusError as err:
                outcomes.append(f"{err.status_code} {err.body['code']}")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        # two slots in all: one replica alone would have given two of its own
        assert sorted(outcomes) == ["503 session_slots_full"] * 4 + ["ok"] * 2, outcomes
        assert redis_server.client().zcard(f"{PREFIX}:sessions") == 2  # refused sessions' claims were released
        assert_counts_return_to_zero(procs, redis_server)


def test_a_tenant_s_share_holds_over_all_replicas(tmp_path, engines, redis_server):  # noqa: F811
    """One seat per worker (two in all): b holds one, a's first request takes the other; then the
    cluster is saturated (every seat taken; kv_high 0 presses the dual gate's KV side, which the
    fake engines' nearly empty caches would not) and a is over its half share, so each of a's other requests, whichever
    replica it goes through and however close together they come, gets 429."""
    cfg = {"tenants": {"a": {"weight": 1}, "b": {"weight": 1}}, "backend": {"max_num_seqs": 1},
           "policies": {"router": "least_loaded", "ingress": {"name": "tenant_share", "params": {"slack": 0.0, "kv_high": 0.0}}}}
    with replicas(tmp_path, engines, redis_server, **cfg) as procs:
        b = client(procs[0].url, default_headers={"x-tenant-id": "b"})
        held = b.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "long task b"}], max_tokens=3000, stream=True)
        next(iter(held))
        wait_until(lambda: "t|b" in tables(redis_server).get("r0", {}), "b's request is in r0's table")
        outcomes: list[str] = []
        streams = []
        go = threading.Barrier(6)

        def one(i: int) -> None:
            a = client(procs[i % 3].url, default_headers={"x-tenant-id": "a"})
            go.wait()
            try:
                s = a.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "long task a"}], max_tokens=3000, stream=True
                )
                next(iter(s))
                streams.append(s)
                outcomes.append("admitted")
            except openai.RateLimitError as err:
                outcomes.append(err.body["code"])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert sorted(outcomes) == ["admitted"] + ["tenant_over_share"] * 5, outcomes
        tenant_a = sum(state(gw)["tenant_inflight_tokens"].get("a", 0) for gw in procs)
        assert tenant_a == sum(state(gw)["tenant_inflight_tokens"].get("b", 0) for gw in procs) > 0  # one request each
        for s in [held, *streams]:
            s.close()
        assert_counts_return_to_zero(procs, redis_server)


def test_a_replica_killed_mid_stream_fails_only_its_streams(tmp_path, engines, redis_server):  # noqa: F811
    with replicas(tmp_path, engines, redis_server) as procs:
        outcomes: dict[str, str] = {}
        streaming = threading.Semaphore(0)

        def one(i: int) -> None:
            sid = f"agent-{i}"
            c = client(procs[i % 3].url)
            try:
                raw = c.chat.completions.with_raw_response.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": f"task {i}"}],
                    max_tokens=2000,
                    stream=True,
                    extra_headers={"x-session-id": sid},
                )
                assert raw.headers["x-coda-worker"] == home(sid)
                stream = iter(raw.parse())
                chunks = [next(stream)]
                streaming.release()
                chunks += list(stream)
                outcomes[sid] = "ok" if chunks[-1].choices[0].finish_reason else "truncated"
            except openai.APIError as err:
                outcomes[sid] = type(err).__name__

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for _ in threads:
            assert streaming.acquire(timeout=120), f"a stream never started: {outcomes}"
        wait_until(lambda: len(tables(redis_server).get("r1", {})) > 0, "r1's streams are in its table")
        procs[1].popen.kill()
        for t in threads:
            t.join(120)
        assert outcomes == {f"agent-{i}": "APIConnectionError" if i % 3 == 1 else "ok" for i in range(6)}
        wait_until(lambda: "r1" not in tables(redis_server), "the killed replica's table expires")
        # the agents retry their cut rounds; the client's own retry moves past the dead replica, and each lands at home
        rr = client(procs[0].url, retries=3, http_client=httpx.Client(transport=RoundRobin([gw.url for gw in procs])))
        for i in (1, 4):
            for rnd in range(3):
                assert ask(rr, f"agent-{i}", f"retry {rnd} of task {i}") == home(f"agent-{i}")
        assert_counts_return_to_zero([procs[0], procs[2]], redis_server)


def store_detail(gw: Proc) -> str:
    ready = httpx.get(gw.url + "/ready", timeout=10)
    detail = ready.json()["store"]
    # a fail-open replica serves while the store is away; a fail-closed one defers everything, so it is not ready
    assert ready.status_code == (503 if detail == "unreachable (fail-closed)" else 200)
    return detail


def metric(gw: Proc, name: str) -> float:
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in /metrics")


def test_a_store_that_dies_is_served_through_fail_open_and_caught_up_when_it_returns(tmp_path, engines, redis_server):  # noqa: F811
    with replicas(tmp_path, engines, redis_server) as procs:
        c0 = client(procs[0].url)
        held = c0.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "long"}],
            max_tokens=3000,
            stream=True,
            extra_headers={"x-session-id": "kept"},
        )
        next(iter(held))
        wait_until(lambda: float(tables(redis_server).get("r0", {}).get(f"n|{home('kept')}", 0)) == 1, "the stream is in r0's table")
        redis_server.kill()
        wait_until(lambda: all(store_detail(gw) == "unreachable (fail-open)" for gw in procs), "every replica sees the store down")
        assert all(metric(gw, "coda_store_up") == 0 for gw in procs) and metric(procs[0], "coda_store_errors_total") >= 1
        for i, gw in enumerate(procs):  # still served, on each replica's own state
            assert ask(client(gw.url), f"meanwhile-{i}", "while the store is away") in LABELS
        redis_server.start()  # back on its port, empty
        wait_until(lambda: all(store_detail(gw) == "ok" for gw in procs), "every replica sees the store again")
        # resync: r0 republished its stream and the slots it gave while the store was away
        wait_until(lambda: float(tables(redis_server).get("r0", {}).get(f"n|{home('kept')}", 0)) == 1, "r0 republished its stream")
        slots = redis_server.client().zrange(f"{PREFIX}:sessions", 0, -1)
        assert {session_key(DEFAULT_TENANT, s) for s in ("kept", "meanwhile-0", "meanwhile-1", "meanwhile-2")} <= set(slots)
        wait_until(lambda: state(procs[1])["replica"]["others"].get(f"n|{home('kept')}") == 1, "r1 reads r0's stream again")
        held.close()
        assert_counts_return_to_zero(procs, redis_server)
        assert procs[0].stderr().count("serves on its own state") == 1  # one line for the outage


def test_a_store_that_dies_defers_requests_fail_closed_until_it_returns(tmp_path, engines, redis_server):  # noqa: F811
    ingress = {"name": "admit_all", "defer": {"max_wait_s": 120}}
    with replicas(tmp_path, engines, redis_server, n=2, store={"on_unreachable": "closed"}, policies={"ingress": ingress}) as procs:
        assert ask(client(procs[0].url), "before", "the store is up") in LABELS
        redis_server.kill()
        wait_until(lambda: all(store_detail(gw) == "unreachable (fail-closed)" for gw in procs), "every replica sees the store down")
        outcome: list[str] = []
        waiting = threading.Thread(target=lambda: outcome.append(ask(client(procs[1].url), "held", "while the store is away")))
        waiting.start()
        wait_until(lambda: state(procs[1])["queued"] == 1, "the request is deferred")
        redis_server.start()
        waiting.join(120)
        assert outcome == [home("held")]  # admitted once the store answered, and routed to its home
        assert metric(procs[1], "coda_ingress_deferred_total") == 1
        assert_counts_return_to_zero(procs, redis_server)


def test_a_malformed_store_url_is_one_line_and_exit_2_and_an_unreachable_one_is_served_through(tmp_path, engines):
    bad = subprocess.run(
        [sys.executable, "-m", "coda.cli", "serve", "--backend", engines[0].url, "--store", "http://127.0.0.1:6379"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "store.url" in bad.stderr and "redis://" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    with running("serve", "--backend", engines[0].url, "--port", "0", "--store", f"redis://127.0.0.1:{free_port()}/0") as gw:
        assert store_detail(gw) == "unreachable (fail-open)"
        wait_until(lambda: metric(gw, "coda_store_errors_total") >= 3, "the replica keeps trying the store")
        assert ask(client(gw.url), "alone", "no store") == engines[0].url.split("://", 1)[1]
        assert gw.stderr().count("serves on its own state") == 1  # logged once
