"""The simulator's routing snapshot places each view with its match as it is read and carries the
columns routers read of all of them (``coda.sim.views.RoutingViews``): the columns must say what the
views say; views read within the decision stay the decision's; a match that would need a probe of
the tiers after they changed is refused rather than read from the wrong state."""

import numpy as np
import pytest

from coda.policy.routing import columns
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.spec import load_workload


@pytest.mark.parametrize(
    ("system", "tiers"),
    [("coda", {}), ("vllm", {}), ("cachewise", {}), ("dynamo", {"dram": True, "ssd": True}), ("smetric", {"indexer": True})],
)
def test_columns_match_the_views_and_a_snapshot_keeps_its_views(system, tiers):
    sim = Simulation(load_workload("synth:rate=6,duration=150,seed=4"), SimConfig(system=system, workers=9, **tiers))
    sim.views.columns_from = 1  # columns at every size (by default from 32 workers)
    taken = sim.routing_snapshot
    kept = []

    def check(req):
        snap = taken(req)
        views = tuple(snap.workers)
        cols = columns(snap)
        assert cols is not None
        assert np.array_equal(cols.active_requests, [w.active_requests for w in views])
        assert np.array_equal(cols.active_kv_blocks, [w.active_kv_blocks for w in views])
        assert np.array_equal(cols.hbm_blocks, [w.match.hbm_blocks for w in views])
        assert list(cols.decode_contexts) == [w.decode_contexts for w in views]
        if req.rid % 7 == 0:
            kept.append((snap, views))
        return snap

    sim.routing_snapshot = check
    sim.run()
    assert len(kept) > 10
    assert all(snap.workers[i] == views[i] for snap, views in kept for i in range(len(views)))


def test_small_clusters_get_a_tuple_of_views():
    sim = Simulation(load_workload("synth:rate=6,duration=60,seed=1"), SimConfig(system="coda", workers=4))
    sim.run()
    req = sim.requests[-1]
    assert type(sim.routing_snapshot(req).workers) is tuple


def test_a_match_probed_after_the_residency_moved_is_refused():
    sim = Simulation(load_workload("synth:rate=6,duration=150,seed=4"), SimConfig(system="coda", workers=9))
    sim.views.columns_from = 1
    sim.run()
    req = next(r for r in reversed(sim.requests) if r.chain and sim.views._parts(r.chain, r.owners).holders())
    snap = sim.routing_snapshot(req)
    holder = sim.views._parts(req.chain, req.owners).holders()[0]
    assert snap.workers[holder].match.hbm_blocks == columns(snap).hbm_blocks[holder]  # read within the decision
    again = sim.routing_snapshot(req)
    sim.workers[0].hbm.insert(req.sess.fresh_ids(1))  # a chunk no request has: any change to any tier counts
    assert again.workers[holder] == snap.workers[holder]  # probed already
    late = sim.routing_snapshot(req)
    sim.workers[0].hbm.insert(req.sess.fresh_ids(1))
    with pytest.raises(AssertionError, match="residency"):
        late.workers[holder]
