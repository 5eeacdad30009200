import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.errors import CodaError
from coda.policy.routing import ContextCompatible, DynamoKV, LeastLoaded, RoundRobin, SMetric, context_distance, rendezvous
from coda.policy.snapshots import PrefixMatch, RouteRequest, RoutingSnapshot, WorkerView
from coda.shell.build import make_policy


def snap(workers, *, cont=True, prompt_blocks=10, prompt=None, seq=0):
    req = RouteRequest(
        seq=seq, session_id="s", is_continuation=cont, prompt_tokens=prompt or prompt_blocks * 256, prompt_blocks=prompt_blocks
    )
    return RoutingSnapshot(0.0, req, tuple(workers))


def W(i, load=0, kv=0, hbm=0, dram=0, ssd=0, ctx=(), healthy=True):
    return WorkerView(
        worker_id=i,
        active_requests=load,
        active_kv_blocks=kv,
        waiting_requests=0,
        decode_contexts=tuple(ctx),
        match=PrefixMatch(hbm, dram, ssd),
        healthy=healthy,
    )


def test_dynamo_worked_example_second_worker_wins():
    # overlaps 8/10, 6/10, 2/10, 0/10 with decode loads 12, 4, 3, 1: costs 14, 8, 11, 11
    ws = [W(0, kv=12, hbm=8), W(1, kv=4, hbm=6), W(2, kv=3, hbm=2), W(3, kv=1, hbm=0)]
    r = DynamoKV(weight=1.0)
    assert [r.cost(w, 10) for w in ws] == [14, 8, 11, 11]
    assert r.route(snap(ws)) == 1


def test_dynamo_credits_host_and_disk_hits_partially():
    r = DynamoKV()
    assert r.cost(W(0, dram=8), 10) == pytest.approx(10 - 6)
    assert r.cost(W(0, ssd=8), 10) == pytest.approx(10 - 2)


def test_dynamo_softmax_is_seeded_by_request():
    ws = [W(0, kv=5), W(1, kv=6)]
    r = DynamoKV(temperature=2.0)
    picks = [r.route(snap(ws, seq=i)) for i in range(400)]
    assert picks == [r.route(snap(ws, seq=i)) for i in range(400)]  # a pure function of the snapshot
    # the exact draws of seeds 0..399 (Python's seeded random.Random): 262 of 400 pick the cheaper
    # worker, near its softmax share exp(-0)/(1+exp(-0.5)) = 0.62
    assert picks[:8] == [1, 0, 1, 0, 0, 1, 1, 0] and picks.count(0) == 262
    assert DynamoKV(temperature=2.0, seed=1).route(snap(ws, seq=0)) == 0  # the router's seed moves the draws


@given(seq=st.integers(0, 2**31), temperature=st.floats(0.01, 100.0), seed=st.integers(0, 1000))
def test_dynamo_softmax_never_picks_a_worker_costlier_by_far_more_than_its_temperature(seq, temperature, seed):
    """Its softmax weight, below exp(-40), vanishes in double precision when added to the weight 1 of
    the cheapest worker before it, so no draw of any seed can land on it."""
    ws = [W(0, kv=7), W(1, kv=7 + round(40 * temperature) + 1), W(2, kv=7)]
    assert DynamoKV(temperature=temperature, seed=seed).route(snap(ws, seq=seq)) in (0, 2)


def test_smetric_affinity_and_guard():
    r = SMetric(slack=2, ratio=0.0)
    holder_ok = [W(0, load=3, hbm=40), W(1, load=1), W(2, load=2)]
    assert r.route(snap(holder_ok)) == 0
    holder_busy = [W(0, load=4, hbm=40), W(1, load=1), W(2, load=2)]
    assert r.route(snap(holder_busy)) == 1  # over the bound: least loaded
    assert r.route(snap(holder_ok, cont=False)) == 1  # first request of a session
    assert r.route(snap([W(0, load=1), W(1, load=0)])) == 1  # no hit anywhere


def test_coda_sends_48k_arrival_to_the_closest_decoders():
    ws = [
        W(0, load=3, ctx=(2_000, 3_000, 4_000)),
        W(1, load=3, ctx=(40_000, 52_000, 60_000)),
        W(2, load=2, ctx=(8_000, 9_000)),
        W(3, load=5, ctx=(48_000,)),  # closest but two above the minimum load
    ]
    s = snap(ws, cont=False, prompt=48_000)
    assert ContextCompatible().route(s) == 1
    assert SMetric().route(s) == 2  # the parent would have taken the least loaded
    assert context_distance((48_000,), 48_000) == 0


def test_coda_falls_back_without_telemetry_and_keeps_affinity():
    no_tel = [W(0, load=1, ctx=(10_000,)), W(1, load=1)]
    assert ContextCompatible().route(snap(no_tel, cont=False, prompt=10_000)) == SMetric().route(snap(no_tel, cont=False))
    aff = [W(0, load=1, hbm=20, ctx=(1_000,)), W(1, load=1, ctx=(50_000,))]
    assert ContextCompatible().route(snap(aff, prompt=50_000)) == 0


