"""The ingress snapshot probes a worker's prefix match only when the policy reads that worker's load
(``ClusterViews.match_reader``): what the simulator then counts for the chosen worker
(``SimRequest.ingress_tokens``) must be what a fresh scan of its HBM pool gives at that moment."""

import pytest

from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.spec import load_workload


def checked_admissions(sim: Simulation) -> list[int]:
    """Check each admission's ``ingress_tokens`` against a fresh scan; returns the request ids checked."""
    assert sim.ingress is not None
    admitted = sim.ingress.admitted
    seen: list[int] = []

    def check(req, worker, tenant, now):
        pool = sim.workers[worker].hbm.resident
        run = 0
        while run < len(req.chain) and req.chain[run] in pool:
            run += 1
        assert req.ingress_tokens == req.orig_prompt_tokens - run * sim.C
        seen.append(req.rid)
        admitted(req, worker, tenant, now)

    sim.ingress.admitted = check
    return seen


@pytest.mark.parametrize(
    ("system", "ingress", "dram"),
    [("vllm", None, None), ("cachewise", None, None), ("coda", None, None), ("dynamo", None, True), ("smetric", "queue_limit", True)],
)
def test_the_chosen_workers_new_tokens_match_a_fresh_scan(system, ingress, dram):
    """Nine workers (two nodes of four sharing a DRAM store each, and one more): routers that read
    matches (coda, dynamo, smetric) leave them for the ingress to reuse, the others do not."""
    cfg = SimConfig(system=system, workers=9, dram=dram, **({"policies": {"ingress": ingress}} if ingress else {}))
    sim = Simulation(load_workload("synth:rate=6,duration=150,seed=4"), cfg)
    seen = checked_admissions(sim)
    sim.run()
    hits = [r for r in sim.requests if r.rid in set(seen) and r.ingress_tokens < r.orig_prompt_tokens]
    assert len(seen) > 50 and hits  # some requests found part of their prompt on the chosen worker


def test_a_match_read_after_the_residency_moved_is_refused():
    sim = Simulation(load_workload("synth:rate=6,duration=60,seed=1"), SimConfig(system="vllm", workers=4))
    sim.run()
    req = sim.requests[-1]
    match = sim.views.match_reader(req.chain, req.owners)
    match(0)
    sim.workers[0].hbm.insert(req.sess.fresh_ids(1))  # a chunk no request has: any change to any tier counts
    with pytest.raises(AssertionError, match="residency"):
        match(0)
