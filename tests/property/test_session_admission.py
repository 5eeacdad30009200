"""Hypothesis properties of session admission: a continuation of an admitted session is never
refused; a new session is admitted unless the dual gate (KV pressure AND queue pressure on every
worker) or the slot cap holds; a waiting new session is deferred with a jittered Retry-After until
its deferral budget is spent, then rejected; the ledger frees an idle session's slot after its TTL
and forgets its deferrals once it is admitted. And the whole loop in the simulator: under overload
no round after a session's first is refused by the session policy."""

from __future__ import annotations

import dataclasses
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from coda.policy.ingress import QUEUE_AGE_S, SessionAdmission, saturated
from coda.policy.snapshots import IngressSnapshot, WorkerLoad
from coda.shell.sessions import SessionLedger
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.schema import Round, Session, Workload

KV_HIGH, QUEUE_HIGH = 0.85, 2

loads_st = st.builds(
    WorkerLoad, worker_id=st.integers(0, 7), healthy=st.booleans(), stale=st.booleans(), queue_depth=st.integers(0, 8),
    queue_age_s=st.floats(0, 10), kv_usage=st.floats(0, 1), inflight_requests=st.integers(0, 20), inflight_tokens=st.integers(0, 10**5),
    new_tokens=st.integers(0, 10**5), max_num_seqs=st.integers(0, 16), kv_capacity_tokens=st.integers(0, 10**5),
)
snaps_st = st.builds(
    IngressSnapshot, now_s=st.floats(0, 1e5), tenant=st.just("t"), prompt_tokens=st.integers(1, 10**5),
    workers=st.lists(loads_st, min_size=1, max_size=4).map(tuple), session_id=st.none() | st.sampled_from(["a", "b", "c"]),
    session_active=st.booleans(), active_sessions=st.integers(0, 10), session_deferred_s=st.floats(0, 60),
)
policies_st = st.builds(SessionAdmission, max_sessions=st.integers(0, 8), retry_after_s=st.floats(0.5, 5), retry_jitter=st.floats(0, 1),
                        defer_budget_s=st.floats(0, 30))


def kv_pressed(w: WorkerLoad) -> bool:
    return w.kv_usage >= KV_HIGH or not w.fits()


def queue_pressed(w: WorkerLoad) -> bool:
    return w.queue_depth >= QUEUE_HIGH or w.queue_age_s >= QUEUE_AGE_S or not w.has_seat()


@given(snaps_st, policies_st)
def test_continuations_pass_and_new_sessions_wait_only_behind_the_gate(snap, p):
    d = p.decide(snap)
    if snap.session_active:
        assert (d.action, d.reason) == ("admit", "session_continues")
        return
    capped = bool(p.max_sessions) and snap.active_sessions >= p.max_sessions
    if not capped and not saturated(snap, p.kv_high, p.queue_high, p.max_queue_age_s):
        assert d.action == "admit"
        return
    if snap.session_deferred_s >= p.defer_budget_s:
        assert (d.action, d.status, d.reason) == ("reject", 529, "defer_budget_spent")
    else:
        assert (d.action, d.status) == ("defer", 503)
        assert d.reason == ("session_slots_full" if capped else "new_session_deferred")
        assert p.retry_after_s <= d.retry_after_s <= p.retry_after_s * (1 + p.retry_jitter) + 1e-9
    assert d == p.decide(snap)  # pure: the same snapshot, the same answer (jitter included)


@given(snaps_st)
def test_saturation_needs_kv_and_queue_pressure_on_every_usable_worker(snap):
    sat = saturated(snap, KV_HIGH, QUEUE_HIGH, QUEUE_AGE_S)
    usable = [w for w in snap.workers if w.healthy and not w.stale]
    assert sat == all(kv_pressed(w) and queue_pressed(w) for w in usable)
    # relieving either pressure on one usable worker lifts saturation
    if usable:
        i = snap.workers.index(usable[0])
        for relieved in (dataclasses.replace(usable[0], kv_usage=0.0, inflight_tokens=0, new_tokens=0),
                         dataclasses.replace(usable[0], queue_depth=0, queue_age_s=0.0, inflight_requests=0)):
            workers = snap.workers[:i] + (relieved,) + snap.workers[i + 1:]
            assert not saturated(dataclasses.replace(snap, workers=workers), KV_HIGH, QUEUE_HIGH, QUEUE_AGE_S)


