"""Gateway configuration (pydantic): a YAML/TOML file, then ``CODA_SERVE_*`` environment
variables, then command-line flags, each overriding the one before.

``coda serve --backend URL`` needs nothing else: every other field has a default that is safe
for a single team (no auth, admit everything, Coda's router, character-block indexing). The
policies come from the ``system`` preset's block with ``policies`` laid over it, the schema every
shell reads (``coda.policy.spec``); the gateway enforces the ingress policy and the router.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator

from coda.config.load import env_layer, layered, validated
from coda.policy.spec import PoliciesConfig, TenantSpec
from coda.strict import StrictModel

ENV_PREFIX = "CODA_SERVE_"


class BackendConfig(StrictModel):
    url: str = Field(description="base URL of an OpenAI-compatible engine, e.g. http://10.0.0.5:8000")
    name: str | None = Field(None, description="label in metrics and logs (default: host:port)")
    api_key: str | None = Field(None, description="sent to the engine as 'Authorization: Bearer'")
    kv_events: str | None = Field(None, description="the engine's ZMQ KV-event PUB endpoint, e.g. tcp://10.0.0.5:5557")
    kv_events_replay: str | None = Field(None, description="the engine's ZMQ replay (ROUTER) endpoint, e.g. tcp://10.0.0.5:5558")
    kv_events_topic: str = ""
    max_model_len: PositiveInt | None = Field(None, description="override the engine's /v1/models max_model_len")
    max_num_seqs: PositiveInt | None = Field(None, description="the engine's --max-num-seqs (vLLM does not publish it): the seats "
                                             "default ingress thresholds are derived from; without it seats do not bind")
    kv_capacity_tokens: PositiveInt | None = Field(None, description="override the KV capacity read from the engine's "
                                                   "vllm:cache_config_info (num_gpu_blocks x block_size)")

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"backend url must start with http:// or https://, got {v!r}")
        return v.rstrip("/")

    @property
    def label(self) -> str:
        return self.name or self.url.split("://", 1)[1]


class TenantConfig(TenantSpec):
    cache_salt: str | None = Field(
        None, description="injected as the request's cache_salt so no other tenant can hit (or time) its prefix cache"
    )


class AuthConfig(StrictModel):
    api_keys: dict[str, str] = Field(
        default_factory=dict, description="API key -> tenant; when set, a request without a known key gets 401"
    )
    admin_key: str | None = Field(None, description="bearer key for /debug/state (absent: /debug/state is off)")

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys)


class TelemetryConfig(StrictModel):
    scrape_interval_s: PositiveFloat = Field(0.25, description="how often each engine's /metrics is read")
    stale_after_s: PositiveFloat = Field(1.0, description="telemetry older than this is stale")
    stale: Literal["saturated", "last_value"] = Field(
        "last_value",
        description="how admission treats a worker whose telemetry is older than stale_after_s: last_value (its scraped "
        "signals keep their last value beside the gateway's own exact counts; an engine that stops answering is ejected "
        "by health checks) or saturated (it counts as full; under the gateway's own CPU saturation every scrape is late "
        "and this refuses everything)",
    )
    health_interval_s: PositiveFloat = Field(1.0, description="how often each engine's /health is checked")
    idle_interval_s: PositiveFloat = Field(
        5.0,
        description="with no request in flight and none for this long, scrapes and health "
        "checks run this often instead; the next request wakes them (and waits for one scrape when "
        "its policy reads stale scraped signals)",
    )
    eject_after: PositiveInt = Field(2, description="consecutive failures (health checks or connections) that eject a worker")
    readmit_after: PositiveInt = Field(2, description="consecutive passing health checks that re-admit it")
    startup_timeout_s: PositiveFloat = Field(30.0, description="how long startup waits for every engine to answer")


class IndexerConfig(StrictModel):
    tokenizer: Literal["chars", "words", "engine"] = Field(
        "chars",
        description="chars: 4-byte units of the prompt text; words: the fake engine's word tokenizer and template (exact for it); "
        "engine: the engine's own tokenizer through its /tokenize (exact for vLLM; one round trip per request)",
    )
    tokenizer_path: str | None = Field(
        None,
        description="with tokenizer: engine, the model's folder (tokenizer.json and its chat "
        "template) or tokenizer.json: tokenize in the gateway instead of asking the engine's /tokenize",
    )
    tokenize_timeout_s: PositiveFloat = Field(
        0.5,
        description="longest wait for an engine's /tokenize; then the prompt is hashed "
        "by its text (its blocks do not match the engine's events)",
    )
    block_tokens: PositiveInt = Field(
        256, description="block size of the gateway's own prefix hashes (the engine's block size with KV events)"
    )
    approx_blocks_per_worker: PositiveInt | None = Field(
        None,
        description="without KV events: blocks remembered per worker (LRU); default: as many as the worker's engine holds (its "
        "KV capacity from /metrics or kv_capacity_tokens, in the gateway's blocks), 65536 while that is unknown; set it for an "
        "engine that also keeps KV in host memory",
    )
    max_sessions: PositiveInt = Field(100_000, description="sessions whose block hashes are kept (least recently seen dropped first)")
    session_cache_mib: PositiveInt = Field(
        64,
        description="memory for the sessions' last prompts and block hashes (least recently "
        "seen dropped first; a dropped session's next prompt is hashed in full)",
    )


class KVEventsConfig(StrictModel):
    expect_within_s: PositiveFloat = Field(
        10.0,
        description="a worker with kv_events whose first batch has not come this long after its first request is flagged "
        "(/ready, coda_worker_kv_events_missing, one log line) and routed with the gateway's own index until one comes",
    )


class AccessLogConfig(StrictModel):
    path: str | None = Field(None, description="JSONL file with one line per request, no prompt text ('-': stderr; absent: off)")
    sample: float = Field(1.0, gt=0.0, le=1.0, description="share of requests logged, each kept at random")


class StoreConfig(StrictModel):
    """Where replicas of the gateway keep what must be global (in-flight counts per worker and
    tenant, session slots, deferred requests, TTFT estimates); one replica needs none."""

    url: str | None = Field(
        None, description="absent: in-process (one replica); redis://host:port/db (or rediss://): a Redis server every replica shares"
    )
    on_unreachable: Literal["open", "closed"] = Field(
        "open", description="the store down: admit by this replica's own state (open) or defer every request until it returns (closed)"
    )
    key_prefix: str = Field("coda", min_length=1, description="prefix of every key the gateway writes")
    replica_id: str | None = Field(None, min_length=1, description="this replica's name in the store (default: hostname-pid)")
    publish_interval_s: PositiveFloat = Field(
        0.5,
        description="how often this replica publishes its counts without a change; they "
        "expire after a few intervals, so a dead replica's counts do not leak",
    )

    @field_validator("url")
    @classmethod
    def _scheme(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://")):
            raise ValueError(f"store url must start with redis:// or rediss://, e.g. redis://127.0.0.1:6379/0, got {v!r}")
        if v is not None:
            if urlsplit(v).query:
                raise ValueError(f"store url takes no query parameters (the gateway sets its own timeouts), got {v!r}")
            try:
                _ = urlsplit(v).port  # a port that is not a number raises
            except ValueError as err:
                raise ValueError(f"store url {v!r}: {err}") from None
        return v


class LimitsConfig(StrictModel):
    """What one client may hold at the door; each default is assumed (sized from common servers'
    defaults and agent clients' requests), not measured. See docs/gateway.md#limits."""

    max_headers: PositiveInt = Field(128, description="headers in one request; more get 431")
    max_header_bytes: PositiveInt = Field(
        256 * 1024, description="bytes of all headers of one request (a 64 KiB session id fits); more get 431"
    )
    max_request_line_bytes: PositiveInt = Field(8 * 1024, description="bytes of the request target (path and query); more get 414")
    max_json_depth: PositiveInt = Field(128, description="nesting of arrays and objects in a JSON body; deeper gets 400")
    header_timeout_s: PositiveFloat = Field(
        10.0, description="longest a request's head (line and headers) may take to arrive; then 408 and the connection closes"
    )
    body_timeout_s: PositiveFloat = Field(
        30.0, description="longest wait between two pieces of a request body; then 408 and the connection closes"
    )
    keep_alive_timeout_s: PositiveFloat = Field(30.0, description="an idle keep-alive connection is closed after this long")
    max_connections: PositiveInt | None = Field(
        None,
        description="open client connections; a request on one more gets 503 with Retry-After (default: half the process's "
        "open-file limit, since each admitted connection may hold an engine connection too, and at most 8192)",
    )


class GatewayConfig(PoliciesConfig):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    backends: list[BackendConfig] = Field(min_length=1)
    auth: AuthConfig = AuthConfig()
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)
    decision_log: str | None = Field(None, description="JSONL file of every decision with its signal values ('-': stderr)")
    access_log: AccessLogConfig = AccessLogConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    indexer: IndexerConfig = IndexerConfig()
    kv_events: KVEventsConfig = KVEventsConfig()
    store: StoreConfig = StoreConfig()
    max_body_bytes: PositiveInt = Field(16 * 1024 * 1024, description="larger request bodies get 413")
    limits: LimitsConfig = LimitsConfig()
    connect_timeout_s: PositiveFloat = Field(2.0, description="connecting to an engine; a failure tries another worker")
    first_byte_timeout_s: PositiveFloat = Field(600.0, description="longest wait for an engine's first response byte")
    midstream_failure: Literal["abort", "error_event"] = Field(
        "abort",
        description="an engine failing mid-response: abort the client's connection (a transport error clients retry), or end "
        "an event stream with an SSE error event",
    )
    drain_timeout_s: NonNegativeFloat = Field(30.0, description="on SIGTERM, how long in-flight requests may finish")

    @field_validator("backends", mode="before")
    @classmethod
    def _urls(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [u for u in v.split(",") if u.strip()]
        if isinstance(v, list):
            return [{"url": b.strip()} if isinstance(b, str) else b for b in v]
        return v

    def tenant(self, name: str) -> TenantConfig:
        return self.tenants.get(name) or TenantConfig()


def build_config(
    file_data: dict[str, Any], cli: dict[str, Any], environ: Mapping[str, str] | None = None, source: str = "command line"
) -> GatewayConfig:
    """File, then ``CODA_SERVE_*`` environment variables, then flags (``coda.config.load.layered``).
    A variable names a nested key with ``__``: ``CODA_SERVE_PORT=9000``,
    ``CODA_SERVE_POLICIES__INGRESS__NAME=session``; values parse as YAML scalars."""
    data = layered(file_data, env_layer(os.environ if environ is None else environ, ENV_PREFIX), cli)
    missing_backends = not data.get("backends")
    return validated(GatewayConfig, data, source, "give at least one --backend URL" if missing_backends else "")
