"""The door's waste measures: time an engine sat idle while the gateway held requests, refusals
made while an engine sat idle, and the most requests in flight per worker."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.gateway.admission import Admission, JsonlLog
from coda.gateway.prometheus import GatewayMetrics
from coda.gateway.watch import IdleWatch
from coda.serving.errors import ApiError
from tests.conftest import ManualClock
from tests.unit.test_gateway_state import make_state, ticket

steps = st.lists(st.tuples(st.floats(0.0, 10.0, allow_nan=False), st.booleans(), st.booleans()), max_size=40)


@given(steps)
def test_idle_watch_sums_exactly_the_time_both_held_and_idle(events):
    """Between two reports the condition is constant: the sum is the time after each report that
    saw both, the longest the longest run of such reports."""
    watch, now, total, run, longest, on = IdleWatch(), 0.0, 0.0, 0.0, 0.0, False
    for dt, holding, idle in events:
        now += dt
        if on:
            total += dt
            run += dt
            longest = max(longest, run)
        watch.update(now, holding, idle)
        on = holding and idle
        run = run if on and run else 0.0
    assert watch.total_s(now) == pytest.approx(total)
    assert watch.longest(now) == pytest.approx(longest)


def held_request(in_flight_on: list[int]) -> tuple[GatewayMetrics, float]:
    """One request held by ``queue_limit`` (every engine reports a full queue) while the clock
    moves 3 s, with requests already in flight on the workers ``in_flight_on``; its 503 comes
    after the hold. The door's metrics and the time counted idle while held."""

    async def run() -> tuple[GatewayMetrics, float]:
        clock = ManualClock()
        s = make_state(clock, policies={"ingress": {"name": "queue_limit", "params": {"max_waiting": 1}, "defer": {"max_wait_s": 0.2}}})
        for i in in_flight_on:
            s.begin(ticket(s, "a", None, 640), s.workers[i])
        for w in s.workers:
            w.queue_depth = 1
        metrics = GatewayMetrics()
        adm = Admission(s, metrics, JsonlLog(None))

        async def later() -> None:
            await asyncio.sleep(0.05)
            clock.t = 3.0
            adm.kick()

        async def held() -> None:
            with pytest.raises(ApiError) as err:
                await adm.admit(ticket(s, "a", None, 640))
            assert err.value.status == 503

        await asyncio.gather(later(), held())
        clock.t = 10.0  # nothing is held any more: the interval closed when the 503 went
        return metrics, s.idle_watch.total_s(clock())

    return asyncio.run(run())


def test_a_request_held_while_a_worker_has_nothing_in_flight_counts_as_idle_time():
    metrics, idle_s = held_request([0, 1])  # worker 2 idle
    assert idle_s == pytest.approx(3.0)
    assert metrics.registry.get_sample_value("coda_ingress_refused_while_idle_total") == 1


def test_a_request_held_while_every_worker_serves_is_not_idle_time():
    metrics, idle_s = held_request([0, 1, 2])
    assert idle_s == 0.0
    assert metrics.registry.get_sample_value("coda_ingress_refused_while_idle_total") == 0


def test_the_peak_of_requests_in_flight_stays_after_they_end():
    s = make_state()
    tickets = [ticket(s, "a", None, 640) for _ in range(3)]
    for t in tickets:
        s.begin(t, s.workers[0])
    for t in tickets:
        s.end(t)
    assert [w.inflight_peak for w in s.workers] == [3, 0, 0]
    assert b"coda_worker_inflight_peak_requests" in GatewayMetrics().render(s, {})


def test_a_door_that_counts_seats_never_sends_a_worker_more_than_its_seats():
    """The router prefers the worker holding a session's context; when that worker's one seat is
    taken, a policy that admitted the continuation because another worker has a seat sends it there."""

    async def run() -> list[int]:
        s = make_state(backends=[{"url": u, "max_num_seqs": 1} for u in ("http://a:1", "http://b:2")],
                       policies={"ingress": {"name": "queue_limit", "defer": {"max_wait_s": 0}}})
        adm = Admission(s, GatewayMetrics(), JsonlLog(None))
        placed = []
        for _ in range(2):
            t = ticket(s, "a", "s1", 6400)
            await adm.admit(t)
            assert t.plan is not None
            s.begin(t, t.plan[0])
            placed.append(t.plan[0].id)
        with pytest.raises(ApiError):  # both seats taken: deferred
            await adm.admit(ticket(s, "a", "s1", 6400))
        return placed

    assert sorted(asyncio.run(run())) == [0, 1]
