"""A minimal discrete-event loop on ``heapq``: (time, sequence, callback, argument)."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    """Events at equal times run in the order they were scheduled (the sequence number breaks ties)."""

    __slots__ = ("now", "_heap", "_seq", "events_run")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self.events_run = 0

    def at(self, t: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        if t < self.now:
            t = self.now
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, arg))

    def run(self, until: float = float("inf"), stop: Callable[[], bool] | None = None) -> None:
        heap = self._heap
        pop = heapq.heappop
        n = 0
        while heap and heap[0][0] <= until:
            t, _, fn, arg = pop(heap)
            self.now = t
            fn(arg)
            n += 1
            if stop is not None and (n & 255) == 0 and stop():
                break
        self.events_run += n

    def __len__(self) -> int:
        return len(self._heap)
