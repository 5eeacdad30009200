"""One engine state, three shells, equal snapshots.

The state is scripted once (two workers, 16-token blocks, 100 blocks of KV each):

- worker 0 decodes request A (160-token prompt, 20 tokens generated: context 180, 12 blocks held)
  and holds request B waiting (sent 3 s ago, no output yet; 64-token prompt, its first block cached
  and idle, the second in the node's DRAM store and the third on its SSD);
- worker 1 decodes request C (320-token prompt, 5 generated: context 325, 21 blocks held) and holds
  the first 10 blocks of the arriving request's prompt, cached and idle;
- the arriving request R: 400 tokens of a session with a completed earlier round, tenant ``t``
  (deadline 1 s), with A, B and C in flight (none of them found its prompt resident when sent, so
  each newly occupies its whole prompt); the workers' first-token estimates are 0.2 and 0.3 s.

Each shell is put in that state through its own inputs (the simulator's workers and KV pools; the
gateway's in-flight tickets, relayed tokens, KV index and scraped telemetry; vLLM's request list and
prefix-cache hits) and must build the same routing, ingress and admission snapshots.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from coda.gateway.config import build_config
from coda.gateway.prompt import make_tokenizer
from coda.gateway.telemetry import apply_metrics, parse_metrics
from coda.gateway.view import GatewayState, Ticket
from coda.gateway.view import Session as GatewaySession
from coda.integrations.vllm.snapshot import Hits, admission_snapshot
from coda.shell.kvindex import BlockHasher
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sim.request import RUNNING, SimRequest
from coda.workload.schema import Round, Session, Workload
from tests.conftest import ManualClock

C = 16
NOW = 50.0
DEADLINE_MS = 1000.0
TTFT = [0.2, 0.3]



def sim_state() -> tuple[Simulation, SimRequest]:
    rounds = [Round(new_input_tokens=384, output_tokens=8, kind="user"), Round(new_input_tokens=16, output_tokens=8)]
    wl = Workload(sessions=[Session(session_id="s1", start_s=0.0, rounds=rounds, tenant="t")], meta={"duration_s": 100.0})
    cfg = SimConfig(system="coda", workers=2, chunk_tokens=C, dram=True, ssd=True, warmup_s=0, policies={"ingress": "deadline+session"},
                    tenants={"t": {"deadline_ms": DEADLINE_MS}})
    sim = Simulation(wl, cfg)
    assert sim.tiers.hbm_chunks >= 100
    for w in sim.workers:  # 100 blocks each, as the gateway's telemetry below says
        w.hbm.capacity = 100
    sim.loop.now = NOW
    sess = sim.sessions[0]

    def request(rid: int, prompt: int, generated: int, worker: int, decoding: bool, sent_s: float = NOW) -> SimRequest:
        r = SimRequest(rid, sess, 1, "tool_followup", 10.0 + rid)
        r.prompt_tokens = r.orig_prompt_tokens = prompt
        r.emitted = generated
        r.chain = [(sess.owner << 32) | (1000 * (rid + 1) + j) for j in range(prompt // C)]
        r.owners = (sess.owner,)
        w = sim.workers[worker]
        w.enqueue(r)
        r.ingress_tokens = prompt  # nothing of it was resident when it was sent
        sim.ingress.admitted(r, worker, "t", sent_s)
        if decoding:
            sim.ingress.answered(r)
            w.waiting.remove(r)
            w.running.append(r)
            r.state = RUNNING
            r.computed = prompt + generated - 1
            held = -(-(prompt + generated) // C)
            w.hbm.insert(r.chain)
            r.held, r.private = len(r.chain), held - len(r.chain)
            w.hbm.private += r.private
        return r

    request(1, 160, 20, 0, decoding=True)  # A
    b = request(0, 64, 0, 0, decoding=False, sent_s=NOW - 3)  # B: id 0, its position in vLLM's queue below
    sim.workers[0].hbm.insert(b.chain[:1])
    sim.workers[0].hbm.release(b.chain[:1])  # cached and idle
    sim.workers[0].dram.put(b.chain[1:2])
    sim.workers[0].ssd.put(b.chain[2:3])
    request(2, 320, 5, 1, decoding=True)  # C
    arriving = SimRequest(3, sess, 1, "tool_followup", NOW)
    arriving.prompt_tokens = arriving.orig_prompt_tokens = 400
    arriving.chain = [(sess.owner << 32) | (9000 + j) for j in range(400 // C)]
    arriving.owners = (sess.owner,)
    sim.workers[1].hbm.insert(arriving.chain[:10])
    sim.workers[1].hbm.release(arriving.chain[:10])
    sim.ttft_estimates = list(TTFT)
    sim.ingress.ledger.touch("s1", NOW)
    return sim, arriving


def gateway_state(sim: Simulation) -> tuple[GatewayState, Ticket]:
    seats = sim.config.max_num_seqs  # the engines' --max-num-seqs, which vLLM does not publish: the gateway's config says it
    cfg = build_config({"backends": [{"url": f"http://127.0.0.1:{i}", "max_num_seqs": seats} for i in (1, 2)], "system": "coda",
                        "policies": {"ingress": "deadline+session"},
                        "tenants": {"t": {"deadline_ms": DEADLINE_MS}}, "indexer": {"block_tokens": C}}, {}, {})
    clock = ManualClock(NOW)
    s = GatewayState(cfg, make_tokenizer("words"), clock)  # one unit per token, so 16-token blocks
    for w, kv, ttft in zip(s.workers, (12 / 100, 21 / 100), TTFT):  # scraped telemetry: what vLLM's /metrics says
        w.models = {"m": {"id": "m"}}
        apply_metrics(w, parse_metrics(f'vllm:kv_cache_usage_perc{{engine="0"}} {kv}\n'
                                       f'vllm:cache_config_info{{block_size="{C}",num_gpu_blocks="100",engine="0"}} 1.0\n'), NOW)
        w.ttft_s = ttft
    s.workers[0].queue_depth = 1  # B waits in engine 0's queue

    def send(prompt: int, worker: int, generated: int | None) -> Ticket:
        t = Ticket(s.next_rid(), "/v1/completions", "t", None, "m", prompt, 16, [], list(s.workers), {})
        s.begin(t, s.workers[worker])
        if generated is not None:
            s.answered(t)
            s.streamed(t, generated)
        return t

    send(160, 0, 20)  # A, decoding
    clock.t = NOW - 3
    send(64, 0, None)  # B, no byte back yet
    clock.t = NOW
    send(320, 1, 5)  # C, decoding
    hashes = list(range(400 // C))
    s.indexer.stored(s.workers[1].tiers.hbm, hashes[:10])  # what worker 1's KV events announced
    s.sessions["s1"] = GatewaySession(BlockHasher(C), seen_s=NOW, completed_rounds=1)
    s.ledger.touch("s1", NOW)
    t = Ticket(sim._route_seq, "/v1/completions", "t", "s1", "m", 400, 16, hashes, list(s.workers), s.match(hashes, s.workers),
               deadline_s=DEADLINE_MS / 1000)
    return s, t


@pytest.fixture(scope="module")
def shells():
    sim, req = sim_state()
    gw, ticket = gateway_state(sim)
    return sim, req, gw, ticket


def test_routing_snapshots_are_equal(shells):
    sim, req, gw, ticket = shells
    a, b = sim.routing_snapshot(req), gw.routing_snapshot(ticket, set())
    assert a == b
    assert a.workers[0].decode_contexts == (180,) and a.workers[0].active_requests == 2
    assert a.workers[0].active_kv_blocks == (160 + 20 + 64) // C
    assert a.workers[1].match.hbm_blocks == 10 and a.request.is_continuation


def test_ingress_snapshots_are_equal(shells):
    sim, req, gw, ticket = shells
    a, b = sim.ingress_snapshot(req), gw.ingress_snapshot(ticket)
    assert a == b
    assert a.prefix_hit == 0.0  # neither policy reads it, so neither shell computes it
    assert [w.queue_age_s for w in a.workers] == [3.0, 0.0] and a.session_deferred_s == 0.0  # B has waited 3 s for its first output
    assert a.deadline_slack_s == pytest.approx(1.0 - 0.2) and a.session_active and a.active_sessions == 1
    assert [w.kv_usage for w in a.workers] == [0.12, 0.21] and [w.inflight_tokens for w in a.workers] == [160 + 64, 320]
    # what R would newly occupy: its whole prompt on worker 0, all but the 10 blocks worker 1 holds in HBM there
    assert [w.new_tokens for w in a.workers] == [400, 400 - 10 * C] and a.tenant_inflight_tokens == 160 + 64 + 320
    assert [(w.max_num_seqs, w.kv_capacity_tokens) for w in a.workers] == [(256, 100 * C)] * 2  # the engines' limits


def test_admission_snapshots_of_the_simulator_and_the_vllm_plugin_are_equal(shells):
    sim, *_ = shells
    w = sim.workers[0]
    b = w.waiting[0]
    vllm_request = SimpleNamespace(request_id="b", arrival_time=b.arrived_s, num_tokens=b.prompt_tokens)
    # vLLM's free queue holds free blocks and idle cached ones; B's first block is cached and idle;
    # the KV connector's side-effect-free lookup finds the next block in DRAM and the one after on SSD
    free = w.hbm.reclaimable
    from_vllm = admission_snapshot(NOW, [vllm_request], lambda r: Hits(hbm_tokens=C, idle_blocks=1, dram_tokens=C, ssd_tokens=C), C, free)
    from_sim = w.snapshot()
    assert from_sim == from_vllm
    row = from_sim.rows()[0]
    # 4 blocks for the 64-token prompt (as vLLM, the first output's slot comes with the first decode step), 1 of them
    # hit in HBM (the tiers' hits need blocks too, to load into); 88 = 100 - A's 12 held (B's idle one counts as free)
    assert row.hbm_tokens == 16 and row.dram_tokens == 16 and row.ssd_tokens == 16 and row.extra_blocks == 3 and row.fits
    assert from_sim.free_blocks == 88
