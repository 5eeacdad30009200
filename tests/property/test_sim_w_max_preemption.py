"""Hypothesis properties of W_max preemption in the simulator (``tiered_aging`` with ``preempt``).

Scripted cases: single-round sessions with prompts no two share (so a running request's blocks are
exactly what its preemption frees), arriving over a few seconds on one worker whose HBM holds any one
of them. Properties:

- after every step's scheduling, the request that was the oldest waiting when the step began, if
  overdue and still waiting, is waiting only if the requests running that arrived after it do not
  hold what it lacks (or, lacking only a seat, none arrived after it), or the step preempted for
  it, or vLLM's own preemption for decode growth (the newest admitted goes) put a request back
  after the step's W_max decision: nothing younger keeps it out for longer than a step;
- no request waits beyond W_max, or beyond the end of the requests older than it, by more than a
  few steps;
- every request completes, and no preemption is made for W_max without ``preempt``.
"""

from __future__ import annotations

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.schema import Workload
from tests.conftest import make_session

CHUNK, W_MAX = 64, 0.5
PROFILE = "a100-qwen3coder30b-fp8-roofline"  # no per-request API time: a request waits in the queue from its arrival

requests_st = st.lists(st.tuples(st.floats(0, 2), st.integers(64, 3000), st.integers(1, 600)), min_size=2, max_size=14)


def run(reqs, hbm_chunks: int, seats: int, preempt: bool):
    wl = Workload(sessions=[make_session(f"s{i}", t, [(p, o, 0.0)]) for i, (t, p, o) in enumerate(reqs)], meta={"duration_s": 1e5})
    # vLLM's count of blocks, its null block included
    cfg = SimConfig(system="coda", workers=1, profile=PROFILE, chunk_tokens=CHUNK, num_gpu_blocks=hbm_chunks + 1, max_num_seqs=seats,
                    warmup_s=0, drain_s=1e6, dram=False, policies={"state": {"params": {"w_max_s": W_MAX, "preempt": preempt}}})
    sim = Simulation(wl, cfg)
    w = sim.workers[0]
    violations: list[str] = []
    schedule = w._schedule

    def checked() -> None:
        made, preempted = w.w_max_preemptions, {r.rid: r.preemptions for r in w.running}
        # the request W_max preemption serves this step: the oldest waiting when the step begins (one
        # that becomes the oldest during it, as a tie admitted first leaves its twin, is served next step)
        oldest = min(w.waiting, key=lambda r: r.arrived_s) if w.waiting else None
        schedule()
        if oldest is None or oldest not in w.waiting:
            return
        if sim.loop.now - oldest.arrived_s < W_MAX or not preempt:
            return
        if w.w_max_preemptions > made or any(r.preemptions > preempted[r.rid] for r in w.waiting if r.rid in preempted):
            # progress this step, or vLLM's own preemption (decode growth) put a request back after the
            # step's W_max decision, changing what the oldest lacks: the next step decides on it
            return
        _, idle, _, _, extra = w._plan_hits(oldest)
        lack = extra - (w.hbm.reclaimable - idle)
        younger = [r for r in w.running if r.arrived_s > oldest.arrived_s]
        held = sum(r.held + r.private for r in younger)
        if lack > 0 and younger and held >= lack:
            violations.append(f"{sim.loop.now:.3f}: request {oldest.rid} lacks {lack} blocks, younger running hold {held}")
        if lack <= 0 and younger and len(w.running) + w.n_restoring >= w.max_num_seqs:
            violations.append(f"{sim.loop.now:.3f}: request {oldest.rid} lacks a seat a younger running request holds")

    longest = [0.0]
    launch = w.launch

    def timed(ends):
        longest[0] = max(longest[0], float(np.max(np.diff(ends, prepend=sim.loop.now))))
        launch(ends)

    # each stay in the queue, [entered, admitted]: from the arrival, then from each preemption
    stays: dict[int, list[list[float]]] = {}
    admit, preempt_ = w._admit, w._preempt

    def admitted(req):
        stays.setdefault(req.rid, [[req.arrived_s, 0.0]])[-1][1] = sim.loop.now
        admit(req)

    def preempted(victim):
        stays[victim.rid].append([sim.loop.now, 0.0])
        preempt_(victim)

    w._schedule, w.launch, w._admit, w._preempt = checked, timed, admitted, preempted
    res = sim.run()
    return sim, res, violations, longest[0], stays


@settings(max_examples=80)
@given(reqs=requests_st, spare=st.integers(0, 4), seats=st.integers(1, 6))
def test_nothing_younger_keeps_an_overdue_request_waiting(reqs, spare, seats):
    need = max(-(-(p + o + 1) // CHUNK) for _, p, o in reqs)
    sim, res, violations, longest_step, stays = run(reqs, need + spare, seats, preempt=True)
    event(f"W_max preemptions: {min(res.summary()['w_max']['preemptions'], 3)}")
    assert not violations, violations[:3]
    assert len(res.records) == len(reqs) and all(r["state"] == "completed" for r in res.records)
    for q in sim.requests:
        # once W_max has passed and every older request (or one of the same instant) has ended, only
        # younger ones run: they are preempted for it, a step at a time while the ones left grow into
        # what they freed. vLLM's own preemption for decode growth may put it back in the queue
        # after that (the newest admitted goes), so each stay in the queue is bounded from its start.
        free_at = max([q.arrived_s + W_MAX] + [o.finish_s for o in sim.requests if o is not q and o.arrived_s <= q.arrived_s])
        for entered, left in stays[q.rid]:
            assert left <= max(entered, free_at) + (len(reqs) + 1) * longest_step, (q.rid, q.arrived_s, entered, left, free_at)


@settings(max_examples=15)
@given(reqs=requests_st, spare=st.integers(0, 8), seats=st.integers(1, 6))
def test_without_preempt_no_request_is_preempted_for_w_max(reqs, spare, seats):
    need = max(-(-(p + o + 1) // CHUNK) for _, p, o in reqs)
    _, res, _, _, _ = run(reqs, need + spare, seats, preempt=False)
    w_max = res.summary()["w_max"]
    assert not w_max["preempt"] and w_max["preemptions"] == 0
    assert all(r["state"] == "completed" for r in res.records)
