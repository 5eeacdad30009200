import pytest

from coda.errors import CodaError
from coda.workload.spec import load_workload
from coda.workload.stats import workload_stats
from coda.workload.subsample import subsample


@pytest.fixture(scope="module")
def wl():
    return load_workload("synth:rate=7,duration=1800,seed=3")


def test_rate_subsample_keeps_whole_sessions(wl):
    sub = subsample(wl, rate=3, seed=1)
    original = {s.session_id: s for s in wl.sessions}
    assert all(original[s.session_id] == s for s in sub.sessions)  # rounds, tools, start times unchanged
    rate = workload_stats(sub)["request_rate"]
    assert abs(rate / 3 - 1) < 0.05
    assert sub.meta["subsample"]["rate"] == 3


def test_fraction_and_determinism(wl):
    a = subsample(wl, fraction=0.25, seed=2)
    b = subsample(wl, fraction=0.25, seed=2)
    assert a.sessions == b.sessions
    assert len(a.sessions) == round(0.25 * len(wl.sessions))


def test_errors_name_the_fix(wl):
    with pytest.raises(CodaError, match="can only thin"):
        subsample(wl, rate=100)
    with pytest.raises(CodaError, match="exactly one of"):
        subsample(wl)
    with pytest.raises(CodaError, match=r"\(0, 1\]"):
        subsample(wl, fraction=1.5)
