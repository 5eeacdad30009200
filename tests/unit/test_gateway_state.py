"""Invariants of the gateway's bookkeeping and admission: in-flight counts return to zero whatever
the order of events, every request ends with exactly one decision, the approximate index stays
bounded, routing snapshots carry what the routers read."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from coda.gateway.admission import Admission, JsonlLog
from coda.gateway.config import build_config
from coda.gateway.prometheus import GatewayMetrics
from coda.gateway.prompt import CharTokenizer
from coda.gateway.view import APPROX_BLOCKS_UNKNOWN, GatewayState, Ticket
from coda.serving.errors import ApiError
from coda.shell.sessions import SessionLedger
from tests.conftest import ManualClock

URLS = ["http://a:1", "http://b:2", "http://c:3"]



def make_state(clock: ManualClock | None = None, **cfg) -> GatewayState:
    s = GatewayState(build_config({"backends": URLS, **cfg}, {}, {}), CharTokenizer(), clock or ManualClock(0.0))
    for w in s.workers:
        w.models = {"m": {"id": "m"}}
        w.scraped_at = 0.0
    return s


def ticket(s: GatewayState, tenant: str, session: str | None, tokens: int) -> Ticket:
    units = list(range(tokens // 64))
    hashes = s.block_hashes(session, units)
    cands = s.serving("m")
    return Ticket(s.next_rid(), "/v1/chat/completions", tenant, session, "m", tokens, 16, hashes, cands,
                  s.match(hashes, cands))


ops = st.lists(st.tuples(st.sampled_from(["begin", "end", "fail", "pass"]), st.integers(0, 7), st.sampled_from(["a", "b"]),
                         st.integers(64, 5000)), max_size=60)


@given(ops)
def test_inflight_counts_return_to_zero(seq):
    s = make_state(telemetry={"eject_after": 2, "readmit_after": 1})
    open_tickets: dict[int, Ticket] = {}
    for op, k, tenant, tokens in seq:
        if op == "begin" and k not in open_tickets:
            t = ticket(s, tenant, f"s{k}", tokens)
            w, _ = s.route(t, set())
            assert w is not None
            s.begin(t, w)
            open_tickets[k] = t
        elif op == "end" and k in open_tickets:
            s.end(open_tickets.pop(k), ttft_s=0.01)
        elif op == "fail":
            s.failed(s.workers[k % 3])
        elif op == "pass":
            s.passed(s.workers[k % 3])
        assert sum(len(w.inflight) for w in s.workers) == len(open_tickets)
        assert (
            sum(s.tenant_inflight.values())
            == sum(w.inflight_new_tokens for w in s.workers)
            == sum(t.new_tokens for t in open_tickets.values())
        )
        assert all(0 <= t.new_tokens <= t.prompt_tokens for t in open_tickets.values())
    for t in open_tickets.values():
        s.end(t)
        s.end(t)  # idempotent
    assert all(not w.inflight and w.inflight_tokens == w.inflight_new_tokens == 0 for w in s.workers) and s.tenant_inflight == {}


def test_approx_index_is_bounded_and_routes_a_session_back():
    s = make_state(indexer={"approx_blocks_per_worker": 10, "block_tokens": 64})
    t = ticket(s, "a", "s1", 64 * 8)
    w, _ = s.route(t, set())
    s.begin(t, w)
    s.end(t, completed=True)
    t2 = ticket(s, "a", "s1", 64 * 12)  # the session's next, longer prompt
    assert t2.matches[w.id].hbm_blocks == 8
    snap = s.routing_snapshot(t2, set())
    assert snap.request.is_continuation and snap.request.prompt_blocks == 12
    assert s.route(t2, set())[0] is w
    for i in range(5):
        tt = ticket(s, "a", f"x{i}", 64 * 8)
        s.begin(tt, w)
        s.end(tt)
    assert s.indexer.blocks(w.tiers.hbm) <= 10
    assert s.route(t2, {w.id})[0] is not w  # a retry excludes the failed worker
    assert s.route(t2, {0, 1, 2})[0] is None


def test_without_a_configured_bound_the_approx_index_keeps_what_the_engine_holds():
    """An engine that says it holds 5 blocks is remembered with its 5 most recent blocks; one whose
    capacity is unknown keeps the assumed bound, and a configured bound stands over the engine's."""
    s = make_state(indexer={"block_tokens": 64})
    w, unknown = s.workers[0], s.workers[1]
    w.kv_capacity_tokens = 5 * 64
    assert (s.approx_blocks(w), s.approx_blocks(unknown)) == (5, APPROX_BLOCKS_UNKNOWN)
    cands = s.serving("m")
    prompts = [[1000 * i + u for u in range(4)] for i in range(3)]  # three prompts of 4 blocks each, none shared
    for i, units in enumerate(prompts):
        hashes = s.block_hashes(f"s{i}", units)
        t = Ticket(s.next_rid(), "/v1/chat/completions", "a", f"s{i}", "m", 64 * 4, 16, hashes, cands, s.match(hashes, cands))
        s.begin(t, w)
        s.end(t, completed=True)
    assert s.indexer.blocks(w.tiers.hbm) == 5
    last = s.block_hashes("s2", prompts[2])
    assert s.match(last, cands)[w.id].hbm_blocks == 4  # the last prompt is still there
    configured = make_state(indexer={"block_tokens": 64, "approx_blocks_per_worker": 7})
    configured.workers[0].kv_capacity_tokens = 5 * 64
    assert configured.approx_blocks(configured.workers[0]) == 7


