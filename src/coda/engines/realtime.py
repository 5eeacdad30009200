"""The simulator's event-loop interface (``now``, ``at``) driven by asyncio's clock.

Simulator code (``coda.sim.worker.Worker``) schedules callbacks at virtual times; here virtual
time runs ``speedup`` times faster than the wall clock, so the same worker serves real HTTP
requests at the pace its cost model predicts. Events keep the discrete loop's order (time, then
scheduling sequence); while a callback runs, ``now`` is its scheduled virtual time, so the
worker's own timeline is exactly the simulator's even when delivery is late. Input from outside
(an HTTP request) is scheduled at the current virtual time with ``at(virtual_now(), ...)``.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable
from typing import Any


class RealtimeLoop:
    __slots__ = ("speedup", "now", "on_drained", "late_max_s", "_aloop", "_wall0", "_heap", "_seq", "_handle", "_armed", "_eps")

    def __init__(self, speedup: float = 1.0, on_drained: Callable[[], None] | None = None) -> None:
        """Create inside a running asyncio loop. ``on_drained`` runs after each batch of due events."""
        if not speedup > 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.speedup = speedup
        self.now = 0.0
        self.on_drained = on_drained
        self.late_max_s = 0.0  # worst wall-clock lateness of an event (the loop could not keep up)
        self._aloop = asyncio.get_running_loop()
        self._wall0 = self._aloop.time()
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self._handle: asyncio.TimerHandle | None = None
        self._armed = float("inf")
        self._eps = 1e-6 * speedup  # float slack between the timer's wall time and virtual time

    def wall_now(self) -> float:
        """The virtual time the wall clock has reached (behind ``now`` only while due events run late)."""
        return (self._aloop.time() - self._wall0) * self.speedup

    def virtual_now(self) -> float:
        return max(self.now, self.wall_now())

    def at(self, t: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        if t < self.now:
            t = self.now
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, arg))
        if t < self._armed:
            self._arm(t)

    def _arm(self, t: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed = t
        self._handle = self._aloop.call_at(self._wall0 + t / self.speedup, self._drain)

    def _drain(self) -> None:
        self._handle = None
        self._armed = float("inf")
        heap = self._heap
        vnow = self.virtual_now() + self._eps
        if heap:
            self.late_max_s = max(self.late_max_s, (vnow - heap[0][0]) / self.speedup)
        while heap and heap[0][0] <= vnow:
            t, _, fn, arg = heapq.heappop(heap)
            if t > self.now:
                self.now = t
            fn(arg)
        if self.on_drained is not None:
            self.on_drained()
        if heap and heap[0][0] < self._armed:
            self._arm(heap[0][0])

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)
