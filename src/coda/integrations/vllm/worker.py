"""``CodaWorker``: the platform's vLLM worker, carrying each step's cohort plan to the attention backend.

    vllm serve M --scheduler-cls coda.integrations.vllm.scheduler.CodaScheduler \\
                 --worker-cls coda.integrations.vllm.worker.CodaWorker

The scheduler plans a step's attention split; the attention backend runs in the worker, which
receives the step as its ``SchedulerOutput`` (the same object in one process, a pickled copy in a
worker process of its own). ``CodaWorker`` is the platform's worker (vLLM-CPU's ``CPUWorker``, or
the GPU ``Worker``) that, when ``CODA_SCHEDULER_CONFIG`` turns cohorts on and its profile allows
them on this device (``coda.integrations.vllm.cohort_gate``, the scheduler's rule), wraps the
platform's attention backends before the model is built (``cohort_backend.install``) and exposes
each step's plan to them while the step executes. With cohorts off it is the platform's worker
unchanged, so attention keeps its CUDA graphs. A model whose attention backend the wrapper refuses
(``cohort_backend.REFUSED``) runs every step whole, and the worker says so once the model is loaded.
"""

from __future__ import annotations

from typing import Any

from vllm.config import get_layers_from_vllm_config
from vllm.logger import init_logger
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.platforms import current_platform

from coda.cost.profile import load_profile
from coda.integrations.vllm import cohort_backend
from coda.integrations.vllm.cohort_gate import engine_device, why_off
from coda.integrations.vllm.cohort_plan import PLAN_ATTR, STEP
from coda.integrations.vllm.settings import load_settings

if current_platform.is_cpu():
    from vllm.v1.worker.cpu_worker import CPUWorker as PlatformWorker
else:
    from vllm.v1.worker.gpu_worker import Worker as PlatformWorker

logger = init_logger("vllm.coda.worker")


class CodaWorker(PlatformWorker):  # type: ignore[misc,valid-type]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = load_settings()
        execution = settings.policy_spec.execution.name
        off = execution == "full" or why_off(execution, load_profile(settings.profile), engine_device(current_platform)) is not None
        self.coda_wrapped = [] if off else cohort_backend.install()
        logger.info("Coda worker: execution policy %s; cohort attention wraps %s%s", execution, ", ".join(self.coda_wrapped) or "nothing",
                    " (cohorts off)" if off else "")

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        if self.coda_wrapped:
            layers = get_layers_from_vllm_config(self.vllm_config, AttentionLayerBase).values()
            note = cohort_backend.refusal(layer.get_attn_backend() for layer in layers)
            if note is not None:
                logger.warning(note)

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        STEP.begin(getattr(scheduler_output, PLAN_ATTR, None))
        try:
            return super().execute_model(scheduler_output, *args, **kwargs)
        finally:
            STEP.end()
