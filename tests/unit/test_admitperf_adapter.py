"""admitperf's policies behind Coda's ingress contract: built by name from the registry (its entry
points), fed each usable worker's signals, and deciding as admitperf's own rules say."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.errors import CodaError
from coda.integrations.admitperf import AdmitPerfKvThreshold, AdmitPerfQueueDepth
from coda.policy.ingress import KVHeadroom
from coda.policy.snapshots import IngressSnapshot, WorkerLoad
from coda.shell.build import make_policy

pytest.importorskip("admitperf", reason="admitperf is not installed: pip install 'coda[admitperf]' (make test installs it)")


def snap(*workers: WorkerLoad) -> IngressSnapshot:
    return IngressSnapshot(now_s=0.0, tenant="t", prompt_tokens=100, workers=workers)


def test_queue_depth_admits_while_some_engine_queues_at_most_max_waiting_and_defers_with_its_retry_after():
    policy = make_policy("ingress", "admitperf_queue_depth", {"max_waiting": 2, "retry_after_s": 0.5})
    assert isinstance(policy, AdmitPerfQueueDepth)
    assert policy.decide(snap(WorkerLoad(0, queue_depth=9), WorkerLoad(1, queue_depth=2))).action == "admit"
    held = policy.decide(snap(WorkerLoad(0, queue_depth=9), WorkerLoad(1, queue_depth=3)))
    assert (held.action, held.status, held.retry_after_s, held.reason, held.signal) == ("defer", 503, 0.5, "queue_depth", "queue_depth")


def test_a_stale_or_unhealthy_worker_gives_no_room_and_the_signal_says_telemetry():
    policy = AdmitPerfQueueDepth(max_waiting=2)
    d = policy.decide(snap(WorkerLoad(0, healthy=False), WorkerLoad(1, stale=True), WorkerLoad(2, queue_depth=5)))
    assert d.action == "defer" and d.signal == "queue_depth+telemetry"


def test_kv_threshold_refuses_with_a_529_while_every_cache_is_that_full():
    d = AdmitPerfKvThreshold(threshold=0.8).decide(snap(WorkerLoad(0, kv_usage=0.95), WorkerLoad(1, kv_usage=0.8)))
    assert (d.action, d.status, d.reason, d.signal) == ("reject", 529, "kv_pressure", "kv_usage")


@given(st.floats(0.0, 1.0), st.lists(st.tuples(st.floats(0.0, 1.0), st.booleans(), st.booleans()), min_size=1, max_size=6))
def test_kv_threshold_admits_exactly_when_coda_kv_headroom_does_at_the_same_threshold(threshold, workers):
    s = snap(*(WorkerLoad(i, healthy=h, stale=st_, kv_usage=kv) for i, (kv, h, st_) in enumerate(workers)))
    theirs = AdmitPerfKvThreshold(threshold=threshold).decide(s).action == "admit"
    ours = KVHeadroom(max_kv_usage=threshold).decide(s).action == "admit"
    assert theirs == ours


def test_bad_parameters_name_the_policy_and_the_value():
    with pytest.raises(CodaError, match="admitperf_kv_threshold: threshold must be within"):
        make_policy("ingress", "admitperf_kv_threshold", {"threshold": 1.5})
    with pytest.raises(CodaError, match="unknown parameter"):
        make_policy("ingress", "admitperf_queue_depth", {"threshold": 0.5})
