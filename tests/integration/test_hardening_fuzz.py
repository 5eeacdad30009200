"""Fuzzing the gateway's HTTP surface: hypothesis draws requests shaped like the APIs' request
models (chat, completions, responses, messages), with fields of every type, odd headers, junk
bodies, other methods and routes, and sends them to `coda serve` in front of a `coda
fake-engine` on loopback. Whatever comes in, the gateway itself never answers 5xx, every 4xx
carries the API's error body, and every count of the gateway is back to 0 afterwards."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from coda.engines.launch import FakeEngineProcess
from coda.gateway.app import GENERATION_ROUTES
from coda.serving.procs import running
from tests.waiting import HANG_GUARD_S, wait_until

pytestmark = pytest.mark.timeout(600)
MODEL = "coda-fake"
ADMIN = {"authorization": "Bearer admin"}
EXAMPLES = 150

junk = st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(), st.text(max_size=12),
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2))
text = st.text(st.characters(codec="utf-8"), max_size=40)
part = st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text", "image_url", "tool_result", "x"])},
                             optional={"text": st.one_of(text, junk)})
message = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer"]), junk)},
    optional={"content": st.one_of(text, st.lists(part, max_size=3), junk), "tool_call_id": junk, "name": junk},
)
body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just(MODEL), junk),
        "messages": st.one_of(st.lists(message, max_size=4), junk),
        "prompt": st.one_of(text, st.lists(text, max_size=2), junk),
        "input": st.one_of(text, st.lists(message, max_size=2), junk),
        "system": st.one_of(text, junk),
        "instructions": st.one_of(text, junk),
        "max_tokens": st.one_of(st.integers(1, 4), junk),
        "max_completion_tokens": st.one_of(st.integers(1, 4), junk),
        "max_output_tokens": st.one_of(st.integers(1, 4), junk),
        "stream": st.one_of(st.booleans(), junk),
        "prompt_cache_key": st.one_of(text, junk),
        "user": st.one_of(text, junk),
        "metadata": st.one_of(st.fixed_dictionaries({}, optional={"user_id": junk, "session_id": junk}), junk),
        "previous_response_id": st.one_of(st.just("resp_1"), junk),
        "conversation": junk,
        "cache_salt": junk,
    },
)
# printable ASCII, without the leading or trailing blank no HTTP client sends
header_value = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80).map(str.strip)
headers = st.fixed_dictionaries(
    {},
    optional={
        "x-session-id": header_value,
        "x-tenant-id": header_value,
        "x-coda-deadline-ms": header_value,
        "session_id": header_value,
        "content-type": st.sampled_from(["application/json", "text/plain", "multipart/form-data"]),
        "authorization": header_value,
    },
)
request = st.one_of(
    st.tuples(st.just("POST"), st.sampled_from(GENERATION_ROUTES), headers, body.map(lambda b: json.dumps(b).encode())),
    st.tuples(st.just("POST"), st.sampled_from(GENERATION_ROUTES), headers, st.binary(max_size=64)),
    st.tuples(st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
              st.sampled_from([*GENERATION_ROUTES, "/v1/models", "/health", "/ready", "/metrics", "/debug/state", "/v2/x", "/"]),
              headers, st.just(b"")),
)


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    with FakeEngineProcess("--speedup", "100") as engine:
        path = folder / "coda.yaml"
        path.write_text(yaml.safe_dump({"backends": [engine.url], "auth": {"admin_key": "admin"}}))
        with running("serve", "--config", str(path), "--port", "0") as g, httpx.Client(base_url=g.url, timeout=HANG_GUARD_S) as client:
            yield g, client


def error_body(path: str, resp: httpx.Response) -> bool:
    """The API's error format: OpenAI's everywhere, Anthropic's on /v1/messages."""
    try:
        err = resp.json()
    except ValueError:
        return False
    if path == "/v1/messages" and err.get("type") == "error":
        return {"type", "message"} <= set(err["error"])
    return isinstance(err.get("error"), dict) and {"message", "type", "param", "code"} <= set(err["error"])


def test_any_request_gets_no_5xx_from_the_gateway_and_an_error_body_on_every_4xx_and_counts_return_to_zero(gw):
    g, client = gw
    seen: dict[int, int] = {}

    @settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(req=request)
    # well-formed requests always run, since a draw may hold none (the 200 side of the surface)
    @example(req=("POST", "/v1/chat/completions", {}, json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                                  "max_tokens": 2}).encode()))
    @example(req=("POST", "/v1/completions", {"x-session-id": "s"}, json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2,
                                                                                "stream": True}).encode()))
    @example(req=("GET", "/health", {}, b""))
    def one(req: tuple[str, str, dict[str, str], bytes]) -> None:
        method, path, hdrs, content = req
        with client.stream(method, path, headers=hdrs, content=content) as resp:
            resp.read()
        seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
        own = "x-coda-worker" not in resp.headers  # answered by the gateway, not relayed from the engine
        assert not (own and resp.status_code >= 500), (method, path, resp.status_code, resp.text[:500])
        if 400 <= resp.status_code < 500 and method != "HEAD":
            assert error_body(path, resp), (method, path, resp.status_code, resp.text[:500])

    one()
    assert seen.get(200) and any(400 <= s < 500 for s in seen), seen  # both sides of the surface were reached

    def idle() -> bool:
        s = client.get("/debug/state", headers=ADMIN).json()
        return s["inflight_requests"] == 0 and s["queued"] == 0 and not any(s["tenant_inflight_tokens"].values()) and all(
            w["inflight_requests"] == 0 and w["inflight_tokens"] == 0 for w in s["workers"]
        )

    wait_until(idle, lambda: f"counts after fuzzing: {client.get('/debug/state', headers=ADMIN).text[:2000]}")
    assert client.get("/health").status_code == 200
