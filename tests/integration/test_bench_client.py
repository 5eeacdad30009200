"""`coda bench` as a good client, against a real scripted HTTP server on loopback: it waits at
least Retry-After, gives up after the attempt limit and the retry budget, slows a tenant down on
429, counts rejected and abandoned rounds in goodput's denominator, never counts a retry twice,
and records bad responses (unreachable endpoint, non-OpenAI bodies, a stream cut mid-way) as
failed with a reason while the run goes on."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from coda.bench.replay import BenchConfig
from coda.bench.run import run_once
from coda.errors import CodaError
from coda.protocol import tokenizer as tok
from coda.workload.schema import Round, Session, Workload
from tests.integration.loopback import serve


@dataclass
class Seen:
    session: str
    tenant: str
    nth: int  # this session's n-th request (0-based)
    t: float
    body: dict


Reply = Callable[[Seen], Response]


def ok(tokens: int, delay_s: float = 0.0) -> Response:
    async def gen():
        if delay_s:
            await asyncio.sleep(delay_s)
        for i in range(tokens):
            yield _chunk({"content": ("" if i == 0 else " ") + f"w{i}"})
        yield _chunk({}, "length")
        yield b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": %d}}\n\n' % tokens
        yield b"data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


def _chunk(delta: dict, reason: str | None = None) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}).encode() + b"\n\n"


def status(code: int, **headers: str) -> Response:
    return JSONResponse({"error": {"message": f"scripted {code}", "type": "overloaded", "code": code}}, status_code=code, headers=headers)


def cut_after(chunks: int) -> Response:
    async def gen():
        for i in range(chunks):
            yield _chunk({"content": f" w{i}"})
        raise ConnectionAbortedError("scripted cut")  # uvicorn drops the connection mid-body

    return StreamingResponse(gen(), media_type="text/event-stream")


class ScriptedServer:
    """A real HTTP server's app (served on loopback by the fixture below) answering each request with ``script(seen)``."""

    def __init__(self) -> None:
        self.script: Reply = lambda s: ok(3)
        self.seen: list[Seen] = []
        self.inflight: Counter[str] = Counter()
        self.peak: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.t0 = time.perf_counter()
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]), Route("/v1/models", self._models)])
        self.url = ""  # set while it is served (the fixture below)

    def reset(self, script: Reply) -> None:
        self.script, self.seen, self.t0 = script, [], time.perf_counter()
        self.peak.clear()

    async def _models(self, _: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        sid, tenant = request.headers.get("x-session-id", ""), request.headers.get("x-tenant-id", "")
        seen = Seen(sid, tenant, sum(s.session == sid for s in self.seen), time.perf_counter() - self.t0, body)
        self.seen.append(seen)
        self.inflight[tenant] += 1
        self.peak[tenant].append((seen.t, self.inflight[tenant]))
        try:
            resp = self.script(seen)
            if isinstance(resp, StreamingResponse):
                inner = resp.body_iterator

                async def tracked():
                    try:
                        async for part in inner:
                            yield part
                    finally:
                        self.inflight[tenant] -= 1

                resp.body_iterator = tracked()
                return resp
        except BaseException:
            self.inflight[tenant] -= 1
            raise
        self.inflight[tenant] -= 1
        return resp



@pytest.fixture(scope="module")
def server():
    srv = ScriptedServer()
    with serve(srv.app, log_level="critical") as srv.url:
        yield srv


def sessions(*specs: tuple[str, int], tenant: str | None = None, out: int = 3) -> list[Session]:
    return [Session(session_id=sid, start_s=0.0, tenant=tenant, rounds=[Round(new_input_tokens=20, output_tokens=out) for _ in range(n)])
            for sid, n in specs]


def bench(url: str, sess: list[Session], duration_s: float = 10.0, **cfg: Any) -> tuple[Any, dict]:
    config = BenchConfig(endpoint=url, **{"drain_s": 20.0, "backoff_base_s": 0.01, **cfg})
    return asyncio.run(run_once(Workload(sessions=sess, meta={"duration_s": duration_s}), config, "scripted"))


def by_session(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        out[r["session_id"]].append(r)
    return out


def test_retry_after_is_honoured_then_the_request_and_its_session_are_rejected(server):
    server.reset(lambda s: status(503, **{"Retry-After": "0.2"}) if s.session == "busy" else ok(3))
    replay, summary = bench(server.url, sessions(("busy", 4), ("fine", 2)), max_attempts=3)
    arrivals = [s.t for s in server.seen if s.session == "busy"]
    assert len(arrivals) == 3  # the attempt limit
    assert all(b - a >= 0.2 for a, b in zip(arrivals, arrivals[1:]))  # waits at least Retry-After
    busy = by_session(replay.records)["busy"]
    assert [r["state"] for r in busy] == ["rejected"] * 4
    assert busy[0]["status"] == 503 and busy[0]["statuses"] == [503] * 3 and busy[0]["reason"].startswith("attempts_exhausted")
    assert busy[0]["deferred"] and busy[0]["waited_s"] >= 0.4
    assert [r["reason"] for r in busy[1:]] == ["session_abandoned"] * 3 and all(r["attempts"] == 0 for r in busy[1:])
    # Six rounds offered (three of them never sent) in five HTTP requests (two of them retries).
    assert (summary["offered"], summary["completed"], summary["rejected"], summary["failed"]) == (6, 2, 4, 0)
    assert summary["goodput"] == pytest.approx(2 / 6) and summary["retries"] == 2 and len(server.seen) == 3 + 2
    assert summary["deferred"] == 1 and summary["admitted"] == 2
    assert summary["rejected_by_reason"] == {"attempts_exhausted": 1, "session_abandoned": 3}


def test_an_abandoned_session_offers_only_the_rounds_that_would_be_ready_in_the_window(server):
    server.reset(lambda s: status(529, **{"Retry-After": "0"}))
    gappy = Session(
        session_id="gappy", start_s=0.0, rounds=[Round(new_input_tokens=20, output_tokens=3, tool_duration_s=40.0) for _ in range(4)]
    )
    replay, summary = bench(server.url, [gappy], duration_s=100.0, max_attempts=1)
    recs = sorted(replay.records, key=lambda r: r["round"])
    # Rejected at about 0 s; served instantly, rounds 1 and 2 would be ready 40 and 80 s later, round 3
    # after the 100 s window: it is not offered, as it would not be for a session still running.
    assert [r["round"] for r in recs] == [0, 1, 2] and [r["reason"] for r in recs[1:]] == ["session_abandoned"] * 2
    assert recs[2]["ready_s"] - recs[1]["ready_s"] == pytest.approx(40.0) and recs[1]["ready_s"] >= recs[0]["end_s"] + 40.0
    assert (summary["offered"], summary["rejected"]) == (3, 3)


def test_retry_after_ms_and_529_then_success(server):
    server.reset(lambda s: status(529, **{"retry-after-ms": "150"}) if s.nth == 0 else ok(4))
    replay, summary = bench(server.url, sessions(("s", 1)))
    (rec,) = replay.records
    assert rec["state"] == "completed" and rec["statuses"] == [529, 200] and rec["attempts"] == 2 and not rec["deferred"]
    assert server.seen[1].t - server.seen[0].t >= 0.15 and rec["ttft_s"] >= 0.15  # the wait is the user's latency
    assert rec["output_tokens"] == 4 and summary["retries"] == 1 and summary["goodput"] == 1.0


def test_429_halves_the_tenant_concurrency_and_spares_other_tenants(server):
    def script(s: Seen) -> Response:
        first_a = [x for x in server.seen if x.tenant == "a"][:4]
        if s.tenant == "a" and s in first_a:
            return status(429, **{"Retry-After": "0.05"})
        return ok(2, delay_s=0.4)

    server.reset(script)
    sess = sessions(*((f"a{i}", 1) for i in range(8)), tenant="a") + sessions(*((f"b{i}", 1) for i in range(4)), tenant="b")
    replay, summary = bench(server.url, sess)
    assert summary["completed"] == 12
    retries = sorted(s.t for s in server.seen if s.tenant == "a" and s.nth == 1)
    assert len(retries) == 4
    # Retry-After was 0.05 s, but after four 429s tenant a may run one request at a time: the
    # retries wait for the four slow requests already in flight, then the limit grows back slowly.
    assert retries[0] >= 0.35 and retries[-1] - retries[0] >= 0.35
    assert max(n for t, n in server.peak["a"] if t >= retries[0]) <= 2 < max(n for _, n in server.peak["a"])
    assert max(n for _, n in server.peak["b"]) == 4  # tenant b ran all its sessions at once


def test_the_retry_budget_caps_retries_across_requests(server):
    server.reset(lambda s: status(503, **{"Retry-After": "0.01"}))
    replay, summary = bench(server.url, sessions(*((f"s{i}", 1) for i in range(4))), max_attempts=10, retry_rate=0.0, retry_burst=2.0)
    assert len(server.seen) == 4 + 2 and summary["retries"] == 2 and summary["rejected"] == 4
    assert summary["rejected_by_reason"]["retry_budget_exhausted"] >= 2


def test_an_unreachable_endpoint_stops_the_run_before_it_starts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(CodaError, match=f"--endpoint http://127.0.0.1:{port} does not answer"):
        bench(f"http://127.0.0.1:{port}", sessions(("a", 2), ("b", 2)), model="m")


def test_bad_responses_fail_with_a_reason_and_the_run_goes_on(server):
    def script(s: Seen) -> Response:
        return {
            "html": lambda: Response("<html>hello</html>", media_type="text/html"),
            "garbage": lambda: Response("data: {nope\n\n", media_type="text/event-stream"),
            "nochoices": lambda: Response('data: {"text": "x"}\n\n', media_type="text/event-stream"),
            "cut": lambda: cut_after(2),
            "boom": lambda: JSONResponse({"error": {"message": "boom"}}, status_code=500),
        }.get(s.session, lambda: ok(3))()

    server.reset(script)
    replay, summary = bench(server.url, sessions(("html", 1), ("garbage", 1), ("nochoices", 1), ("cut", 1), ("boom", 1), ("fine", 2)))
    reasons = {r["session_id"]: r["reason"] for r in replay.records if r["round"] == 0}
    assert reasons["html"].startswith("bad_response") and "text/html" in reasons["html"]
    assert reasons["garbage"].startswith("bad_response") and reasons["nochoices"].startswith("bad_response")
    assert reasons["cut"].startswith("stream_cut") and reasons["boom"] == "http_500: boom"
    assert summary["completed"] == 2 and summary["failed"] == 5 and summary["rejected"] == 0


def raw_stream(*parts: bytes) -> Response:
    """An SSE body sent as exactly these writes (so an event or a line can be split across reads)."""

    async def gen():
        for part in parts:
            yield part
            await asyncio.sleep(0)

    return StreamingResponse(gen(), media_type="text/event-stream")


def test_sse_joins_multi_line_data_skips_comments_and_reads_usage_from_the_final_event(server):
    first = json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "w0 w1"}, "finish_reason": None}]}, indent=1)
    multi = "".join(f"data: {line}\r\n" for line in first.splitlines())  # one JSON object over many data: lines, CRLF
    body = (
        ": a comment the parser must skip\n\n"
        + "event: message\nid: 1\nretry: 100\n"
        + multi
        + "\r\n"
        + 'data: {"choices": [{"index": 0, "delta": {"content": " w2"},\ndata:  "finish_reason": "length"}]}\n\n'
        + ": keep-alive\n"
        + 'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}}\n\n'
        + "data: [DONE]\n\n"
    ).encode()
    cuts = [5, 40, len(multi) - 3, len(body) - 20]  # writes that split lines and events mid-way
    server.reset(lambda s: raw_stream(*(body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)]))))
    replay, summary = bench(server.url, sessions(("s", 1)))
    (rec,) = replay.records
    assert rec["state"] == "completed" and rec["reason"] is None
    assert rec["output_tokens"] == 3 and len(rec["gaps_s"]) == 2 and rec["gaps_s"][0] == 0.0  # w0 and w1 came in one chunk
    assert rec["server_prompt_tokens"] == 7 and rec["hbm_hit_tokens"] == 4  # the final event's usage, decoded as JSON


