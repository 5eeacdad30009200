"""The load benchmark's denominator: every door is charged the rounds the workload would make ready
in the window at the unloaded pace, so a session refused at round k and one slowed at round k are
charged the same rounds over the same window."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.metrics.offered import symmetric_summary, unloaded_ready_s
from coda.metrics.requests import Window
from coda.workload.schema import Round, Session, Workload

SLO = {"ttft_slo_s": 1.0, "tbt_slo_s": 0.1}


def workload() -> Workload:
    def session(sid: str, start: float) -> Session:
        return Session(session_id=sid, start_s=start, rounds=[Round(new_input_tokens=100, output_tokens=10, tool_duration_s=5.0)
                                                              for _ in range(3)])
    return Workload(sessions=[session("a", 0.0), session("b", 2.0), session("late", 50.0)])


def done(sid: str, k: int, ready: float, ttft: float = 0.2) -> dict:
    return {"session_id": sid, "round": k, "ready_s": ready, "first_token_s": ready + ttft, "finish_s": ready + ttft + 0.5,
            "output_tokens": 10, "tbt_mean_s": 0.05, "state": "completed", "reason": "ok", "admitted": True, "deferred": False}


def refused(sid: str, k: int, ready: float, reason: str = "new_session_deferred") -> dict:
    return {"session_id": sid, "round": k, "ready_s": ready, "first_token_s": None, "finish_s": None, "output_tokens": 0,
            "tbt_mean_s": None, "state": "rejected", "reason": reason, "admitted": False, "deferred": True}


def test_unloaded_pace_is_the_trace_timing_with_each_round_served_alone():
    s = workload().sessions[1]
    assert unloaded_ready_s(s) == [2.0, 7.0, 12.0] and unloaded_ready_s(s, time_scale=0.1) == pytest.approx([0.2, 0.7, 1.2])
    # with each round's end alone (trace seconds after the first became ready): served 1 s, then 5 s of tool time, and so on
    assert unloaded_ready_s(s, time_scale=0.5, alone_ends_s=[1.0, 7.0, 13.0]) == pytest.approx([1.0, 4.0, 7.0])


def test_a_refused_session_is_charged_as_far_as_the_unloaded_pace_reaches():
    window = Window(0.0, 20.0)
    alone = {"a": [0.7, 6.4, 12.1], "b": [1.0, 14.0, 20.0]}  # b's rounds take long alone: its last would be ready at 21 s
    # admit_all: b is slowed, its last round not yet ready when the window ends
    slowed = [done("a", 0, 0.0), done("a", 1, 5.7), done("a", 2, 11.4), done("b", 0, 2.0, ttft=4.0), done("b", 1, 12.5, ttft=3.0)]
    # a shedding policy: b is refused at once; the replay recorded its unsent rounds as if served instantly (7 s, 12 s)
    shed = [done("a", 0, 0.0), done("a", 1, 5.7), done("a", 2, 11.4), refused("b", 0, 2.0), refused("b", 1, 7.0, "session_abandoned"),
            refused("b", 2, 12.0, "session_abandoned")]
    a, b = (symmetric_summary(r, workload(), window, time_scale=1.0, alone_s=alone, **SLO) for r in (slowed, shed))
    assert a["offered"] == b["offered"] == 5  # b's last round is charged to neither
    assert (a["slo_met"], a["completed"], a["late"]) == (3, 5, 0) and (b["rejected"], b["abandoned"], b["slo_met"]) == (2, 1, 3)
    assert a["goodput_symmetric"] == b["goodput_symmetric"] == pytest.approx(0.6)
    # sessions that start in the window and would end in it unloaded: a (b would not finish by 20 s)
    assert (a["sessions_offered"], a["sessions_completed"], a["sessions_good"], a["session_goodput"]) == (1, 1, 1, 1.0)
    # without a profile each round is served instantly: b's three rounds all fall in the window
    c = symmetric_summary(shed, workload(), window, time_scale=1.0, **SLO)
    assert (c["offered"], c["abandoned"], c["sessions_offered"], c["session_goodput"]) == (6, 2, 2, 0.5)


def test_a_session_refused_at_round_k_and_one_slowed_at_round_k_are_charged_the_same_rounds():
    window = Window(0.0, 20.0)  # no profile: b's rounds would be ready at 2, 7 and 12 s
    first = [done("a", 0, 0.0), done("a", 1, 5.7), done("a", 2, 11.4), done("b", 0, 2.0)]
    # slowed at round 1: its first token after 15 s, so round 2 would be ready at 28 s, past the window, and is never sent
    slowed = [*first, done("b", 1, 7.0, ttft=15.0)]
    # refused at round 1: the replay recorded round 2 as abandoned, ready at once
    shed = [*first, refused("b", 1, 7.0), refused("b", 2, 7.0, "session_abandoned")]
    a, b = (symmetric_summary(r, workload(), window, time_scale=1.0, **SLO) for r in (slowed, shed))
    assert a["offered"] == b["offered"] == 6  # round 2 of b charged to both
    assert (a["completed"], a["late"], a["abandoned"], a["slo_met"]) == (5, 1, 0, 4)
    assert (b["completed"], b["rejected"], b["abandoned"], b["late"], b["slo_met"]) == (4, 2, 1, 0, 4)
    assert a["goodput_symmetric"] == b["goodput_symmetric"] == pytest.approx(4 / 6)
    assert a["slo_rps_symmetric"] == b["slo_rps_symmetric"] == pytest.approx(4 / 20)


records_st = st.lists(st.tuples(st.sampled_from(["a", "b", "late"]), st.integers(0, 2), st.floats(0, 60),
                                st.sampled_from(["completed", "rejected", "failed"]), st.floats(0, 3)), max_size=12,
                      unique_by=lambda x: (x[0], x[1]))


@given(records_st, st.floats(0, 30), st.floats(1, 60))
def test_the_charged_rounds_come_from_the_workload_alone_and_each_ends_once(raw, start, length):
    window = Window(start, start + length)
    records = [
        (done(sid, k, t, ttft) if state == "completed" else {**refused(sid, k, t), "state": state}) for sid, k, t, state, ttft in raw
    ]
    got = symmetric_summary(records, workload(), window, time_scale=1.0, **SLO)
    assert got["offered"] == symmetric_summary([], workload(), window, time_scale=1.0, **SLO)["offered"]
    assert got["completed"] + got["rejected"] + got["failed"] + got["late"] == got["offered"]
    assert got["slo_met"] <= got["completed"]
    assert 0 <= got["goodput_symmetric"] <= 1 and 0 <= got["session_goodput"] <= 1 and got["sessions_good"] <= got["sessions_completed"]