def test_unhealthy_workers_are_skipped():
    ws = [W(0, load=0, healthy=False), W(1, load=5), W(2, load=4)]
    for r in (RoundRobin(), LeastLoaded(), SMetric(), DynamoKV(), ContextCompatible()):
        assert r.route(snap(ws, seq=0)) in (1, 2)


def test_registry_params_are_validated():
    assert make_policy("router", "smetric", {"slack": 5}).slack == 5
    with pytest.raises(CodaError, match="unknown parameter"):
        make_policy("router", "dynamo_kv", {"wieght": 2})
    with pytest.raises(CodaError, match="must be a number"):
        make_policy("router", "dynamo_kv", {"weight": "heavy"})
    with pytest.raises(CodaError, match="valid: "):
        make_policy("router", "nope")


workers_st = st.lists(
    st.builds(
        W,
        i=st.just(0),
        load=st.integers(0, 20),
        kv=st.integers(0, 500),
        hbm=st.integers(0, 40),
        dram=st.integers(0, 40),
        ssd=st.integers(0, 40),
        ctx=st.lists(st.integers(1, 200_000), max_size=6),
        healthy=st.booleans(),
    ),
    min_size=1,
    max_size=8,
).map(lambda ws: [WorkerView(i, w.active_requests, w.active_kv_blocks, 0, w.decode_contexts, w.match, w.healthy) for i, w in enumerate(ws)])


@given(ws=workers_st, cont=st.booleans(), seq=st.integers(0, 100), arrival=st.integers(1, 200_000))
def test_routers_stay_in_the_candidate_set_and_coda_respects_affinity(ws, cont, seq, arrival):
    s = snap(ws, cont=cont, seq=seq, prompt=arrival)
    healthy = {w.worker_id for w in ws if w.healthy} or {w.worker_id for w in ws}
    for r in (RoundRobin(), LeastLoaded(), SMetric(), DynamoKV(), DynamoKV(temperature=1.0), ContextCompatible()):
        assert r.route(s) in healthy
    chosen = SMetric().affinity(s)
    if chosen is not None:
        assert ContextCompatible().route(s) == chosen.worker_id


def test_the_coda_rule_skips_idle_load_eligible_workers_and_falls_back_only_when_none_decodes():
    """The paper's fallback: the parent's choice stands only when no load-eligible worker has an
    active decode population; an idle eligible worker is skipped, not a reason to fall back."""
    ws = [W(0, load=1, ctx=(40_000,)), W(1, load=1, ctx=()), W(2, load=1, ctx=(3_000,))]
    s = snap(ws, cont=False, prompt=3_200)
    assert ContextCompatible().route(s) == 2 and ContextCompatible().explain(s).rule == "context compatible"
    strict = ContextCompatible(idle_near_worker="fall_back")
    assert strict.explain(s).rule.startswith("least loaded") and strict.route(s) == SMetric().route(s)
    idle = [W(0, load=1), W(1, load=1)]
    assert ContextCompatible().explain(snap(idle, cont=False)).rule == "least loaded (no eligible worker decoding)"


names_st = st.lists(st.text(st.characters(codec="utf-8"), min_size=1, max_size=12), min_size=1, max_size=8, unique=True)


@given(names=names_st, key=st.text(max_size=20), order=st.randoms(use_true_random=False))
def test_rendezvous_agrees_whatever_order_each_replica_lists_the_workers_in(names, key, order):
    shuffled = list(names)
    order.shuffle(shuffled)
    assert names[rendezvous(key, names)] == shuffled[rendezvous(key, shuffled)]


@given(names=names_st.filter(lambda n: len(n) > 1), keys=st.lists(st.text(max_size=20), max_size=40), gone=st.integers(0, 7))
def test_rendezvous_moves_only_the_keys_of_a_worker_that_leaves(names, keys, gone):
    left = names[gone % len(names)]
    rest = [n for n in names if n != left]
    for k in keys:
        before, after = names[rendezvous(k, names)], rest[rendezvous(k, rest)]
        assert after == before or before == left


def home_snap(workers, home, cont=False):
    req = RouteRequest(seq=0, session_id="s", is_continuation=cont, prompt_tokens=2560, prompt_blocks=10, home_worker=home)
    return RoutingSnapshot(0.0, req, tuple(workers))


@pytest.mark.parametrize("router", [SMetric(), ContextCompatible()])
def test_a_session_goes_to_its_home_worker_within_the_load_bound_and_a_prefix_hit_comes_first(router):
    assert router.route(home_snap([W(0, load=1), W(1, load=2)], home=1)) == 1  # its first request too: every replica agrees
    assert router.route(home_snap([W(0, load=0), W(1, load=3)], home=1)) == 0  # home over the bound (0 + slack 2): least loaded
    assert router.route(home_snap([W(0, load=1, hbm=5), W(1)], home=1, cont=True)) == 0  # a known prefix outranks the hash
    assert router.route(home_snap([W(0, load=1), W(1, healthy=False)], home=1)) == 0  # an ejected home is no candidate
