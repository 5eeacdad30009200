"""The load benchmark's denominator: a refused session's unsent rounds are charged only as far as
its own trace timing at the unloaded pace reaches inside the window, as a slowed session's late
rounds are not charged either; every round a client sent counts where the replay put it."""

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
    assert (a["slo_met"], a["completed"]) == (3, 5) and (b["rejected"], b["abandoned"], b["slo_met"]) == (2, 1, 3)
    assert a["goodput_symmetric"] == b["goodput_symmetric"] == pytest.approx(0.6)
    # sessions that start in the window and would end in it unloaded: a (b would not finish by 20 s)
    assert (a["sessions_offered"], a["sessions_completed"], a["sessions_good"], a["session_goodput"]) == (1, 1, 1, 1.0)
    # without a profile each round is served instantly: b's three rounds all fall in the window
    c = symmetric_summary(shed, workload(), window, time_scale=1.0, **SLO)
    assert (c["offered"], c["abandoned"], c["sessions_offered"], c["session_goodput"]) == (6, 2, 2, 0.5)


records_st = st.lists(st.tuples(st.sampled_from(["a", "b", "late"]), st.integers(0, 2), st.floats(0, 60),
                                st.sampled_from(["completed", "rejected", "failed"]), st.floats(0, 3)), max_size=12,
                      unique_by=lambda x: (x[0], x[1]))


@given(records_st, st.floats(0, 30), st.floats(1, 60))
def test_every_offered_round_ends_once_and_sent_rounds_count_as_replayed(raw, start, length):
    window = Window(start, start + length)
    records = [
        (done(sid, k, t, ttft) if state == "completed" else {**refused(sid, k, t), "state": state}) for sid, k, t, state, ttft in raw
    ]
    got = symmetric_summary(records, workload(), window, time_scale=1.0, **SLO)
    assert got["completed"] + got["rejected"] + got["failed"] == got["offered"]
    assert got["offered"] - got["abandoned"] == sum(window.start_s <= r["ready_s"] <= window.end_s for r in records)
    assert 0 <= got["goodput_symmetric"] <= 1 and 0 <= got["session_goodput"] <= 1 and got["sessions_good"] <= got["sessions_completed"]
