import pytest

from coda.sim.kvcache import OWNER_SHIFT, HbmPool, KVStore, Versions


def _pool(cap=10):
    v = Versions()
    for _ in range(3):
        v.new_owner()
    return HbmPool(0, cap, v), v


def ids(owner, *idx):
    return [(owner << OWNER_SHIFT) | i for i in idx]


def test_release_puts_tail_first_in_lru_and_evict_takes_it_first():
    pool, _ = _pool()
    chain = ids(1, 0, 1, 2, 3)
    pool.insert(chain)
    pool.release(chain)
    assert pool.evict(2) == ids(1, 3, 2)  # the tail goes first; the prefix survives
    assert pool.leading_hits(chain) == (2, 2)


def test_shared_chunks_are_refcounted_and_not_evicted_while_used():
    pool, _ = _pool()
    group = ids(0, 0, 1)
    pool.insert(group)
    pool.acquire(group)  # a second request shares the group prefix
    pool.release(group)
    assert pool.evict(5) == []  # still referenced once
    pool.release(group)
    assert pool.reclaimable == 10
    assert sorted(pool.evict(5)) == sorted(group)


def test_versions_change_with_residency_of_the_owner():
    pool, v = _pool()
    before = list(v.v)
    pool.insert(ids(2, 0))
    assert v.v[2] == before[2] + 1 and v.v[1] == before[1]


def test_capacity_is_enforced():
    pool, _ = _pool(cap=2)
    pool.insert(ids(1, 0, 1))
    with pytest.raises(AssertionError, match="over capacity"):
        pool.insert(ids(1, 2))


def test_store_spills_lru_to_lower_tier():
    v = Versions()
    v.new_owner()
    ssd = KVStore("ssd", 0, 10, v)
    dram = KVStore("dram", 0, 2, v, lower=ssd)
    dram.put([1, 2])
    dram.touch([1])
    dram.put([3])
    assert list(dram.chunks) == [1, 3] and 2 in ssd
    assert dram.leading([1, 3, 2], 0) == 2 and ssd.leading([1, 3, 2], 2) == 1
