"""The ranks of a data-parallel group with expert parallelism step together.

A rank with work hands its batch to the group (``ready``); a group step starts as soon as none is
running, with every rank ready at that instant, and lasts what ``ExpertParallelGroup.step_s``
says (the slowest rank's own part, the MoE blocks on the group's tokens, dispatch and combine).
A rank that becomes ready during a step joins the next one, as vLLM's ranks meet at the next
forward pass's first collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from coda.cost.expert_parallel import ExpertParallelGroup
from coda.sim.loop import EventLoop

if TYPE_CHECKING:
    from coda.sim.worker import Worker


class Lockstep:
    def __init__(self, loop: EventLoop, cost: ExpertParallelGroup) -> None:
        self.loop = loop
        self.cost = cost
        self._ready: dict[int, tuple[Worker, Sequence[tuple[int, int]], np.ndarray]] = {}
        self._stepping = False
        self._start_pending = False
        self.steps = 0

    def ready(self, worker: Worker, chunks: Sequence[tuple[int, int]], contexts: np.ndarray) -> None:
        """``worker`` has fixed its next batch; it starts with the group's next step."""
        self._ready[worker.id] = (worker, chunks, contexts)
        self._start_soon()

    def _start_soon(self) -> None:
        # Deferred to the end of this instant, so that every rank ready now joins the step.
        if not self._stepping and not self._start_pending and self._ready:
            self._start_pending = True
            self.loop.at(self.loop.now, self._start)

    def _start(self, _: object) -> None:
        self._start_pending = False
        members, self._ready = list(self._ready.values()), {}
        end = self.loop.now + self.cost.step_s([(chunks, ctx) for _, chunks, ctx in members])
        self._stepping = True
        self.steps += 1
        for worker, _, _ in members:
            worker.launch(np.array([end]))
        self.loop.at(end, self._ended)

    def _ended(self, _: object) -> None:
        self._stepping = False
        self._start_soon()
