"""The predicted-wait door in the gateway: a request whose predicted wait exceeds what is left of
its session's deferral budget is answered 503 at once, never held, and the 503 spends the budget,
so the session's next request is answered 529; with a short engine queue, a continuation waits in
the hold for a seat and is sent before a new session's request held beside it; a held request
whose client leaves leaves nothing behind."""

from __future__ import annotations

import asyncio

import pytest

from coda.gateway.admission import Admission, JsonlLog
from coda.gateway.prometheus import GatewayMetrics
from coda.serving.errors import ApiError
from tests.conftest import ManualClock
from tests.unit.test_gateway_state import make_state, ticket


def test_a_refusal_costs_no_hold_when_the_predicted_wait_exceeds_the_budget():
    async def run() -> None:
        clock = ManualClock()
        # one seat; held requests would wait up to 30 s, far longer than the budget of 0.5 s
        s = make_state(clock, backends=[{"url": "http://a:1", "max_num_seqs": 1}], policies={"ingress": {
            "name": "predicted_wait", "params": {"ttft_slo_s": 0.5, "defer_budget_s": 0.5, "adaptive_cap": False},
            "defer": {"max_wait_s": 30}}})
        first = ticket(s, "a", "early", 640)
        s.begin(first, s.workers[0])
        clock.t = 1.0
        s.end(first, completed=True)  # one request ended after 1 s: about one seat frees per second
        s.begin(ticket(s, "a", "early", 640), s.workers[0])  # the seat is taken again
        metrics = GatewayMetrics()
        adm = Admission(s, metrics, JsonlLog(None))
        with pytest.raises(ApiError) as err:
            await adm.admit(ticket(s, "a", "late", 640))
        assert (err.value.status, err.value.code) == (503, "wait_over_budget")
        # the predicted wait (one seat at about one a second: 0.95 s), stretched by up to half
        assert 0.9 <= err.value.retry_after_s <= 1.45
        assert metrics.registry.get_sample_value("coda_ingress_deferred_total") == 0.0  # never held
        clock.t = 1.6  # past the budget since that 503
        with pytest.raises(ApiError) as err:
            await adm.admit(ticket(s, "a", "late", 640))
        assert (err.value.status, err.value.code) == (529, "defer_budget_spent")

    asyncio.run(run())


def test_a_held_continuation_is_sent_before_a_new_session_held_beside_it():
    async def run() -> None:
        clock = ManualClock()
        s = make_state(clock, backends=[{"url": "http://a:1", "max_num_seqs": 1}], policies={"ingress": {
            "name": "predicted_wait", "params": {"adaptive_cap": False, "defer_budget_s": 60.0}, "defer": {"max_wait_s": 30}}})
        adm = Admission(s, GatewayMetrics(), JsonlLog(None))

        async def send(session: str) -> None:  # as the proxy does: an admitted request begins before anything else decides
            t = ticket(s, "a", session, 640)
            await adm.admit(t)
            assert t.plan is not None
            s.begin(t, t.plan[0])
            sent.append((session, t))

        sent: list[tuple[str, object]] = []
        await send("old")  # the session "old" takes a slot
        clock.t = 1.0
        s.end(sent[0][1], completed=True)  # about one request ends a second
        await send("busy")  # the one seat is taken again
        held = [asyncio.create_task(send("old")), asyncio.create_task(send("new"))]
        for _ in range(50):
            await asyncio.sleep(0)
        assert (s.queued, s.held_continuations, len(sent)) == (2, 1, 2)  # both held, neither sent to the busy engine
        s.end(sent[1][1], completed=True)
        adm.kick()  # the seat is free: the continuation takes it, the new session waits on
        for _ in range(50):
            await asyncio.sleep(0)
        assert [name for name, _ in sent] == ["old", "busy", "old"]
        assert held[0].done() and not held[1].done() and (s.queued, s.held_continuations) == (1, 0)
        assert adm.liveness.undecided == 1
        held[1].cancel()  # its client leaves while it is held: nothing of it is kept
        with pytest.raises(asyncio.CancelledError):
            await held[1]
        assert (s.queued, s.held_continuations, adm.liveness.undecided) == (0, 0, 0)

    asyncio.run(run())
