"""Ingress policies: pure decisions on snapshots, compositions, the session ledger, the registry."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.errors import CodaError
from coda.policy.contracts import SIGNALS
from coda.policy.registry import names
from coda.policy.snapshots import IngressSnapshot, WorkerLoad
from coda.shell.build import make_policy
from coda.shell.sessions import SessionLedger

INGRESS_POLICIES = names("ingress")


def snap(*workers: WorkerLoad, **kw) -> IngressSnapshot:
    return IngressSnapshot(now_s=kw.pop("now_s", 0.0), tenant=kw.pop("tenant", "t"), prompt_tokens=kw.pop("prompt_tokens", 100),
                           workers=workers or (WorkerLoad(0),), **kw)


def test_every_policy_is_registered_frozen_and_declares_known_signals():
    for name in INGRESS_POLICIES:
        p = make_policy("ingress", name)
        assert p.name == name and p.signals <= set(SIGNALS)
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.name = "x"  # type: ignore[misc]
        assert p.decide(snap()).action == "admit"  # an idle cluster admits everything


def test_queue_limit_defers_only_when_no_worker_has_room():
    p = make_policy("ingress", "queue_limit", {"max_waiting": 2})
    assert p.decide(snap(WorkerLoad(0, queue_depth=5), WorkerLoad(1, queue_depth=1))).action == "admit"
    d = p.decide(snap(WorkerLoad(0, queue_depth=5), WorkerLoad(1, queue_depth=2)))
    assert (d.action, d.status, d.reason, d.retry_after_s) == ("defer", 503, "queue_full", 1.0)
    # an unhealthy or stale worker has no room, whatever its numbers say
    assert p.decide(snap(WorkerLoad(0, queue_depth=5), WorkerLoad(1, healthy=False))).action == "defer"
    assert p.decide(snap(WorkerLoad(0, queue_depth=5), WorkerLoad(1, stale=True))).action == "defer"


def test_default_thresholds_come_from_each_engine_s_limits():
    q, over = make_policy("ingress", "queue_limit"), make_policy("ingress", "overload")
    # 4 seats: a 5th request in flight could not start at once, so queue_limit defers it and overload rejects it
    full = WorkerLoad(0, inflight_requests=4, inflight_tokens=400, max_num_seqs=4)
    assert q.decide(snap(full)).action == "defer" and over.decide(snap(full)).action == "reject"
    assert q.decide(snap(dataclasses.replace(full, inflight_requests=3))).action == "admit"
    # a 1,000-token KV cache with 950 tokens newly occupied in flight: a request that would newly occupy 100 does not
    # fit, one that would newly occupy 50 does (whatever its whole prompt: the rest is resident there already)
    kv = WorkerLoad(0, inflight_requests=2, inflight_tokens=950, kv_capacity_tokens=1000)
    assert q.decide(snap(dataclasses.replace(kv, new_tokens=100), prompt_tokens=100)).action == "defer"
    assert q.decide(snap(dataclasses.replace(kv, new_tokens=50), prompt_tokens=60_000)).action == "admit"
    idle = dataclasses.replace(kv, inflight_requests=0, inflight_tokens=0, new_tokens=5000)
    assert q.decide(snap(idle, prompt_tokens=5000)).action == "admit"  # idle: always fits
    # the same load on a worker whose limits are unknown: nothing binds but the engine's queue
    assert q.decide(snap(WorkerLoad(0, inflight_requests=400, inflight_tokens=10**7))).action == "admit"
    # overload's queue limit is a quarter of the seats; explicit counts win over the seats
    assert over.limits(WorkerLoad(0, max_num_seqs=256)) == (256, 64) and over.limits(WorkerLoad(0)) == (64, 16)
    assert make_policy("ingress", "overload", {"max_inflight": 8, "queue_reject": 2}).limits(WorkerLoad(0, max_num_seqs=256)) == (8, 2)
    # session and tenant_share count every seat taken as queue pressure, a request that does not fit as KV pressure;
    # saturation needs both (the dual gate)
    s = make_policy("ingress", "session")
    assert s.decide(snap(full, session_id="new")).action == "admit"
    assert s.decide(snap(dataclasses.replace(kv, new_tokens=100), session_id="new")).action == "admit"
    assert s.decide(snap(dataclasses.replace(full, kv_usage=0.9), session_id="new")).reason == "new_session_deferred"
    assert s.decide(snap(dataclasses.replace(kv, new_tokens=100, queue_age_s=2.5), session_id="new")).reason == "new_session_deferred"


def test_kv_headroom_and_overload():
    kv = make_policy("ingress", "kv_headroom", {"max_kv_usage": 0.8})
    assert kv.decide(snap(WorkerLoad(0, kv_usage=0.79))).action == "admit"
    assert kv.decide(snap(WorkerLoad(0, kv_usage=0.8))).reason == "kv_full"
    over = make_policy("ingress", "overload", {"max_inflight": 2})
    d = over.decide(snap(WorkerLoad(0, inflight_requests=2), WorkerLoad(1, inflight_requests=3)))
    assert (d.action, d.status, d.reason) == ("reject", 529, "overloaded")
    assert over.decide(snap(WorkerLoad(0, inflight_requests=2), WorkerLoad(1, inflight_requests=1))).action == "admit"


def test_tenant_share_rejects_the_heavy_tenant_only_under_saturation():
    p = make_policy("ingress", "tenant_share", {"slack": 0.0})
    busy = (WorkerLoad(0, queue_depth=3, kv_usage=0.9, inflight_tokens=900),)
    heavy = snap(*busy, tenant="a", tenant_inflight_tokens=800, active_weight=2.0)
    light = snap(*busy, tenant="b", tenant_inflight_tokens=100, active_weight=2.0)
    d = p.decide(heavy)
    assert (d.action, d.status, d.reason) == ("reject", 429, "tenant_over_share")
    assert p.decide(light).action == "admit"
    # the same heavy tenant may use idle capacity
    idle = (WorkerLoad(0, queue_depth=0, inflight_tokens=900),)
    assert p.decide(snap(*idle, tenant="a", tenant_inflight_tokens=800, active_weight=2.0)).action == "admit"
    # a larger weight is a larger entitlement
    assert p.decide(snap(*busy, tenant="a", tenant_inflight_tokens=800, tenant_weight=9.0, active_weight=10.0)).action == "admit"


def test_session_policy_lets_running_sessions_continue_and_defers_new_ones():
    p = make_policy("ingress", "session", {"max_sessions": 2})
    hot = (WorkerLoad(0, kv_usage=0.95, queue_depth=2),)
    assert p.decide(snap(WorkerLoad(0, kv_usage=0.95), session_id="new")).action == "admit"  # a full cache that nothing waits on
    assert p.decide(snap(*hot, session_id="s", session_active=True)).action == "admit"
    d = p.decide(snap(*hot, session_id="new"))
    assert (d.action, d.status, d.reason) == ("defer", 503, "new_session_deferred")
    assert p.decide(snap(session_id="new", active_sessions=2)).reason == "session_slots_full"
    assert p.decide(snap(session_id="new", active_sessions=1)).action == "admit"
    assert p.session_ttl_s == 300.0 and make_policy("ingress", "queue_limit+session", {"session": {"idle_ttl_s": 5.0}}).session_ttl_s == 5.0
    assert make_policy("ingress", "queue_limit").session_ttl_s is None


def test_deadline_rejects_what_cannot_meet_it():
    p = make_policy("ingress", "deadline", {"grace_s": 0.5})
    assert p.decide(snap(deadline_slack_s=math.inf)).action == "admit"
    assert p.decide(snap(deadline_slack_s=-0.4)).action == "admit"
    d = p.decide(snap(deadline_slack_s=-0.6))
    assert (d.action, d.status, d.reason) == ("reject", 529, "deadline_unmeetable")


def test_composition_takes_the_most_severe_decision_and_unions_needs():
    p = make_policy("ingress", "queue_limit+tenant_share", {"queue_limit": {"max_waiting": 1}, "tenant_share": {"slack": 0.0}})
    assert p.name == "queue_limit+tenant_share" and p.signals == {
        "queue_depth",
        "queue_age",
        "kv_usage",
        "tenant_share",
        "inflight_requests",
        "inflight_tokens",
    }
    busy = (WorkerLoad(0, queue_depth=3, kv_usage=0.9, inflight_tokens=900),)
    assert p.decide(snap(*busy, tenant_inflight_tokens=0, active_weight=2.0)).action == "defer"  # queue full, tenant light
    d = p.decide(snap(*busy, tenant_inflight_tokens=800, active_weight=2.0))
    assert (d.action, d.policy) == ("reject", "tenant_share")  # reject beats defer


def test_registry_errors_name_the_fix():
    with pytest.raises(CodaError, match="unknown ingress policy 'nope'; valid: admit_all"):
        make_policy("ingress", "nope")
    with pytest.raises(CodaError, match="unknown parameter.*max_wait.*valid: max_waiting"):
        make_policy("ingress", "queue_limit", {"max_wait": 3})
    with pytest.raises(CodaError, match="key them by part name"):
        make_policy("ingress", "queue_limit+session", {"max_waiting": 3})
    with pytest.raises(CodaError, match="kv_high must be within"):
        make_policy("ingress", "session", {"kv_high": 1.5})


def test_session_ledger_expires_idle_sessions():
    led = SessionLedger(ttl_s=10.0)
    led.touch("a", 0.0)
    led.touch("b", 5.0)
    assert led.active("a", 10.0) and led.count(10.0) == 2
    led.touch("a", 12.0)  # a continues; b expires at 15
    assert not led.active("b", 15.5) and led.active("a", 15.5) and led.count(15.5) == 1
    assert not led.active(None, 0.0)
    led.touch(None, 0.0)
    assert led.count(30.0) == 0


workers_st = st.lists(
    st.builds(
        WorkerLoad,
        worker_id=st.integers(0, 7),
        healthy=st.booleans(),
        stale=st.booleans(),
        queue_depth=st.integers(0, 50),
        kv_usage=st.floats(0, 1),
        inflight_requests=st.integers(0, 100),
        inflight_tokens=st.integers(0, 10**6),
        new_tokens=st.integers(0, 10**5),
        max_num_seqs=st.integers(0, 64),
        kv_capacity_tokens=st.integers(0, 10**6),
    ),
    min_size=1,
    max_size=6,
).map(tuple)
snap_st = st.builds(
    IngressSnapshot,
    now_s=st.floats(0, 1e6),
    tenant=st.sampled_from(["a", "b"]),
    prompt_tokens=st.integers(1, 10**5),
    workers=workers_st,
    session_id=st.none() | st.just("s"),
    session_active=st.booleans(),
    active_sessions=st.integers(0, 20),
    tenant_inflight_tokens=st.integers(0, 10**6),
    tenant_weight=st.floats(0.1, 10),
    active_weight=st.floats(0.1, 100),
    deadline_slack_s=st.floats(-10, 10) | st.just(math.inf),
)
ALL = "+".join(INGRESS_POLICIES)


@given(snap_st)
def test_decisions_are_pure_and_well_formed(s):
    for name in [*INGRESS_POLICIES, ALL]:
        p = make_policy("ingress", name)
        d = p.decide(s)
        assert d == p.decide(dataclasses.replace(s))  # same snapshot, same decision
        assert {"admit": 200, "defer": 503}.get(d.action, d.status) == d.status and d.status in (200, 503, 429, 529)
        assert d.action == "admit" or d.retry_after_s > 0
    # a composition never admits what one of its parts refuses
    parts = [make_policy("ingress", n).decide(s).action for n in INGRESS_POLICIES]
    assert (make_policy("ingress", ALL).decide(s).action == "admit") == all(a == "admit" for a in parts)


@pytest.mark.parametrize(
    ("name", "params", "why"),
    [
        ("queue_limit", {"max_waiting": -1}, "max_waiting must be >= 1"),
        ("queue_limit", {"max_waiting": 0}, "max_waiting must be >= 1"),
        ("overload", {"max_inflight": -3}, "max_inflight must be >= 1"),
        ("overload", {"max_inflight": "lots"}, "max_inflight='lots' must be an integer"),
        ("overload", {"queue_reject": 0}, "queue_reject must be >= 1"),
        ("session", {"max_sessions": -2}, "max_sessions must be >= 0"),
        ("tenant_share", {"slack": -0.5}, "slack must be >= 0"),
        ("tenant_share", {"queue_high": 0}, "queue_high must be >= 1"),
        ("kv_headroom", {"retry_after_s": -1.0}, "retry_after_s must be >= 0"),
    ],
)
def test_impossible_parameters_are_refused_by_the_policy_itself(name, params, why):
    """Every shell builds policies through the registry, so each of them refuses these."""
    with pytest.raises(CodaError, match=re.escape(why)):
        make_policy("ingress", name, params)
