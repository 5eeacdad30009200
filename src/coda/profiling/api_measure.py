"""Measure a live engine's step costs through its OpenAI API (``coda profile measure --endpoint``).

Nothing inside the engine is visible, so every timing is the latency of a controlled request on
``/v1/completions`` (the server's default sampling, as clients use it), one measurement at a time
on an otherwise idle engine. Prompts are token ids (sizes exact; ids drawn from 10-999, which
every vocabulary has) except where the server's own text handling is the point:

* prefill: the time to the first streamed token (through ``coda bench``'s client, so its TTFT is
  what that client sees) after a fresh prompt of ``new`` tokens (every
  prompt starts with its own random tokens, so nothing hits the prefix cache), or after ``cached``
  tokens that an earlier request of the same prefix left in the prefix cache (the engine's
  reported ``cached_tokens`` says how many really hit; the rest count as new);
* text: the same for a text prompt of Coda's words sent a second time; nearly all of it hits the
  prefix cache, so what is left beyond the step is the API's own work, which grows with the
  prompt (tokenization);
* the API under load: the API server's time for a request is the client's TTFT less the engine's
  own part (its queue and prefill time, from vLLM's ``/metrics`` histograms, so the step model does
  not enter), measured for fresh text probes of two sizes while ``streams`` other requests stream
  their answers (each sent again when it ends, so the load holds): the server tokenizes,
  detokenizes and streams for all of them in one process, so its time per request, and per
  prompt token, grows with them (``api_stream_s`` and ``api_stream_token_s`` per streaming
  request);
* decode: ``batch`` concurrent requests over ``context``-token prompts sent once before, so every
  prompt is cached, the batch joins in one step and decodes in lockstep; the step time is the
  median latency of ``output`` tokens minus that of ``SHORT`` tokens, per extra token, which
  cancels the API latency and the first step. These are not streamed: a long streamed answer
  also times the server's per-token work, which on a loaded machine arrives late and in bursts;
* host CPU (``Plan.host``, for an engine whose API server shares the forward pass's core): a
  lockstep decode batch is timed alone and while one client sends fresh text requests back to
  back (the CPU the API server spends on each delays the batch's steps by as much: per request and
  per prompt token), and streamed beside not streamed (the server's work per streamed token and
  per step).

Each shape is warmed up, then measured ``repeats`` times in interleaved rounds (a slow moment of
the machine touches every shape a little, not one shape a lot), and the median is kept.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
from httpx_sse import EventSource

from coda.bench.client import Endpoint
from coda.errors import CodaError
from coda.protocol import tokenizer as tok

MIN_ID, MAX_ID = 10, 1000
SHORT = 8  # tokens of the reference decode request
PROBE_WORDS = (32, 384)  # text prompts of the API-under-load probes (a word is one to three tokens)
PROBES = 4  # probes per load and round
HOST_CONTEXT = 32  # words (one to three tokens each) of the prompt of each request of a host probe's decode batch
HOST_OUTPUT = 384  # tokens of a host probe's decode batch: long enough that dozens of requests arrive within it
PROBE_TRIES = 4  # tries per probe: one whose load changed under it (a stream ended) is sent again
STREAM_MAX = 1024  # answer of a request streaming beside the probes (sent again when it ends; longer leaves fewer probes to retry)
#: vLLM's histograms of the engine's own part of a request's first token (EngineCore timestamps)
ENGINE_TTFT_PARTS = ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds")
#: how long a probe waits for the engine's histograms to count it (assumed bound): vLLM records a
#: request's queue and prefill time as its output is processed, which a busy host can delay past
#: the moment the client holds the answer
ENGINE_STATS_SETTLE_S = 5.0


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the endpoint says about itself (``/v1/models``, ``/version``, vLLM's ``/metrics``)."""

    url: str
    model: str
    root: str | None
    version: str | None
    max_model_len: int | None
    block_tokens: int | None
    kv_capacity_tokens: int | None
    cache: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Timing:
    """One request as the client saw it: ``done_s`` is its first chunk when streamed, else its end."""

    sent_s: float
    done_s: float
    tokens: int
    prompt_tokens: int
    cached_tokens: int | None

    @property
    def seconds(self) -> float:
        return self.done_s - self.sent_s


