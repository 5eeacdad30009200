"""The fake engine's core without HTTP: the real-time loop keeps the discrete loop's order and
clock, tokens come out at the cost model's pace, prefix hits follow the token blocks, and aborts
free the worker."""

from __future__ import annotations

import asyncio

import pytest

from coda.engines.fake import FakeEngine, FakeEngineConfig
from coda.engines.realtime import RealtimeLoop
from coda.errors import CodaError
from coda.protocol import tokenizer as tok
from coda.sim.config import SimConfig


def run(coro):
    return asyncio.run(coro)


def test_events_run_in_time_then_schedule_order_with_now_at_their_time():
    async def main():
        seen, early = [], []
        loop = RealtimeLoop(speedup=100.0, on_drained=lambda: seen.append("drained"))

        def record(name: str) -> None:
            seen.append((name, loop.now))
            early.append(loop.wall_now() < loop.now - 1e-6 * loop.speedup)  # run before its wall-clock time?

        for t, name in ((1.0, "b"), (0.5, "a"), (1.0, "c")):
            loop.at(t, record, name)
        loop.at(-5.0, record, "past")  # clamped to now
        while len(loop):
            await asyncio.sleep(0.001)
        return seen, early

    seen, early = run(main())
    assert [s for s in seen if s != "drained"] == [("past", 0.0), ("a", 0.5), ("b", 1.0), ("c", 1.0)]
    assert "drained" in seen and not any(early)  # never before its time (a slow machine only runs events later)


def engine(**sim) -> FakeEngine:
    return FakeEngine(FakeEngineConfig(speedup=20.0, engine=SimConfig(**{"system": "vllm", "chunk_tokens": 16, **sim})))


async def generate(e: FakeEngine, prompt: list[str], n: int) -> tuple[list[str], object]:
    req = e.submit(prompt, n)
    out = []
    async for words in e.stream(req):
        out += words
    return out, req


def test_tokens_come_at_the_cost_models_pace_and_repeat_prompts_hit_the_prefix_cache():
    async def main():
        e = engine()
        e.start()
        prompt = tok.render([("user", tok.text(5, 2000))])
        out, req = await generate(e, prompt, 30)
        again, req2 = await generate(e, prompt, 30)
        e.close()
        return e, prompt, out, req, again, req2

    e, prompt, out, req, again, req2 = run(main())
    # on the worker's own (virtual) clock, the first token comes one prefill step after arrival
    assert req.first_token_s - req.ready_s == pytest.approx(e.cost.step_s([(len(prompt), 0)], []), rel=1e-9)
    assert len(out) == req.output_tokens == 30 and again == out  # deterministic for the same prompt
    assert req.cached_tokens == 0 and req2.cached_tokens == (len(prompt) - 1) // 16 * 16
    assert req2.ready_s >= req.finish_s  # the worker's virtual clock only moves forward


def test_aborting_a_queued_request_takes_it_out_of_the_queue():
    async def main():
        e = engine(max_num_seqs=1)
        e.start()
        running = e.submit(tok.render([("user", tok.text(1, 50))]), 2000)
        queued = e.submit(tok.render([("user", tok.text(2, 50))]), 200)
        reader = asyncio.ensure_future(e.stream(queued).__anext__())  # a client waiting for its first token
        await asyncio.sleep(0.05)
        waiting_before = len(e.worker.waiting)
        reader.cancel()  # ... goes away, as starlette cancels a stream whose client disconnected
        await asyncio.sleep(0.01)
        state = (waiting_before, len(e.worker.waiting), queued.done, queued.aborted, running.done)
        async for _ in e.stream(running):
            pass
        e.close()
        return state, running

    (waiting_before, waiting_after, done, aborted, running_done), running = run(main())
    assert (waiting_before, waiting_after, done, aborted, running_done) == (1, 0, True, True, False)
    assert running.released == 2000


def test_presets_that_need_sessions_are_refused_with_the_reason():
    with pytest.raises(CodaError, match="eviction policy tool_aware needs each session"):
        FakeEngine(FakeEngineConfig(engine=SimConfig(system="coda")))
    with pytest.raises(CodaError, match="max_model_len"):
        FakeEngine(FakeEngineConfig(max_model_len=10**7))
