"""Task metrics from hand-built records, and the analytic time alone against a one-session simulation."""

from __future__ import annotations

import pytest

from coda.metrics.requests import STALL_S, Window, summarize
from coda.metrics.tasks import Task, alone_times_s, jain_index, task_summary, tasks
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.schema import Round, Session, Workload


def rec(sid: str, k: int, n: int, ready: float, first: float | None, finish: float | None, state: str | None = None,
        reason: str | None = None) -> dict:
    done = finish is not None
    return {
        "reason": reason,
        "session_id": sid,
        "round": k,
        "session_rounds": n,
        "ready_s": ready,
        "first_token_s": first,
        "finish_s": finish,
        "output_tokens": 10,
        "prompt_tokens": 100,
        "new_input_tokens": 100,
        "tbt_mean_s": 0.01 if done else None,
        "state": state or ("completed" if done else "unfinished"),
    }


def test_completion_time_runs_from_first_ready_to_last_finish():
    records = [rec("a", 0, 2, 1.0, 1.5, 2.0), rec("a", 1, 2, 5.0, 5.2, 7.5)]
    assert tasks(records, 0.0, 10.0, run_end_s=20.0) == [Task("a", 6.5, False, 2)]


def test_an_unfinished_or_abandoned_session_is_censored_at_the_run_end():
    records = [
        rec("a", 0, 3, 1.0, 1.5, 2.0),
        rec("a", 1, 3, 4.0, None, None),  # still running at the end
        rec("d", 0, 3, 5.0, 5.5, 6.0),  # in its tool call at the end, its next round not yet sent
        rec("b", 0, 2, 2.0, None, None, "rejected"),
        rec("b", 1, 2, 3.0, None, None, "rejected", "session_abandoned"),  # shed
        rec("c", 0, 1, 3.0, 3.1, 3.4),
    ]
    got = {t.session_id: t for t in tasks(records, 0.0, 10.0, run_end_s=12.0)}
    assert got["a"] == Task("a", 11.0, True, 2)
    assert got["b"] == Task("b", 10.0, True, 1)  # its second round was never sent
    assert got["c"] == Task("c", pytest.approx(0.4), False, 1)
    assert got["d"] == Task("d", 7.0, True, 1, 6.0)
    s = task_summary(list(got.values()), None)
    assert s["tasks"] == 4 and s["tasks_censored"] == 3
    assert s["slowdown_p99"] is None and s["slowdown_jain"] is None
    # a censored task is compared with its time alone through the last round it sent
    # plus the idle time since that round finished, which alone would pass the same
    slow = task_summary([got["a"], got["b"], got["d"]], {"a": [1.0, 5.5, 9.0], "b": [2.5, 4.0], "d": [0.5, 3.0, 4.0]})
    assert slow["slowdown_p50"] == pytest.approx(2.0)  # a: 11 / 5.5, b: 10 / 2.5, d: 7 / (0.5 + 6)


def test_only_sessions_whose_first_request_is_ready_in_the_window_are_measured():
    records = [
        rec("early", 0, 2, 1.0, 1.1, 1.2),
        rec("early", 1, 2, 6.0, 6.1, 6.2),
        rec("late", 0, 1, 11.0, 11.1, 11.2),
        rec("in", 0, 1, 5.0, 5.1, 5.3),
    ]
    assert [t.session_id for t in tasks(records, 5.0, 10.0, run_end_s=12.0)] == ["in"]


def test_slowdown_divides_by_the_time_alone():
    ts = [Task("a", 4.0, False, 2), Task("b", 2.0, False, 1)]
    s = task_summary(ts, {"a": [0.5, 2.0], "b": [2.0]})
    assert s["slowdown_p50"] == pytest.approx(1.5) and s["slowdown_p99"] == pytest.approx(1.99)
    assert s["task_time_p50_s"] == pytest.approx(3.0)
    assert s["slowdown_jain"] == pytest.approx(9 / 10)  # (2 + 1)^2 / (2 (4 + 1))