def test_session_hash_state_stays_within_its_memory_budget_and_dropping_it_changes_no_hash():
    s = make_state(indexer={"session_cache_mib": 1, "block_tokens": 64})
    prompts = {f"s{i}": list(range(i, i + 20_000)) for i in range(40)}  # about 160 KiB of packed units each
    first = {sid: s.block_hashes(sid, units) for sid, units in prompts.items()}
    held = sum(x.hasher.nbytes for x in s.sessions.values())
    assert s.session_bytes == held <= 2**20 and len(s.sessions) < 40
    assert list(s.sessions)[-1] == "s39" and "s0" not in s.sessions  # least recently seen went first
    again = s.block_hashes("s0", prompts["s0"] + [7] * 64)
    assert again[: len(first["s0"])] == first["s0"] and len(again) > len(first["s0"])  # re-hashed in full, same names
    assert s.session_bytes == sum(x.hasher.nbytes for x in s.sessions.values()) <= 2**20


def test_idle_sessions_are_forgotten_after_the_session_ttl_and_slots_stay_bounded():
    clock = ManualClock(0.0)
    s = make_state(clock, policies={"ingress": {"name": "session", "params": {"idle_ttl_s": 10.0}}})
    for i in range(5):
        s.block_hashes(f"s{i}", list(range(100)))
        s.ledger.touch(f"s{i}", clock())
    clock.t = 8.0
    s.block_hashes("s4", list(range(120)))  # s4 is seen again
    s.ledger.touch("s4", clock())
    clock.t = 15.0
    s.expire_sessions()
    assert list(s.sessions) == ["s4"] and s.ledger.count(clock()) == 1
    assert s.session_bytes == s.sessions["s4"].hasher.nbytes
    clock.t = 30.0
    s.expire_sessions()
    assert not s.sessions and s.session_bytes == 0 and s.ledger.count(clock()) == 0
    small = SessionLedger(300.0, limit=3)
    for i in range(10):
        small.touch(f"x{i}", float(i))
    assert [sid for sid, _ in small.ages(10.0)] == ["x7", "x8", "x9"]  # the least recently admitted go first


def test_reads_scraped_only_when_a_decision_reads_engine_metrics():
    assert not make_state().reads_scraped  # admit_all and the coda router read no /metrics signal
    assert make_state(policies={"ingress": {"name": "queue_limit"}}).reads_scraped
    assert make_state(store={"url": "redis://127.0.0.1:1/0"}).reads_scraped  # replicas read the engine's own counts