def test_the_jitter_spreads_retries_across_sessions():
    hot = (WorkerLoad(0, kv_usage=0.95, queue_depth=5),)
    p = SessionAdmission()
    waits = {p.decide(IngressSnapshot(now_s=7.0, tenant="t", prompt_tokens=10, workers=hot, session_id=f"s{i}")).retry_after_s
             for i in range(50)}
    assert len(waits) == 50 and min(waits) >= 2.0 and max(waits) <= 3.0 and max(waits) - min(waits) > 0.5


ops_st = st.lists(st.tuples(st.sampled_from(["touch", "defer", "wait"]), st.sampled_from(["a", "b", "c"]), st.floats(0, 8)), max_size=40)


@given(ops_st)
def test_ledger_frees_idle_slots_and_keeps_deferrals_until_admitted(ops):
    ttl = 5.0
    led = SessionLedger(ttl)
    now = 0.0
    touched: dict[str, float] = {}
    deferred: dict[str, tuple[float, float]] = {}  # first, last
    for op, sid, dt in ops:
        if op == "wait":
            now += dt
        elif op == "touch":
            led.touch(sid, now)
            touched[sid] = now
            deferred.pop(sid, None)
        else:
            led.defer(sid, now)
            if not now - touched.get(sid, -math.inf) <= ttl:
                if sid in deferred and now - deferred[sid][1] <= ttl:
                    deferred[sid] = (deferred[sid][0], now)
                else:
                    deferred[sid] = (now, now)
        active = {s for s, t in touched.items() if now - t <= ttl}
        assert led.count(now) == len(active) and all(led.active(s, now) == (s in active) for s in "abc")
        for s in "abc":
            want = now - deferred[s][0] if s in deferred and now - deferred[s][1] <= ttl else 0.0
            assert math.isclose(led.deferred_for_s(s, now), want)


CHUNK_GIB = 96 * 1024 * 64 / 2**30  # one 64-token chunk of the paper profile


def overloaded(seed: int, sessions: int, rounds: int) -> Simulation:
    """Sessions arriving within a second on one engine of 3 seats and 60 chunks of KV."""
    rng = random.Random(seed)
    wl = Workload(sessions=[
        Session(session_id=f"s{i}", start_s=rng.uniform(0, 1), rounds=[
            Round(new_input_tokens=rng.randint(100, 800), output_tokens=rng.randint(10, 200), kind="tool_followup" if k else "user",
                  tool_duration_s=rng.uniform(0, 2)) for k in range(rounds)])
        for i in range(sessions)], meta={"duration_s": 1e5})
    cfg = SimConfig(workers=1, max_num_seqs=3, chunk_tokens=64, hbm_kv_gib=60 * CHUNK_GIB, warmup_s=0, drain_s=1e6,
                    policies={"ingress": "session"})
    sim = Simulation(wl, cfg)
    sim.run()
    return sim


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10**6), sessions=st.integers(8, 16), rounds=st.integers(2, 4))
def test_under_overload_no_later_round_of_a_session_is_refused_by_the_session_policy(seed, sessions, rounds):
    """The session policy may turn new sessions away, but every session it admitted keeps its slot
    (the TTL is far longer than the run) and completes."""
    sim = overloaded(seed, sessions, rounds)
    for r in sim.requests:
        assert r.round_idx == 0 or r.reason in ("", "session_abandoned"), (r.round_idx, r.reason)
    started = {r.sess.session.session_id for r in sim.requests if r.round_idx == 0 and not r.reason}
    done = {r.sess.session.session_id for r in sim.requests if r.round_idx == rounds - 1 and r.finish_s >= 0}
    assert started == done


def test_the_overload_case_does_turn_new_sessions_away():
    """The property above is not vacuous: this load saturates the engine."""
    sim = overloaded(seed=2, sessions=16, rounds=4)
    assert sim.ingress.decisions.get("defer:new_session_deferred", 0) > 0
    assert any(r.round_idx == 0 and r.reason == "defer_timeout" for r in sim.requests)