def test_jain_index_is_one_for_equal_values_and_one_over_n_when_one_holds_all():
    assert jain_index([3.0] * 7) == pytest.approx(1.0)
    assert jain_index([5.0, 0.0, 0.0, 0.0]) == pytest.approx(1 / 4)
    assert jain_index([]) is None


def test_stalled_counts_waits_past_60_s_and_requests_that_never_finished():
    records = [
        rec("a", 0, 1, 0.0, 1.0, 2.0),  # fine
        rec("b", 0, 1, 0.0, STALL_S + 0.5, STALL_S + 1.0),  # first token after 60 s
        rec("c", 0, 1, 0.0, STALL_S - 0.5, STALL_S + 9.0),  # just under
        rec("d", 0, 1, 0.0, None, None),  # never finished
        rec("e", 0, 1, 0.0, None, None, "rejected"),
    ]
    s = summarize(records, Window(0.0, 100.0), ttft_slo_s=5.0, tbt_slo_s=1.0, run_end_s=100.0)
    assert s["stalled"] == 3
    assert s["ttft_max_s"] == pytest.approx(100.0) and s["latency_censored"] == 1  # d, still waiting when the run ended
    assert s["tasks"] == 5 and s["tasks_censored"] == 2


def lone_session(group: bool) -> Session:
    spec = [(3000, 50, 1.0), (700, 2000, 0.5), (10, 1, 0.0), (9000, 300, 2.0)]
    rounds = [
        Round(new_input_tokens=n, output_tokens=o, tool_duration_s=t, prefix_tokens=500 if group and i == 0 else None)
        for i, (n, o, t) in enumerate(spec)
    ]
    return Session(session_id="a", start_s=3.0, rounds=rounds, prefix_group="g" if group else None)


@pytest.mark.parametrize("profile", ["a100-qwen3coder30b-fp8-calibrated", "vllm-cpu-tiny"])
def test_time_alone_agrees_with_a_one_session_simulation(profile):
    """The analytic time alone and a simulation of the session by itself follow the same steps
    (chunked prefill over the cached prefix, decode runs at batch 1, the engine's per-request
    time), so they differ only by float rounding: 1e-9 relative. A prefill budget below the
    largest prompt, decode runs split at ``decode_run_max`` and a round of one output token
    exercise every branch."""
    wl = Workload(sessions=[lone_session(group=False)], meta={"duration_s": 1e5})
    cfg = SimConfig(
        system="vllm", profile=profile, workers=1, warmup_s=0, max_num_batched_tokens=2048, decode_run_max=300, num_gpu_blocks=100
    )
    res = Simulation(wl, cfg).run()
    (task,) = tasks(res.records, 0.0, 1e5, res.sim.loop.now)
    alone = alone_times_s(wl.sessions[0], res.sim.cost, chunk_tokens=cfg.chunk_tokens, max_num_batched_tokens=2048, decode_run_max=300)
    assert not task.censored
    assert task.time_s == pytest.approx(alone[-1], rel=1e-9)
    first_ready = res.records[0]["ready_s"]
    assert [r["finish_s"] - first_ready for r in res.records] == pytest.approx(alone, rel=1e-9)  # every round, not only the last
    assert res.summary()["slowdown_p50"] == pytest.approx(1.0, rel=1e-9)


def test_a_cold_shared_prompt_makes_the_lone_session_slower_than_its_best_case():
    """Alone assumes the session's prefix group is warm (its best case); a lone simulation starts cold."""
    wl = Workload(sessions=[lone_session(group=True)], meta={"duration_s": 1e5})
    s = Simulation(wl, SimConfig(system="vllm", workers=1, warmup_s=0)).run().summary()
    assert s["slowdown_p50"] > 1.0


def test_the_frontier_keeps_the_points_no_other_beats_on_both_axes():
    from coda.eval.pareto import frontier

    # (tail, throughput): b dominates a; c has a longer tail but more throughput; d is beaten by c
    points = [(2.0, 10.0), (1.0, 12.0), (3.0, 20.0), (4.0, 15.0)]
    assert frontier(points) == [1, 2]
    assert frontier([(1.0, 5.0)]) == [0] and frontier([]) == []
