"""The scaled synthetic workload the fidelity runs use (``synth:...,tokens=0.03,tools=0.1``): the
calibrated workload's sessions with fewer tokens (round counts agree in distribution; integer
rounding of small contexts moves single sessions) and shorter tools, the defaults unchanged."""

from __future__ import annotations

import pytest

from coda.errors import CodaError
from coda.workload.schema import session_prompts
from coda.workload.spec import load_workload

BASE = "synth:rate=3,duration=600,seed=4"


def test_scales_of_one_are_the_calibrated_workload():
    assert load_workload(BASE + ",tokens=1,tools=1").sessions == load_workload(BASE).sessions


def test_token_scale_keeps_the_session_structure():
    full, small = load_workload(BASE), load_workload(BASE + ",tokens=0.03")
    assert len(full.sessions) == len(small.sessions) and small.num_requests == pytest.approx(full.num_requests, rel=0.15)
    big = sum(p for s in full.sessions for _, p in session_prompts(s))
    little = sum(p for s in small.sessions for _, p in session_prompts(s))
    assert 0.02 < little / big < 0.045
    assert max(p for s in small.sessions for _, p in session_prompts(s)) <= 0.03 * 200_000 + 500
    assert small.meta["token_scale"] == 0.03 and "token_scale" not in full.meta


def test_tool_scale_multiplies_tool_and_think_times():
    full, fast = load_workload(BASE), load_workload(BASE + ",tools=0.1")
    for a, b in zip(full.sessions, fast.sessions):
        for ra, rb in zip(a.rounds, b.rounds):
            assert rb.tool_duration_s == pytest.approx(ra.tool_duration_s * 0.1, abs=1e-4)
            assert rb.think_time_s == pytest.approx(ra.think_time_s * 0.1, abs=1e-3)
            assert [t.name for t in ra.tools] == [t.name for t in rb.tools]
            assert ra.new_input_tokens == rb.new_input_tokens


@pytest.mark.parametrize("bad", ["tokens=0", "tokens=1.5", "tools=0", "tools=-1"])
def test_bad_scales_name_the_fix(bad):
    with pytest.raises(CodaError, match=bad.split("=")[0]):
        load_workload(f"{BASE},{bad}")
