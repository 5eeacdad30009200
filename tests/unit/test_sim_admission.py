"""Engine admission inside the simulator: the starvation guard and shadow comparisons."""

from __future__ import annotations

from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.schema import Workload
from tests.conftest import make_session

CHUNK_GIB = 96 * 1024 * 64 / 2**30


def _big_and_smalls():
    smalls = [make_session(f"s{i}", 0.5 * i, [(640, 200, 0.0)]) for i in range(30)]
    big = make_session("big", 0.2, [(6400, 10, 0.0)])
    return Workload(sessions=[big, *smalls], meta={"duration_s": 100.0})


def _admissions(hold: bool, admission: str = "promote_one"):
    cfg = SimConfig(system="coda", workers=1, chunk_tokens=64, hbm_kv_gib=105 * CHUNK_GIB, warmup_s=0,
                    policies={"state": {"params": {"w_max_s": 2.0, "hold_queue": hold, "admission": admission}}})
    sim = Simulation(_big_and_smalls(), cfg)
    sim.run()
    recs = {r["session_id"]: r for r in (q.record() for q in sim.requests)}
    return recs


def test_hold_queue_admits_the_large_request_once_memory_drains():
    guarded = _admissions(True)
    big = guarded["big"]
    # it waits at most W_max plus the time the running small requests take to drain
    assert big["admitted_s"] - big["ready_s"] < 2.0 + 3.0
    late = [r for r in guarded.values() if r["session_id"] != "big" and r["ready_s"] > big["ready_s"] + 2.0]
    assert late and all(r["admitted_s"] >= big["admitted_s"] for r in late)


def test_without_holding_the_queue_small_requests_keep_bypassing_it():
    for admission in ("promote_one", "every_slot"):
        paper = _admissions(False, admission)
        big = paper["big"]
        last_small_ready = max(r["ready_s"] for r in paper.values() if r["session_id"] != "big")
        assert big["admitted_s"] > last_small_ready, admission  # bypassed by every small request


def test_promote_one_asks_the_policy_once_per_step_and_admits_the_rest_in_fcfs_order():
    """Three cached continuations and a cold request wait when a step has room for all: with
    promote_one the policy's choice goes first and the others follow in arrival order; with
    every_slot the policy orders them all."""
    from coda.policy.state import TieredAging

    class Counting(TieredAging):
        calls = 0

        def choose(self, snap):
            Counting.calls += 1
            return super().choose(snap)

    orders = {}
    for admission in ("promote_one", "every_slot"):
        wl = Workload(
            sessions=[make_session(f"s{i}", 0.0, [(n, 4, 0.0)]) for i, n in enumerate((3000, 600, 2000, 100))], meta={"duration_s": 10.0}
        )
        sim = Simulation(
            wl, SimConfig(system="coda", workers=1, chunk_tokens=64, warmup_s=0, policies={"state": {"params": {"admission": admission}}})
        )
        w = sim.workers[0]
        w.state_policy = Counting(sim.cost, admission=admission)
        Counting.calls = 0
        sim.run()
        orders[admission] = ([r.sess.session.session_id for r in sorted(sim.requests, key=lambda r: r.admit_seq)], Counting.calls)
    cheapest = "s3"  # 100 new tokens
    promote, asked = orders["promote_one"]
    assert promote[0] == cheapest and promote[1:] == ["s0", "s1", "s2"] and asked == 1
    every, asked_every = orders["every_slot"]
    assert every[0] == cheapest and asked_every == 4


def test_shadow_policy_counts_decisions_that_differ():
    wl = _big_and_smalls()
    cfg = SimConfig(
        system="coda",
        workers=1,
        chunk_tokens=64,
        hbm_kv_gib=105 * CHUNK_GIB,
        warmup_s=0,
        policies={"state": {"shadow": "fifo"}, "router": {"shadow": "round_robin"}},
    )
    res = Simulation(wl, cfg).run()
    sh = res.summary()["shadow"]
    assert sh["state"]["policy"] == "fifo" and sh["state"]["decisions"] >= len(wl.sessions)
    assert sh["state"]["differs"] > 0  # FIFO would have held the queue behind the large request
    assert sh["router"]["differs"] == 0  # one worker: every router agrees
    # the same system with FIFO in shadow of FIFO never differs
    same = Simulation(wl, cfg.with_overrides(system="vllm")).run().summary()["shadow"]["state"]
    assert same["differs"] == 0 and same["decisions"] > 0


def test_a_prefix_split_between_dram_and_ssd_is_restored_when_dram_is_full():
    """Without the CPU shadow, evicted chunks are copied to DRAM and DRAM's oldest spill to SSD. B's
    admission and then its decode growth evict 7 of A's 10 chunks, tail first, into a 6-chunk DRAM:
    3 stay in HBM, 6 in DRAM, A's last chunk on SSD. A's next round loads the SSD chunk into DRAM,
    which evicts DRAM's oldest: the DRAM part is taken first, so it stays."""
    a = make_session("a", 0.0, [(640, 5, 10.0), (64, 5, 0.0)])
    b = make_session("b", 1.0, [(1280, 10, 0.0)])
    cfg = SimConfig(
        system="vllm",
        workers=1,
        chunk_tokens=64,
        hbm_kv_gib=24.5 * CHUNK_GIB,
        dram_kv_gib=6.5 * CHUNK_GIB,
        ssd=True,
        cpu_shadow=False,
        warmup_s=0,
    )
    sim = Simulation(Workload(sessions=[a, b], meta={"duration_s": 20.0}), cfg)
    sim.run()
    resumed = next(r.record() for r in sim.requests if r.sess.session.session_id == "a" and r.round_idx == 1)
    assert resumed["state"] == "completed" and resumed["path"] == "ssd"
    assert (resumed["hbm_hit_tokens"], resumed["dram_hit_tokens"], resumed["ssd_hit_tokens"]) == (3 * 64, 6 * 64, 64)
