"""Tiered-Aging, fewest-blocks and FIFO on scripted ready queues (the paper's Figure 7 idea)."""

from __future__ import annotations

import numpy as np
import pytest

from coda.policy.snapshots import AdmissionCandidate, AdmissionSnapshot
from coda.policy.state import FewestBlocks, Fifo, TieredAging
from coda.shell.build import make_policy


class StubCost:
    """Round numbers: restore 1 s per 1000 tokens, SSD 2 s per 1000, prefill 1 s per 1000 new tokens."""

    profile = None

    def kv_bytes(self, tokens: int) -> int:
        return tokens

    def h2d_s(self, nbytes: float, outstanding_s: float = 0.0) -> float:
        return nbytes / 1000 + outstanding_s

    def ssd_read_s(self, nbytes: float) -> float:
        return nbytes / 500

    def prefill_only_s(self, new: int, cached: int) -> float:
        return new / 1000


def cand(rid, ready, *, hbm=0, dram=0, ssd=0, new=100, extra=1, fits=True):
    return AdmissionCandidate(rid, ready, hbm + dram + ssd + new, hbm, dram, ssd, extra, fits)


def snap(now, *cands, **kw):
    return AdmissionSnapshot.from_candidates(now, sorted(cands, key=lambda c: c.ready_s), **kw)


class Queue:
    """A worker's ready queue driven by a policy: admit one at a time and record the order."""

    def __init__(self, policy):
        self.policy = policy
        self.waiting: list[AdmissionCandidate] = []
        self.order: list[str] = []

    def admit(self, now, names):
        s = snap(now, *self.waiting)
        i = self.policy.choose(s)
        if i is None:
            return None
        rid = int(s.request_ids[i])
        self.waiting = [c for c in self.waiting if c.request_id != rid]
        self.order.append(names[rid])
        return names[rid]


def test_figure7_cheap_hbm_first_then_aging_lets_the_dram_request_in():
    ta = TieredAging(StubCost(), tau_s=5.0, w_max_s=20.0)
    names = {1: "A-dram", 2: "B-hbm", 3: "C-hbm", 4: "D-hbm", 5: "E-cold"}
    q = Queue(ta)
    # A: 10K tokens to restore from DRAM (10 s) + 0.1 s prefill; B, C: HBM-ready, cheap.
    q.waiting = [cand(1, 0.0, dram=10_000, new=100), cand(2, 1.0, hbm=5_000, new=1000), cand(3, 2.0, hbm=5_000, new=500)]
    assert q.admit(2.0, names) == "C-hbm"  # aged costs: A 10.1/1.4 = 7.2, B 1/1.2 = 0.83, C 0.5/1
    assert q.admit(2.0, names) == "B-hbm"
    q.waiting.append(cand(4, 10.0, hbm=1000, new=400))
    assert q.admit(10.0, names) == "D-hbm"  # A 10.1/3 = 3.37 > D 0.4
    q.waiting.append(cand(5, 16.0, new=3000))
    assert q.admit(16.0, names) == "A-dram"  # aging: A 10.1/4.2 = 2.40 < E 3.0
    assert q.order == ["C-hbm", "B-hbm", "D-hbm", "A-dram"]
    # FIFO would have taken A first and held the cheap HBM-ready requests behind a 10 s restore.
    assert Fifo().choose(snap(2.0, cand(1, 0.0, dram=10_000), cand(2, 1.0, hbm=5_000))) == 0


def test_wmax_forces_the_oldest_feasible():
    ta = TieredAging(StubCost(), tau_s=5.0, w_max_s=20.0)
    names = {1: "E", 2: "G-cold", 3: "H-cheap", 4: "I-cheapest", 5: "J-cheapest"}
    q = Queue(ta)
    q.waiting = [cand(1, 0.0, new=3000), cand(2, 10.0, new=50_000), cand(3, 15.0, new=100)]
    assert q.admit(15.0, names) == "H-cheap"
    assert q.admit(15.0, names) == "E"  # E 3/(1+15/5) = 0.75 < G 50/2 = 25
    q.waiting.append(cand(4, 29.0, new=10))
    assert q.admit(29.0, names) == "I-cheapest"  # G has waited 19 s: still by aged cost
    q.waiting.append(cand(5, 30.0, new=10))
    assert q.admit(30.0, names) == "G-cold"  # G has waited W_max: it goes first
    assert q.order == ["H-cheap", "E", "I-cheapest", "G-cold"]


