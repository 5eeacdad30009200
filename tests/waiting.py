"""Waiting in tests: on a condition, never for a fixed time.

The timeout only guards against a hang; it is generous so that a busy machine, which makes
everything slower, never turns a waiting test red. What a test asserts is the condition itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable

HANG_GUARD_S = 120.0


def wait_until(pred: Callable[[], bool], what: str | Callable[[], str] = "", timeout_s: float = HANG_GUARD_S, poll_s: float = 0.02) -> None:
    """Return once ``pred()`` holds; fail naming ``what`` (a text, or a function giving one) if it
    has not held within ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > end:
            detail = what() if callable(what) else what
            raise AssertionError(f"condition not reached within {timeout_s:g} s (a hang guard): {detail}")
        time.sleep(poll_s)
