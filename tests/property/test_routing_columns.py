"""The simulator's routing snapshot places each view with its match as it is read and carries the
columns routers read of all of them (``coda.sim.views.RoutingViews``): the columns must say what the
views say, and a snapshot read after later decisions must still give the views of its own."""

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
        if req.rid % 7 == 0:
            fresh = taken(req)  # read per view only after the decisions that follow
            kept.append((fresh, views))
        return snap

    sim.routing_snapshot = check
    sim.run()
    assert len(kept) > 10
    assert all(snap.workers[i] == views[i] for snap, views in kept for i in range(len(views)))
    assert all(tuple(snap.workers) == views for snap, views in kept)