def test_a_properly_ended_stream_whose_tokens_decode_to_no_text_is_served(server):
    """A token that decodes to no text (a special token) comes as a chunk with empty text; the
    usage block counts it. Without a usage count, a stream with no text carried no tokens."""
    empty = 'data: {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "length"}]}\n\n'
    usage = 'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}\n\n'
    bodies = {"special": empty + usage + "data: [DONE]\n\n", "nothing": empty + "data: [DONE]\n\n"}
    server.reset(lambda s: raw_stream(bodies[s.session].encode()))
    replay, _ = bench(server.url, sessions(("special", 1), ("nothing", 1)))
    recs = {r["session_id"]: r for r in replay.records}
    assert recs["special"]["state"] == "completed" and recs["special"]["output_tokens"] == 1
    assert recs["special"]["first_token_s"] is not None
    assert recs["nothing"]["state"] == "failed" and recs["nothing"]["reason"] == "bad_response: the stream carried no tokens"


def test_requests_carry_session_tenant_model_and_trace_lengths(server):
    server.reset(lambda s: ok(5))
    bench(server.url, sessions(("s1", 2), tenant="acme", out=5))
    first, second = server.seen
    assert (first.session, first.tenant, first.body["model"]) == ("s1", "acme", "scripted")  # model from /v1/models
    assert first.body["max_tokens"] == 5 and first.body["ignore_eos"] is True and first.body["stream"] is True
    # The second prompt is the first plus the assistant text actually returned plus the new input.
    assert second.body["messages"][: len(first.body["messages"])] == first.body["messages"]
    assert second.body["messages"][len(first.body["messages"])] == {"role": "assistant", "content": "w0 w1 w2 w3 w4"}


