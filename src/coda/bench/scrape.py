"""The server's side of a run: each engine's Prometheus ``/metrics`` (vLLM's names), sampled while
the bench replays, so a result shows queue depth, KV usage and the prefix-cache hit rate over
time beside the latencies the client measured.

A sample is taken before the first request and another after the run, so counter deltas cover
the whole run. Gauges are summed over an engine's label sets (data-parallel ranks, models);
counters are read as deltas between samples. A scrape that fails mid-run is counted, not fatal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from coda.metrics.requests import Window
from coda.shell import liveness

# series name -> the sample names that feed it, in order of preference (vLLM renamed the KV gauge)
GAUGES = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
COUNTERS = {
    "prefix_queries": "vllm:prefix_cache_queries_total",
    "prefix_hits": "vllm:prefix_cache_hits_total",
    "external_prefix_queries": "vllm:external_prefix_cache_queries_total",
    "external_prefix_hits": "vllm:external_prefix_cache_hits_total",
    "preemptions": "vllm:num_preemptions_total",
}
WANTED = {name for names in GAUGES.values() for name in names} | set(COUNTERS.values())


class ScrapeError(Exception):
    """An engine's /metrics cannot be read, or holds none of vLLM's metrics."""


def parse(text: str) -> dict[str, float]:
    """The wanted samples of a Prometheus text exposition, each summed over its label sets."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in WANTED:
                sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    return sums


def metric_sum(text: str, name: str) -> float:
    """Sum of a Prometheus metric's samples in an exposition text."""
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


def _metrics_url(base: str) -> str:
    base = base.rstrip("/")
    return (base[: -len("/v1")] if base.endswith("/v1") else base) + "/metrics"


@dataclass(slots=True)
class EngineSeries:
    """One engine's samples: the time (the replay's clock) and each series' value, None when absent."""

    url: str
    t_s: list[float] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=lambda: {k: [] for k in (*GAUGES, *COUNTERS)})
    errors: int = 0
    last_error: str | None = None

    def add(self, t: float, sums: dict[str, float]) -> None:
        self.t_s.append(t)
        for key, names in GAUGES.items():
            self.values[key].append(next((sums[n] for n in names if n in sums), None))
        for key, name in COUNTERS.items():
            self.values[key].append(sums.get(name))

    def hit_rate(self, hits: str = "prefix_hits", queries: str = "prefix_queries") -> list[float | None]:
        """Hits over queries in each interval between samples (None where nothing was queried)."""
        h, q = self.values[hits], self.values[queries]
        out: list[float | None] = [None]
        for i in range(1, len(self.t_s)):
            known = None not in (h[i], h[i - 1], q[i], q[i - 1])
            dq = q[i] - q[i - 1] if known else 0.0  # type: ignore[operator]
            out.append((h[i] - h[i - 1]) / dq if dq > 0 else None)  # type: ignore[operator]
        return out

    def series(self) -> dict[str, Any]:
        return {"url": self.url, "t_s": self.t_s, **self.values, "prefix_hit_rate": self.hit_rate(),
                "external_prefix_hit_rate": self.hit_rate("external_prefix_hits", "external_prefix_queries"),
                "errors": self.errors, "last_error": self.last_error}

    def summary(self, window: Window) -> dict[str, Any]:
        """Means and peaks of the gauges over the samples in the window; counter deltas over the
        whole run (first to last sample) and the prefix-cache hit rate over them."""
        inside = [i for i, t in enumerate(self.t_s) if window.start_s <= t <= window.end_s]
        out: dict[str, Any] = {"samples": len(self.t_s), "errors": self.errors}
        for key in GAUGES:
            vals = [v for i in inside if (v := self.values[key][i]) is not None]
            out[f"{key}_mean"] = sum(vals) / len(vals) if vals else None
            out[f"{key}_max"] = max(vals, default=None)
        for key in COUNTERS:
            vals = [v for v in self.values[key] if v is not None]
            out[f"{key}_delta"] = vals[-1] - vals[0] if len(vals) >= 2 else None
        q, h = out["prefix_queries_delta"], out["prefix_hits_delta"]
        out["prefix_hit_rate"] = h / q if q and h is not None else None
        return out


class Scraper:
    """Samples every ``interval_s`` until cancelled; ``check()`` first, so a wrong URL stops the run
    before it starts."""

    def __init__(self, urls: Sequence[str], interval_s: float, now: Callable[[], float]) -> None:
        self.engines = [EngineSeries(u) for u in urls]
        self.interval_s = interval_s
        self.now = now
        self._client = httpx.AsyncClient(timeout=10.0)

    async def _get(self, engine: EngineSeries) -> dict[str, float]:
        resp = await self._client.get(_metrics_url(engine.url))
        resp.raise_for_status()
        return parse(resp.text)

    async def check(self) -> None:
        for engine in self.engines:
            try:
                sums = await self._get(engine)
            except (httpx.HTTPError, ValueError) as err:
                raise ScrapeError(f"{_metrics_url(engine.url)}: {str(err) or type(err).__name__}") from None
            if not any(name in sums for names in GAUGES.values() for name in names):
                raise ScrapeError(
                    f"{_metrics_url(engine.url)} has none of vLLM's metrics ({', '.join(GAUGES['waiting'] + GAUGES['kv_usage'])})"
                )

    async def sample(self) -> None:
        """One sample of every engine, taken together."""
        t = self.now()
        results = await asyncio.gather(*(self._get(e) for e in self.engines), return_exceptions=True)
        for engine, res in zip(self.engines, results):
            if isinstance(res, BaseException):
                engine.errors += 1
                engine.last_error = f"{type(res).__name__}: {res}"
            else:
                engine.add(t, res)

    async def run(self) -> None:
        """Sample every ``interval_s`` (after the first, which the caller takes before any request)."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.sample()

    async def close(self) -> None:
        await self._client.aclose()

    def series(self) -> list[dict[str, Any]]:
        return [e.series() for e in self.engines]

    def summary(self, window: Window) -> dict[str, dict[str, Any]]:
        return {e.url: e.summary(window) for e in self.engines}


async def gateway_liveness(endpoint: str) -> list[tuple[str, dict[str, str], float]] | None:
    """The ingress gate counters (``coda.shell.liveness``) of a Coda gateway at ``endpoint``, as
    samples; ``None`` when the endpoint is not one (no such counters, or no /metrics)."""
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            resp = await client.get(_metrics_url(endpoint))
        resp.raise_for_status()
        families = list(text_string_to_metric_families(resp.text))
    except (httpx.HTTPError, ValueError):
        return None
    wanted = (liveness.FIRES, liveness.TOUCHED, liveness.DECIDED)
    samples = [(s.name, dict(s.labels), float(s.value)) for f in families for s in f.samples if s.name in wanted]
    return samples if any(name == liveness.TOUCHED for name, _, _ in samples) else None
