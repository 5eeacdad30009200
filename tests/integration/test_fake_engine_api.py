"""`coda fake-engine` as clients see it: the official openai client, the four APIs, vLLM's metric
names, OpenAI-format errors for client mistakes, prefix reuse, and aborts on disconnect."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from coda.engines.launch import FakeEngineProcess
from coda.protocol import tokenizer as tok
from tests.waiting import wait_until

MODEL = "coda-fake"
CHUNK = 16


@pytest.fixture(scope="module")
def engine():
    with FakeEngineProcess("--speedup", "20", "--chunk-tokens", str(CHUNK), "--max-model-len", "4000") as eng:
        yield eng
    assert eng.proc is not None and eng.proc.returncode in (0, -15), f"fake engine did not stop cleanly: {eng.stderr()}"


@pytest.fixture(scope="module")
def client(engine):
    return openai.OpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0)


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def prompt_tokens(url: str, messages: list[dict]) -> int:
    return httpx.post(url + "/tokenize", json={"messages": messages}).json()["count"]


def test_openai_chat_streams_exact_token_counts(engine, client):
    messages = [{"role": "system", "content": tok.text(1, 40)}, {"role": "user", "content": "list the files please"}]
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=7, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    text, usage, reasons = "", None, []
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reasons.append(choice.finish_reason)
    assert len(text.split()) == 7 and usage.completion_tokens == 7
    assert usage.prompt_tokens == prompt_tokens(engine.url, messages) == 40 + 4 + 2 * 2 + 1
    assert reasons[-1] == "length"
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=7)
    assert again.choices[0].message.content == text  # deterministic for the same prompt


def test_openai_chat_tool_calls_stream_and_not(client):
    tools = [
        {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object", "properties": {"input": {"type": "string"}}}}}
    ]
    messages = [{"role": "user", "content": "run the tests"}]
    resp = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=5)
    call = resp.choices[0].message.tool_calls[0]
    assert resp.choices[0].finish_reason == "tool_calls" and call.function.name == "Bash"
    assert len(json.loads(call.function.arguments)["input"].split()) == 5
    args, names = "", set()
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=5, stream=True):
        for c in chunk.choices[0].delta.tool_calls or ():
            args += c.function.arguments or ""
            names.add(c.function.name)
    assert json.loads(args) == json.loads(call.function.arguments) and "Bash" in names
    # The tool call and its result are part of the next prompt's context.
    follow = messages + [resp.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "ok"}]
    nxt = client.chat.completions.create(model=MODEL, messages=follow, max_tokens=3)
    assert nxt.usage.prompt_tokens > resp.usage.prompt_tokens + 5


def test_prefix_reuse_is_what_the_token_blocks_share(engine, client):
    first = [{"role": "user", "content": tok.text(7, 300)}]
    r1 = client.chat.completions.create(model=MODEL, messages=first, max_tokens=40, extra_body={"ignore_eos": True})
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    second = first + [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": tok.text(8, 50)}]
    r2 = client.chat.completions.create(model=MODEL, messages=second, max_tokens=4)
    # KV of prompt + output minus the last sampled token is cached, in whole blocks.
    assert r2.usage.prompt_tokens_details.cached_tokens == (r1.usage.prompt_tokens + 40 - 1) // CHUNK * CHUNK
    edited = [{"role": "user", "content": tok.text(7, 100) + " " + tok.text(9, 200)}]  # shares the first 101 tokens
    r3 = client.chat.completions.create(model=MODEL, messages=edited, max_tokens=2)
    assert r3.usage.prompt_tokens_details.cached_tokens == 101 // CHUNK * CHUNK


def test_completions_responses_and_messages(engine, client):
    done = client.completions.create(model=MODEL, prompt="def main ( ) :", max_tokens=4)
    assert len(done.choices[0].text.split()) == 4 and done.usage.prompt_tokens == 5
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(model=MODEL, prompt="def main ( ) :", max_tokens=4, stream=True) if c.choices
    )
    assert streamed == done.choices[0].text

    resp = client.responses.create(model=MODEL, input="summarize the diff", instructions="be brief", max_output_tokens=6)
    assert resp.status == "completed" and len(resp.output_text.split()) == 6 and resp.usage.output_tokens == 6
    deltas, final = "", None
    for ev in client.responses.create(model=MODEL, input="summarize the diff", instructions="be brief", max_output_tokens=6, stream=True):
        if ev.type == "response.output_text.delta":
            deltas += ev.delta
        if ev.type == "response.completed":
            final = ev.response
    assert deltas == final.output_text == resp.output_text

    body = {
        "model": MODEL,
        "max_tokens": 5,
        "system": "you are terse",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}],
    }
    msg = httpx.post(engine.url + "/v1/messages", json=body).json()
    assert msg["type"] == "message" and msg["stop_reason"] == "max_tokens" and len(msg["content"][0]["text"].split()) == 5
    events, text = [], ""
    with httpx.stream("POST", engine.url + "/v1/messages", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = json.loads(line[6:])
                events.append(data["type"])
                if data["type"] == "content_block_delta":
                    text += data["delta"]["text"]
    assert events[0] == "message_start" and events[-1] == "message_stop" and text == msg["content"][0]["text"]
    tool = httpx.post(engine.url + "/v1/messages", json={**body, "tools": [{"name": "Read", "input_schema": {"type": "object"}}]}).json()
    assert tool["stop_reason"] == "tool_use" and tool["content"][0]["name"] == "Read"


def test_models_health_tokenize_and_vllm_metric_names(engine):
    models = httpx.get(engine.url + "/v1/models").json()
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == 4000
    assert models["data"][0]["coda"]["profile"]["name"]  # provenance of the cost model
    assert httpx.get(engine.url + "/health").status_code == 200
    tokens = httpx.post(engine.url + "/tokenize", json={"prompt": "a b c"}).json()
    assert tokens["count"] == 3 and tokens["tokens"] == tok.token_ids(["a", "b", "c"])
    text = httpx.get(engine.url + "/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:generation_tokens_total",
    ):
        assert f"\n{name}{{" in text, name
    assert metric(engine.url, "vllm:prefix_cache_hits_total") > 0  # the reuse test above hit


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/chat/completions", b"[1, 2]", 400, "JSON object"),
        ("/v1/chat/completions", b'{"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}', 404, "does not exist"),
        ("/v1/chat/completions", b'{"messages": []}', 400, "messages"),
        ("/v1/chat/completions", b'{"messages": [{"content": "hi"}]}', 400, "role"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', 400, "n must be 1"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', 400, "max_tokens"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}', 400, "maximum context length"),
        ("/v1/completions", b'{"prompt": ["a", "b"]}', 400, "one prompt"),
        ("/v1/responses", b'{"input": 5}', 400, "input"),
        ("/v1/chat/nothing", b"{}", 404, "Not Found"),
    ],
)
def test_client_mistakes_get_openai_errors_not_500(engine, path, body, status, needle):
    r = httpx.post(engine.url + path, content=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert needle in err["message"] and err["code"] == status


def test_anthropic_errors_and_wrong_method(engine):
    r = httpx.post(engine.url + "/v1/messages", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["type"] == "error" and "max_tokens" in r.json()["error"]["message"]
    r = httpx.get(engine.url + "/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_disconnect_aborts_the_request_and_frees_its_kv(engine):
    before = metric(engine.url, "vllm:generation_tokens_total")
    body = {"model": MODEL, "messages": [{"role": "user", "content": tok.text(3, 200)}], "max_tokens": 3000, "stream": True}
    with httpx.stream("POST", engine.url + "/v1/chat/completions", json=body) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 6:
                break
    wait_until(lambda: metric(engine.url, "vllm:num_requests_running") == 0, "the engine aborts the request whose client went away")
    assert metric(engine.url, "vllm:kv_cache_usage_perc") == 0.0
    assert metric(engine.url, "vllm:generation_tokens_total") - before < 3000  # it stopped at the next step, not at max_tokens
    aborted = [
        ln for ln in httpx.get(engine.url + "/metrics").text.splitlines() if ln.startswith("vllm:request_success_total") and "abort" in ln
    ]
    assert aborted and float(aborted[0].rsplit(" ", 1)[1]) >= 1
