"""Hypothesis properties of the task metrics: Jain's index lies in [1/n, 1], and no simulated task
runs faster than the same session alone on an idle worker."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coda.metrics.tasks import jain_index, tasks
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.schema import Round, Session, Workload

# Float rounding only: both sides sum the same cost-model calls, in other orders.
SLOWDOWN_TOLERANCE = 1e-9


@given(st.lists(st.floats(0.0, 1e6), min_size=1, max_size=50).filter(any))
def test_jain_index_lies_between_one_over_n_and_one(values):
    j = jain_index(values)
    assert 1 / len(values) - 1e-12 <= j <= 1 + 1e-12


rounds_st = st.lists(st.tuples(st.integers(1, 900), st.integers(1, 120), st.floats(0, 5)), min_size=1, max_size=4)
sessions_st = st.lists(st.tuples(st.floats(0, 10), rounds_st, st.booleans()), min_size=1, max_size=5)


# The roofline's step cost is linear in a step's tokens, so the best case of ``alone_times_s`` is a
# strict lower bound there. Under the calibrated kernel model (not linear in a step's tokens)
# another split of the same prefill can be cheaper: hypothesis found a lone session
# that ran 0.02% faster than its analytic time alone.
LINEAR_PROFILE = "a100-qwen3coder30b-fp8-roofline"


def build(sessions) -> Workload:
    out = []
    for i, (start, rounds, grouped) in enumerate(sessions):
        rs = [Round(new_input_tokens=n, output_tokens=o, tool_duration_s=t, prefix_tokens=128 if (j == 0 and grouped) else None)
              for j, (n, o, t) in enumerate(rounds)]
        out.append(Session(session_id=f"s{i}", start_s=start, rounds=rs, prefix_group="g" if grouped else None))
    return Workload(sessions=out, meta={"duration_s": 1e5})  # every session is measured and finishes


@settings(max_examples=40)
@given(sessions=sessions_st, workers=st.integers(1, 3), max_seqs=st.integers(1, 6), budget=st.sampled_from([128, 512, 4096]),
       run_max=st.sampled_from([1, 7, 1024]), system=st.sampled_from(["vllm", "coda", "dynamo"]))
def test_no_task_beats_its_time_alone(sessions, workers, max_seqs, budget, run_max, system):
    wl = build(sessions)
    cfg = SimConfig(workers=workers, chunk_tokens=64, max_num_seqs=max_seqs, max_num_batched_tokens=budget, decode_run_max=run_max,
                    warmup_s=0, drain_s=1e6, system=system, profile=LINEAR_PROFILE)
    res = Simulation(wl, cfg).run()
    alone = res.alone_s()
    measured = tasks(res.records, 0.0, 1e5, res.sim.loop.now)
    assert len(measured) == len(wl.sessions) and not any(t.censored for t in measured)
    for t in measured:
        assert t.time_s >= alone[t.session_id][-1] * (1 - SLOWDOWN_TOLERANCE), t
    s = res.summary()
    assert s["slowdown_p50"] >= 1 - SLOWDOWN_TOLERANCE
    assert 1 / len(measured) - 1e-12 <= s["slowdown_jain"] <= 1 + 1e-12
