"""Routing views kept with a prefix run catch up with the workers rebuilt since the run was last
used, through the refresh log, or are placed again in full once the log has moved past them: with
the log cut short every few refreshes, every routing and ingress snapshot still equals a fresh
build (the simulator's default keeps thousands of entries, so a run of tests rarely reaches a cut)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.spec import load_workload
from tests.property.test_sim_invariants import check_snapshots


@settings(max_examples=6)
@given(log_max=st.integers(0, 12), seed=st.integers(0, 3))
@pytest.mark.parametrize("system", ["coda", "dynamo"])
def test_snapshots_equal_a_fresh_build_whatever_the_refresh_log_keeps(system, log_max, seed):
    sim = Simulation(load_workload(f"synth:rate=4,duration=90,seed={seed}"), SimConfig(system=system, workers=9, seed=seed))
    sim.views.log_max = log_max
    checked = check_snapshots(sim)
    sim.run()
    assert checked["route"] > 20 and sim.views._log_start > 0  # the log was cut, kept placements placed again
