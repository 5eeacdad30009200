"""Load checks count what a request will newly occupy on a worker, not its whole prompt.

Agent prompts share long prefixes (the system prompt, the tool definitions, the session's earlier
rounds). Counting each in-flight prompt in full against the engine's KV capacity made a few of them
"fill" an engine that held them all in a fraction of its cache, and ``queue_limit`` then refused
every request while the engines sat nearly idle. These tests drive the gateway's own bookkeeping
(planning, the KV index, ``begin``) into that state.
"""

from __future__ import annotations

from coda.gateway.config import build_config
from coda.gateway.prompt import make_tokenizer
from coda.gateway.view import GatewayState, Ticket

C = 16  # tokens per block (the "words" tokenizer: one unit per token)
SEATS = 16
CAPACITY_BLOCKS = 400  # 6,400 tokens of KV
PREFIX_BLOCKS = 256  # a 4,096-token shared agent prefix: one prompt holds 64% of the cache


def gateway(policy: str = "queue_limit") -> GatewayState:
    cfg = build_config({"backends": [{"url": "http://127.0.0.1:1", "max_num_seqs": SEATS, "kv_capacity_tokens": CAPACITY_BLOCKS * C}],
                        "policies": {"ingress": policy}, "indexer": {"block_tokens": C}}, {}, {})
    s = GatewayState(cfg, make_tokenizer("words"), lambda: 0.0)
    w = s.workers[0]
    w.models, w.kv_capacity_tokens, w.scraped_at = {"m": {"id": "m"}}, CAPACITY_BLOCKS * C, 0.0
    return s


def agent_ticket(s: GatewayState, k: int, shared: bool = True) -> Ticket:
    """Agent ``k``'s prompt: the shared prefix (or one of its own as long), then two blocks of its own."""
    prefix = list(range(PREFIX_BLOCKS * C)) if shared else [10**6 * (k + 1) + i for i in range(PREFIX_BLOCKS * C)]
    units = prefix + [10**9 + k] * (2 * C)
    hashes = s.block_hashes(f"agent-{k}", units)
    return Ticket(
        s.next_rid(), "/v1/chat/completions", "t", f"agent-{k}", "m", len(units), 16, hashes, s.workers, s.match(hashes, s.workers)
    )


def fill(s: GatewayState, n: int, shared: bool = True) -> None:
    for k in range(n):
        t = agent_ticket(s, k, shared)
        d, _, _ = s.decide(t)
        assert d.action == "admit", (k, d)
        s.begin(t, s.workers[0])


def test_in_flight_agent_prompts_sharing_a_prefix_do_not_fill_an_engine_with_room():
    for policy in ("queue_limit", "session", "tenant_share"):
        s = gateway(policy)
        fill(s, SEATS - 1)  # 15 prompts of 4,128 tokens: 61,920 prompt tokens in flight beside 6,400 of KV
        w = s.workers[0]
        assert w.inflight_tokens == (SEATS - 1) * (PREFIX_BLOCKS + 2) * C
        assert w.inflight_new_tokens == (PREFIX_BLOCKS + 2 * (SEATS - 1)) * C  # the prefix once, then each agent's own blocks
        t = agent_ticket(s, SEATS)
        snap = s.ingress_snapshot(t)
        assert snap.workers[0].new_tokens == 2 * C
        assert s.decide(t)[0].action == "admit", policy


def test_prompts_that_share_nothing_still_fill_the_cache():
    s = gateway()
    fill(s, 1, shared=False)
    d, snap, _ = s.decide(agent_ticket(s, 1, shared=False))
    assert snap.workers[0].new_tokens == (PREFIX_BLOCKS + 2) * C
    assert (d.action, d.reason) == ("defer", "queue_full")  # 2 x 4,128 tokens do not fit in 6,400


def test_the_seat_limit_still_binds():
    s = gateway()
    fill(s, SEATS)
    assert s.decide(agent_ticket(s, SEATS))[0].action == "defer"


def test_a_finished_request_returns_what_it_counted():
    s = gateway()
    t = agent_ticket(s, 0)
    s.begin(t, s.workers[0])
    u = agent_ticket(s, 1)
    s.begin(u, s.workers[0])
    assert (t.new_tokens, u.new_tokens) == ((PREFIX_BLOCKS + 2) * C, 2 * C)
    s.end(t)
    s.end(u)
    assert s.workers[0].inflight_new_tokens == 0 and s.tenant_inflight == {}
