"""W_max preemption's rule in the policy core: Tiered-Aging's decisions with ``preempt`` and the victim
order both shells run (``coda.policy.state.preemption_victims``)."""

from __future__ import annotations

from coda.policy.snapshots import AdmissionCandidate, AdmissionSnapshot
from coda.policy.state import Fifo, TieredAging, overdue, preemption_victims, w_max_of
from coda.shell.shadow import ShadowedState
from tests.unit.test_state_policies import StubCost


def queue(now: float, *rows: tuple[int, float, bool]) -> AdmissionSnapshot:
    """Candidates in queue order (a preempted request is back at the front): (id, ready, fits)."""
    return AdmissionSnapshot.from_candidates(now, [AdmissionCandidate(rid, ready, 100, 0, 0, 0, 1, fits) for rid, ready, fits in rows])


def test_the_oldest_goes_first_once_overdue_wherever_preemptions_put_it_in_the_queue():
    ta = TieredAging(StubCost(), w_max_s=4.0, preempt=True)
    # request 7 was preempted and is back at the front; request 1 arrived first and has waited W_max
    s = queue(10.0, (7, 8.0, True), (1, 5.0, True), (2, 9.0, True))
    assert overdue(s.now_s, s.ready_s, 4.0) == 1
    assert ta.explain(s).index == 1 and ta.explain(s).rule == "W_max: oldest first"


def test_nothing_is_admitted_while_the_overdue_request_does_not_fit():
    ta = TieredAging(StubCost(), w_max_s=4.0, preempt=True)
    s = queue(10.0, (7, 8.0, True), (1, 5.0, False), (2, 9.0, True))
    assert ta.choose(s) is None and ta.explain(s).rule == "W_max: oldest does not fit, preempt"
    # before W_max, or without preempt, the others that fit go ahead of it (the paper's guard)
    assert TieredAging(StubCost(), w_max_s=4.0, preempt=True).choose(queue(8.0, (1, 5.0, False), (2, 6.0, True))) == 1
    assert TieredAging(StubCost(), w_max_s=4.0).choose(s) is not None
    assert overdue(8.0, [5.0], 4.0) is None and overdue(9.0, [], 4.0) is None


def test_victims_are_the_youngest_requests_that_arrived_after_it_until_enough_blocks_are_freed():
    running = [(1.0, 5), (6.0, 2), (3.0, 4), (8.0, 1)]  # (ready_s, blocks its preemption frees)
    assert preemption_victims(2.0, 3, False, running) == [3, 1]  # 8.0 then 6.0: 3 blocks
    assert preemption_victims(2.0, 6, False, running) == [3, 1, 2]
    # the request that arrived before it is never a victim, even where it alone would free enough
    assert preemption_victims(2.0, 8, False, running) == []
    assert preemption_victims(2.0, 0, False, running) == []
    # short of a seat only: the youngest one
    assert preemption_victims(2.0, 0, True, running) == [3]
    assert preemption_victims(9.0, 0, True, running) == []


def test_shells_read_w_max_and_the_switch_through_a_shadow():
    ta = TieredAging(StubCost(), w_max_s=7.0, preempt=True)
    assert w_max_of(ta) == (7.0, True)
    assert w_max_of(ShadowedState(ta, TieredAging(StubCost()))) == (7.0, True)
    assert w_max_of(TieredAging(StubCost())) == (20.0, False)
    assert w_max_of(Fifo()) == (None, False)
