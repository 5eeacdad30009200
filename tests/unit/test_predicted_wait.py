"""The predicted-wait door. With a short engine queue (the default) an engine is sent only what it
could start at once: a continuation waits in the hold until one can, and a new session's request
is not sent while a continuation is held. Without it, continuations pass and a new request is
admitted when its predicted wait is within its share of the SLO. Either way a request not sent is
held only when its wait fits what is left of its session's deferral budget, and otherwise refused
at once (503 with the wait as Retry-After, no hold; 529 once the budget is spent); the adaptive cap
refuses new sessions at once; the cap moves by AIMD; and a session's slot lapses after its own
pause plus a margin, so that in a long run sessions that start late are admitted once the early
ones are done."""

from __future__ import annotations

import dataclasses

import pytest

from coda.policy.ingress import CapRule, PredictedWait
from coda.policy.snapshots import IngressSnapshot, WorkerLoad
from coda.shell.sessions import SessionCap, SessionLedger, ledger_of
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.schema import Round, Session, Workload

DOOR = PredictedWait(ttft_slo_s=4.0, wait_share=0.5, defer_budget_s=10.0, retry_jitter=0.0, adaptive_cap=False, short_engine_queue=False)
SHORT = dataclasses.replace(DOOR, short_engine_queue=True)


def snap(short_tokens: int, freed_per_s: float, deferred_s: float = 0.0, **kw: object) -> IngressSnapshot:
    """One worker of 10,000 KV tokens whose requests in flight leave the arriving one ``short_tokens`` short."""
    w = WorkerLoad(0, inflight_requests=3, inflight_tokens=9_000 + short_tokens, new_tokens=1_000, kv_capacity_tokens=10_000,
                   freed_tokens_per_s=freed_per_s, ended_per_s=1.0)
    return IngressSnapshot(now_s=100.0, tenant="t", prompt_tokens=1_000, workers=(w,), session_id="new", session_deferred_s=deferred_s,
                           **kw)  # type: ignore[arg-type]


def test_admitted_when_the_wait_is_within_its_share_of_the_slo_and_continuations_always():
    assert DOOR.decide(snap(2_000, 1_000.0)).action == "admit"  # 2 s <= half of 4 s
    assert DOOR.decide(snap(10**6, 0.0, session_active=True)).reason == "session_continues"


def test_with_a_short_engine_queue_an_engine_is_sent_only_what_it_can_start_and_held_continuations_go_first():
    held = SHORT.decide(snap(500, 1_000.0, session_active=True))  # a continuation 500 tokens short: 0.5 s
    assert (held.action, held.status, held.reason, held.signal) == ("defer", 503, "engine_queue_full", "inflight_tokens")
    assert held.retry_after_s == pytest.approx(0.5)
    assert SHORT.decide(snap(0, 1_000.0, session_active=True)).reason == "session_continues"  # it fits: sent
    assert SHORT.decide(snap(0, 1_000.0)).action == "admit"  # a new request that fits, nothing held
    first = SHORT.decide(snap(0, 1_000.0, held_continuations=1))  # it fits, but a continuation waits for room: it goes first
    assert (first.action, first.reason, first.signal) == ("defer", "predicted_wait", "held_continuations")
    short = SHORT.decide(snap(2_000, 1_000.0))  # a 2 s wait, within the SLO's share: held here, not queued on the engine
    assert (short.action, short.retry_after_s) == ("defer", pytest.approx(2.0))
    over = SHORT.decide(snap(12_000, 1_000.0))  # a 12 s wait, over the 10 s budget: refused at once, no hold
    assert (over.action, over.status, over.reason) == ("reject", 503, "wait_over_budget")


def test_held_only_when_the_wait_fits_what_is_left_of_the_budget():
    d = DOOR.decide(snap(6_000, 1_000.0, deferred_s=3.0))  # 6 s wait, 7 s of budget left
    assert (d.action, d.status, d.reason) == ("defer", 503, "predicted_wait") and d.retry_after_s == pytest.approx(4.0)


def test_a_refusal_costs_no_hold_when_the_predicted_wait_exceeds_the_budget():
    d = DOOR.decide(snap(8_000, 1_000.0, deferred_s=3.0))  # 8 s wait, 7 s of budget left: holding would only delay the refusal
    assert (d.action, d.status, d.reason) == ("reject", 503, "wait_over_budget")
    assert d.retry_after_s == pytest.approx(8.0 - 2.0)  # back when the wait should be within its share
    assert DOOR.decide(snap(8_000, 1_000.0, deferred_s=10.0)).status == 529  # the budget spent
    nothing_freed = DOOR.decide(snap(1, 0.0))  # nothing ended yet to predict from: asked back after retry_after_s, not held
    assert (nothing_freed.action, nothing_freed.status, nothing_freed.retry_after_s) == ("reject", 503, DOOR.retry_after_s)


