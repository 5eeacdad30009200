"""`coda serve`'s door against hostile clients, on loopback in front of a `coda fake-engine`: every
limit of ``limits`` (header count and bytes, request line, JSON depth, head and body timeouts, idle
keep-alive, open connections) is enforced with an OpenAI-style error body where HTTP allows one,
memory stays bounded, and ``/ready`` tells the truth when a fail-closed store is down.

Raw sockets speak HTTP here: the point is what a client library would never send. Every wait is on
the server closing the connection, with a socket timeout that only guards against a hang."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from coda.engines.launch import FakeEngineProcess
from coda.serving.procs import Proc, running
from tests.integration.redis_server import free_port
from tests.waiting import HANG_GUARD_S, wait_until

pytestmark = pytest.mark.timeout(300)
MODEL = "coda-fake"
#: small limits, so that a test trips them with a request of a few KiB (the defaults are documented in docs/gateway.md)
LIMITS = {"max_headers": 32, "max_header_bytes": 4096, "max_request_line_bytes": 1024, "header_timeout_s": 0.5,
          "body_timeout_s": 0.5, "keep_alive_timeout_s": 0.5}


@pytest.fixture(scope="module")
def engine():
    with FakeEngineProcess("--speedup", "4") as e:
        yield e


@contextlib.contextmanager
def gateway(tmp: Path, engine: FakeEngineProcess, **cfg) -> Iterator[Proc]:
    path = tmp / f"coda-{len(list(tmp.glob('coda-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump({"backends": [engine.url], **cfg}))
    with running("serve", "--config", str(path), "--port", "0") as gw:
        yield gw


@pytest.fixture(scope="module")
def gw(tmp_path_factory, engine):
    with gateway(tmp_path_factory.mktemp("door"), engine, limits=LIMITS) as g:
        yield g


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=HANG_GUARD_S)


def read_all(s: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset counts as a close)."""
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def exchange(url: str, data: bytes) -> bytes:
    """Send ``data`` (as much as the server takes before it closes) and read until it closes."""
    with connect(url) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)
        return read_all(s)


def parse(resp: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, json.loads(body)


def openai_error(body: dict, code: str) -> None:
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["code"] == code, body
    assert body["error"]["message"]


def request(path: str = "/health", headers: bytes = b"", method: bytes = b"GET") -> bytes:
    return method + b" " + path.encode() + b" HTTP/1.1\r\nhost: x\r\n" + headers + b"\r\n"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def healthy(gw: Proc) -> bool:
    return httpx.get(gw.url + "/health", timeout=HANG_GUARD_S).status_code == 200


def test_a_json_body_nested_100000_levels_deep_is_a_400_not_a_500(gw):
    raw = b'{"model":"' + MODEL.encode() + b'","messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    resp = httpx.post(gw.url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}, timeout=HANG_GUARD_S)
    assert resp.status_code == 400
    openai_error(resp.json(), "json_too_deep")
    # just past the limit too, where the decoder itself would have coped
    raw = b'{"model":"' + MODEL.encode() + b'","messages":[{"role":"user","content":"hi"}],"x":' + b"[" * 200 + b"]" * 200 + b"}"
    assert httpx.post(gw.url + "/v1/chat/completions", content=raw, timeout=HANG_GUARD_S).json()["error"]["code"] == "json_too_deep"


def test_too_many_headers_or_header_bytes_get_431_with_an_error_body(gw):
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(LIMITS["max_headers"] + 1))
    status, _, body = parse(exchange(gw.url, request(headers=many)))
    assert status == 431
    openai_error(body, "headers_too_large")
    status, _, body = parse(exchange(gw.url, request(headers=b"x-big: " + b"a" * (LIMITS["max_header_bytes"] + 1) + b"\r\n")))
    assert status == 431
    openai_error(body, "headers_too_large")
    assert healthy(gw)


def test_ten_thousand_headers_and_a_64_mib_header_are_cut_without_growing_memory(gw):
    before = rss_mib(gw.pid)
    for data in (b"".join(b"x-h%d: v\r\n" % i for i in range(10_000)), b"x-big: " + b"a" * (64 * 2**20)):
        resp = exchange(gw.url, request(headers=data))
        assert resp == b"" or parse(resp)[0] == 431  # answered, or cut off before the client finished sending
        assert healthy(gw)
    # the 64 MiB header took RSS up by 120 MiB when the parser held it whole; cut at the limit it holds a few KiB
    assert rss_mib(gw.pid) - before < 32


