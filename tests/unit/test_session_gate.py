"""Session admission in the gateway's own bookkeeping: a new session waiting behind a saturated
cluster is deferred until its deferral budget is spent, then rejected with 529; an admitted
session's continuation passes the same gate; an idle session loses its slot after the TTL; a
policy that reads a signal the shell cannot supply refuses to start."""

from __future__ import annotations

import pytest

from coda.errors import CodaError
from coda.gateway.config import build_config
from coda.gateway.prompt import make_tokenizer
from coda.gateway.view import GatewayState, Ticket
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.spec import load_workload
from tests.conftest import ManualClock

C = 16



def gateway(clock: ManualClock) -> GatewayState:
    cfg = build_config({"backends": [{"url": "http://127.0.0.1:1", "max_num_seqs": 2}], "indexer": {"block_tokens": C},
                        "telemetry": {"stale_after_s": 1000.0},  # the scripted telemetry stays fresh: only the gate decides
                        "policies": {"ingress": {"name": "session", "params": {"defer_budget_s": 10.0, "idle_ttl_s": 60.0}}}}, {}, {})
    s = GatewayState(cfg, make_tokenizer("words"), clock)
    w = s.workers[0]
    w.models, w.scraped_at = {"m": {"id": "m"}}, clock.t
    return s


def ticket(s: GatewayState, session: str, k: int) -> Ticket:
    units = [hash((session, k, i)) & 0xFFFF for i in range(4 * C)]
    hashes = s.block_hashes(session, units)
    return Ticket(s.next_rid(), "/v1/chat/completions", "t", session, "m", len(units), 16, hashes, s.workers, s.match(hashes, s.workers))


def test_a_new_session_is_deferred_then_rejected_while_admitted_ones_continue():
    clock = ManualClock(100.0)
    s = gateway(clock)
    running = []
    for sid in ("a", "b"):  # two sessions take both seats
        t = ticket(s, sid, 0)
        assert s.decide(t)[0].action == "admit"
        s.begin(t, s.workers[0])
        running.append(t)
    s.workers[0].kv_usage = 0.95  # and the engine's cache is nearly full: both gates pressed
    d = s.decide(ticket(s, "c", 0))[0]
    assert (d.action, d.status, d.reason) == ("defer", 503, "new_session_deferred") and 2.0 <= d.retry_after_s <= 3.0
    clock.t += 9.0
    assert s.decide(ticket(s, "c", 0))[0].action == "defer"  # 9 s of its 10 s budget
    cont = ticket(s, "a", 1)
    assert s.decide(cont)[0].reason == "session_continues"  # a continuation passes the same saturated gate
    clock.t += 1.0
    d = s.decide(ticket(s, "c", 0))[0]
    assert (d.action, d.status, d.reason) == ("reject", 529, "defer_budget_spent")
    for t in running:  # the engine drains: the waiting session gets in, and its deferrals are forgotten
        s.end(t, completed=True)
    s.workers[0].kv_usage = 0.2
    t = ticket(s, "c", 0)
    assert s.decide(t)[0].action == "admit"
    s.begin(t, s.workers[0])
    assert s.ledger.deferred_for_s("c", clock.t) == 0.0 and s.ledger.active("c", clock.t)


def test_an_idle_session_releases_its_slot_after_the_ttl():
    clock = ManualClock(100.0)
    s = gateway(clock)
    t = ticket(s, "a", 0)
    s.begin(t, s.workers[0])
    s.end(t, completed=True)
    clock.t += 60.0
    assert s.ingress_snapshot(ticket(s, "a", 1)).session_active and s.ledger.count(clock.t) == 1
    clock.t += 0.5
    snap = s.ingress_snapshot(ticket(s, "a", 1))
    assert not snap.session_active and snap.active_sessions == 0


def test_a_policy_reading_a_signal_the_shell_cannot_supply_refuses_to_start(monkeypatch):
    from coda.policy import registry
    from coda.policy.ingress import SessionAdmission
    from coda.policy.registry import lookup, register

    lookup("ingress", "session")  # the built-ins are loaded; the policy registered below is gone after the test
    monkeypatch.setattr(registry, "_REGISTRY", {kind: dict(table) for kind, table in registry._REGISTRY.items()})

    class NeedsGpuTemperature(SessionAdmission):
        pass

    register("ingress", "needs_temp", lambda: NeedsGpuTemperature(name="needs_temp", signals=frozenset({"gpu_temperature"})))
    with pytest.raises(CodaError, match="needs gpu_temperature, which the simulator cannot supply"):
        Simulation(load_workload("synth:rate=1,duration=5,seed=1"), SimConfig(policies={"ingress": "needs_temp"}))