@dataclass(frozen=True, slots=True)
class PrefillSample:
    """Latency of one token after a prompt: ``new`` tokens computed over ``cached`` ones; a text
    prompt (``text_tokens`` > 0) is also tokenized by the server, a token-id prompt is not."""

    new: int
    cached: int
    ttft_s: list[float]
    text_tokens: int = 0

    @property
    def seconds(self) -> float:
        return statistics.median(self.ttft_s)


@dataclass(frozen=True, slots=True)
class DecodeSample:
    batch: int
    context: float  # mean context over the measured steps
    step_s: list[float]

    @property
    def seconds(self) -> float:
        return statistics.median(self.step_s)


@dataclass(frozen=True, slots=True)
class ApiSample:
    """The API server's time for a text probe of ``prompt_tokens`` tokens (client TTFT less the
    engine's queue and prefill) while ``streams`` other requests stream their answers."""

    streams: int
    prompt_tokens: int
    api_s: list[float]

    @property
    def seconds(self) -> float:
        return statistics.median(self.api_s)


@dataclass(frozen=True, slots=True)
class HostSample:
    """A lockstep decode of ``batch`` requests over ``context`` prompt tokens, ``output`` tokens each:
    streamed (``streams``) or not. Not streamed, it is timed alone (``quiet_s``) and while one
    client sent text requests of ``words`` words back to back (``loaded_s``), ``arrivals`` of them,
    each (new, cached) tokens, sent and answered within it. Streamed, ``loaded_s`` is the streamed
    batch's time and ``arrivals`` is empty."""

    batch: int
    context: int
    output: int
    words: int
    streams: bool
    quiet_s: float
    loaded_s: float
    arrivals: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """The shapes to measure: prefills as (new, cached), decodes as (batch, context)."""

    prefill: tuple[tuple[int, int], ...]
    decode: tuple[tuple[int, int], ...]
    text: tuple[int, ...] = ()  # words of cached text prompts (the server's tokenizer cost)
    streams: tuple[int, ...] = ()  # requests streaming beside the API-under-load probes
    stream_tokens: int = STREAM_MAX  # answer of each of those (each is sent again when it ends)
    probe_words: tuple[int, ...] = PROBE_WORDS  # words of the probes' text prompts
    output_tokens: int = 96
    repeats: int = 3
    warmup: int = 1
    host: tuple[tuple[int, int], ...] = ()  # host probes' decode batches (batch, context); empty: none
    host_words: tuple[int, ...] = PROBE_WORDS  # words of the text requests sent beside them
    host_output: int = HOST_OUTPUT  # tokens of each host probe's decode (its window)

    @classmethod
    def for_engine(
        cls, info: EngineInfo, *, max_batch: int, output_tokens: int = 96, repeats: int = 3, max_context: int | None = None,
        host: bool = False,
    ) -> Plan:
        """A grid over what the engine can hold: prompts within max_model_len (and ``max_context``),
        and every decode batch (prompts, outputs, a block of slack each) within its KV capacity;
        with ``host``, host probes over batches that leave a seat and the KV of the requests beside them."""
        limit = min(info.max_model_len or 4096, max_context or 1 << 62)
        cap = info.kv_capacity_tokens or limit
        slack = output_tokens + (info.block_tokens or 16)
        top = min(limit, cap) - slack
        news = sorted({n for n in (16, 128, 512, 1024, 2048, 3072, 4096, 6144) if n <= top} | {top})
        cached = [(n, int(f * top)) for n in (64, 512) for f in (0.25, 0.5, 0.75) if n + int(f * top) <= top]
        decode = [
            (b, c)
            for b in (1, 2, 4, 8, 16, 32)
            if b <= max_batch
            for c in sorted({64, 512, 1024, 2048, 4096, min(top, cap // b - slack)})
            if 64 <= c <= top and b * (c + slack) <= cap
        ]
        text = tuple(n for n in (64, 256, 512, 1024, 1536) if 3 * n <= top)  # a word is at most ~3 tokens
        streams = tuple(sorted({0, max_batch // 2, max_batch - 1}))  # the probe takes the last seat
        probe_words = tuple(w for w in PROBE_WORDS if 3 * w <= top)
        block = info.block_tokens or 16
        room = (cap - 3 * max(probe_words, default=0) - block) // max(1, max_batch - 1)  # each stream's KV beside the largest probe
        stream_tokens = max(SHORT, min(STREAM_MAX, room - 64 - block))
        beside = 3 * max(probe_words, default=0) + block
        host_batches = sorted({1, max(1, (max_batch - 1) // 2), max_batch - 1}) if host and max_batch >= 3 else []
        host_shapes = tuple((b, HOST_CONTEXT) for b in host_batches if b * (3 * HOST_CONTEXT + HOST_OUTPUT + block) + beside <= cap)
        return cls(
            tuple((n, 0) for n in news) + tuple(cached), tuple(decode), text, streams, stream_tokens, probe_words, output_tokens, repeats,
            host=host_shapes, host_words=probe_words,
        )


def _fail(url: str, what: str) -> CodaError:
    return CodaError(f"--endpoint {url}: {what}")


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus samples by name (labels, value); empty for a text that is not an exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                out.setdefault(smp.name, []).append((dict(smp.labels), float(smp.value)))
    except ValueError:
        return {}
    return out


class Prober:
    """Timed requests to one endpoint; ``measure`` runs a ``Plan``."""

    def __init__(self, url: str, *, seed: int = 0, timeout_s: float = 300.0, log: Callable[[str], None] = lambda _: None) -> None:
        base = url.rstrip("/")
        self.url = base[: -len("/v1")] if base.endswith("/v1") else base
        self.rng = random.Random(seed)
        self.log = log
        self.client = httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=10.0))
        self.endpoint = Endpoint(self.url, model=None, api="completions", timeout_s=timeout_s)
        self.model = ""

    async def close(self) -> None:
        await self.client.aclose()
        await self.endpoint.close()

    # --- the engine ------------------------------------------------------------------------
    async def _get(self, path: str) -> httpx.Response | None:
        try:
            return await self.client.get(path)
        except httpx.HTTPError:
            return None

    async def inspect(self) -> EngineInfo:
        """The served model and, from vLLM's ``/metrics``, the KV cache; a clear error if this is not an OpenAI server."""
        try:
            resp = await self.client.get("/v1/models")
        except httpx.ConnectError as err:
            raise _fail(self.url, f"cannot connect ({err or 'connection refused'}); is the engine running?") from None
        except httpx.HTTPError as err:
            raise _fail(self.url, f"GET /v1/models failed: {type(err).__name__}: {err}") from None
        try:
            models = resp.json()["data"]
            entry = models[0]
            self.model = str(entry["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise _fail(
                self.url, f"GET /v1/models answered HTTP {resp.status_code} without an OpenAI model list; not an OpenAI-compatible server"
            ) from None
        version = await self._get("/version")
        metrics = await self._get("/metrics")
        samples = _samples(metrics.text if metrics is not None and metrics.status_code == 200 else "")
        cache = samples.get("vllm:cache_config_info", [({}, 0.0)])[0][0]
        if sum(v for name in ("vllm:num_requests_running", "vllm:num_requests_waiting") for _, v in samples.get(name, ())) > 0:
            raise _fail(self.url, "the engine is serving other requests; measure an idle engine")
        blocks = cache.get("num_gpu_blocks")
        bs = cache.get("block_size")
        return EngineInfo(
            url=self.url,
            model=self.model,
            root=entry.get("root"),
            version=(version.json().get("version") if version is not None and version.status_code == 200 else None),
            max_model_len=entry.get("max_model_len"),
            block_tokens=int(bs) if bs and bs.isdigit() else None,
            kv_capacity_tokens=int(blocks) * int(bs) if blocks and blocks.isdigit() and bs and bs.isdigit() else None,
            cache=cache,
        )

    # --- one request -----------------------------------------------------------------------
    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(MIN_ID, MAX_ID) for _ in range(n)]

    async def complete(self, prompt: list[int] | str, max_tokens: int) -> Timing:
        """One request, not streamed, timed to its end, with the server's default sampling (as
        clients send): a long streamed answer would also time the server's per-token work, which on
        a loaded machine arrives late and in bursts."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
        sent = time.perf_counter()
        try:
            resp = await self.client.post("/v1/completions", json=body)
        except httpx.HTTPError as err:
            raise _fail(self.url, f"POST /v1/completions failed: {type(err).__name__}: {err}") from None
        done = time.perf_counter()
        if resp.status_code != 200:
            raise _fail(self.url, f"POST /v1/completions answered HTTP {resp.status_code}: {resp.text[:200]!r}")
        try:
            usage = resp.json().get("usage")
        except (ValueError, AttributeError):
            usage = None
        return self._timing(sent, done, max_tokens, usage)

    async def first_token(self, prompt: list[int] | str) -> Timing:
        """One streamed single-token request through ``coda bench``'s own client, timed to its first
        chunk: the TTFT that client sees (its overhead included)."""
        return await self.streamed(prompt, 1, first=True)

    async def streamed(self, prompt: list[int] | str, max_tokens: int, *, first: bool = False) -> Timing:
        """One streamed request through ``coda bench``'s own client, timed to its first chunk
        (``first``) or to its end."""
        body = msgspec.json.encode(
            {
                "model": self.model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )
        a = await self.endpoint.send(body, {})
        done = a.first_token_s if first else a.end_s
        if not a.ok or done is None:
            raise _fail(self.url, f"POST /v1/completions (streamed): {a.reason or f'HTTP {a.status}'}")
        return self._timing(a.sent_s, done, max_tokens, a.usage)

    def _timing(self, sent: float, done: float, max_tokens: int, usage: Any) -> Timing:
        try:
            tokens, prompt_tokens = int(usage["completion_tokens"]), int(usage["prompt_tokens"])
        except (KeyError, TypeError, ValueError):
            raise _fail(self.url, "POST /v1/completions answered without an OpenAI usage block; not an OpenAI-compatible server") from None
        if tokens != max_tokens:
            raise _fail(self.url, f"asked for {max_tokens} tokens with ignore_eos, got {tokens}; the server must honour ignore_eos")
        return Timing(sent, done, tokens, prompt_tokens, (usage.get("prompt_tokens_details") or {}).get("cached_tokens"))

    # --- shapes ----------------------------------------------------------------------------
    async def prefill(self, new: int, cached: int) -> tuple[int, int, float]:
        """(new, cached, latency) of one single-token request; ``cached`` as the engine reports it when it does."""
        prefix = self.ids(cached)
        if cached:
            await self.complete(prefix, 1)
        t = await self.first_token(prefix + self.ids(new))
        hit = cached if t.cached_tokens is None else t.cached_tokens
        return new + cached - hit, hit, t.seconds

    async def text(self, words: int) -> tuple[int, int, int, float]:
        """(new, cached, prompt tokens, latency) of a text prompt of ``words`` words sent a second time:
        nearly all of it hits the prefix cache, so what is left beyond the step is the API's work,
        tokenization included."""
        prompt = tok.text(self.rng.randrange(1 << 62), words)
        await self.complete(prompt, 1)
        t = await self.first_token(prompt)
        hit = t.cached_tokens or 0
        return t.prompt_tokens - hit, hit, t.prompt_tokens, t.seconds

    async def decode(self, batch: int, context: int, output: int) -> float:
        """Step time of ``batch`` lockstep requests over cached ``context``-token prompts: the median
        latency of ``output`` tokens minus that of ``SHORT`` tokens, per extra token."""
        prompts = [self.ids(context) for _ in range(batch)]
        for p in prompts:
            await self.complete(p, 1)
        short = await asyncio.gather(*(self.complete(p, SHORT) for p in prompts))
        long = await asyncio.gather(*(self.complete(p, output) for p in prompts))
        return (statistics.median(t.seconds for t in long) - statistics.median(t.seconds for t in short)) / (output - SHORT)

    async def _lockstep(self, prompts: list[str], output: int, stream: bool) -> list[Timing]:
        """A batch of cached prompts sent at once, ``output`` tokens each (joined in one step)."""
        send = self.streamed if stream else self.complete
        return list(await asyncio.gather(*(send(p, output) for p in prompts)))

    async def _beside(self, words: int, stop: asyncio.Event, into: list[Timing]) -> None:
        """Fresh text requests of ``words`` words, one token each, back to back until ``stop``."""
        while not stop.is_set():
            into.append(await self.complete(tok.text(self.rng.randrange(1 << 62), words), 1))

    async def host(self, batch: int, context: int, output: int, sizes: tuple[int, ...]) -> list[HostSample]:
        """Host probes over one lockstep batch of ``context``-word prompts (a seat left free for the requests beside it):
        streamed against not streamed, and not streamed with and without text requests of each of
        ``sizes`` words sent back to back beside it."""
        prompts = [tok.text(self.rng.randrange(1 << 62), context) for _ in range(batch)]  # text: any OpenAI server takes it
        tokens = [(await self.complete(p, 1)).prompt_tokens for p in prompts]
        context = int(statistics.median(tokens))

        def seconds(ts: list[Timing]) -> float:
            return statistics.median(t.seconds for t in ts)

        quiet = seconds(await self._lockstep(prompts, output, stream=False))
        out = [HostSample(batch, context, output, 0, True, quiet, seconds(await self._lockstep(prompts, output, stream=True)), ())]
        for words in sizes:
            side: list[Timing] = []
            stop = asyncio.Event()
            task = asyncio.create_task(self._beside(words, stop, side))
            try:
                while not side:  # the load runs before the batch starts
                    await asyncio.sleep(0.001)
                timed = await self._lockstep(prompts, output, stream=False)
            finally:
                stop.set()
                await task
            start, end = min(t.sent_s for t in timed), max(t.done_s for t in timed)
            arrivals = tuple((t.prompt_tokens - (t.cached_tokens or 0), t.cached_tokens or 0) for t in side if start <= t.done_s <= end)
            out.append(HostSample(batch, context, output, words, False, quiet, seconds(timed), arrivals))
        return out

    async def _engine_ttft_s(self) -> tuple[float, float] | None:
        """(sum, count) of the engine's queue and prefill time histograms; None where not exposed."""
        resp = await self._get("/metrics")
        samples = _samples(resp.text if resp is not None and resp.status_code == 200 else "")
        sums = [sum(v for _, v in samples.get(f"{m}_sum", ())) for m in ENGINE_TTFT_PARTS]
        counts = [sum(v for _, v in samples.get(f"{m}_count", ())) for m in ENGINE_TTFT_PARTS]
        if not all(f"{m}_sum" in samples for m in ENGINE_TTFT_PARTS) or counts[0] != counts[1]:
            return None
        return sum(sums), counts[0]

    async def _engine_ttft_counting(self, before: tuple[float, float] | None) -> tuple[float, float] | None:
        """The engine's histograms once they count one request more than ``before`` (or as they
        stand after ``ENGINE_STATS_SETTLE_S``): the probe's timing reaches /metrics after its answer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ENGINE_STATS_SETTLE_S
        while True:
            after = await self._engine_ttft_s()
            if before is None or after is None or after[1] > before[1] or loop.time() >= deadline:
                return after
            await asyncio.sleep(0.02)

    async def _stream(self, prompt: list[int], max_tokens: int, decoding: asyncio.Event, ends: list[int]) -> None:
        """A background request streaming its answer, sent again each time it ends so that the load
        holds for as long as the probes take (a fast engine finishes any answer before them).
        ``decoding`` is set while its answer streams; ``ends[0]`` counts the answers that ended, from
        the chunk that carries the finish reason (the engine has finished it by then)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
        what = "POST /v1/completions (a request streaming beside the probes)"
        while True:
            async with self.client.stream("POST", "/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    raise _fail(self.url, f"{what}: HTTP {resp.status_code}")
                async for event in EventSource(resp).aiter_sse():
                    if not event.data or event.data == "[DONE]":
                        continue
                    try:
                        choices = msgspec.json.decode(event.data).get("choices") or []
                    except (msgspec.DecodeError, AttributeError):
                        raise _fail(self.url, f"{what}: a stream event that is not an OpenAI chunk: {event.data[:80]!r}") from None
                    if any(isinstance(c, dict) and c.get("finish_reason") for c in choices):
                        break  # the answer ended; what follows ([DONE]) is not waited for
                    decoding.set()
            decoding.clear()  # it ended (or the stream closed without a finish reason)
            ends[0] += 1

    async def api_under_load(self, streams: int, probes: int, max_tokens: int, sizes: tuple[int, ...]) -> list[tuple[int, int, float]]:
        """(words, prompt tokens, API seconds) of ``probes`` sequential text probes of each size of
        ``sizes`` words while ``streams`` requests stream (a probe's client TTFT less the engine's
        queue and prefill time for it); empty when the endpoint exposes no engine timing. A probe
        counts only if every stream was decoding from its start to its end and the engine's
        histograms counted it alone; else it is sent again, up to ``PROBE_TRIES`` times."""
        if await self._engine_ttft_s() is None:
            return []
        events = [asyncio.Event() for _ in range(streams)]
        ends = [0]
        tasks = [asyncio.create_task(self._stream(self.ids(64), max_tokens, e, ends)) for e in events]
        out: list[tuple[int, int, float]] = []
        try:
            for words in [w for _ in range(probes) for w in sizes]:
                for _ in range(PROBE_TRIES):
                    await self._all_decoding(events, tasks)
                    ended, before = ends[0], await self._engine_ttft_s()
                    t = await self.first_token(tok.text(self.rng.randrange(1 << 62), words))
                    after = await self._engine_ttft_counting(before)
                    steady = ends[0] == ended and all(e.is_set() for e in events)
                    if steady and before is not None and after is not None and after[1] - before[1] == 1:
                        out.append((words, t.prompt_tokens, t.seconds - (after[0] - before[0])))
                        break
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return out

    @staticmethod
    async def _all_decoding(events: list[asyncio.Event], tasks: list[asyncio.Task[None]]) -> None:
        """Wait until every background stream is decoding; a stream that failed raises its error."""
        while not all(e.is_set() for e in events):
            waiting = [asyncio.ensure_future(e.wait()) for e in events if not e.is_set()]
            await asyncio.wait([*waiting, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for w in waiting:
                w.cancel()
            for task in tasks:
                if task.done():
                    task.result()  # it ends only by raising

    async def measure(self, plan: Plan) -> tuple[list[PrefillSample], list[DecodeSample], list[ApiSample], list[HostSample]]:
        self.log(f"warm-up: {len(plan.prefill)} prefill, {len(plan.decode)} decode and {len(plan.text)} text shapes x {plan.warmup}")
        for _ in range(plan.warmup):
            for n, c in plan.prefill:
                await self.prefill(n, c)
            for b, c in plan.decode:
                await self.decode(b, c, 2 * SHORT)
            for w in plan.text:
                await self.text(w)
        pre: dict[tuple[int, int], list[float]] = {}
        hits: dict[tuple[int, int], tuple[int, int]] = {}
        dec: dict[tuple[int, int], list[float]] = {}
        txt: dict[int, list[tuple[int, int, int, float]]] = {}
        api: dict[tuple[int, int], list[tuple[int, float]]] = {}
        host: list[HostSample] = []
        for r in range(plan.repeats):
            self.log(f"round {r + 1}/{plan.repeats}")
            for n, c in plan.prefill:
                new, hit, ttft = await self.prefill(n, c)
                pre.setdefault((n, c), []).append(ttft)
                hits[(n, c)] = (new, hit)
            for b, c in plan.decode:
                dec.setdefault((b, c), []).append(await self.decode(b, c, plan.output_tokens))
            for w in plan.text:
                txt.setdefault(w, []).append(await self.text(w))
            for b in plan.streams:
                for words, n, seconds in await self.api_under_load(b, PROBES, plan.stream_tokens, plan.probe_words):
                    api.setdefault((b, words), []).append((n, seconds))
            for b, c in plan.host:
                host += await self.host(b, c, plan.host_output, plan.host_words)
        prefill = [PrefillSample(*hits[k], ttft_s=v) for k, v in pre.items()]
        # A text's hit varies with where its last block ends; the median repeat stands for the shape.
        for runs in txt.values():
            new, hit, n, _ = sorted(runs, key=lambda r: r[3])[len(runs) // 2]
            prefill.append(PrefillSample(new, hit, [r[3] for r in runs], text_tokens=n))
        decode = [DecodeSample(b, c + (SHORT + plan.output_tokens) / 2.0, v) for (b, c), v in dec.items()]
        # a size's prompt tokens vary a little with its words: the median stands for the shape
        api_samples = [ApiSample(b, int(statistics.median(n for n, _ in v)), [t for _, t in v]) for (b, _), v in api.items()]
        return prefill, decode, api_samples, host
