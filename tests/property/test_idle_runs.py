"""A pool's idle runs (``IdleRuns``) always lay out its LRU exactly, and tool-aware reclaim read
from them chooses the same chunks, in the same order, as read from the LRU itself, whatever was
inserted, acquired, released, evicted or discarded in between and whichever sessions are out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coda.policy.eviction import ToolAware
from coda.sim.kvcache import OWNER_SHIFT, HbmPool, Versions, owners_of
from tests.conftest import pool_step

GROUP, SESSIONS = 0, (1, 2, 3, 4)


def chain(shared: int, session: int, own: int) -> list[int]:
    return [(GROUP << OWNER_SHIFT) | j for j in range(shared)] + [(session << OWNER_SHIFT) | j for j in range(own)]


chains = st.builds(chain, st.integers(0, 8), st.sampled_from(SESSIONS), st.integers(0, 10))
ops = st.lists(st.tuples(st.sampled_from(["insert", "acquire", "release", "evict", "discard"]), chains, st.integers(1, 12)),
               max_size=80)
# per owner: out on these tools for this long, or not out; the predictor's samples
statuses = st.dictionaries(st.sampled_from((GROUP, *SESSIONS)),
                           st.tuples(st.sampled_from([(), ("bash",), ("read", "bash")]), st.floats(0, 30)))
samples = st.lists(st.tuples(st.sampled_from([(), ("bash",), ("read",)]), st.floats(0.01, 60)), max_size=20)


@settings(max_examples=300)
@given(ops, statuses, samples, st.integers(1, 40))
def test_idle_runs_lay_out_the_lru_and_give_the_same_victims(steps, out, observed, window):
    policy = ToolAware(window_chunks=window, min_samples=2)
    for tools, d in observed:
        policy.observe(tools, d)
    status = out.get

    versions = Versions()
    for _ in range(1 + max(SESSIONS)):
        versions.new_owner()
    chosen = {"lru": [], "runs": []}

    def by_lru(lru, n):
        got = policy.victims(lru, n, status, owners_of)
        chosen["lru"].append(got)
        return got

    def by_runs(runs, n):
        got = policy.victims_by_runs(runs, len(runs), n, status)
        chosen["runs"].append(got)
        assert got == policy.victims(pool.lru, n, status, owners_of)
        return got

    pool = HbmPool(0, 40, versions, evictor=by_lru, run_evictor=by_runs)
    held: list[list[int]] = []
    for op, c, n in steps:
        if not pool_step(pool, held, op, c, n) and op == "acquire" and c:
            run = [x for x in c[: pool.leading_hits(c)[0]]]
            if run:
                pool.acquire(run)
                held.append(run)
        laid = [x for _, chunks in pool.idle_runs for x in chunks]
        assert laid == list(pool.lru)
        assert len(pool.idle_runs) == len(pool.lru)
        assert all(chunks and all(x >> OWNER_SHIFT == o for x in chunks) for o, chunks in pool.idle_runs)
    assert not chosen["lru"]  # the pool asked the runs, never the LRU
