"""admitperf's admission policies as Coda ingress policies, so they run beside Coda's own behind
the same gateway, on the same signals, and in the same load tests (``coda serve --ingress
admitperf_queue_depth``).

admitperf (``pip install 'coda[admitperf]'``) decides on a mapping of vLLM metric names. The
adapter hands it each usable worker's scraped signals under vLLM's names and admits when admitperf
admits on some worker: the question Coda's own policies ask (``coda.policy.ingress.room``), since
the router then places the request. Its defer keeps the Retry-After it gives; its refusal is a 529.
Registered through the ``coda.policies`` entry points, as any other package's policies are.

Not adapted: admitperf's ``dual_gate``, whose second signal (the engine's prefix-cache hit rate
since it started, from two vLLM counters) is not among the signals the shells supply
(``coda.policy.contracts.SIGNALS``); fed nothing, it would admit everything, which is admitperf's
own rule for a signal it cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from coda.errors import CodaError
from coda.policy.contracts import Decision, IngressPolicy
from coda.policy.ingress import binding
from coda.policy.params import Count, Fraction, Positive
from coda.policy.snapshots import IngressSnapshot, WorkerLoad


def engine_metrics(w: WorkerLoad) -> dict[str, float]:
    """A worker's scraped signals under the vLLM metric names admitperf reads."""
    return {"vllm:kv_cache_usage_perc": w.kv_usage, "vllm:num_requests_waiting": float(w.queue_depth)}


def _policies() -> Any:
    try:
        import admitperf.policies
    except ImportError:
        raise CodaError("the admitperf ingress policies need the admitperf package: pip install 'coda[admitperf]'") from None
    return admitperf.policies


def _decide(name: str, impl: Any, snap: IngressSnapshot, signal: str) -> Decision:
    """admitperf's verdict on each usable worker (healthy, telemetry fresh), Coda's decision over them."""
    verdicts = [impl.decide(engine_metrics(w)) for w in snap.workers if w.healthy and not w.stale]
    if any(v.admitted for v in verdicts):
        return Decision("admit", name)
    bound = binding(snap, {signal: lambda w: True})
    defers = [v for v in verdicts if v.verdict == "defer"]
    if defers:
        retry_s = min(v.retry_after_ms for v in defers) / 1000
        return Decision("defer", name, defers[0].reason, 503, retry_s, bound)
    return Decision("reject", name, verdicts[0].reason if verdicts else "no_worker", 529, 1.0, bound)


@dataclass(frozen=True, slots=True)
class AdmitPerfQueueDepth(IngressPolicy):
    """admitperf's ``queue_depth``: hold a request while every engine queues more than
    ``max_waiting`` (Coda's ``queue_limit`` default, assumed), asking it back after ``retry_after_s``."""

    max_waiting: Count = 4
    retry_after_s: Positive = 1.0
    name: str = "admitperf_queue_depth"
    signals: frozenset[str] = frozenset({"queue_depth"})
    _impl: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        impl = _policies().QueueDepth(max_waiting=self.max_waiting, retry_after_ms=round(self.retry_after_s * 1000))
        object.__setattr__(self, "_impl", impl)

    def decide(self, snap: IngressSnapshot) -> Decision:
        return _decide(self.name, self._impl, snap, "queue_depth")


@dataclass(frozen=True, slots=True)
class AdmitPerfKvThreshold(IngressPolicy):
    """admitperf's ``kv_threshold``: refuse while every engine's KV cache is at least ``threshold``
    full (Coda's ``kv_headroom`` default, assumed)."""

    threshold: Fraction = 0.9
    name: str = "admitperf_kv_threshold"
    signals: frozenset[str] = frozenset({"kv_usage"})
    _impl: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_impl", _policies().KvThreshold(threshold=self.threshold))

    def decide(self, snap: IngressSnapshot) -> Decision:
        return _decide(self.name, self._impl, snap, "kv_usage")
