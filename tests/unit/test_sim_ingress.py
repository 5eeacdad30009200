"""The gateway's ingress policies inside the simulator: admit / defer / reject and honest accounting."""

from __future__ import annotations

import bisect
import json

import numpy as np
import pytest

from coda.errors import CodaError
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sim.observe import SimObserver
from coda.workload.spec import load_workload

WL = "synth:rate=6,duration=900,seed=4"


@pytest.fixture(scope="module")
def wl():
    return load_workload(WL)


def run(wl, ingress: str | None = None, params: dict | None = None, defer: dict | None = None, **kw):
    """``cachewise`` on one worker behind the simulated gateway running ``ingress``."""
    policies = {"ingress": {"name": ingress, "params": params or {}, **({"defer": defer} if defer else {})}} if ingress else None
    res = Simulation(
        wl, SimConfig(**{"workers": 1, "system": "cachewise", "warmup_s": 0, "drain_s": 20_000, "policies": policies, **kw})
    ).run()
    return res, res.summary()


def test_admit_all_is_the_same_as_no_ingress(wl):
    _, base = run(wl)
    _, same = run(wl, ingress="admit_all")
    for k in ("output_tps", "slo_tps", "ttft_p95_s", "completed", "offered"):
        assert same[k] == base[k]
    res, _ = run(wl, ingress="admit_all")
    assert res.sim.ingress.decisions == {"admit:ok": len(res.records)}  # one decision per request


def test_every_offered_request_ends_exactly_once(wl):
    for policy in ("queue_limit", "overload", "session", "session+overload"):
        params = {"max_inflight": 6} if policy == "overload" else {"overload": {"max_inflight": 6}} if "overload" in policy else {}
        res, s = run(wl, ingress=policy, params=params)
        states = [r["state"] for r in res.records if r["measured"]]
        assert len(states) == s["offered"]  # every round ready in the window is offered once, sent or not
        assert s["offered"] == s["completed"] + s["rejected"] and s["unfinished"] == 0, policy
        assert s["goodput"] == pytest.approx(s["slo_met"] / s["offered"])


def test_rejection_abandons_the_session_and_counts_its_unsent_rounds(wl):
    res, s = run(wl, ingress="overload", params={"max_inflight": 4})
    reasons = {}
    for r in res.records:
        if r["state"] == "rejected":
            reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    assert reasons.get("overloaded", 0) > 0 and reasons.get("session_abandoned", 0) > reasons["overloaded"]
    by_session = {}
    for r in res.records:
        by_session.setdefault(r["session_id"], []).append(r)
    for recs in by_session.values():
        recs.sort(key=lambda r: r["round"])
        states = [r["state"] for r in recs]
        if "rejected" in states:  # nothing of a session completes after its rejection
            first = states.index("rejected")
            assert all(x == "rejected" for x in states[first:])


def test_unsent_rounds_are_offered_when_they_would_have_become_ready(wl):
    """An abandoned session's rounds follow each other by their tool and think times, and only those
    ready inside the window are offered: a rejection near the window's end is not charged the
    session's whole future."""
    res, s = run(wl, ingress="overload", warmup_s=300, params={"max_inflight": 4})
    sessions = {x.session_id: x for x in wl.sessions}
    gone = [r for r in res.records if r["reason"] == "session_abandoned"]
    assert gone and any(not r["measured"] for r in gone) and any(r["measured"] for r in gone)
    by_session: dict[str, list[dict]] = {}
    for r in gone:
        by_session.setdefault(r["session_id"], []).append(r)
    for sid, recs in by_session.items():
        recs.sort(key=lambda r: r["round"])
        rounds = sessions[sid].rounds
        for a, b in zip(recs, recs[1:]):
            gap = rounds[a["round"]].tool_duration_s + rounds[a["round"]].think_time_s
            assert b["ready_s"] - a["ready_s"] == pytest.approx(gap)
    start, end = res.sim.window.start_s, res.sim.window.end_s
    assert start == 300 and all(r["measured"] == (start <= r["ready_s"] <= end) for r in gone)


def test_deferred_requests_wait_and_then_run_or_time_out(wl):
    limit = {"max_waiting": 1, "retry_after_s": 0.5}
    res, s = run(wl, ingress="queue_limit", params=limit, defer={"max_wait_s": 60.0})
    deferred = [r for r in res.records if r["deferred"]]
    assert deferred and s["ingress"]["deferred"] == sum(r["measured"] for r in deferred)
    assert all(r["state"] in ("completed", "rejected") for r in deferred if r["measured"])
    short, _ = run(wl, ingress="queue_limit", params=limit, defer={"max_wait_s": 0.1})
    assert any(r["reason"] == "defer_timeout" for r in short.records)


class StepBoundaries(SimObserver):
    """Observer: when each batch started and when each of its iterations ended (admissions happen
    at starts, finishes at iteration ends)."""

    worker_fields = frozenset()

    def __init__(self) -> None:
        self.instants: list[float] = []

    def on_step(self, worker, start_s, durations_s, *_) -> None:
        self.instants += [start_s, *(start_s + np.cumsum(durations_s))]

    def at_a_boundary(self, t: float) -> bool:
        ordered = sorted(self.instants)
        i = bisect.bisect_left(ordered, t - 1e-9)
        return i < len(ordered) and ordered[i] <= t + 1e-9

    def on_route(self, *_) -> None:
        pass


def test_a_held_request_decides_again_when_an_engine_admits_or_finishes_a_request(wl):
    """Event-driven, as the gateway: a deferred request reaches its engine at the instant another
    request was admitted or finished there (a step boundary), never on a polling tick."""
    steps = StepBoundaries()
    policies = {"ingress": {"name": "queue_limit", "params": {"max_waiting": 1, "retry_after_s": 0.5}, "defer": {"max_wait_s": 600.0}}}
    res = Simulation(wl, SimConfig(workers=1, system="cachewise", warmup_s=0, drain_s=20_000, policies=policies), observers=[steps]).run()
    late = [r for r in res.sim.requests if r.deferred_since >= 0 and r.arrived_s >= 0]
    assert late and all(r.arrived_s > r.ready_s and steps.at_a_boundary(r.arrived_s) for r in late)


def test_the_deferral_queue_is_bounded(wl):
    res, s = run(wl, ingress="queue_limit", params={"max_waiting": 1}, defer={"max_queue": 1, "max_wait_s": 600.0})
    full = [r for r in res.records if r["reason"] == "gateway_queue_full"]
    assert full and s["ingress"]["decisions"]["defer:queue_full"] >= len(full)


def test_the_deadline_policy_fires_once_a_worker_has_a_ttft_estimate(wl):
    """A 1 ms deadline is unmeetable once the worker's observed TTFT says so; before its first
    token the worker predicts 0 and the first requests pass."""
    res, _ = run(wl, ingress="deadline", tenants={"default": {"deadline_ms": 1.0}})
    decided = [r for r in res.records if r["reason"] != "session_abandoned"]
    assert decided[0]["state"] == "completed"
    assert any(r["reason"] == "deadline_unmeetable" for r in res.records)


def test_unknown_ingress_policy_names_the_valid_ones(wl):
    with pytest.raises(CodaError, match="valid: .*queue_limit"):
        run(wl, ingress="nope")


def test_cli_flag(tmp_path):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "coda.cli", "sim", "-w", "synth:rate=2,duration=300,seed=1", "--ingress", "queue_limit", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    s = json.loads(out.stdout)
    assert s["config"]["policies"]["ingress"]["name"] == "queue_limit" and s["ingress"]["policy"] == "queue_limit"
