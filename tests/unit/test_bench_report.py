"""Bench summaries use coda.metrics.requests's definitions: every offered request is exactly one of
completed, rejected or failed; goodput's denominator holds them all; the knee rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.bench.report import bench_summary, knee
from coda.metrics.requests import Window


@st.composite
def records(draw) -> list[dict]:
    out = []
    for i in range(draw(st.integers(0, 30))):
        state = draw(st.sampled_from(["completed", "rejected", "failed"]))
        ready = draw(st.floats(0, 20))
        rec = {
            "request_id": i,
            "session_id": f"s{i}",
            "round": draw(st.integers(0, 3)),
            "session_rounds": 4,
            "ready_s": ready,
            "state": state,
            "prompt_tokens": 100,
            "new_input_tokens": 10,
            "output_tokens": 0,
            "first_token_s": None,
            "finish_s": None,
            "tbt_mean_s": None,
            "gaps_s": [],
            "attempts": draw(st.integers(0, 4)),
            "admitted": False,
            "deferred": draw(st.booleans()),
            "hbm_hit_tokens": 0,
            "reason": None
            if state == "completed"
            else draw(st.sampled_from(["attempts_exhausted: x", "session_abandoned", "connect_error: y"])),
        }
        if state == "completed":
            ttft, n = draw(st.floats(0.01, 8)), draw(st.integers(1, 20))
            gaps = [draw(st.floats(0.001, 0.3)) for _ in range(n - 1)]
            rec.update(
                first_token_s=ready + ttft,
                finish_s=ready + ttft + sum(gaps),
                output_tokens=n,
                gaps_s=gaps,
                admitted=True,
                tbt_mean_s=sum(gaps) / (n - 1) if n > 1 else None,
            )
        out.append(rec)
    return out


@given(records())
def test_every_offered_request_is_counted_once_and_goodput_divides_by_all_of_them(recs):
    s = bench_summary(recs, Window(5.0, 15.0), ttft_slo_s=5.0, tbt_slo_s=0.1, run_end_s=40.0)
    offered = [r for r in recs if 5.0 <= r["ready_s"] <= 15.0]
    assert s["offered"] == len(offered) == s["completed"] + s["rejected"] + s["failed"]
    assert sum(s["rejected_by_reason"].values()) == s["rejected"] and sum(s["failed_by_reason"].values()) == s["failed"]
    good = [
        r
        for r in offered
        if r["state"] == "completed" and r["first_token_s"] - r["ready_s"] <= 5.0 and (r["output_tokens"] <= 1 or r["tbt_mean_s"] <= 0.1)
    ]
    assert s["goodput"] == pytest.approx(len(good) / max(len(offered), 1))
    assert s["retries"] == sum(max(r["attempts"] - 1, 0) for r in offered)
    assert "reuse_hbm" not in s  # a client cannot tell tiers apart
    firsts = [r for r in offered if r["round"] == 0]
    assert s["tasks"] == len(firsts) and s["tasks_censored"] == len(firsts)  # each session here has 4 rounds and sent one


def test_knee_is_the_highest_rate_within_5_percent_of_the_best_goodput():
    rows = [{"rate": 1, "goodput": 0.97}, {"rate": 2, "goodput": 0.99}, {"rate": 4, "goodput": 0.95}, {"rate": 8, "goodput": 0.6}]
    assert knee(rows) == 4
    assert knee([{"rate": 1, "goodput": None}]) is None
    levels = [{"concurrency": 1, "goodput": 1.0}, {"concurrency": 4, "goodput": 0.96}, {"concurrency": 16, "goodput": 0.5}]
    assert knee(levels, "concurrency") == 4  # the same rule on the closed loop's axis
