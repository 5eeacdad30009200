"""The hand-off of a step's cohort plan from the scheduler to the attention backend.

The scheduler attaches the plan to the step's ``SchedulerOutput`` (``PLAN_ATTR``), which reaches
the worker whole: the same object in the engine's process, a pickled copy in a worker process of
its own. ``CodaWorker`` puts it in ``STEP`` while it executes the step, where the cohort backend's
metadata builder reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the ``SchedulerOutput`` attribute that carries a step's plan: ``(batch size, short cohort size)``
PLAN_ATTR = "coda_cohort_plan"


@dataclass
class StepPlan:
    """The plan of the step the worker is executing (``None`` between steps): the batch size it was
    made for and the short cohort's size; ``split_steps`` counts the steps that ran split."""

    batch: int | None = None
    cut: int | None = None
    split_steps: int = 0
    _counted: bool = False

    def begin(self, plan: tuple[int, int] | None) -> None:
        self.batch, self.cut = plan if plan is not None else (None, None)
        self._counted = False

    def end(self) -> None:
        self.batch = self.cut = None

    def mark_split(self) -> None:
        if not self._counted:
            self.split_steps += 1
            self._counted = True


STEP = StepPlan()