def test_ejection_forgets_the_workers_blocks_and_stale_telemetry_counts_as_saturated():
    clock = ManualClock(0.0)
    s = make_state(clock, policies={"ingress": "queue_limit"}, telemetry={"eject_after": 1, "stale_after_s": 1.0, "stale": "saturated"})
    t = ticket(s, "a", "s", 640)
    w, _ = s.route(t, set())
    s.begin(t, w)
    s.end(t)
    assert s.indexer.blocks(w.tiers.hbm) > 0
    assert s.failed(w) and not w.healthy and s.indexer.blocks(w.tiers.hbm) == 0
    assert s.ingress_snapshot(t).workers[w.id].healthy is False
    clock.t = 5.0
    assert all(x.stale for x in s.ingress_snapshot(t).workers)
    assert s.decide(t)[0].action == "defer"
    for x in s.workers:
        x.scraped_at = 5.0
    assert s.decide(t)[0].action == "admit"


def test_with_last_value_old_telemetry_is_scraped_again_but_does_not_count_the_worker_full():
    clock = ManualClock(0.0)
    s = make_state(clock, policies={"ingress": "queue_limit"}, telemetry={"stale_after_s": 1.0, "stale": "last_value"})
    t = ticket(s, "a", "s", 640)
    clock.t = 5.0
    # a decision still asks for a scrape first (Telemetry.fresh), but decides on the last values
    assert all(s.needs_scrape(w, clock.t) for w in s.workers)
    assert not any(x.stale for x in s.ingress_snapshot(t).workers)
    assert s.decide(t)[0].action == "admit"
    # the last scraped values still bind: every engine queue last seen at max_waiting defers
    for w in s.workers:
        w.queue_depth = 4
    assert s.decide(t)[0].action == "defer"


def test_shadows_run_beside_the_enforced_policies_and_unknown_names_fail():
    from coda.errors import CodaError

    s = make_state(policies={"ingress": {"shadow": "session"}, "router": {"shadow": "dynamo_kv"}})
    assert s.ingress.shadow.name == "session" and s.router.shadow.name == "dynamo_kv"
    t = ticket(s, "a", "s", 640)
    d, _, shadow = s.decide(t)
    assert d.policy == "admit_all" and shadow.policy == "session"
    with pytest.raises(CodaError, match="unknown router 'nope'; valid: "):
        make_state(policies={"router": {"shadow": "nope"}})


@settings(max_examples=30)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["a", "b"])), min_size=1, max_size=25), st.lists(st.integers(0, 3), max_size=10)
)
def test_every_request_ends_with_exactly_one_decision(arrivals, queue_changes):
    """Requests arrive while engine queues change; each is admitted or refused exactly once, and
    the gateway's queue of deferred requests empties."""

    async def run() -> None:
        s = make_state(
            policies={
                "ingress": {
                    "name": "queue_limit+tenant_share",
                    "params": {"queue_limit": {"max_waiting": 2}},
                    "defer": {"max_wait_s": 0.05, "max_queue": 5},
                }
            }
        )
        metrics = GatewayMetrics()
        adm = Admission(s, metrics, JsonlLog(None))
        outcomes: list[str] = []

        async def one(q: int, tenant: str) -> None:
            for w in s.workers:
                w.queue_depth = q
            t = ticket(s, tenant, None, 640)
            try:
                await adm.admit(t)
                outcomes.append("admit")
                w, _ = s.route(t, set())
                s.begin(t, w)
                await asyncio.sleep(0)
                s.end(t)
                adm.kick()
            except ApiError as err:
                assert err.status in (503, 429, 529) and err.retry_after_s > 0
                outcomes.append(str(err.status))

        async def churn() -> None:
            for q in queue_changes:
                await asyncio.sleep(0.01)
                for w in s.workers:
                    w.queue_depth = q
                adm.kick()

        await asyncio.gather(churn(), *(one(q, tenant) for q, tenant in arrivals))
        total = sum(s_.value for fam in metrics.decisions.collect() for s_ in fam.samples if s_.name.endswith("_total"))
        assert len(outcomes) == len(arrivals) == total
        assert s.queued == 0 and s.inflight_total() == 0

    asyncio.run(run())


