"""The routers read every worker on each decision in C-level steps, or from the snapshot's worker
columns where its shell keeps them (``coda.policy.routing``); their choices must be those of the
plain definitions, written out here worker by worker."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from coda.policy.routing import ContextCompatible, LeastLoaded, RoundRobin, SMetric, WorkerColumns, context_distance, least_loaded_of
from coda.policy.snapshots import PrefixMatch, RouteRequest, RoutingSnapshot, WorkerView


def reference_candidates(snap):
    return [w for w in snap.workers if w.healthy] or list(snap.workers)


def reference_affinity(r: SMetric, snap):
    ws = reference_candidates(snap)
    lo = min(w.active_requests for w in ws)
    bound = lo + max(r.slack, r.ratio * lo)
    if snap.request.is_continuation:
        best = max(ws, key=lambda w: (w.match.hbm_blocks, -w.active_requests, -w.worker_id))
        if best.match.hbm_blocks > 0:
            return best if best.active_requests <= bound else None
    home = next((w for w in ws if w.worker_id == snap.request.home_worker), None)
    return home if home is not None and home.active_requests <= bound else None


def reference_least_loaded(ws):
    return min(ws, key=lambda w: (w.active_requests, w.active_kv_blocks, w.worker_id))


def reference_context_compatible(r: ContextCompatible, snap) -> int:
    held = reference_affinity(r.parent, snap)
    if held is not None:
        return held.worker_id
    ws = reference_candidates(snap)
    lo = min(w.active_requests for w in ws)
    near = [w for w in ws if w.active_requests <= lo + r.load_slack]
    decoding = [w for w in near if w.decode_contexts]
    if not decoding or (r.idle_near_worker == "fall_back" and len(decoding) < len(near)):
        return reference_least_loaded(ws).worker_id
    dist = {w.worker_id: context_distance(w.decode_contexts, snap.request.prompt_tokens) for w in decoding}
    load = {w.worker_id: w.active_requests for w in snap.workers}
    return min(dist, key=lambda wid: (dist[wid], load[wid], wid))


class ColumnViews(tuple):
    """Views with the columns a shell may keep of them (every worker healthy, each at its id)."""

    @property
    def columns(self) -> WorkerColumns:
        return WorkerColumns(*(np.array([getattr(w, f) for w in self], dtype=np.int64) for f in ("active_requests", "active_kv_blocks")),
                             np.array([w.match.hbm_blocks for w in self], dtype=np.int64), [w.decode_contexts for w in self])


@st.composite
def snapshots(draw, columned=False):
    n = draw(st.integers(1, 12))
    ids = list(range(n)) if columned else draw(st.permutations(range(n)))  # ids in any order: routers return ids, not positions
    workers = tuple(
        WorkerView(
            worker_id=ids[i],
            active_requests=draw(st.integers(0, 4)),
            active_kv_blocks=draw(st.integers(0, 3)),
            waiting_requests=0,
            decode_contexts=tuple(draw(st.lists(st.sampled_from([1, 300, 2_000, 9_000, 48_000]), max_size=3))),
            match=PrefixMatch(draw(st.integers(0, 3)), draw(st.integers(0, 2)), 0),
            healthy=True if columned else draw(st.booleans()) if draw(st.booleans()) else True,
        )
        for i in range(n)
    )
    if columned:
        workers = ColumnViews(workers)
    home = draw(st.none() | st.integers(0, n))
    request = RouteRequest(
        seq=draw(st.integers(0, 50)),
        session_id="s",
        is_continuation=draw(st.booleans()),
        prompt_tokens=draw(st.sampled_from([1, 500, 4_000, 40_000])),
        prompt_blocks=4,
        home_worker=home,
    )
    return RoutingSnapshot(0.0, request, workers)


any_snapshot = snapshots() | snapshots(columned=True)


@given(snap=any_snapshot, slack=st.integers(0, 3), ratio=st.sampled_from([0.0, 0.25, 1.0]))
def test_smetric_chooses_as_its_definition(snap, slack, ratio):
    r = SMetric(slack=slack, ratio=ratio)
    held = reference_affinity(r, snap)
    assert r.affinity(snap) == held
    assert r.route(snap) == (held or reference_least_loaded(reference_candidates(snap))).worker_id
    assert least_loaded_of(snap.workers) == reference_least_loaded(snap.workers)
    assert LeastLoaded().route(snap) == reference_least_loaded(reference_candidates(snap)).worker_id
    ws = reference_candidates(snap)
    assert RoundRobin().route(snap) == ws[snap.request.seq % len(ws)].worker_id


@given(snap=any_snapshot, load_slack=st.integers(0, 2), idle=st.sampled_from(["skip", "fall_back"]))
def test_context_compatible_chooses_as_its_definition(snap, load_slack, idle):
    r = ContextCompatible(load_slack=load_slack, idle_near_worker=idle)
    assert r.route(snap) == reference_context_compatible(r, snap)
