"""Closed-loop replay of agent sessions against an endpoint: ``Replay(workload, config).run()``.

Each session starts at its (scaled) start time and sends its rounds in order; round k+1 becomes
ready when round k's response has ended plus its (scaled) tool or think time. With
``max_concurrency`` N the start times are ignored instead: N sessions run at a time, as N agents
would, and a slot whose session ended starts the next one of the workload (in start order), so
load is set by N rather than by an arrival rate (as in vLLM's ``--max-concurrency``, AIPerf's
``--concurrency`` and GuideLLM's concurrent profile). Every round that
becomes ready inside the run's arrival window is *offered* and ends exactly once as
``completed``, ``rejected`` (429/503/529 after the attempt limit or the retry budget, with the
status and reason) or ``failed`` (anything else, with the reason). A session whose round did not
complete is abandoned; its unsent rounds are recorded then, with reason ``session_abandoned``, the
state of the round that ended it, and the time each would have become ready had the session been
served instantly (``unsent_ready_s``), so shedding cannot shrink goodput's denominator. Retries
belong to their round's record and are never counted as offered requests.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt

from coda.bench.client import RETRYABLE, Attempt, Endpoint
from coda.bench.overload import RetryBudget, TenantLimiter, backoff_s
from coda.bench.prompts import Conversation
from coda.bench.scrape import Scraper
from coda.bench.vocab import HFVocabulary, Vocabulary, WordVocabulary
from coda.errors import CodaError
from coda.metrics.requests import Window
from coda.sim.config import SloConfig
from coda.workload.schema import Session, Workload, next_ready_s, session_prompts, unsent_ready_s
from coda.workload.stats import workload_duration_s

SHARDS = 32  # httpx transports the sessions are spread over (see Endpoint)
LAG_PERIOD_S = 0.01


class BenchConfig(BaseModel):
    """Everything that defines a bench run besides the workload (CLI flags and config files map onto it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str = Field(description="base URL of an OpenAI-compatible server")
    model: str | None = Field(None, description="model name (default: the first one /v1/models lists)")
    api: Literal["chat", "completions"] = "chat"
    duration_s: PositiveFloat | None = Field(None, description="arrival window in wall seconds (default: the workload's, scaled)")
    warmup_s: NonNegativeFloat = Field(0.0, description="start of the measurement window")
    drain_s: NonNegativeFloat = Field(60.0, description="time after the window for its requests to finish")
    time_scale: PositiveFloat = Field(1.0, description="wall seconds per trace second for session starts and tool/think times")
    max_sessions: PositiveInt | None = None
    tenant: str = Field("default", description="tenant of sessions that name none (sent as x-tenant-id)")
    api_key: str | None = Field(None, exclude=True, repr=False)
    max_attempts: PositiveInt = Field(4, description="attempts per request, the first included")
    backoff_base_s: PositiveFloat = 0.5
    backoff_max_s: PositiveFloat = 30.0
    max_retry_after_s: PositiveFloat = Field(60.0, description="longest Retry-After honoured; longer ones are capped")
    retry_rate: NonNegativeFloat = Field(5.0, description="retry budget: tokens per second (one per retry)")
    retry_burst: NonNegativeFloat = Field(20.0, description="retry budget: bucket size")
    max_concurrency: PositiveInt | None = Field(None, description="closed loop: this many sessions at a time, start times ignored")
    tenant_concurrency: PositiveInt | None = Field(None, description="per-tenant in-flight limit (429s lower it, successes restore it)")
    scrape_metrics: bool = Field(False, description="sample each engine's /metrics (vLLM's names) during the run")
    metrics_endpoints: tuple[str, ...] | None = Field(None, description="engines whose /metrics to sample (default: the endpoint)")
    scrape_interval_s: PositiveFloat = Field(1.0, description="seconds between /metrics samples")
    ignore_eos: bool = Field(True, description="send ignore_eos so output lengths follow the trace")
    tool_calls: bool = Field(
        False,
        description="a round followed by tool calls asks the engine to write them (structured output) and ends where they "
        "end, so an engine that reads tool calls from its output sees them; its output length is the calls' own",
    )
    tokenizer: str | None = Field(
        None, description="Hugging Face tokenizer.json (or its directory) to size prompts in the endpoint's tokens"
    )
    timeout_s: PositiveFloat = 600.0
    seed: int = 0
    slo: SloConfig = SloConfig()
    profile: str | None = Field(
        None,
        description="cost profile (name or JSON path) for each session's time alone, behind slowdown; "
        "without one, task completion times only",
    )


class Replay:
    """Build once, ``await run()`` once; ``stop()`` (Ctrl-C) ends it early with what was measured."""

    def __init__(self, workload: Workload, config: BenchConfig, clock: Callable[[], float] = time.perf_counter) -> None:
        self.workload = workload
        self.config = config
        self._clock = clock
        self.duration_s = config.duration_s or workload_duration_s(workload) * config.time_scale
        if config.metrics_endpoints and not config.scrape_metrics:
            raise ValueError("metrics_endpoints name the engines to sample with scrape_metrics; turn it on (--scrape-metrics)")
        if config.warmup_s >= self.duration_s:
            raise ValueError(f"warmup_s={config.warmup_s:g} leaves no measurement window in a {self.duration_s:g} s run")
        starts = sorted(workload.sessions, key=lambda s: (s.start_s, s.session_id))
        if config.max_concurrency is None:
            starts = [s for s in starts if s.start_s * config.time_scale <= self.duration_s]
        self.sessions = starts[: config.max_sessions]
        self.vocab: Vocabulary = HFVocabulary(config.tokenizer) if config.tokenizer else WordVocabulary()
        self.records: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self.model: str | None = config.model
        self.window_end = self.duration_s
        self.ended_early = False
        self._rng = random.Random(config.seed)
        self.budget = RetryBudget(config.retry_rate, config.retry_burst, clock)
        self.limiters: dict[str, TenantLimiter] = {}
        self._t0 = 0.0
        self._stop = asyncio.Event()
        self._cancel_reason = "run_ended"
        self.wall_s = 0.0
        self.scraper: Scraper | None = None
        self.loop_lag: list[float] = []  # how late the client's event loop woke, every LAG_PERIOD_S

    # --- clock -----------------------------------------------------------------------------
    def now(self) -> float:
        return self._clock() - self._t0

    async def _sleep_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)

    # --- running ---------------------------------------------------------------------------
    def stop(self) -> None:
        """End now (Ctrl-C): in-flight requests become failed ``interrupted``; the window ends here."""
        self._cancel_reason = "interrupted"
        self.ended_early = True
        self._stop.set()

    async def run(self) -> None:
        cfg = self.config
        lanes = min(len(self.sessions), cfg.max_concurrency or len(self.sessions))
        endpoint = self.endpoint(shards=min(SHARDS, lanes))
        try:
            listed = await endpoint.served_models()  # also the check that the endpoint answers at all
            if self.model is None:
                self.model = endpoint.model = listed[0] if listed else None
            elif listed and self.model not in listed:
                raise CodaError(
                    f"--model {self.model!r}: {cfg.endpoint} serves {', '.join(listed)}; pass one of them, or drop --model for the first"
                )
            if cfg.scrape_metrics:
                self.scraper = Scraper(cfg.metrics_endpoints or (cfg.endpoint,), cfg.scrape_interval_s, self.now)
                await self.scraper.check()
            self._t0 = self._clock()
            watch = asyncio.create_task(self._watch_lag())
            if self.scraper is not None:
                await self.scraper.sample()  # before the first request: counter deltas cover the whole run
                scraping = asyncio.create_task(self.scraper.run())
            if cfg.max_concurrency is None:
                tasks = [asyncio.create_task(self._session(endpoint, s, i)) for i, s in enumerate(self.sessions)]
            else:
                queue = deque(self.sessions)
                tasks = [asyncio.create_task(self._slot(endpoint, queue, i)) for i in range(lanes)]
            everything = asyncio.gather(*tasks, return_exceptions=True)
            stopper = asyncio.create_task(self._stop.wait())
            deadline = self.duration_s + self.config.drain_s
            await asyncio.wait({everything, stopper}, timeout=max(deadline - self.now(), 0.0), return_when=asyncio.FIRST_COMPLETED)
            if self._stop.is_set():
                self.window_end = min(self.window_end, self.now())
            elif cfg.max_concurrency is not None and everything.done():
                self.window_end = min(self.window_end, self.now())  # the workload ran out: no idle tail in the window
            for t in (*tasks, stopper, watch):
                t.cancel()
            await asyncio.gather(everything, stopper, watch, return_exceptions=True)
            if self.scraper is not None:
                scraping.cancel()
                await asyncio.gather(scraping, return_exceptions=True)
                await self.scraper.sample()  # after the last response
        finally:
            self.wall_s = self.now()
            await endpoint.close()
            if self.scraper is not None:
                await self.scraper.close()

    def endpoint(self, shards: int) -> Endpoint:
        """The client every request goes through: one server's. A subclass may return an ``Endpoint``
        that spreads requests over several servers (a load balancer's view, as a soak test needs)."""
        return self.client(self.config.endpoint, shards)

    def client(self, url: str, shards: int) -> Endpoint:
        """A client of the server at ``url`` with this replay's model, API, key, timeout and clock."""
        cfg = self.config
        return Endpoint(
            url,
            model=cfg.model,
            api=cfg.api,
            api_key=cfg.api_key,
            ignore_eos=cfg.ignore_eos,
            timeout_s=cfg.timeout_s,
            shards=shards,
            clock=self._clock,
        )

    async def _watch_lag(self) -> None:
        """Measure the client's own stalls: a late wake-up here delays every request's timestamps too."""
        while True:
            t = self._clock()
            await asyncio.sleep(LAG_PERIOD_S)
            self.loop_lag.append(max(0.0, self._clock() - t - LAG_PERIOD_S))

    def window(self) -> Window:
        return Window(self.config.warmup_s, max(self.window_end, self.config.warmup_s))

    # --- one session -----------------------------------------------------------------------
    async def _slot(self, endpoint: Endpoint, queue: deque[Session], shard: int) -> None:
        """One of ``max_concurrency`` lanes: run sessions one after another, each from when the last ended."""
        while queue and self.now() <= self.duration_s and not self._stop.is_set():
            await self._session(endpoint, queue.popleft(), shard, start_s=self.now())

    async def _session(self, endpoint: Endpoint, sess: Session, shard: int, start_s: float | None = None) -> None:
        """Replay one session from its start time, or from ``start_s`` (a concurrency slot), its
        rounds' own timing shifted with it."""
        ts = self.config.time_scale
        first = sess.rounds[0]
        ready = max(sess.start_s * ts, first.at_s * ts if first.at_s is not None else 0.0)
        shift = 0.0 if start_s is None else start_s - ready
        ready += shift
        conv = Conversation(sess, self.vocab)
        trace_prompts = [p for _, p in session_prompts(sess)]
        tenant = sess.tenant or self.config.tenant
        headers = {"x-session-id": sess.session_id, "x-tenant-id": tenant}
        for k in range(len(sess.rounds)):
            if ready > self.duration_s:
                return  # rounds that become ready after the window are not offered
            # The prompt is built before the round is ready: the client's own work is not the user's latency.
            rnd = sess.rounds[k]
            tools = [t.name for t in rnd.tools] if self.config.tool_calls else ()
            body = endpoint.body(conv.prompt(k), rnd.output_tokens, tools)
            await self._sleep_until(ready)
            if self._stop.is_set():
                return
            rec = self._record(sess, k, ready, tenant, trace_prompts[k])
            rec["prompt_tokens"] = conv.prompt_tokens
            try:
                text = await self._request(endpoint, rec, body, headers, shard)
            except asyncio.CancelledError:
                rec["state"], rec["reason"] = "failed", self._cancel_reason
                self.counts["failed"] += 1
                raise
            if text is None:
                self._abandon(sess, k + 1, rec["state"], tenant, trace_prompts, shift)
                return
            conv.reply(text)
            if k + 1 < len(sess.rounds):
                ready = next_ready_s(sess, k, rec["end_s"] - shift, ts) + shift

    def _record(self, sess: Session, k: int, ready: float, tenant: str, trace_prompt: int) -> dict[str, Any]:
        rnd = sess.rounds[k]
        rec: dict[str, Any] = {
            "request_id": len(self.records),
            "session_id": sess.session_id,
            "round": k,
            "session_rounds": len(sess.rounds),
            "kind": rnd.kind,
            "tenant": tenant,
            "ready_s": ready,
            "sent_s": None,
            "first_token_s": None,
            "finish_s": None,
            "end_s": None,
            "ttft_s": None,
            "e2e_s": None,
            "tbt_mean_s": None,
            "gaps_s": [],
            "prompt_tokens": 0,
            "trace_prompt_tokens": trace_prompt,
            "new_input_tokens": rnd.new_input_tokens,
            "output_tokens": 0,
            "trace_output_tokens": rnd.output_tokens,
            "hbm_hit_tokens": 0,
            "server_prompt_tokens": None,
            "state": "failed",
            "status": None,
            "reason": "in_flight",
            "attempts": 0,
            "statuses": [],
            "waited_s": 0.0,
            "admitted": False,
            "deferred": False,
        }
        self.records.append(rec)
        self.counts["offered"] += 1
        return rec

    def _abandon(self, sess: Session, first: int, state: str, tenant: str, trace_prompts: list[int], shift: float) -> None:
        for k, unshifted in unsent_ready_s(sess, first, self.now() - shift, self.config.time_scale):
            ready = unshifted + shift
            if ready > self.duration_s:
                return  # as for a live session: rounds ready after the window are not offered
            rec = self._record(sess, k, ready, tenant, trace_prompts[k])
            rec["state"], rec["reason"] = state, "session_abandoned"
            self.counts[state] += 1

    # --- one request, with retries ---------------------------------------------------------
    async def _request(self, endpoint: Endpoint, rec: dict[str, Any], body: bytes, headers: dict[str, str], shard: int) -> str | None:
        """The assistant text when the round completes; None when it ended rejected or failed."""
        cfg = self.config
        limiter = self.limiters.get(rec["tenant"])
        if limiter is None:
            limiter = self.limiters[rec["tenant"]] = TenantLimiter(cfg.tenant_concurrency)
        while True:
            epoch = await limiter.acquire()
            rec["attempts"] += 1
            self.counts["inflight"] += 1
            outcome = "error"
            a = Attempt(sent_s=self._clock())
            try:
                a = await endpoint.send(body, headers, shard, into=a)
                outcome = "ok" if a.ok else "429" if a.status == 429 else "error"
            except asyncio.CancelledError:
                if a.first_token_s is not None:  # cut off while streaming: its TTFT is known, not censored
                    rec["first_token_s"] = a.first_token_s - self._t0
                raise
            finally:
                self.counts["inflight"] -= 1
                limiter.release(outcome, epoch)
            rec["statuses"].append(a.status)
            rec["status"] = a.status
            if a.status == 200:
                rec["admitted"] = True
            if a.ok:
                self._completed(rec, a)
                return a.text
            if a.status not in RETRYABLE:
                return self._end(rec, "failed", a.reason or f"http_{a.status}")
            rec["deferred"] |= a.status == 503
            if rec["attempts"] >= cfg.max_attempts:
                return self._end(rec, "rejected", f"attempts_exhausted: {a.reason}")
            if not self.budget.try_spend():
                return self._end(rec, "rejected", f"retry_budget_exhausted: {a.reason}")
            retry_after = min(a.retry_after_s, cfg.max_retry_after_s) if a.retry_after_s is not None else None
            wait = backoff_s(rec["attempts"], retry_after, cfg.backoff_base_s, cfg.backoff_max_s, self._rng)
            rec["waited_s"] += wait
            self.counts["retries"] += 1
            await asyncio.sleep(wait)

    def _end(self, rec: dict[str, Any], state: str, reason: str) -> None:
        rec["state"], rec["reason"] = state, reason
        rec["end_s"] = self.now()
        self.counts[state] += 1
        return None

    def _completed(self, rec: dict[str, Any], a: Attempt) -> None:
        t0 = self._t0
        first, last = a.first_token_s - t0, a.last_token_s - t0  # type: ignore[operator]
        usage = a.usage or {}
        out = usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else a.tokens
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        rec.update(
            state="completed",
            reason=None,
            sent_s=a.sent_s - t0,
            first_token_s=first,
            finish_s=last,
            end_s=a.end_s - t0,  # type: ignore[operator]
            ttft_s=first - rec["ready_s"],
            e2e_s=last - rec["ready_s"],
            output_tokens=out,
            tbt_mean_s=(last - first) / (out - 1) if out > 1 else None,
            gaps_s=[round(g, 7) for g in a.gaps],
            hbm_hit_tokens=cached if isinstance(cached, int) else 0,
            server_prompt_tokens=usage.get("prompt_tokens"),
        )
        self.counts["completed"] += 1


