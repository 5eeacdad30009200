"""Hypothesis properties of the predicted-wait arithmetic: a worker predicts no wait exactly when
the arriving request could start there at once; otherwise the wait is the tokens and seats it
lacks over the rates they are freed at, growing with what is in flight and shrinking as the rates
rise; the door reads the least wait over the workers it may use, sending only what could start at
once under a short engine queue; and the drain rate a shell feeds
it is, for a steady stream of ends, the stream's rate within the discretisation of its average."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.policy.ingress import PredictedWait, least_wait_s, predicted_wait_s, seats_short, tokens_short
from coda.policy.snapshots import IngressSnapshot, WorkerLoad
from coda.shell.estimates import DRAIN_TAU_S, DrainRate

rates_st = st.floats(0, 1e5, allow_subnormal=False)
loads_st = st.builds(
    WorkerLoad, worker_id=st.integers(0, 7), healthy=st.booleans(), stale=st.booleans(), inflight_requests=st.integers(0, 40),
    inflight_tokens=st.integers(0, 10**6), new_tokens=st.integers(0, 10**5), max_num_seqs=st.integers(0, 32),
    kv_capacity_tokens=st.integers(0, 10**6), freed_tokens_per_s=rates_st, ended_per_s=st.floats(0, 100, allow_subnormal=False),
)


@given(loads_st)
def test_no_wait_exactly_when_the_request_could_start_at_once(w):
    wait = predicted_wait_s(w)
    assert wait >= 0
    assert (wait == 0) == w.can_start()


@given(loads_st)
def test_the_wait_is_what_is_lacking_over_the_rate_it_is_freed_at(w):
    wait = predicted_wait_s(w)
    parts = [(tokens_short(w), w.freed_tokens_per_s), (seats_short(w), w.ended_per_s)]
    if any(short > 0 and rate == 0 for short, rate in parts):
        assert wait == math.inf
        return
    assert wait == pytest.approx(max((short / rate for short, rate in parts if short > 0), default=0.0), rel=1e-12)


@given(loads_st, st.integers(0, 10**5), st.integers(0, 8), st.floats(1, 10))
def test_more_in_flight_waits_no_less_and_faster_draining_no_more(w, tokens, requests, speedup):
    busier = dataclasses.replace(w, inflight_tokens=w.inflight_tokens + tokens, inflight_requests=w.inflight_requests + requests)
    assert predicted_wait_s(busier) >= predicted_wait_s(w)
    faster = dataclasses.replace(w, freed_tokens_per_s=w.freed_tokens_per_s * speedup, ended_per_s=w.ended_per_s * speedup)
    assert predicted_wait_s(faster) <= predicted_wait_s(w)


@given(st.lists(loads_st, max_size=4), st.floats(0, 60), st.booleans(), st.integers(0, 3), st.booleans())
def test_the_door_reads_the_least_wait_of_the_workers_it_may_use_and_admits_within_its_bound(loads, deferred, short, held, active):
    snap = IngressSnapshot(now_s=1.0, tenant="t", prompt_tokens=100, workers=tuple(loads), session_id="s", session_deferred_s=deferred,
                           held_continuations=held, session_active=active)
    usable = [predicted_wait_s(w) for w in loads if w.healthy and not w.stale]
    wait = least_wait_s(snap)
    assert wait == min(usable, default=math.inf)
    p = PredictedWait(adaptive_cap=False, short_engine_queue=short)
    d = p.decide(snap)
    if short:  # sent only where it could start at once; a new session's request also waits for held continuations
        assert (d.action == "admit") == (wait == 0 and (active or held == 0))
    else:  # continuations always; a new request within its share of the SLO
        assert (d.action == "admit") == (active or wait <= p.wait_share * p.ttft_slo_s)
    if d.action == "defer" and not active:  # a new session's request is held only when the wait fits what is left of the budget
        assert wait <= p.defer_budget_s - deferred


@given(st.floats(0.2, 50), st.integers(1, 4096), st.integers(2, 400), st.floats(0, 100))
def test_a_steady_stream_of_ends_reads_as_its_rate(per_s, tokens, n, start):
    drain = DrainRate()
    drain.sent(start)
    for i in range(1, n + 1):
        drain.ended(tokens, start + i / per_s)
    freed, ended = drain.rates()
    # the decayed sum of evenly spaced ends over its continuous counterpart: x / (1 - exp(-x)), x the spacing over tau
    x = 1 / (per_s * DRAIN_TAU_S)
    assert per_s * (1 - 1e-9) <= ended <= per_s * x / -math.expm1(-x) * (1 + 1e-9)
    assert freed == pytest.approx(ended * tokens, rel=1e-9)
