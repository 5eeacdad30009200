"""The gateway's ingress policies inside the simulator: admit / defer / reject and honest accounting."""

from __future__ import annotations

import json

import pytest

from coda.errors import CodaError
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.spec import load_workload

WL = "synth:rate=6,duration=900,seed=4"


@pytest.fixture(scope="module")
def wl():
    return load_workload(WL)


def run(wl, **kw):
    res = Simulation(wl, SimConfig(**{"workers": 1, "system": "cachewise", "warmup_s": 0, "drain_s": 20_000, **kw})).run()
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
        res, s = run(wl, ingress=policy, policy_params={"overload": {"max_inflight": 6}} if "overload" in policy else {})
        states = [r["state"] for r in res.records if r["measured"]]
        assert len(states) == s["offered"]  # every round ready in the window is offered once, sent or not
        assert s["offered"] == s["completed"] + s["rejected"] and s["unfinished"] == 0, policy
        assert s["goodput"] == pytest.approx(s["slo_met"] / s["offered"])


def test_rejection_abandons_the_session_and_counts_its_unsent_rounds(wl):
    res, s = run(wl, ingress="overload", policy_params={"overload": {"max_inflight": 4}})
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
    res, s = run(wl, ingress="overload", warmup_s=300, policy_params={"overload": {"max_inflight": 4}})
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
    res, s = run(wl, ingress="queue_limit", policy_params={"queue_limit": {"max_waiting": 1, "retry_after_s": 0.5}})
    deferred = [r for r in res.records if r["deferred"]]
    assert deferred and s["ingress"]["deferred"] == sum(r["measured"] for r in deferred)
    assert all(r["state"] in ("completed", "rejected") for r in deferred if r["measured"])
    short, _ = run(wl, ingress="queue_limit", defer_max_s=0.1, policy_params={"queue_limit": {"max_waiting": 1, "retry_after_s": 0.5}})
    assert any(r["reason"] == "defer_timeout" for r in short.records)


def test_unknown_ingress_policy_names_the_valid_ones(wl):
    with pytest.raises(CodaError, match="valid: .*queue_limit"):
        run(wl, ingress="nope")


def test_cli_flag(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "coda.cli", "sim", "-w", "synth:rate=2,duration=300,seed=1", "--ingress", "queue_limit", "--json"],
                         capture_output=True, text=True, timeout=120, check=True)
    s = json.loads(out.stdout)
    assert s["config"]["ingress"] == "queue_limit" and s["ingress"]["policy"] == "queue_limit"