BEHAVIOURS = {
    "ok": lambda: ok(3),
    "503": lambda: status(503, **{"Retry-After": "0"}),
    "429": lambda: status(429, **{"retry-after-ms": "1"}),
    "529": lambda: status(529),
    "500": lambda: status(500),
}


@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    plans=st.lists(
        st.lists(st.lists(st.sampled_from(sorted(BEHAVIOURS)), min_size=1, max_size=4), min_size=1, max_size=3), min_size=1, max_size=4
    )
)
def test_every_offered_round_ends_exactly_once_and_tokens_are_conserved(server, plans):
    """plans[session][round] = the answers to that round's successive attempts (then ok)."""

    def script(s: Seen) -> Response:
        rnd = (len(s.body["messages"]) - 1) // 2  # round k's prompt: the first user message, then k (assistant, user) pairs
        answers = plans[int(s.session[1:])][rnd]
        tries = sum(1 for x in server.seen[:-1] if x.session == s.session and len(x.body["messages"]) == len(s.body["messages"]))
        return BEHAVIOURS[answers[tries]]() if tries < len(answers) else ok(3)

    server.reset(script)
    sess = [
        Session(session_id=f"s{i}", start_s=0.0, rounds=[Round(new_input_tokens=10 + j, output_tokens=3) for j in range(len(p))])
        for i, p in enumerate(plans)
    ]
    replay, summary = bench(server.url, sess, max_attempts=3, backoff_base_s=0.001)
    recs = replay.records
    assert len(recs) == summary["offered"] == sum(len(p) for p in plans)  # every round offered once
    assert sorted((r["session_id"], r["round"]) for r in recs) == sorted((f"s{i}", j) for i, p in enumerate(plans) for j in range(len(p)))
    assert Counter(r["state"] for r in recs) == Counter({k: summary[k] for k in ("completed", "rejected", "failed") if summary[k]})
    assert sum(r["attempts"] for r in recs) == len(server.seen)  # every HTTP request belongs to exactly one round
    for r in recs:
        if r["state"] == "completed":
            assert r["output_tokens"] == 3 and r["statuses"][-1] == 200
        for x in server.seen:
            if x.session == r["session_id"] and len(x.body["messages"]) == 2 * r["round"] + 1:  # this round's prompt
                assert len(tok.render((m["role"], m["content"]) for m in x.body["messages"])) == r["prompt_tokens"]


