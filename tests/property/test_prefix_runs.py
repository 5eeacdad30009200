"""A tier's remembered prefix runs always equal a fresh scan, whatever was stored, evicted or
discarded in between, for chains that share a group's prompt to different lengths."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from coda.sim.kvcache import OWNER_SHIFT, HbmPool, KVStore, Versions, leading_run
from tests.conftest import pool_step

GROUP, SESSIONS = 0, (1, 2, 3)


def chain(shared: int, session: int, own: int) -> list[int]:
    """``shared`` chunks of the group's prompt, then ``own`` chunks of the session's."""
    return [(GROUP << OWNER_SHIFT) | j for j in range(shared)] + [(session << OWNER_SHIFT) | j for j in range(own)]


chains = st.builds(chain, st.integers(0, 12), st.sampled_from(SESSIONS), st.integers(0, 6))
ops = st.lists(
    st.tuples(st.sampled_from(["insert", "release", "evict", "discard", "put", "probe"]), chains, st.integers(1, 8)), max_size=60
)


@settings(max_examples=400)
@given(ops)
@example(
    [
        ("insert", chain(8, 1, 2), 1),
        ("probe", chain(8, 2, 0), 1),
        ("release", chain(0, 1, 0), 1),
        ("evict", chain(8, 2, 0), 3),
        ("put", chain(8, 3, 1), 1),
        ("probe", chain(6, 1, 0), 1),
        ("put", chain(0, 1, 9), 1),
        ("put", chain(0, 2, 9), 1),
        ("put", chain(0, 3, 9), 1),
        ("probe", chain(8, 1, 0), 1),
    ]
)  # the shared prompt's tail evicted from HBM, then pushed out of the store
def test_remembered_runs_equal_a_fresh_scan(steps):
    versions = Versions()
    for _ in range(1 + max(SESSIONS)):
        versions.new_owner()
    pool = HbmPool(0, 64, versions)
    store = KVStore("dram", 0, 24, versions)
    held: list[list[int]] = []  # chains the pool references, to release or discard later
    for op, c, n in steps:
        if not pool_step(pool, held, op, c, n) and op == "put":
            store.put(c)
        assert pool.leading(c) == leading_run(pool.resident, c)
        assert store.leading(c, 0) == leading_run(store.chunks, c)