@given(st.lists(st.text(min_size=1, max_size=16), min_size=1, max_size=20, unique=True))
def test_replicas_agree_on_a_session_s_home_whatever_order_they_list_the_backends_in(sessions):
    store = {"url": "redis://127.0.0.1:6379/0"}
    one, other = (
        make_state(store=store),
        GatewayState(build_config({"backends": URLS[::-1], "store": store}, {}, {}), CharTokenizer(), ManualClock(0.0)),
    )
    for w in other.workers:
        w.models = {"m": {"id": "m"}}
    for sid in sessions:
        a, b = ticket(one, "a", sid, 640), ticket(other, "a", sid, 640)
        home_a, home_b = one.routing_snapshot(a, set()).request.home_worker, other.routing_snapshot(b, set()).request.home_worker
        assert one.workers[home_a].label == other.workers[home_b].label
        assert one.route(a, set())[0].label == one.workers[home_a].label  # the router sends it there
    assert (
        make_state().routing_snapshot(ticket(make_state(), "a", "s", 640), set()).request.home_worker is None
    )  # one replica: its own index


def replica_admission(rid: str, store, clock: ManualClock, urls: list[str], policies: dict) -> Admission:
    """One replica (its own state, one seat per worker) deciding through ``store``."""
    from coda.gateway.replica import Replica

    cfg = {
        "backends": [{"url": u, "max_num_seqs": 1} for u in urls],
        "store": {"url": "redis://127.0.0.1:6379/0", "replica_id": rid},
        "policies": policies,
    }
    s = GatewayState(build_config(cfg, {}, {}), CharTokenizer(), clock)
    for w in s.workers:
        w.models = {"m": {"id": "m"}}
        w.scraped_at = 0.0
    metrics = GatewayMetrics()
    return Admission(s, metrics, JsonlLog(None), Replica(s, store, metrics))


def test_replicas_on_one_store_take_seats_as_one():
    """Two replicas deciding in turn on one store: each sees the other's requests, so the three
    seats (one per worker) are given once, not once per replica."""
    from coda.gateway.store import LocalStore
    from coda.shell.sessions import SessionLedger

    async def run() -> list[str]:
        clock = ManualClock(0.0)
        store = LocalStore(SessionLedger(300.0), clock, 10.0)
        policies = {"ingress": {"name": "queue_limit", "defer": {"max_wait_s": 0}}}
        admissions = [replica_admission(rid, store, clock, URLS, policies) for rid in ("a", "b")]
        outcomes = []
        for i in range(6):
            adm = admissions[i % 2]
            t = ticket(adm.state, "a", None, 640)
            try:
                await adm.admit(t)
            except ApiError as err:
                outcomes.append(err.code)
                continue
            assert t.plan is not None
            adm.state.begin(t, t.plan[0])  # where the gateway sends it (its first attempt goes to the planned worker)
            outcomes.append("admit")
        for adm in admissions[::-1]:  # b's table drops the refused request it counted while deciding; then a reads it
            await adm.replica.publish()
        assert sum(v for k, v in admissions[0].state.others.items() if k.startswith("n|")) == sum(
            len(w.inflight) for w in admissions[1].state.workers
        )
        return outcomes

    assert asyncio.run(run()) == ["admit"] * 3 + ["queue_full"] * 3


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://127.0.0.1:6379", "must start with redis://"),
        ("redis://h:port/0", "Port could not be cast"),
        ("redis://h:6379/0?socket_timeout=9", "no query parameters"),
    ],
)
def test_a_malformed_store_url_is_one_line_naming_the_field(url, why):
    from coda.errors import CodaError

    with pytest.raises(CodaError, match=f"store.url: .*{why}") as exc:
        build_config({"backends": URLS, "store": {"url": url}}, {}, {})
    assert "\n" not in str(exc.value)


