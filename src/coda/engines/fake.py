"""The fake engine's core: one simulated worker (``coda.sim.worker.Worker``) serving real requests.

The worker, its scheduler, its KV pools and the cost model are the simulator's own; only the
loop differs (``RealtimeLoop``: virtual time runs ``speedup`` times the wall clock) and the worker
steps one iteration per event (``decode_run_max=1``), as a real engine does, so every token is
released at its simulated time. A request's KV chunks are named by hashing its token blocks
(``coda.engines.blocks``), so two requests share chunks exactly when they share a token prefix.
Nothing here speaks HTTP (``coda.engines.server`` does).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from prometheus_client import generate_latest
from pydantic import Field, PositiveFloat, PositiveInt

from coda.cost.model import build_cost_model
from coda.cost.profile import load_profile
from coda.engines.blocks import BlockRegistry, TokenSequence
from coda.engines.kv_publisher import KVEventPublisher
from coda.engines.prometheus import EngineMetrics
from coda.engines.realtime import RealtimeLoop
from coda.errors import CodaError
from coda.metrics.requests import Window
from coda.policy.presets import system_preset
from coda.protocol import tokenizer as tok
from coda.protocol.kv_events import MEDIUM_CPU, MEDIUM_DISK, MEDIUM_GPU, BlockRemoved, BlockStored, KVCacheEvent
from coda.shell.build import build_policies
from coda.sim.config import SimConfig
from coda.sim.kvcache import HbmPool, KVStore, Versions, owners_of
from coda.sim.request import SimRequest
from coda.sim.tiers import resolve_tiers
from coda.sim.worker import NodeLinks, Worker, WorkerSettings
from coda.strict import StrictModel

MEDIUM = {"hbm": MEDIUM_GPU, "dram": MEDIUM_CPU, "ssd": MEDIUM_DISK}


#: the system a fake engine runs unless told otherwise: the engine it fakes (vLLM's FCFS order, one
#: attention launch, LRU eviction), not the cluster default, whose tool-aware eviction needs sessions
ENGINE_SYSTEM = "vllm"


class FakeEngineConfig(StrictModel):
    """What the fake engine adds to the simulator's worker configuration (``engine``)."""

    model: str = Field("coda-fake", description="the served model name")
    speedup: PositiveFloat = Field(1.0, description="virtual seconds per wall second")
    max_model_len: PositiveInt | None = Field(None, description="longest prompt + output; default: what one worker's HBM KV holds")
    default_max_tokens: PositiveInt = Field(256, description="output length of a request that sets no max_tokens")
    kv_events: str | None = Field(None, description="ZMQ PUB endpoint for vLLM-format KV events, e.g. tcp://*:5557")
    kv_events_replay: str | None = Field(None, description="ZMQ ROUTER endpoint answering replay requests")
    kv_events_topic: str = ""
    engine: SimConfig = SimConfig(system=ENGINE_SYSTEM)


class _Recorder:
    """The worker reports gaps and steps to a recorder; the fake engine measures at the HTTP edge instead."""

    window = Window(-math.inf, math.inf)  # an engine has no measurement window

    def steps(self, *_: Any) -> None:
        pass

    def gap(self, *_: Any) -> None:
        pass


class LiveRequest(SimRequest):
    """A simulator request with the HTTP side's view: words to stream and when they were released."""

    __slots__ = ("out_words", "wake", "released", "done", "aborted", "t_arrival", "t_last")

    def __init__(self, rid: int, seq: TokenSequence, prompt_tokens: int, out_words: list[str]) -> None:
        super().__init__(rid, seq, 0, "user", 0.0)
        self.prompt_tokens = self.orig_prompt_tokens = self.new_input_tokens = prompt_tokens
        self.output_tokens = len(out_words)
        self.out_words = out_words
        self.wake = asyncio.Event()
        self.released = 0
        self.done = False
        self.aborted = False
        self.t_arrival = time.perf_counter()
        self.t_last = 0.0

    @property
    def cached_tokens(self) -> int:
        return max(self.hbm_hit, 0) + max(self.dram_hit, 0) + max(self.ssd_hit, 0)


