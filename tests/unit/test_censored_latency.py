"""Requests the run's end cut off count in the latency columns, censored there, so the longest
wait is a lower bound on the true one and says so; a run without them reports what it did."""

from __future__ import annotations

import pytest

from coda.bench.ladder import metrics_of
from coda.metrics.requests import Window, censored_latencies, summarize

SLO = {"ttft_slo_s": 5.0, "tbt_slo_s": 1.0}


def rec(sid: str, ready: float, first: float | None, finish: float | None, state: str = "completed", reason: str | None = None,
        k: int = 1) -> dict:
    return {"session_id": sid, "round": k, "session_rounds": 2, "ready_s": ready, "first_token_s": first, "finish_s": finish,
            "output_tokens": 2 if finish is not None else 0, "tbt_mean_s": finish - first if finish is not None else None,
            "prompt_tokens": 10, "new_input_tokens": 10, "state": state, "reason": reason}


DONE = [rec("a", 0.0, 1.0, 2.0), rec("b", 1.0, 3.0, 4.0)]
# the simulator's request still queued, the replay's cut off waiting and cut off while streaming, and one refused
CUT = [rec("c", 2.0, None, None, "unfinished"), rec("d", 4.0, None, None, "failed", "run_ended"),
       rec("e", 5.0, 6.0, None, "failed", "run_ended"), rec("f", 5.0, None, None, "rejected", "overloaded")]


def test_a_request_cut_off_counts_with_its_wait_so_far_and_a_known_first_token_stays():
    ttft, e2e, cut = censored_latencies(DONE + CUT, run_end_s=30.0)
    assert cut.tolist() == [False, False, True, True, True, False]
    assert ttft[:5].tolist() == pytest.approx([1.0, 2.0, 28.0, 26.0, 1.0]) and e2e[2:5].tolist() == pytest.approx([28.0, 26.0, 25.0])
    s = summarize(DONE + CUT, Window(0.0, 10.0), run_end_s=30.0, **SLO)
    assert s["latency_censored"] == 3 and s["ttft_max_s"] == pytest.approx(28.0)  # a lower bound: c waits on
    assert s["ttft_p50_s"] == pytest.approx(2.0) and s["e2e_mean_s"] == pytest.approx((2.0 + 3.0 + 28.0 + 26.0 + 25.0) / 5)
    assert (s["completed"], s["goodput"], s["itl_p50_s"]) == (2, pytest.approx(2 / 6), pytest.approx(1.0))  # ITL: finished only


def test_without_cut_off_requests_the_columns_are_those_of_the_completed():
    s, bare = (summarize(DONE + CUT[3:], Window(0.0, 10.0), run_end_s=end, **SLO) for end in (30.0, None))
    assert s["latency_censored"] == 0 and {k: v for k, v in s.items() if k.startswith(("ttft", "e2e"))} == {
        k: v for k, v in bare.items() if k.startswith(("ttft", "e2e"))}


def test_the_burst_counts_the_cut_off_in_its_ttft_columns_and_flags_the_longest_wait():
    records = [{**r, "round": 1} for r in DONE + CUT]
    s = summarize(records, Window(0.0, 10.0), run_end_s=30.0, **SLO)
    m = metrics_of(records, Window(0.0, 10.0), s, None, 30.0)
    assert (m["max_wait_s"], m["max_wait_censored"]) == (pytest.approx(28.0), 3)
    assert m["ttft_p95_continuation_s"] > 20.0  # c and d waited past the run's end: without them it would be about 2 s
