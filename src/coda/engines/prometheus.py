"""The fake engine's Prometheus metrics, under vLLM's names and labels, in a registry of its own."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from coda.protocol.buckets import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS


class EngineMetrics:
    """vLLM's metric names (``vllm:...``), labelled ``model_name`` and ``engine`` as vLLM labels them."""

    def __init__(self, model: str, block_size: int, num_blocks: int) -> None:
        self.registry = CollectorRegistry()
        labels = ("model_name", "engine")
        values = (model, "0")

        def make(kind: type, name: str, doc: str, **kw: Any) -> Any:
            return kind(name, doc, labels, registry=self.registry, **kw).labels(*values)

        self.running = make(Gauge, "vllm:num_requests_running", "Requests in model execution batches")
        self.waiting = make(Gauge, "vllm:num_requests_waiting", "Requests waiting to be processed")
        self.kv_usage = make(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage (1 = 100%)")
        self.queries = make(Counter, "vllm:prefix_cache_queries", "Prefix-cache queries, in tokens")
        self.hits = make(Counter, "vllm:prefix_cache_hits", "Prefix-cache hits, in tokens")
        self.ext_queries = make(Counter, "vllm:external_prefix_cache_queries", "External (CPU/disk tier) prefix-cache queries, in tokens")
        self.ext_hits = make(Counter, "vllm:external_prefix_cache_hits", "External (CPU/disk tier) prefix-cache hits, in tokens")
        self.prompt_tokens = make(Counter, "vllm:prompt_tokens", "Prefill tokens processed")
        self.generation_tokens = make(Counter, "vllm:generation_tokens", "Generation tokens processed")
        self.preemptions = make(Counter, "vllm:num_preemptions", "Cumulative preemptions")
        self.ttft = make(Histogram, "vllm:time_to_first_token_seconds", "Time to first token", buckets=TTFT_BUCKETS)
        self.itl = make(Histogram, "vllm:inter_token_latency_seconds", "Inter-token latency", buckets=ITL_BUCKETS)
        self.e2e = make(Histogram, "vllm:e2e_request_latency_seconds", "End-to-end request latency", buckets=E2E_BUCKETS)
        self.success = Counter("vllm:request_success", "Successful requests", (*labels, "finished_reason"), registry=self.registry)
        # vLLM's info gauge of its CacheConfig (every field a label; these are the ones that size the cache)
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ("block_size", "num_gpu_blocks", "engine"),
            registry=self.registry,
        )
        info.labels(str(block_size), str(num_blocks), "0").set(1)
        # Not a vLLM metric: how late the real-time loop ran an event (the machine could not keep up).
        self.late = make(Gauge, "coda:fake_engine_late_max_seconds", "Worst wall-clock lateness of a simulated event")
        self._values = values

    def finished(self, reason: str) -> None:
        self.success.labels(*self._values, reason).inc()