def test_with_a_shared_store_a_worker_s_load_is_at_least_what_its_engine_runs_and_queues():
    """The other replicas' requests count even when no table says so (the store away): through the
    engine's fresh /metrics; a stale scrape is not trusted, and one replica alone counts its own."""
    clock = ManualClock(0.0)
    shared = make_state(clock, store={"url": "redis://127.0.0.1:6379/0"}, telemetry={"stale_after_s": 1.0})
    alone = make_state(clock)
    for s in (shared, alone):
        s.workers[0].running, s.workers[0].queue_depth = 3, 1
    t = ticket(shared, "a", None, 640)
    assert shared.ingress_snapshot(t).workers[0].inflight_requests == 4
    assert shared.routing_snapshot(t, set()).workers[0].active_requests == 4
    assert alone.ingress_snapshot(ticket(alone, "a", None, 640)).workers[0].inflight_requests == 0
    shared.others = {f"n|{shared.workers[0].label}": 6.0}  # the tables say more: they stand
    assert shared.ingress_snapshot(t).workers[0].inflight_requests == 6
    shared.others = {}
    clock.t = 5.0  # the scrape is stale now
    assert shared.ingress_snapshot(t).workers[0].inflight_requests == 0


class Yielding:
    """A store whose every step gives the event loop away first, ``pauses`` times (drawn), so the
    replicas' decisions interleave as they would over a network."""

    def __init__(self, inner, pauses) -> None:
        self.inner, self.pauses, self.kind = inner, pauses, "redis"

    async def _pause(self) -> None:
        for _ in range(next(self.pauses)):
            await asyncio.sleep(0)

    async def sync(self, *args):
        await self._pause()
        got = await self.inner.sync(*args)
        await self._pause()
        return got

    async def settle(self, *args):
        await self._pause()
        return await self.inner.settle(*args)


@settings(max_examples=100)
@given(
    st.lists(st.integers(0, 3), min_size=8, max_size=8),
    st.lists(st.tuples(st.integers(0, 2), st.sampled_from([None, "s0", "s1", "s2"])), min_size=1, max_size=12),
)
# s0's first request through two replicas at once: the later claim's refusal once ended the earlier claim, so s1 took a second slot
@example([0, 0, 1, 0, 0, 0, 0, 0], [(0, "s0"), (1, "s0"), (1, "s1")])
def test_replicas_deciding_at_once_never_give_more_seats_or_session_slots_than_there_are(pause_cycle, arrivals):
    """Three replicas on one store, their store steps interleaved in any order: however the
    requests arrive, no more requests run than the workers have seats, and no more sessions hold a
    slot than ``max_sessions``."""
    import itertools

    from coda.gateway.store import LocalStore
    from coda.shell.sessions import SessionLedger

    async def run() -> None:
        clock = ManualClock(0.0)
        ledger = SessionLedger(300.0)
        store = Yielding(LocalStore(ledger, clock, 10.0), itertools.cycle(pause_cycle))
        policies = {
            "router": "least_loaded",
            "ingress": {"name": "queue_limit+session", "params": {"session": {"max_sessions": 1}}, "defer": {"max_wait_s": 0}},
        }
        admissions = [replica_admission(rid, store, clock, URLS[:2], policies) for rid in ("a", "b", "c")]
        admitted: list[Ticket] = []

        async def one(replica: int, session: str | None) -> None:
            adm = admissions[replica]
            t = ticket(adm.state, "a", session, 640)
            try:
                await adm.admit(t)
            except ApiError:
                return
            assert t.plan is not None
            adm.state.begin(t, t.plan[0])
            admitted.append(t)

        await asyncio.gather(*(one(r, sid) for r, sid in arrivals))
        assert 1 <= len(admitted) <= 2  # two workers, one seat each
        assert all(w.inflight_peak <= 1 for adm in admissions for w in adm.state.workers)  # as each replica counted them
        assert len({t.session_id for t in admitted} - {None}) <= 1  # one session slot
        assert ledger.count(clock()) <= 1  # and the claims of refused sessions were dropped

    asyncio.run(run())


def test_the_store_url_comes_from_the_environment_too():
    cfg = build_config(
        {"backends": URLS}, {}, {"CODA_SERVE_STORE__URL": "redis://redis:6379/0", "CODA_SERVE_STORE__ON_UNREACHABLE": "closed"}
    )
    assert (cfg.store.url, cfg.store.on_unreachable, cfg.store.publish_interval_s) == ("redis://redis:6379/0", "closed", 0.5)
