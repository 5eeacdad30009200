"""The tool predictor's blocked samples answer as one sorted list would, past many block splits."""

from __future__ import annotations

import bisect
import math
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from coda.policy.tools import _Samples

durations = st.floats(min_value=0.0, max_value=600.0, allow_nan=False)


def reference(values: list[float], elapsed: float, statistic: str) -> float | None:
    """The residual over the samples greater than ``elapsed``, from one sorted list."""
    i = bisect.bisect_right(values, elapsed)
    above = values[i:]
    if not above:
        return None
    if statistic == "median":
        return values[(i + len(values)) // 2] - elapsed
    return math.fsum(above) / len(above) - elapsed


@settings(max_examples=60, deadline=None)
@given(
    # few distinct values (ties across block edges) or many (several splits of a small block)
    adds=st.lists(st.one_of(durations, st.sampled_from([0.0, 1.0, 2.5, 30.0])), min_size=1, max_size=400),
    split=st.sampled_from([2, 3, 8, 512]),
    probes=st.lists(st.one_of(durations, st.sampled_from([0.0, 1.0, 2.5, 30.0, -1.0])), min_size=1, max_size=20),
)
def test_blocked_samples_match_one_sorted_list(adds: list[float], split: int, probes: list[float]) -> None:
    samples = _Samples(split)  # small blocks: splits happen within a few samples
    values: list[float] = []
    for j, d in enumerate(adds):
        samples.add(d)
        bisect.insort(values, d)
        assert samples.n == len(values)
        for e in probes[: 1 + j % len(probes)]:
            for stat in ("mean", "median"):
                want, got = reference(values, e, stat), samples.residual(e, stat)  # type: ignore[arg-type]
                if want is None:
                    assert got is None
                else:
                    assert got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9), (stat, e, got, want)
    flat = [v for block in samples._blocks for v in block]
    assert flat == values  # one sorted order across blocks
    assert statistics.median_low(values) == samples._at((len(values) - 1) // 2)
