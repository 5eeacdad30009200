"""The gateway's parts without a network: config precedence, identity, prompts, telemetry parsing,
header stripping, usage extraction, KV-event translation."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.datastructures import Headers

from coda.errors import CodaError
from coda.gateway.admission import JsonlLog
from coda.gateway.config import BackendConfig, build_config
from coda.gateway.identity import MAX_TENANT_CHARS, Identities, session_key, with_cache_salt
from coda.gateway.kv_consumer import BlockTranslator
from coda.gateway.prompt import CharTokenizer, WordTokenizer, prompt_text
from coda.gateway.proxy import HOP_BY_HOP, NOT_FORWARDED, stream_usage, strip_hop_by_hop, usage_of
from coda.gateway.telemetry import apply_metrics, parse_metrics
from coda.gateway.view import Worker
from coda.protocol.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from coda.serving.errors import ApiError
from coda.shell.kvindex import BlockHasher, KVIndexer, WorkerTiers

URL = "http://127.0.0.1:8000"


def test_config_precedence_file_then_env_then_flags():
    file = {"backends": [URL], "port": 9000, "policies": {"ingress": {"name": "queue_limit", "params": {"max_waiting": 2},
                                                                     "defer": {"max_wait_s": 1.0}}}}
    env = {"CODA_SERVE_PORT": "9100", "CODA_SERVE_POLICIES__INGRESS__NAME": "session", "OTHER": "x"}
    cfg = build_config(file, {}, env)
    ingress = cfg.policies.ingress
    # a new name drops the old policy's parameters (they were queue_limit's), the defer settings stay
    assert cfg.port == 9100 and ingress.name == "session" and ingress.params == {} and ingress.defer.max_wait_s == 1.0
    cfg = build_config(file, {"port": 9200, "policies": {"ingress": {"shadow": "admit_all"}}}, env)
    ingress = cfg.policies.ingress
    assert cfg.port == 9200 and ingress.name == "session" and ingress.shadow.name == "admit_all"
    cfg = build_config({}, {}, {"CODA_SERVE_BACKENDS": f"{URL},http://h:1/"})
    assert [b.url for b in cfg.backends] == [URL, "http://h:1"] and cfg.backends[1].label == "h:1"


def test_the_documented_environment_variables_are_accepted_and_take_effect():
    """Every ``CODA_SERVE_*=value`` example of the docstring and the gateway doc is one the schema accepts."""
    docs = (build_config.__doc__ or "") + (Path(__file__).resolve().parents[2] / "docs" / "gateway.md").read_text()
    examples = re.findall(r"`(CODA_SERVE_[A-Z0-9_]+)=([^`]+)`", docs)
    assert ("CODA_SERVE_POLICIES__INGRESS__NAME", "session") in examples and len(examples) >= 3
    default = build_config({"backends": [URL]}, {}, {})
    for name, value in examples:
        assert build_config({"backends": [URL]}, {}, {name: value}) != default, name


def test_config_errors_name_the_fix():
    with pytest.raises(CodaError, match="give at least one --backend URL"):
        build_config({}, {}, {})
    with pytest.raises(CodaError, match="must start with http"):
        build_config({"backends": ["localhost:8000"]}, {}, {})
    with pytest.raises(CodaError, match="coda.yaml: policies.ingress.defer.max_queu: Extra inputs"):
        build_config({"backends": [URL], "policies": {"ingress": {"defer": {"max_queu": 3}}}}, {}, {}, source="coda.yaml")


def test_identity_from_keys_or_header():
    ids = Identities(build_config({"backends": [URL], "auth": {"api_keys": {"k1": "team-a"}, "admin_key": "root"}}, {}, {}))
    assert ids.tenant(Headers({"authorization": "Bearer k1"})) == "team-a"
    assert ids.tenant(Headers({"x-api-key": "k1"})) == "team-a"
    for headers, text in (({}, "missing API key"), ({"authorization": "Bearer k2"}, "invalid API key")):
        with pytest.raises(ApiError, match=text) as exc:
            ids.tenant(Headers(headers))
        assert exc.value.status == 401
    assert ids.is_admin(Headers({"authorization": "Bearer root"})) and not ids.is_admin(Headers({"authorization": "Bearer k1"}))
    open_ids = Identities(build_config({"backends": [URL]}, {}, {}))
    assert open_ids.tenant(Headers({"x-tenant-id": "t9"})) == "t9" and open_ids.tenant(Headers({})) == "default"
    labels = {open_ids.label(f"t{i}") for i in range(200)}
    assert len(labels) == 65 and "other" in labels  # a header cannot grow /metrics without bound


@given(st.text(max_size=200), st.text(min_size=1, max_size=5000), st.text(max_size=200))
def test_a_session_key_is_fixed_size_and_belongs_to_its_tenant(tenant, sid, other):
    key = session_key(tenant, sid)
    assert key is not None and len(key) == 32  # whatever the client sent
    assert key == session_key(tenant, sid) and session_key(tenant, None) is None
    if other != tenant:
        assert session_key(other, sid) != key  # another tenant naming the same id gets another slot


def test_an_overlong_tenant_header_is_refused_naming_the_limit():
    ids = Identities(build_config({"backends": [URL]}, {}, {}))
    assert ids.tenant(Headers({"x-tenant-id": "t" * MAX_TENANT_CHARS})) == "t" * MAX_TENANT_CHARS
    with pytest.raises(ApiError, match=f"at most {MAX_TENANT_CHARS}") as exc:
        ids.tenant(Headers({"x-tenant-id": "t" * (MAX_TENANT_CHARS + 1)}))
    assert exc.value.status == 400


def test_the_logs_hold_their_records_in_a_buffer_until_flushed(tmp_path):
    path = tmp_path / "decisions.jsonl"
    log = JsonlLog(str(path))
    log.write({"rid": 1})
    assert path.read_text() == ""  # buffered: the gateway's timer flushes it
    log.flush()
    assert path.read_text() == '{"rid":1}\n'
    log.close()


def test_cache_salt_keeps_every_other_byte():
    raw = b' {"model":"m",  "messages":[{"role":"user","content":"\\u00e9t\\u00e9"}], "x": 1.50}'
    body = msgspec.json.decode(raw)
    salted = with_cache_salt(raw, body, "tenant-a")
    assert salted == b'{"cache_salt":"tenant-a",' + raw.lstrip()[1:]
    assert msgspec.json.decode(salted) == {**body, "cache_salt": "tenant-a"}
    assert msgspec.json.decode(with_cache_salt(b'{"cache_salt":"mine","a":1}', {"cache_salt": "mine", "a": 1}, "t")) == {
        "cache_salt": "t:mine",
        "a": 1,
    }
    assert msgspec.json.decode(with_cache_salt(b"{}", {}, "t")) == {"cache_salt": "t"}


def test_hop_by_hop_headers_are_stripped():
    raw = [
        (b"Host", b"gw"),
        (b"Connection", b"keep-alive, X-Trace"),
        (b"X-Trace", b"1"),
        (b"Keep-Alive", b"timeout=5"),
        (b"TE", b"trailers"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Content-Length", b"10"),
        (b"X-Session-Id", b"s"),
        (b"Authorization", b"Bearer k"),
    ]
    assert strip_hop_by_hop(raw, NOT_FORWARDED) == [(b"X-Session-Id", b"s"), (b"Authorization", b"Bearer k")]
    assert (b"Content-Length", b"10") in strip_hop_by_hop(raw, HOP_BY_HOP)


def test_usage_from_the_final_event_of_a_stream_or_the_json_body():
    chat = (
        b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}}'
        b"\n\ndata: [DONE]\n\n"
    )
    assert stream_usage(chat) == (12, 5)
    assert stream_usage(b"ge more text\n\n" + chat.replace(b"\n", b"\r\n")) == (12, 5)  # a tail cut mid-event, CRLF line ends
    anthropic = (
        b'event: message_delta\ndata: {"type":"message_delta","usage":{"input_tokens":7,"output_tokens":3}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    assert stream_usage(anthropic) == (7, 3)
    assert stream_usage(b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n') is None
    assert stream_usage(b'data: {"usage": {"prompt_tokens": 1') is None  # cut off
    # a "usage" key inside generated text is not the response's usage
    body = (
        b'{"choices":[{"message":{"content":"\\"usage\\": {\\"prompt_tokens\\": 1, \\"completion_tokens\\": 2}"}}],'
        b'"usage":{"prompt_tokens":9,"completion_tokens":4}}'
    )
    assert usage_of(body) == (9, 4)
    assert usage_of(b'{"choices":[]}') is None and usage_of(b"not json") is None


METRICS = """# HELP vllm:num_requests_running Number of requests
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 4.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 7.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",engine="0",\
num_gpu_blocks="1000",prefix_caching_hash_algo="sha256"} 1.0
vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",engine="1",\
num_gpu_blocks="500",prefix_caching_hash_algo="sha256"} 1.0
"""


def test_parse_vllm_metrics():
    values = parse_metrics(METRICS)
    # a metric whose name extends a wanted one (waiting_by_reason) is not it; the KV capacity sums the ranks' caches
    assert values == {
        "vllm:num_requests_running": 4.0,
        "vllm:num_requests_waiting": 2.0,
        "vllm:kv_cache_usage_perc": 0.375,
        "vllm:prefix_cache_queries": 100.0,
        "kv_capacity_tokens": 32 * 1500,
    }
    w = Worker(0, BackendConfig(url=URL), WorkerTiers(0, "hbm:0"))
    apply_metrics(w, values, 5.0)
    assert (w.queue_depth, w.running, w.kv_usage, w.scraped_at, w.kv_capacity_tokens) == (2, 4, 0.375, 5.0, 48_000)
    assert w.supplies("queue_depth") and w.supplies("kv_usage") and w.supplies("tenant_share")
    assert parse_metrics('vllm:num_requests_running{engine="0"} 5.0\n') == {"vllm:num_requests_running": 5.0}  # on the first line
    # an engine restarted with another cache configuration: its capacity is read again, not remembered
    assert parse_metrics(METRICS.replace('num_gpu_blocks="500"', 'num_gpu_blocks="100"'))["kv_capacity_tokens"] == 32 * 1100
    legacy = parse_metrics('# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="m"} 0.9\n')
    apply_metrics(w, legacy, 6.0)
    assert w.kv_usage == 0.9 and w.supplies("kv_usage") and not w.supplies("queue_depth")


def chat(*texts: str) -> dict:
    return {
        "model": "m",
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "messages": [{"role": "user", "content": t} for t in texts],
    }


@given(st.lists(st.text(min_size=1, max_size=400), min_size=1, max_size=6), st.text(min_size=1, max_size=400))
def test_an_appended_message_keeps_the_prompt_a_prefix(texts, more):
    a, b = chat(*texts), chat(*texts, more)
    assert prompt_text("/v1/chat/completions", b).startswith(prompt_text("/v1/chat/completions", a))
    tk = CharTokenizer()
    pa, pb = tk.prompt("/v1/chat/completions", a), tk.prompt("/v1/chat/completions", b)
    assert pb.units[: len(pa.units)] == pa.units and pa.min_tokens <= pa.tokens


def test_word_tokenizer_counts_like_the_fake_engine():
    p = WordTokenizer().prompt("/v1/chat/completions", chat("one two three"))
    assert p.tokens == 2 + 3 + 1 and len(p.units) == p.tokens  # role marker, words, end marker, generation marker
    with pytest.raises(ApiError, match="messages must be a non-empty list"):
        WordTokenizer().prompt("/v1/chat/completions", {"messages": []})


def stored(hashes, parent, tokens, medium="GPU", block_size=4):
    return BlockStored(
        block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=block_size, lora_id=None, medium=medium, lora_name=None
    )


def test_kv_events_are_renamed_to_local_hashes_that_prompts_match():
    idx = KVIndexer()
    tiers = WorkerTiers(0, "hbm:0", "dram:0", "ssd:0")
    w = Worker(0, BackendConfig(url=URL, kv_events="tcp://x:1"), tiers)
    tr = BlockTranslator(w, idx, block_tokens=4)
    prompt = list(range(100, 116))  # four blocks
    # the engine names blocks with its own hashes (bytes, as vLLM's sha256); two events chain them
    tr.apply(KVEventBatch(ts=0.0, events=[stored([b"e1", b"e2"], None, prompt[:8]), stored([b"e3"], b"e2", prompt[8:12])]))
    local = BlockHasher(4).update(prompt)
    assert idx.match(local, [tiers])[0].hbm_blocks == 3
    tr.apply(
        KVEventBatch(ts=1.0, events=[stored([b"e3"], b"e2", prompt[8:12], medium="CPU"), BlockRemoved(block_hashes=[b"e3"], medium="GPU")])
    )
    m = idx.match(local, [tiers])[0]
    assert (m.hbm_blocks, m.dram_blocks) == (2, 1)
    # a block whose parent was never seen, another block size, or a LoRA: skipped, not guessed
    tr.apply(KVEventBatch(ts=2.0, events=[stored([b"x"], b"unknown", prompt[:4]), stored([b"y"], None, prompt[:8], block_size=8)]))
    assert tr.skipped == 2
    tr.apply(KVEventBatch(ts=3.0, events=[AllBlocksCleared()]))
    assert idx.match(local, [tiers])[0].hbm_blocks == 0 and not idx.locations


def test_the_access_log_keeps_a_sample_of_its_records(tmp_path):
    path = tmp_path / "access.jsonl"
    log = JsonlLog(str(path), sample=0.25)
    for i in range(400):
        log.write({"rid": i})
    log.close()
    kept = [msgspec.json.decode(line)["rid"] for line in path.read_text().splitlines()]
    assert 0 < len(kept) < 400 and kept == sorted(kept)  # some, not all, in order
    assert not JsonlLog(None).enabled
