"""Comparing numbers that came out of a fit with what a file recorded.

A fit's last bits depend on the BLAS kernel, the SIMD path numpy picks for the processor and the
order of summation, so the same code and data give different bits on another machine. A test
that checks "the shipped profile is what the fit writes" compares floats within a relative
tolerance, and everything else (counts, names, flags, the shape of the data) exactly.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

#: Relative tolerance of a refit against its committed result: far above the 1e-16 scale of
#: floating-point reordering, far below any change a reader of a profile would notice.
FIT_REL = 1e-9
#: Absolute floor for values that should be zero but come out of a subtraction (a residual of 0).
FIT_ABS = 1e-12


def approx_tree(expected: Any, rel: float = FIT_REL, abs: float = FIT_ABS) -> Any:
    """``expected`` with every float replaced by ``pytest.approx``: nested dicts, lists and tuples
    keep their structure and are compared exactly in shape; ints, bools, strings and None exactly."""
    if isinstance(expected, dict):
        return {k: approx_tree(v, rel, abs) for k, v in expected.items()}
    if isinstance(expected, (list, tuple)):
        return type(expected)(approx_tree(v, rel, abs) for v in expected)
    if isinstance(expected, float) and math.isfinite(expected):
        return pytest.approx(expected, rel=rel, abs=abs)
    return expected

