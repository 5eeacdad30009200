"""The symmetric denominator: what the workload offers in the window at the unloaded pace does not
depend on what a policy did, so goodputs of different policies divide by the same count."""

from __future__ import annotations

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
            "output_tokens": 10, "tbt_mean_s": 0.05, "state": "completed", "admitted": True, "deferred": False}


def refused(sid: str, k: int, ready: float, reason: str = "new_session_deferred") -> dict:
    return {"session_id": sid, "round": k, "ready_s": ready, "first_token_s": None, "finish_s": None, "output_tokens": 0,
            "tbt_mean_s": None, "state": "rejected", "reason": reason, "admitted": False, "deferred": True}


def test_unloaded_pace_is_the_trace_timing_with_instant_service():
    s = workload().sessions[1]
    assert unloaded_ready_s(s) == [2.0, 7.0, 12.0] and unloaded_ready_s(s, time_scale=0.1) == [0.2, 0.7, 1.2]


def test_a_slowed_session_and_a_refused_one_are_charged_alike():
    window = Window(0.0, 20.0)
    # admit_all: b is slowed, its last round not yet sent when the run ends; a completes
    slowed = [done("a", 0, 0.0), done("a", 1, 5.7), done("a", 2, 11.4), done("b", 0, 2.0, ttft=4.0), done("b", 1, 12.5, ttft=3.0)]
    # a shedding policy: b is refused, its unsent rounds recorded from the refusal (earlier than the unloaded pace)
    shed = [done("a", 0, 0.0), done("a", 1, 5.7), done("a", 2, 11.4), refused("b", 0, 2.0), refused("b", 1, 7.0, "session_abandoned"),
            refused("b", 2, 12.0, "session_abandoned")]
    a, b = (symmetric_summary(r, workload(), window, time_scale=1.0, **SLO) for r in (slowed, shed))
    assert a["offered"] == b["offered"] == 6  # a's and b's three rounds; "late" starts after the window
    assert (a["unsent"], a["slo_met"], b["rejected"], b["slo_met"]) == (1, 3, 3, 3)
    assert a["goodput"] == b["goodput"] == 0.5
    assert (a["sessions_offered"], a["sessions_completed"], a["sessions_good"]) == (2, 1, 1) and a["session_goodput"] == 0.5
    assert b["sessions_completed"] == 1 and b["deferred"] == 3


records_st = st.lists(st.tuples(st.sampled_from(["a", "b", "late"]), st.integers(0, 2), st.floats(0, 60),
                                st.sampled_from(["completed", "rejected", "failed"]), st.floats(0, 3)), max_size=12)


@given(records_st, st.floats(0, 30), st.floats(1, 60))
def test_the_denominator_does_not_depend_on_the_records(raw, start, length):
    window = Window(start, start + length)
    records = [(done(sid, k, t, ttft) if state == "completed" else {**refused(sid, k, t), "state": state}) for sid, k, t, state, ttft in raw]
    base = symmetric_summary([], workload(), window, time_scale=1.0, **SLO)
    got = symmetric_summary(records, workload(), window, time_scale=1.0, **SLO)
    assert got["offered"] == base["offered"] and got["sessions_offered"] == base["sessions_offered"]
    assert got["completed"] + got["rejected"] + got["failed"] + got["unsent"] == got["offered"]
    assert 0 <= got["goodput"] <= 1 and 0 <= got["session_goodput"] <= 1 and got["sessions_good"] <= got["sessions_completed"]