def test_task_metrics_and_slowdown_when_a_cost_profile_is_given(server):
    server.reset(lambda s: ok(3, delay_s=0.05))
    gappy = [
        Session(
            session_id=f"t{i}", start_s=0.0, rounds=[Round(new_input_tokens=20, output_tokens=3, tool_duration_s=0.2) for _ in range(3)]
        )
        for i in range(2)
    ]
    replay, summary = bench(server.url, gappy, profile="vllm-cpu-tiny")
    assert (summary["tasks"], summary["tasks_censored"], summary["stalled"]) == (2, 0, 0)
    # three rounds, each at least the scripted 50 ms before its first token, and two 200 ms tool calls between them
    assert summary["task_time_p50_s"] >= 3 * 0.05 + 2 * 0.2
    assert summary["ttft_max_s"] >= 0.05 and summary["ttft_p99_s"] <= summary["ttft_max_s"]
    assert summary["slowdown_p50"] > 0 and 0.5 <= summary["slowdown_jain"] <= 1.0
    assert "vllm-cpu-tiny" in summary["slowdown_basis"]
    _, without = bench(server.url, gappy)
    assert without["tasks"] == 2 and without["task_time_p99_s"] > 0
    assert without["slowdown_p99"] is None and without["slowdown_jain"] is None and "--profile" in without["slowdown_basis"]


def stall_after(chunks: int, stall_s: float) -> Response:
    async def gen():
        for i in range(chunks):
            yield _chunk({"content": f" w{i}"})
        await asyncio.sleep(stall_s)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


def test_requests_the_run_cuts_off_count_in_the_waits_censored_at_its_end(server):
    """One request still waiting for its first token and one streaming when the drain ends: both
    count in the TTFT columns, the waiting one with its wait so far (a lower bound), the streaming
    one with the first token it got; the summary says how many were censored."""
    server.reset(lambda s: ok(3, delay_s=30.0) if s.session == "waiting" else stall_after(1, 30.0))
    replay, summary = bench(server.url, sessions(("waiting", 1), ("streaming", 1)), duration_s=1.0, drain_s=0.5)
    recs = {r["session_id"]: r for r in replay.records}
    assert {r["reason"] for r in recs.values()} == {"run_ended"}
    assert recs["waiting"]["first_token_s"] is None and recs["streaming"]["first_token_s"] is not None
    streamed_ttft = recs["streaming"]["first_token_s"] - recs["streaming"]["ready_s"]
    assert summary["latency_censored"] == 2
    # the waiting one waited until the run ended, longer than the other's first token took
    assert summary["ttft_max_s"] == pytest.approx(replay.wall_s - recs["waiting"]["ready_s"]) and summary["ttft_max_s"] > streamed_ttft