def test_ties_break_by_raw_cost_then_blocks_then_ready():
    ta = TieredAging(StubCost(), tau_s=5.0, w_max_s=20.0)
    # same aged cost 1.0: X raw 2.0 waited 5 s; Y raw 1.0 fresh -> Y (lower raw cost)
    s = snap(5.0, cand(1, 0.0, new=2000), cand(2, 5.0, new=1000))
    assert int(s.request_ids[ta.choose(s)]) == 2
    # same raw cost and age: fewer extra blocks, then older
    s = snap(1.0, cand(1, 0.0, new=1000, extra=5), cand(2, 0.0, new=1000, extra=3), cand(3, 0.0, new=1000, extra=3))
    assert int(s.request_ids[ta.choose(s)]) == 2


def test_outstanding_h2d_time_counts_only_for_restores():
    ta = TieredAging(StubCost(), tau_s=5.0, w_max_s=20.0)
    rows = [cand(1, 0.0, dram=1000, new=100), cand(2, 0.0, new=1500)]
    assert int(snap(0.0, *rows).request_ids[ta.choose(snap(0.0, *rows))]) == 1  # 1.1 s vs 1.5 s
    busy = snap(0.0, *rows, h2d_outstanding_s=1.0)  # the link is committed for 1 s more
    assert int(busy.request_ids[ta.choose(busy)]) == 2


def test_the_progress_guard_takes_the_oldest_feasible_request_never_one_that_does_not_fit():
    """The paper's Eq. 4 over the feasible set: the oldest request does not fit, so the guard
    admits the oldest feasible one that has waited past W_max, ahead of a cheaper younger one."""
    ta = TieredAging(StubCost(), w_max_s=20.0)
    s = snap(30.0, cand(1, 0.0, new=90_000, fits=False), cand(2, 5.0, new=5_000), cand(3, 25.0, new=100))
    assert ta.explain(s).rule == "W_max: oldest feasible" and ta.choose(s) == 1
    young = snap(30.0, cand(1, 0.0, new=90_000, fits=False), cand(2, 15.0, new=5_000), cand(3, 25.0, new=100))
    assert ta.choose(young) == 2  # no feasible request has waited W_max: the least aged cost (the cheap one)


def test_hold_queue_holds_others_until_the_oldest_fits():
    hold = TieredAging(StubCost(), w_max_s=20.0, hold_queue=True)
    paper = TieredAging(StubCost(), w_max_s=20.0)
    s = snap(30.0, cand(1, 5.0, new=90_000, fits=False), cand(2, 25.0, new=100))
    assert hold.choose(s) is None and hold.explain(s).rule == "hold: oldest does not fit, admit nothing"
    assert paper.choose(s) == 1
    s2 = snap(30.0, cand(1, 5.0, new=90_000, fits=True), cand(2, 25.0, new=100))
    assert hold.choose(s2) == 0


def test_nothing_feasible_and_empty():
    ta = TieredAging(StubCost())
    assert ta.choose(snap(0.0)) is None
    assert ta.choose(snap(1.0, cand(1, 0.5, fits=False))) is None


def test_fifo_blocks_head_of_line_and_fewest_blocks_skips_it():
    s = snap(1.0, cand(1, 0.0, extra=50, fits=False), cand(2, 0.5, extra=9), cand(3, 0.6, extra=4), cand(4, 0.7, extra=4))
    assert Fifo().choose(s) is None
    assert int(s.request_ids[FewestBlocks().choose(s)]) == 3  # fewest blocks, oldest of the tie


def test_registry_builds_with_params():
    from coda.cost.model import AnalyticCost
    from coda.cost.profile import load_profile
    from coda.errors import CodaError

    cost = AnalyticCost(load_profile())
    ta = make_policy("state", "tiered_aging", {"tau_s": 2.0, "frontier": 16}, cost)
    assert ta.tau_s == 2.0 and ta.frontier == 16 and ta.w_max_s == 20.0
    with pytest.raises(CodaError, match="tau_s must be > 0"):
        make_policy("state", "tiered_aging", {"tau_s": 0.0}, cost)
    with pytest.raises(CodaError, match="unknown parameter"):
        make_policy("state", "tiered_aging", {"cost": 1}, cost)
    assert np.isfinite(ta._costs.seconds(snap(0.0, cand(1, 0.0, dram=5000, ssd=2000, new=300)))).all()