class FakeEngine:
    """Build with a config, ``start()`` inside a running asyncio loop, ``close()`` when done."""

    def __init__(self, config: FakeEngineConfig) -> None:
        self.config = config
        cfg = config.engine
        self.preset = system_preset(cfg.system)
        self.profile = load_profile(cfg.profile)
        self.cost = build_cost_model(self.profile)
        # one worker: routing and ingress belong to whatever stands in front of it (coda serve)
        self.policies = build_policies(cfg.policy_spec, self.cost, kinds=("state", "execution", "eviction"))
        if self.policies.eviction.session_status:
            raise CodaError(
                f"eviction policy {self.policies.eviction.name} needs each session's tool calls; the fake engine sees requests, "
                "not sessions: use a system with LRU eviction (e.g. vllm) or set policies.eviction to lru"
            )
        self.C = cfg.chunk_tokens
        self.tiers = resolve_tiers(cfg, self.preset, self.profile, self.cost.kv_bytes(self.C))
        capacity = self.tiers.hbm_chunks * self.C
        if config.max_model_len is not None and config.max_model_len > capacity - self.C:
            raise CodaError(
                f"max_model_len={config.max_model_len} does not fit one worker's HBM KV of {capacity} tokens; lower it or raise hbm_kv_gib"
            )
        self.max_model_len = config.max_model_len or capacity - self.C
        self.metrics = EngineMetrics(config.model, self.C, self.tiers.hbm_chunks)
        self.loop: RealtimeLoop | None = None
        self.worker: Worker | None = None
        self.publisher: KVEventPublisher | None = None
        self._pending_kv: list[tuple[str, str, Sequence[int]]] = []
        self._finished: list[LiveRequest] = []
        self._steps_seen = 0
        self._next_rid = 0
        self.live: dict[int, LiveRequest] = {}

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Build the loop and the worker; idempotent (the CLI starts before serving, the app's lifespan again)."""
        if self.loop is not None:
            return
        cfg, c = self.config.engine, self.config
        # Load the cost model's compiled kernels (numba's on-disk cache) before serving: on the
        # first request that load stalls the real-time loop for seconds, so its whole output would
        # be released at once and a disconnect could no longer stop it early.
        self.cost.step_s([(self.C, 0)], [self.C])
        self.cost.step_s([], [self.C])
        self.loop = RealtimeLoop(c.speedup, self._flush)
        versions = Versions()
        self.owner = versions.new_owner()
        self.registry = BlockRegistry(self.owner, self.C, keep_tokens=c.kv_events is not None)
        if c.kv_events:
            self.publisher = KVEventPublisher(c.kv_events, c.kv_events_replay, c.kv_events_topic)
        listener = self._kv_listener if self.publisher is not None else None
        t = self.tiers
        ssd = KVStore("ssd", 0, t.ssd_chunks, versions, listener=listener) if t.ssd else None
        dram = KVStore("dram", 0, t.dram_chunks, versions, lower=ssd, listener=listener) if t.dram else None
        settings = WorkerSettings(
            loop=self.loop,  # type: ignore[arg-type]  # the EventLoop interface: now, at()
            cost=self.cost,
            versions=versions,
            state_policy=self.policies.state,
            execution=self.policies.execution,
            recorder=_Recorder(),  # type: ignore[arg-type]
            on_finish=self._on_finish,
            chunk_tokens=self.C,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            decode_run_max=1,
            cpu_shadow=t.cpu_shadow,
        )
        evict = self.policies.eviction
        hbm = HbmPool(0, t.hbm_chunks, versions, listener, lambda lru, n: evict.victims(lru, n, lambda owner: None, owners_of))
        self.worker = Worker(0, settings, hbm, dram, ssd, NodeLinks())

    def close(self) -> None:
        for req in list(self.live.values()):
            req.aborted = req.done = True
            req.wake.set()
        if self.loop is not None:
            self.loop.close()
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None

    def describe(self) -> dict[str, Any]:
        """Configuration and provenance printed at startup and served at /v1/models."""
        return {
            "model": self.config.model,
            "system": self.preset.name,
            "policies": self.policies.spec.describe(),
            "profile": {"name": self.profile.name, "kind": self.profile.kind, "description": self.profile.description},
            "speedup": self.config.speedup,
            "chunk_tokens": self.C,
            "max_model_len": self.max_model_len,
            "tiers": self.tiers.describe(),
            "tokenizer": "coda word tokenizer (one token per whitespace-separated word)",
        }

    # --- requests --------------------------------------------------------------------------
    def submit(self, prompt: list[str], max_tokens: int) -> LiveRequest:
        """Queue a request whose prompt is ``prompt`` (token words); it generates ``max_tokens`` tokens."""
        assert self.loop is not None and self.worker is not None
        out_words = tok.words(tok.seed_of(len(prompt), *prompt[-32:]), max_tokens)
        seq = TokenSequence(self.owner, self.registry, prompt + out_words)
        req = LiveRequest(self._next_rid, seq, len(prompt), out_words)
        self._next_rid += 1
        seq.req = req
        req.chain = self.registry.intern(seq.hashes, seq.words, 0, len(prompt) // self.C)
        req.owners = (self.owner,)
        self.live[req.rid] = req
        self.loop.at(self.loop.virtual_now(), self._arrive, req)
        return req

    def _arrive(self, req: LiveRequest) -> None:
        assert self.loop is not None and self.worker is not None
        if req.aborted:
            self._end(req, "abort")
            return
        req.ready_s = self.loop.now
        self.worker.enqueue(req)

    async def stream(self, req: LiveRequest) -> AsyncIterator[list[str]]:
        """Output words as the worker releases them; closing the iterator early aborts the request."""
        sent = 0
        try:
            while True:
                await req.wake.wait()
                req.wake.clear()
                if req.released > sent:
                    yield req.out_words[sent : req.released]
                    sent = req.released
                if req.done:
                    return
        finally:
            if not req.done:
                self.abort(req)

    def abort(self, req: LiveRequest) -> None:
        """Stop a request: a queued one leaves the queue, a running one ends at its next step (as vLLM aborts)."""
        assert self.worker is not None
        req.aborted = True
        if req.done:
            return
        if self.worker.abort(req):
            self._end(req, "abort")

    # --- worker callbacks ------------------------------------------------------------------
    def _on_finish(self, req: SimRequest) -> None:
        assert isinstance(req, LiveRequest)
        self._finished.append(req)

    def _end(self, req: LiveRequest, reason: str) -> None:
        req.done = True
        self.live.pop(req.rid, None)
        self.metrics.finished(reason)
        req.wake.set()

    def _release(self, req: LiveRequest, now: float) -> None:
        n = min(req.emitted, req.output_tokens)
        if n <= req.released:
            return
        m = self.metrics
        if req.released == 0:
            m.ttft.observe(now - req.t_arrival)
            m.queries.inc(req.prompt_tokens)
            m.hits.inc(max(req.hbm_hit, 0))
            m.ext_queries.inc(max(req.prompt_tokens - max(req.hbm_hit, 0), 0))
            m.ext_hits.inc(max(req.dram_hit, 0) + max(req.ssd_hit, 0))
            m.prompt_tokens.inc(req.prompt_tokens)
        else:
            m.itl.observe(now - req.t_last)
        for _ in range(n - req.released - 1):
            m.itl.observe(0.0)  # tokens released together (the loop ran late) arrive together
        m.generation_tokens.inc(n - req.released)
        req.released = n
        req.t_last = now
        req.wake.set()

    def _flush(self) -> None:
        """After each batch of due events: release new tokens, finish requests, publish KV events."""
        worker = self.worker
        assert worker is not None
        now = time.perf_counter()
        if worker.steps != self._steps_seen:
            self._steps_seen = worker.steps
            for r in worker.running:
                if r.emitted > r.released:  # type: ignore[attr-defined]
                    self._release(r, now)  # type: ignore[arg-type]
        if self._finished:
            for r in self._finished:
                self._release(r, now)
                self.metrics.e2e.observe(now - r.t_arrival)
                self.metrics.preemptions.inc(r.preemptions)
                self._end(r, "abort" if r.aborted else "length")
            self._finished.clear()
        if self._pending_kv and self.publisher is not None:
            self.publisher.publish(self._kv_events())
            self._pending_kv.clear()

    # --- KV events -------------------------------------------------------------------------
    def _kv_listener(self, event: str, worker: int, tier: str, chunks: Sequence[int]) -> None:
        self._pending_kv.append((event, tier, list(chunks)))

    def _kv_events(self) -> list[KVCacheEvent]:
        """One BlockStored per run of chained blocks, one BlockRemoved per removal, in order."""
        reg = self.registry
        assert reg.tokens is not None
        out: list[KVCacheEvent] = []
        for event, tier, chunks in self._pending_kv:
            medium = MEDIUM[tier]
            idx = [reg.local(c) for c in chunks]
            if event == "removed":
                out.append(BlockRemoved(block_hashes=[reg.hashes[i] for i in idx], medium=medium))
                continue
            run: list[int] = []
            for i in idx:
                if run and reg.parents[i] != reg.hashes[run[-1]]:
                    out.append(self._stored(run, medium))
                    run = []
                run.append(i)
            if run:
                out.append(self._stored(run, medium))
        return out

    def _stored(self, run: list[int], medium: str) -> BlockStored:
        reg = self.registry
        assert reg.tokens is not None
        return BlockStored(
            block_hashes=[reg.hashes[i] for i in run],
            parent_block_hash=reg.parents[run[0]],
            token_ids=[t for i in run for t in reg.tokens[i]],
            block_size=self.C,
            lora_id=None,
            medium=medium,
            lora_name=None,
        )

    def metrics_text(self) -> bytes:
        """The Prometheus exposition text, with the gauges read now."""
        w = self.worker
        assert w is not None
        m = self.metrics
        m.running.set(len(w.running) + w.n_restoring)
        m.waiting.set(len(w.waiting))
        m.kv_usage.set((w.hbm.used - len(w.hbm.lru)) / w.hbm.capacity)  # as vLLM: cached idle blocks count as free
        m.late.set(self.loop.late_max_s if self.loop is not None else 0.0)
        return generate_latest(m.registry)