def test_the_cap_refuses_new_sessions_at_once_and_lets_continuations_and_sessionless_requests_by():
    full = snap(1_000, 1_000.0, active_sessions=4, session_cap=4)  # a 1-s wait, within its share of the SLO
    assert (DOOR.decide(full).action, DOOR.decide(full).status, DOOR.decide(full).reason) == ("reject", 503, "session_slots_full")
    assert DOOR.decide(dataclasses.replace(full, session_active=True)).action == "admit"
    assert DOOR.decide(dataclasses.replace(full, session_id=None)).action == "admit"
    assert DOOR.decide(dataclasses.replace(full, session_cap=5)).action == "admit"


def test_the_cap_opens_in_slow_start_until_the_first_cut_then_moves_by_aimd_once_per_round_trip():
    cap = SessionCap(CapRule(ttft_slo_s=2.0, initial=10, least=2, most=40, decrease=0.8))
    cap.observe(1.0, sent_s=0.0, pressure=0.5, now_s=1.0, in_use=10)
    assert cap.cap == pytest.approx(11.0)  # slow start: + 1 a sample
    cap.observe(1.0, sent_s=0.0, pressure=0.5, now_s=1.1, in_use=5)
    assert cap.cap == pytest.approx(11.0)  # not in use (11 >= 2 x 5): a light load does not open it
    cap.observe(3.0, sent_s=0.5, pressure=0.5, now_s=2.0, in_use=11)
    assert cap.cap == pytest.approx(8.8) and not cap.slow_start  # the first cut, by decrease, ends slow start
    cap.observe(1.0, sent_s=2.1, pressure=0.5, now_s=2.2, in_use=5)
    assert cap.cap == pytest.approx(8.8 + 1 / 8.8)  # on time, in use: + 1 / cap
    cap.observe(3.0, sent_s=2.3, pressure=0.5, now_s=2.5, in_use=5)
    assert cap.cap == pytest.approx((8.8 + 1 / 8.8) * 0.8)  # late: cut
    cap.observe(3.0, sent_s=2.4, pressure=0.5, now_s=2.6, in_use=5)
    assert cap.cap == pytest.approx((8.8 + 1 / 8.8) * 0.8)  # sent before that cut: the cut answered it already
    cap.observe(1.0, sent_s=2.7, pressure=1.2, now_s=3.0, in_use=3)
    assert cap.cap == pytest.approx((8.8 + 1 / 8.8) * 0.64)  # on time, but its worker was sent more KV than it holds
    for t in range(4, 20):
        cap.observe(9.0, sent_s=float(t), pressure=0.0, now_s=float(t), in_use=2)
    assert cap.cap == 2.0  # never below least


def test_a_slot_lapses_after_its_sessions_own_longest_pause_plus_the_margin():
    led = ledger_of(PredictedWait(first_pause_s=30.0, pause_margin_s=5.0, idle_ttl_s=300.0))
    led.touch("a", 0.0)
    led.ended("a", 10.0)
    assert led.active("a", 44.0) and not led.active("a", 45.5)  # no pause seen yet: 30 s + 5 s after its end
    led.touch("b", 50.0)
    led.ended("b", 51.0)
    led.touch("b", 54.0)  # came back after 3 s
    assert led.active("b", 200.0)  # in flight: its pause does not run
    led.ended("b", 250.0)
    assert led.active("b", 257.5) and not led.active("b", 258.5)  # its own 3 s pause + 5 s
    plain = SessionLedger(ttl_s=300.0)
    plain.touch("a", 0.0)
    plain.ended("a", 10.0)
    assert plain.active("a", 299.0)  # without a pause rule: the TTL alone


def test_in_a_long_run_sessions_starting_late_are_admitted_once_the_early_ones_finish():
    """Two slots; two sessions at the start take them and finish within seconds; two more arrive
    at 100 s, long before the 300 s idle TTL would free a slot."""
    def session(sid: str, start: float) -> Session:
        return Session(session_id=sid, start_s=start, rounds=[Round(new_input_tokens=200, output_tokens=20, tool_duration_s=2.0)
                                                              for _ in range(3)])
    wl = Workload(sessions=[session("early0", 0.0), session("early1", 0.1), session("late0", 100.0), session("late1", 100.1)],
                  meta={"duration_s": 200.0})
    cfg = SimConfig(workers=1, warmup_s=0, policies={"ingress": {"name": "predicted_wait", "params": {
        "adaptive_cap": False, "max_sessions": 2, "first_pause_s": 10.0, "pause_margin_s": 5.0}}})
    sim = Simulation(wl, cfg)
    sim.run()
    done = {r.sess.session.session_id for r in sim.requests if r.round_idx == 2 and r.finish_s >= 0}
    assert done == {"early0", "early1", "late0", "late1"}
    # and the cap binds: a third session beside the early two is refused at once
    crowded = Workload(sessions=[*wl.sessions[:2], session("third", 0.2)], meta={"duration_s": 200.0})
    sim = Simulation(crowded, cfg)
    sim.run()
    third = next(r for r in sim.requests if r.sess.session.session_id == "third")
    assert (third.reason, third.deferred_since) == ("session_slots_full", -1)