def test_the_default_limits_refuse_the_reported_heads(tmp_path, engine):
    """With no limits configured: 10,000 headers, one 1 MiB header and a 16 KiB request line, each
    accepted before the limits existed."""
    with gateway(tmp_path, engine) as g:
        for data in (request(headers=b"".join(b"x-h%d: v\r\n" % i for i in range(10_000))),
                     request(headers=b"x-big: " + b"a" * 2**20 + b"\r\n"), request("/health?q=" + "a" * 16384)):
            resp = exchange(g.url, data)
            assert resp == b"" or parse(resp)[0] in (414, 431)  # answered, or cut off before the client finished sending
        assert healthy(g)


def test_a_request_line_past_the_limit_gets_414(gw):
    status, _, body = parse(exchange(gw.url, request("/health?q=" + "a" * LIMITS["max_request_line_bytes"])))
    assert status == 414
    openai_error(body, "uri_too_long")


def test_a_head_or_a_body_that_stalls_is_answered_408_and_closed(gw):
    """A head that never ends, a body sent one byte and never finished, a connection that never
    sends: each is closed by the server (before the limits, none was closed after 40 s)."""
    body_stall = request("/v1/chat/completions", b"content-type: application/json\r\ncontent-length: 1000\r\n", b"POST") + b"{"
    stalled = [request().removesuffix(b"\r\n"), body_stall]
    socks = [connect(gw.url) for _ in range(20)]
    try:
        for i, s in enumerate(socks[:-1]):
            s.sendall(stalled[i % 2])
        for i, s in enumerate(socks):  # each returns once the server closes it; the socket timeout guards a hang
            resp = read_all(s)
            if i == len(socks) - 1:
                assert resp == b""  # sent nothing: closed without an answer
            else:
                status, _, body = parse(resp)
                assert status == 408
                openai_error(body, "timeout")
    finally:
        for s in socks:
            s.close()
    assert healthy(gw)


def test_a_body_that_stalls_after_its_answer_gets_no_second_answer(gw):
    """The gateway answers 413 on the declared length before the body comes; the stalled rest of
    the body then only closes the connection."""
    head = request("/v1/chat/completions", b"content-type: application/json\r\ncontent-length: %d\r\n" % (64 * 2**20), b"POST")
    resp = exchange(gw.url, head + b'{"model":')
    assert resp.count(b"HTTP/1.1 ") == 1
    status, _, body = parse(resp)
    assert status == 413
    openai_error(body, "request_too_large")


def test_an_idle_keep_alive_connection_is_closed(gw):
    with connect(gw.url) as s:
        s.sendall(request())
        # read_all returns once the server closes the connection, idle for keep_alive_timeout_s after its answer
        assert read_all(s).startswith(b"HTTP/1.1 200")


def test_a_connection_past_the_cap_gets_503_with_retry_after(tmp_path, engine):
    with gateway(tmp_path, engine, limits={"max_connections": 4}) as g:
        held = [connect(g.url) for _ in range(4)]
        try:
            for s in held:  # each is open and served: a request on it completes
                s.sendall(request())
                assert s.recv(65536).startswith(b"HTTP/1.1 200")
            status, headers, body = parse(exchange(g.url, request()))
            assert status == 503 and int(headers["retry-after"]) >= 1
            openai_error(body, "too_many_connections")
        finally:
            for s in held:
                s.close()
        wait_until(lambda: healthy(g), "served again once the server has seen the held connections close")


@pytest.mark.parametrize("mode, ready", [("closed", 503), ("open", 200)])
def test_ready_is_503_while_a_fail_closed_store_is_down(tmp_path, engine, mode, ready):
    store = {"url": f"redis://127.0.0.1:{free_port()}/0", "on_unreachable": mode}
    with gateway(tmp_path, engine, store=store) as g:
        resp = httpx.get(g.url + "/ready", timeout=HANG_GUARD_S)
        assert resp.status_code == ready and resp.json()["store"] == f"unreachable (fail-{mode})"
        assert ("retry-after" in resp.headers) == (ready == 503)
