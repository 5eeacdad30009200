"""`coda serve` in front of two `coda fake-engine` workers on loopback, used through the official
openai client: fidelity against going direct, session stickiness, and every client mistake as an
OpenAI-format 4xx."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from coda.engines.launch import FakeEngineProcess
from coda.gateway.identity import session_key
from coda.serving.procs import running
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
MODEL = "coda-fake"
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    tmp: Path = tmp_path_factory.mktemp("gw")
    with contextlib.ExitStack() as stack:
        engines = [stack.enter_context(FakeEngineProcess("--speedup", "20", "--max-model-len", "4096", "--default-max-tokens", "16"))
                   for _ in range(2)]
        cfg = {
            "backends": [e.url for e in engines],
            "auth": {"api_keys": {"key-a": "a", "key-b": "b"}, "admin_key": "admin"},
            "indexer": {"tokenizer": "words", "block_tokens": 16},
            "max_body_bytes": 200_000,
            "decision_log": str(tmp / "decisions.jsonl"), "policies": {"ingress": {"shadow": "queue_limit"}},
            "access_log": {"path": "-"},
        }
        (tmp / "coda.yaml").write_text(yaml.safe_dump(cfg))
        with running("serve", "--config", str(tmp / "coda.yaml"), "--port", "0") as gw:
            yield gw, engines, tmp


def client(url: str, key: str = "key-a", **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=20, **kw)


def strip_ids(obj):
    """A response without the fields that differ on every call (ids, timestamps)."""
    if isinstance(obj, dict):
        return {k: strip_ids(v) for k, v in obj.items() if k not in ("id", "created", "created_at", "call_id")}
    if isinstance(obj, list):
        return [strip_ids(v) for v in obj]
    return obj


CONTENT_KEYS = ("content", "text", "arguments", "partial_json", "delta")


def stream_summary(events: list[dict]) -> tuple[str, list]:
    """A stream's generated text and its skeleton (events with text blanked, consecutive repeats
    merged): equal for two streams of the same generation however the engine batched tokens."""
    text: list[str] = []

    def blank(obj):
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                if k in CONTENT_KEYS and isinstance(v, str):
                    text.append(v)
                    out[k] = ""
                else:
                    out[k] = blank(v)
            return out
        return [blank(v) for v in obj] if isinstance(obj, list) else obj

    skeletons: list = []
    for ev in events:
        sk = blank(strip_ids(ev))
        if not skeletons or skeletons[-1] != sk:
            skeletons.append(sk)
    return "".join(text), skeletons


def test_chat_with_tools_round_trips_unchanged_streaming_and_not(cluster):
    gw, engines, _ = cluster
    msgs = [{"role": "system", "content": "you are a coding agent"}, {"role": "user", "content": "open the readme please"}]
    args = dict(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="auto", max_tokens=12, temperature=0.0)
    via = client(gw.url).chat.completions.create(**args)
    direct = client(engines[0].url, key="unused").chat.completions.create(**args)
    assert via.choices[0].message.tool_calls[0].function.name == "read_file"
    assert strip_ids(via.model_dump()) == strip_ids(direct.model_dump())

    def collect(c: openai.OpenAI):
        chunks = list(c.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
        return [strip_ids(ch.model_dump()) for ch in chunks]

    streamed, streamed_direct = collect(client(gw.url)), collect(client(engines[1].url, key="unused"))
    assert stream_summary(streamed) == stream_summary(streamed_direct) and len(streamed) > 3
    call = "".join(
        ch["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
        for ch in streamed
        if ch["choices"] and ch["choices"][0]["delta"].get("tool_calls")
    )
    assert json.loads(call)["input"]  # the streamed arguments reassemble into the JSON the engine produced
    assert streamed[-1]["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {"model": MODEL, "prompt": "def main():", "max_tokens": 5, "stream": True}),
        ("/v1/responses", {"model": MODEL, "input": "hello", "max_output_tokens": 5, "tools": TOOLS}),
        ("/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "stream": True}),
    ],
)
def test_other_apis_pass_through(cluster, path, body):
    gw, engines, _ = cluster
    via = httpx.post(gw.url + path, json=body, headers={"authorization": "Bearer key-b"}, timeout=20)
    direct = httpx.post(engines[0].url + path, json=body, timeout=20)
    assert via.status_code == direct.status_code == 200
    if body.get("stream"):
        events = [json.loads(line[6:]) for line in via.text.splitlines() if line.startswith("data: {")]
        events_direct = [json.loads(line[6:]) for line in direct.text.splitlines() if line.startswith("data: {")]
        assert stream_summary(events) == stream_summary(events_direct) and events
    else:
        assert strip_ids(via.json()) == strip_ids(direct.json())


def test_models_are_merged_and_need_a_key(cluster):
    gw, _, _ = cluster
    assert [m.id for m in client(gw.url).models.list()] == [MODEL]
    with pytest.raises(openai.AuthenticationError):
        client(gw.url, key="nope").models.list()


def test_session_sticks_to_the_worker_holding_its_context(cluster):
    gw, engines, _ = cluster
    c = client(gw.url)
    # Hold worker 0 (the least-loaded tie-break) busy with two streams, more than the router's load
    # slack, so the session starts on the other worker; one stream would make worker 0 the only
    # load-eligible worker with decoders, which the coda router prefers.
    busy = [
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"long task {i}"}], max_tokens=3000, stream=True)
        for i in range(2)
    ]
    assert all(next(iter(b)).choices for b in busy)
    msgs = [{"role": "user", "content": " ".join(["context"] * 200)}]
    workers = []
    for turn in range(5):
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL, messages=msgs, max_tokens=4, extra_headers={"x-session-id": "sticky"}
        )
        workers.append(raw.headers["x-coda-worker"])
        reply = raw.parse().choices[0].message.content
        msgs = msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": f"tool output {turn} " * 20}]
        if turn == 0:
            for b in busy:
                b.close()  # worker 0 is idle from here on: only KV affinity keeps the session where it is
    assert workers == [engines[1].url.split("://")[1]] * 5  # without affinity the idle worker 0 would win the tie


def test_client_mistakes_get_openai_errors_never_500(cluster):
    gw, _, _ = cluster
    c = client(gw.url)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401 and "missing API key" in r.json()["error"]["message"]
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        client(gw.url, key="stolen").chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="maximum context length is 4096") as exc:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 5000}])
    assert "checked by the gateway" in str(exc.value)
    with pytest.raises(openai.APIStatusError, match="max_body_bytes") as exc:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * 300_000}])
    assert exc.value.status_code == 413
    auth = {"authorization": "Bearer key-a", "content-type": "application/json"}
    cases = [
        (httpx.post, "/v1/chat/completions", b'{"model": "coda-fake", "messages": [', 400, "not valid JSON"),
        (httpx.post, "/v1/chat/completions", b"[1, 2]", 400, "must be a JSON object"),
        (httpx.post, "/v1/chat/completions", b'{"model": 3}', 400, "model must be a string"),
        (httpx.post, "/v1/embeddings", b"{}", 404, "no such route"),
        (httpx.get, "/v1/chat/completions", None, 405, "Method Not Allowed"),
    ]
    for fn, path, content, status, text in cases:
        r = fn(gw.url + path, headers=auth, **({"content": content} if content is not None else {}), timeout=10)
        assert r.status_code == status, (path, r.text)
        assert text in r.json()["error"]["message"] and r.json()["error"]["type"]
    # the engine's own 4xx passes through unchanged (a bad parameter the gateway does not check)
    r = httpx.post(
        gw.url + "/v1/chat/completions", headers=auth, json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}
    )
    assert r.status_code == 400 and "n must be 1" in r.json()["error"]["message"]


def test_health_ready_metrics_and_debug_state(cluster):
    gw, _, tmp = cluster
    assert httpx.get(gw.url + "/health").status_code == 200
    assert httpx.get(gw.url + "/ready").json()["healthy_workers"] == 2
    client(gw.url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, extra_headers={"x-session-id": "secret-session-42"}
    )
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'coda_ingress_decisions_total{action="admit",policy="admit_all",reason="ok"}' in metrics
    assert 'coda_tenant_output_tokens_total{tenant="a"}' in metrics
    assert "secret-session-42" not in metrics  # no unbounded label values
    assert 'coda_shadow_decisions_total{agree="true",shadow="queue_limit"}' in metrics
    assert httpx.get(gw.url + "/debug/state").status_code == 401
    state = httpx.get(gw.url + "/debug/state", headers={"authorization": "Bearer admin"}).json()
    assert state["inflight_requests"] == 0 and len(state["workers"]) == 2
    assert any(s["session"] == session_key("a", "secret-session-42") for s in state["recent_sessions"])  # known by its tenant's key


def test_per_backend_latency_metrics_and_the_access_log(cluster):
    gw, engines, _ = cluster
    c = client(gw.url)
    secret = "a prompt that must not be logged"
    raw = c.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": secret}],
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-session-id": "logged-1"},
    )
    worker = raw.headers["x-coda-worker"]
    chunks = list(raw.parse())
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": secret}])
    metrics = httpx.get(gw.url + "/metrics").text
    for name in ("coda_backend_ttft_seconds_count", "coda_backend_e2e_seconds_count"):
        assert f'{name}{{worker="{worker}"}}' in metrics  # per backend, labelled by its configured label only

    def logged() -> list[dict]:
        return [json.loads(line) for line in gw.stderr().splitlines() if line.startswith("{")]

    key = session_key("a", "logged-1")  # the session as the logs know it: a digest of tenant and id, never the id
    wait_until(lambda: any(r.get("session") == key for r in logged()), "the stream's access-log record")
    lines = logged()
    mine = next(r for r in lines if r.get("session") == key)
    assert (mine["status"], mine["outcome"], mine["worker"], mine["stream"], mine["tries"]) == (200, "ok", worker, True, 1)
    assert mine["usage"] == [chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens] and mine["ttft_s"] <= mine["e2e_s"]
    assert any(r["status"] == 404 and r["outcome"] == "model_not_found" for r in lines)  # refused before routing: logged too
    assert secret not in gw.stderr() and "logged-1" not in gw.stderr()  # no prompt text, no client session id


def test_concurrent_requests_all_complete(cluster):
    gw, _, _ = cluster
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            chunks = list(
                client(gw.url).chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": f"task {i}"}],
                    max_tokens=8,
                    stream=True,
                    extra_headers={"x-session-id": f"s{i}"},
                )
            )
            assert chunks[-1].choices[0].finish_reason == "length"
        except BaseException as err:  # noqa: BLE001  (reported below)
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    state = httpx.get(gw.url + "/debug/state", headers={"authorization": "Bearer admin"}).json()
    assert state["inflight_requests"] == 0 and state["tenant_inflight_tokens"] == {}
