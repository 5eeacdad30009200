"""The cluster-wide residency (which tiers hold each owner's chunks, and an epoch per owner that
moves whenever any tier's set of them does) and the prefix matches kept from it always equal a
fresh scan, whatever was stored, evicted or discarded in between, on two nodes of two workers
sharing a DRAM store and an SSD store each."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from coda.policy.snapshots import PrefixMatch
from coda.sim.kvcache import OWNER_SHIFT, HbmPool, KVStore, Residency, Versions
from coda.sim.views import ClusterViews

GROUPS, SESSIONS = (0, 1), (2, 3, 4)
WORKERS, PER_NODE = 4, 2


def chain(group: int, shared: int, session: int, own: int) -> list[int]:
    """``shared`` chunks of a group's prompt, then ``own`` chunks of the session's."""
    return [(group << OWNER_SHIFT) | j for j in range(shared)] + [(session << OWNER_SHIFT) | j for j in range(own)]


chains = st.builds(chain, st.sampled_from(GROUPS), st.integers(0, 10), st.sampled_from(SESSIONS), st.integers(0, 6))
ops = st.lists(
    st.tuples(st.sampled_from(["insert", "release", "evict", "discard", "put", "probe"]), st.integers(0, WORKERS - 1), chains,
              st.integers(1, 8)),
    max_size=80,
)


def lead(held, c: list[int], start: int) -> int:
    n = 0
    while start + n < len(c) and c[start + n] in held:
        n += 1
    return n


def fresh_matches(workers, c: list[int]) -> dict[int, PrefixMatch]:
    out = {}
    for w in workers:
        h = lead(w.hbm.resident, c, 0)
        d = lead(w.dram.chunks, c, h)
        s = lead(w.ssd.chunks, c, h + d)
        if h or d or s:
            out[w.id] = PrefixMatch(h, d, s)
    return out


def owned(tier) -> dict[int, frozenset[int]]:
    """Each owner's chunks a tier holds."""
    held = tier.resident if isinstance(tier, HbmPool) else tier.chunks
    out: dict[int, set[int]] = {}
    for c in held:
        out.setdefault(c >> OWNER_SHIFT, set()).add(c)
    return {o: frozenset(cs) for o, cs in out.items()}


@settings(max_examples=300)
@given(ops)
def test_residency_and_kept_matches_equal_a_fresh_scan(steps):
    versions = Versions()
    for _ in range(1 + max(SESSIONS)):
        versions.new_owner()
    res = Residency()
    ssds = [KVStore("ssd", n, 16, versions, residency=res) for n in range(WORKERS // PER_NODE)]
    drams = [KVStore("dram", n, 12, versions, lower=ssds[n], residency=res) for n in range(WORKERS // PER_NODE)]
    pools = [HbmPool(w, 24, versions, residency=res) for w in range(WORKERS)]
    workers = [
        SimpleNamespace(id=w, hbm=pools[w], dram=drams[w // PER_NODE], ssd=ssds[w // PER_NODE], active_requests=0, active_tokens=0,
                        waiting=[])
        for w in range(WORKERS)
    ]
    views = ClusterViews(16, frozenset({"match"}), None, None, res)
    views.attach(workers, [])  # type: ignore[arg-type]
    tiers = [*pools, *drams, *ssds]
    held: list[tuple[int, list[int]]] = []  # (worker, chain) the pools reference, to release or discard later
    for op, w, c, n in steps:
        before = [owned(t) for t in tiers]
        epochs = dict(res.epochs)
        pool = pools[w]
        if op == "insert" and c:
            fresh = [x for x in dict.fromkeys(c) if x not in pool.resident]
            if len(fresh) <= pool.reclaimable:
                pool.make_room(len(fresh))
                pool.insert(c)
                held.append((w, c))
        elif op == "release" and held:
            i, hc = held.pop()
            pools[i].release(hc)
        elif op == "discard" and held:
            i, hc = held.pop()
            pools[i].discard(hc)
        elif op == "evict":
            pool.evict(n)
        elif op == "put":
            drams[w // PER_NODE].put(c)
        after = [owned(t) for t in tiers]
        # holders: exactly the tiers holding some of each owner's chunks
        expect: dict[int, set[int]] = {}
        for t, o_chunks in zip(tiers, after):
            for o in o_chunks:
                expect.setdefault(o, set()).add(id(t))
        assert {o: {id(t) for t in ts} for o, ts in res.holders.items() if ts} == expect
        # an owner whose epoch stayed has the same chunks on every tier
        for o in set(epochs) | set(res.epochs) | set(expect):
            if res.epochs.get(o, 0) == epochs.get(o, 0):
                assert all(b.get(o) == a.get(o) for b, a in zip(before, after)), o
        owners = tuple(dict.fromkeys(x >> OWNER_SHIFT for x in c))
        assert views.matches(c, owners) == fresh_matches(workers, c)
        assert views.matches(c) == fresh_matches(workers, c)
