"""The burst's liveness counts: what CodaScheduler's trace says each mechanism did in a replay, and
a row's verdict (a mechanism that never acted is inert; one nothing counts is uncounted)."""

from __future__ import annotations

from coda.bench.ladder import LIVENESS, liveness_of, trace_liveness

TRACE = [
    {"coda": "0.1.0", "policies": {}},  # the header
    {"step": 1, "cohort": {"n": 4, "cut": 2}, "decisions": [{"chosen": "a", "candidates": [["a", 32, 64, 0, True, 0.1],
                                                                                           ["b", 0, 0, 0, True, 0.2]]}],
     "w_max": {"for": None, "preempted": [], "admitted": []}, "retention": [{"event": "hold", "blocks": 3}, {"event": "out"}]},
    {"step": 2, "cohort": {"n": 4, "cut": None}, "decisions": [{"chosen": "b", "candidates": [["b", 0, 0, 0, True, 0.2]]}],
     "w_max": {"for": "c", "preempted": ["d", "e"], "admitted": ["c"]}, "retention": [{"event": "release", "blocks": 3}]},
    {"step": 3, "cohort": None, "decisions": [], "w_max": None, "retention": []},
]


def test_the_trace_counts_each_mechanism_where_it_acted():
    got = trace_liveness(iter(TRACE), dram_tokens=64.0)
    assert got == {"cohort_splits": 1, "retention_holds": 1, "blocks_kept": 3, "dram_loads": 1, "dram_tokens": 64.0,
                   "w_max_admissions": 1, "w_max_preemptions": 2}


def test_a_row_names_the_mechanisms_that_never_acted_and_those_nothing_counts():
    idle = dict.fromkeys(LIVENESS, 0)
    reps = [{"liveness": {**idle, "w_max_admissions": 2, "retention_holds": None}}, {"liveness": {**idle, "retention_holds": None}}]
    row = liveness_of("coda-tail", reps)
    assert row["w_max_admissions"] == 2 and row["retention_holds"] is None
    assert row["mechanisms"] == ["w_max", "tiers", "cohorts", "retention"]
    assert row["inert"] == ["tiers", "cohorts"] and row["uncounted"] == ["retention"]
    plain = liveness_of("plain", reps)
    assert plain["mechanisms"] == plain["inert"] == plain["uncounted"] == []
