"""KV eviction: tool-aware reclaim (the tool-time predictor, the victim order within the LRU
window) against plain LRU."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coda.policy.eviction import Lru, ToolAware
from coda.policy.tools import ToolPredictor
from coda.sim.kvcache import OWNER_SHIFT, owners_of


def test_tool_aware_reclaim_evicts_the_session_out_longest():
    p = ToolPredictor(min_samples=3)
    for d in (0.1, 0.2, 0.3):
        p.observe(["Read"], d)
    for d in (30.0, 60.0, 90.0):
        p.observe(["Task"], d)
    assert p.remaining(["Task"], 10.0) == pytest.approx(50.0)
    assert p.remaining(["Read"], 0.05) == pytest.approx(0.15)
    assert p.remaining(["Read"], 5.0) == 5.0  # outlived every Read seen: in the tail
    assert p.remaining(["Unknown"], 1.0) == pytest.approx(59.0)  # all tools: calls past 1 s were 30, 60, 90 s
    assert ToolPredictor().remaining(["Task"], 1.0) == 0.0  # nothing learned yet: plain LRU


def test_tool_aware_eviction_takes_the_longest_out_session_first_within_its_window():
    def c(owner, i):
        return (owner << OWNER_SHIFT) | i

    lru = OrderedDict((k, None) for k in [c(1, 3), c(1, 2), c(2, 5), c(2, 4), c(3, 1), c(2, 9)])
    policy = ToolAware(window_chunks=5, min_samples=3)
    for d in (90.0, 100.0, 110.0):
        policy.observe(["Task"], d)
    for d in (4.0, 5.0, 6.0):
        policy.observe(["Read"], d)
    status = {1: None, 2: (("Task",), 0.0), 3: (("Read",), 0.0)}  # owner 1 is not out
    # owner 2 first (in LRU order, within the 5-chunk window), then owner 3, then LRU
    assert policy.victims(lru, 4, status.__getitem__, owners_of) == [c(2, 5), c(2, 4), c(3, 1), c(1, 3)]
    assert policy.victims(lru, 2, lambda owner: None, owners_of) == [c(1, 3), c(1, 2)]  # nobody out: LRU
    assert Lru().victims(lru, 2, status.__getitem__, owners_of) == [c(1, 3), c(1, 2)]


def reference_victims(policy, lru, n: int, out) -> list[int]:
    """ToolAware's choice computed the plain way: every chunk scored through its owner, a stable
    sort by score (highest first) over the LRU window."""
    w = min(max(policy.window_chunks, n), len(lru))
    chunks = list(lru)[:w]
    score = [policy.score(c >> OWNER_SHIFT, out) for c in chunks]
    if not any(x > 0 for x in score):
        return chunks[:n]
    return [chunks[i] for i in np.lexsort((np.arange(w), -np.array(score)))[:n]]


@settings(max_examples=200)
@given(owners=st.lists(st.integers(0, 6), min_size=1, max_size=60), window=st.integers(1, 70), data=st.data())
def test_tool_aware_victims_equal_a_plain_stable_sort(owners, window, data):
    lru = OrderedDict(((o << OWNER_SHIFT) | i, None) for i, o in enumerate(owners))
    policy = ToolAware(window_chunks=window, min_samples=1)
    policy.observe(["Task"], 50.0)
    policy.observe(["Read"], 5.0)
    status = {o: data.draw(st.sampled_from([None, (), ("Task",), ("Read",)])) for o in range(7)}
    elapsed = data.draw(st.floats(0, 60))

    def out(owner):
        return None if status[owner] is None else (status[owner], elapsed)

    n = data.draw(st.integers(1, len(lru)))
    assert policy.victims(lru, n, out, owners_of) == reference_victims(policy, lru, n, out)


def test_the_median_statistic_predicts_the_median_residual():
    p = ToolPredictor(min_samples=3, statistic="median")
    for d in (1.0, 2.0, 30.0):
        p.observe(["Task"], d)
    assert p.remaining(["Task"], 0.5) == pytest.approx(1.5)  # median of {1, 2, 30} = 2, minus 0.5
