"""The KV indexer against a brute-force scan, and incremental block hashing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coda.policy.snapshots import PrefixMatch
from coda.shell.kvindex import BlockHasher, KVIndexer, WorkerTiers
from coda.sim.observe import SimObserver

LOCS = ["hbm:0", "hbm:1", "hbm:2", "dram:0", "ssd:0"]
WORKERS = [WorkerTiers(0, "hbm:0", "dram:0", "ssd:0"), WorkerTiers(1, "hbm:1", "dram:0", "ssd:0"), WorkerTiers(2, "hbm:2")]

events_st = st.lists(
    st.tuples(st.sampled_from(["stored", "removed"]), st.sampled_from(LOCS), st.lists(st.integers(0, 30), max_size=12)), max_size=60
)


def brute(residency, chain, w: WorkerTiers) -> PrefixMatch:
    def lead(loc, start):
        n = 0
        for h in chain[start:]:
            if loc is None or h not in residency.get(loc, set()):
                break
            n += 1
        return n

    h = lead(w.hbm, 0)
    d = lead(w.dram, h)
    return PrefixMatch(h, d, lead(w.ssd, h + d))


@settings(max_examples=300)
@given(events=events_st, chain=st.lists(st.integers(0, 30), max_size=25), clear=st.sampled_from([None, *LOCS]))
def test_match_equals_a_brute_force_scan(events, chain, clear):
    idx = KVIndexer()
    residency: dict[str, set[int]] = {}
    for ev, loc, hashes in events:
        (idx.stored if ev == "stored" else idx.removed)(loc, hashes)
        s = residency.setdefault(loc, set())
        (s.update if ev == "stored" else s.difference_update)(hashes)
    if clear is not None:
        idx.cleared(clear)
        residency.pop(clear, None)
    got = idx.match(chain, WORKERS)
    for w in WORKERS:
        assert got[w.worker] == brute(residency, chain, w)
    for loc in LOCS:
        assert idx.blocks(loc) == len(residency.get(loc, ()))


def test_stale_locations_are_dropped_and_their_bits_reused():
    idx = KVIndexer(max_locations=2)
    idx.stored("hbm:0", [1, 2], now=0.0)
    idx.stored("hbm:1", [1], now=5.0)
    assert idx.evict_stale(now=12.0, max_age_s=10.0) == ["hbm:0"]
    assert idx.match([1, 2], [WorkerTiers(0, "hbm:0"), WorkerTiers(1, "hbm:1")]) == {0: PrefixMatch(), 1: PrefixMatch(1)}
    idx.stored("hbm:2", [1, 2], now=13.0)  # takes the freed bit
    assert idx.match([1, 2], [WorkerTiers(2, "hbm:2")])[2] == PrefixMatch(2)
    with pytest.raises(RuntimeError, match="max_locations"):
        idx.stored("hbm:3", [9])


def test_block_hasher_is_incremental_and_prefix_exact():
    toks = list(range(1000))
    a = BlockHasher(16)
    first = a.update(toks[:500])
    grown = a.update(toks)  # the agent loop: the old prompt plus new tokens
    assert grown[: len(first)] == first and len(grown) == 1000 // 16
    assert grown == BlockHasher(16).update(toks)
    edited = toks[:300] + [-1] + toks[301:]
    again = a.update(edited)  # an edit in block 18 changes that block and every later one
    assert again[:18] == grown[:18] and all(x != y for x, y in zip(again[18:], grown[18:]))
    assert BlockHasher(16, seed=1).update(toks)[0] != grown[0]  # a salt (e.g. per tenant) separates caches


def test_simulated_routing_is_identical_through_the_indexer():
    from coda.sim.cluster import Simulation
    from coda.sim.config import SimConfig
    from coda.workload.spec import load_workload

    wl = load_workload("synth:rate=4,duration=400,seed=5")

    class Obs(SimObserver):
        worker_fields = frozenset()

        def __init__(self):
            self.routes = []

        def on_step(self, *args):
            pass

        def on_route(self, snap, chosen):
            self.routes.append((chosen, tuple(w.match for w in snap.workers)))

    direct, indexed = Obs(), Obs()
    Simulation(wl, SimConfig(system="coda", workers=3), observers=[direct]).run()
    Simulation(wl, SimConfig(system="coda", workers=3, indexer=True), observers=[indexed]).run()
    assert direct.routes and direct.routes == indexed.routes
    assert any(m.hbm_blocks for _, ms in direct.routes for m in ms)


WIDE = [WorkerTiers(w, f"hbm:{w}", f"dram:{w // 4}", f"ssd:{w // 4}") for w in range(256)]
WIDE_LOCS = [loc for w in WIDE for loc in (w.hbm, w.dram, w.ssd)]


@settings(max_examples=100)
@given(
    events=st.lists(
        st.tuples(st.sampled_from(["stored", "removed"]), st.sampled_from(WIDE_LOCS), st.lists(st.integers(0, 20), max_size=10)),
        max_size=80,
    ),
    chain=st.lists(st.integers(0, 20), max_size=20),
)
def test_match_over_256_workers_and_their_stores_equals_a_brute_force_scan(events, chain):
    """320 locations: masks wider than one 64-bit word."""
    idx = KVIndexer(max_locations=3 * len(WIDE))
    for loc in WIDE_LOCS[::-1]:  # the last worker's locations get the low bits, the first worker's the highest
        idx.stored(loc, [])
    residency: dict[str, set[int]] = {}
    for ev, loc, hashes in events:
        (idx.stored if ev == "stored" else idx.removed)(loc, hashes)
        s = residency.setdefault(loc, set())
        (s.update if ev == "stored" else s.difference_update)(hashes)
    got = idx.match(chain, WIDE)
    assert [got[w.worker] for w in WIDE] == [brute(residency, chain, w) for w in WIDE]