class RoundRobin(Endpoint):
    """Each request to the next of several servers in turn: a client that spreads its requests
    itself, with no router in front of the engines."""

    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints = list(endpoints)
        super().__init__(endpoints[0].base, model=endpoints[0].model, api=endpoints[0].api, clock=endpoints[0].clock)
        self._turn = 0

    @property
    def model(self) -> str | None:
        return self.endpoints[0].model

    @model.setter
    def model(self, name: str | None) -> None:
        """The model every server is asked for (the replay names it once it has asked the first)."""
        for e in self.endpoints:
            e.model = name

    async def send(self, body: bytes, headers: dict[str, str], shard: int = 0, into: Attempt | None = None) -> Attempt:
        e = self.endpoints[self._turn % len(self.endpoints)]
        self._turn += 1
        return await e.send(body, headers, shard, into)

    async def close(self) -> None:
        for e in self.endpoints:
            await e.close()
        await super().close()


class SpreadReplay(Replay):
    """The replay over several servers without a router: round robin in the client."""

    def __init__(self, workload: Workload, config: BenchConfig, urls: Sequence[str]) -> None:
        super().__init__(workload, config)
        self.urls = list(urls)

    def endpoint(self, shards: int) -> Endpoint:
        return RoundRobin([self.client(u, shards) for u in self.urls])
