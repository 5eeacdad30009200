"""The gateway's Prometheus metrics. Labels take only bounded values: route paths, status
codes, policy names and reasons, configured backend labels, and tenants (folded into ``other``
past a cap, see ``identity``); never session ids or request ids."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from coda.gateway.view import GatewayState
from coda.protocol.buckets import E2E_BUCKETS, TTFT_BUCKETS

#: event-loop lag: from a scheduling hiccup to a loop too busy to scrape within ``telemetry.stale_after_s``
LOOP_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("coda_gateway_requests", "Requests answered, by route and status", ("route", "status"), registry=r)
        self.decisions = Counter("coda_ingress_decisions", "Final ingress decisions", ("policy", "action", "reason"), registry=r)
        self.deferred = Counter("coda_ingress_deferred", "Requests deferred at least once", registry=r)
        self.gate_fires = Counter("coda_ingress_gate_fires", "Decisions in which a gate (a part of the ingress policy) did not admit, by "
                                  "what it did and the signal that bound (a held request is decided again, so it may count more than once)",
                                  ("gate", "action", "signal"), registry=r)
        self.gate_touched = Counter(
            "coda_ingress_gate_requests_touched",
            "Requests a gate did not admit at least once (over "
            "coda_ingress_requests_decided: the share it touched; 0 all run: it never acted)",
            ("gate",),
            registry=r,
        )
        self.requests_decided = Counter("coda_ingress_requests_decided", "Requests the ingress policy decided for good", registry=r)
        self.shadow = Counter(
            "coda_shadow_decisions", "Shadow decisions, by whether they agreed with the enforced one", ("shadow", "agree"), registry=r
        )
        self.queue = Gauge("coda_ingress_queue_length", "Requests held by defer decisions", registry=r)
        self.idle_while_held = Gauge(
            "coda_ingress_idle_while_held_seconds",
            "Seconds so far during which a healthy worker had nothing in flight while this gateway held deferred requests",
            registry=r,
        )
        self.idle_while_held_longest = Gauge(
            "coda_ingress_idle_while_held_longest_seconds", "The longest of those intervals so far", registry=r
        )
        self.refused_while_idle = Counter(
            "coda_ingress_refused_while_idle",
            "Requests answered 503, 429 or 529 by the ingress policy while a healthy worker had nothing in flight",
            registry=r,
        )
        self.retries = Counter(
            "coda_upstream_retries", "Requests retried on another worker after a failure before the first byte", ("worker",), registry=r
        )
        self.upstream_errors = Counter("coda_upstream_errors", "Failed upstream attempts", ("worker", "kind"), registry=r)
        self.loop_lag = Histogram(
            "coda_gateway_event_loop_lag_seconds",
            "How late the gateway's event loop wakes its housekeeping timer (its own CPU saturation)",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "coda_gateway_overhead_seconds", "Time from request received to upstream request sent", buckets=OVERHEAD_BUCKETS, registry=r
        )
        # per backend, from the upstream request sent: vLLM's buckets, so the panels line up with the engines' own histograms
        self.backend_ttft = Histogram(
            "coda_backend_ttft_seconds",
            "Upstream request sent to its first response byte, streamed responses",
            ("worker",),
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.backend_e2e = Histogram(
            "coda_backend_e2e_seconds",
            "Upstream request sent to its last response byte, responses that completed",
            ("worker",),
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.tokenized = Counter(
            "coda_gateway_tokenized_prompts",
            "Prompts tokenized with the engine tokenizer, by how: local (the "
            "gateway's copy), engine (/tokenize), text (neither answered: hashed by text)",
            ("how",),
            registry=r,
        )
        self.tenant_requests = Counter("coda_tenant_requests", "Requests admitted per tenant", ("tenant",), registry=r)
        self.tenant_input = Counter(
            "coda_tenant_input_tokens",
            "Prompt tokens per tenant (engine usage when reported, else the gateway's estimate)",
            ("tenant",),
            registry=r,
        )
        self.tenant_output = Counter(
            "coda_tenant_output_tokens", "Output tokens per tenant (engine usage when reported)", ("tenant",), registry=r
        )
        self.tenant_unreported = Counter(
            "coda_tenant_usage_unreported", "Responses without a usage block (stream without include_usage)", ("tenant",), registry=r
        )
        self.store_up = Gauge("coda_store_up", "1 while the store the replicas share answers (always 1 in-process)", registry=r)
        self.store_errors = Counter("coda_store_errors", "Store steps that failed (each one served on the replica's own state)", registry=r)
        w = ("worker",)
        self.w_inflight = Gauge("coda_worker_inflight_requests", "Requests in flight through the gateway", w, registry=r)
        self.w_tokens = Gauge("coda_worker_inflight_tokens", "Prompt tokens in flight through the gateway", w, registry=r)
        self.w_new_tokens = Gauge(
            "coda_worker_inflight_new_tokens",
            "KV tokens the requests in flight through the gateway newly "
            "occupy (their prompts beyond the prefix resident when sent): what the load checks count",
            w,
            registry=r,
        )
        self.w_peak = Gauge(
            "coda_worker_inflight_peak_requests",
            "The most requests in flight on the worker at once through every gateway replica, since start",
            w,
            registry=r,
        )
        self.w_healthy = Gauge("coda_worker_healthy", "1 while the worker passes health checks", w, registry=r)
        self.w_stale = Gauge("coda_worker_telemetry_stale", "1 while the worker's telemetry is stale", w, registry=r)
        self.w_queue = Gauge("coda_worker_queue_depth", "Requests waiting in the engine (scraped)", w, registry=r)
        self.w_kv = Gauge("coda_worker_kv_usage", "Engine KV-cache usage fraction (scraped)", w, registry=r)
        self.w_kv_batches = Gauge("coda_worker_kv_event_batches", "KV event batches applied", w, registry=r)
        self.w_kv_gaps = Gauge("coda_worker_kv_event_gaps", "KV event sequence gaps seen", w, registry=r)
        self.w_kv_missing = Gauge(
            "coda_worker_kv_events_missing",
            "1 while a worker configured with kv_events has delivered no batch "
            "within kv_events_expect_within_s of its first request (routing uses the gateway's own index for it)",
            w,
            registry=r,
        )

    def render(self, state: GatewayState, kv_stats: dict[int, tuple[int, int, bool]]) -> bytes:
        """The exposition text with per-worker gauges read now."""
        now = state.clock()
        for w in state.workers:
            lab = w.label
            self.w_inflight.labels(lab).set(len(w.inflight))
            self.w_tokens.labels(lab).set(w.inflight_tokens)
            self.w_new_tokens.labels(lab).set(w.inflight_new_tokens)
            self.w_peak.labels(lab).set(w.inflight_peak)
            self.w_healthy.labels(lab).set(int(w.healthy))
            self.w_stale.labels(lab).set(int(state.telemetry_old(w, now)))
            self.w_queue.labels(lab).set(w.queue_depth)
            self.w_kv.labels(lab).set(w.kv_usage)
            if w.id in kv_stats:
                self.w_kv_batches.labels(lab).set(kv_stats[w.id][0])
                self.w_kv_gaps.labels(lab).set(kv_stats[w.id][1])
                self.w_kv_missing.labels(lab).set(int(kv_stats[w.id][2]))
        self.queue.set(state.queued)
        self.idle_while_held.set(state.idle_watch.total_s(now))
        self.idle_while_held_longest.set(state.idle_watch.longest(now))
        return generate_latest(self.registry)
