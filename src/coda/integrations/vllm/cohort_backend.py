"""Cohort-split decode attention inside vLLM: an attention backend that wraps the platform's own.

The scheduler plans each pure-decode step once, from the scheduled batch (``CodaScheduler``: the
execution policy of ``coda.policy.execution``, the object the simulator runs), and attaches the
plan to the step's ``SchedulerOutput``; ``CodaWorker`` hands it to this backend while the step
executes (``coda.integrations.vllm.cohort_plan``). On a step whose plan splits, the metadata builder builds the step's metadata
as usual and, beside it, one metadata per cohort (the ``cut`` shortest contexts, then the rest);
the attention implementation then runs the wrapped backend's attention twice, once per cohort,
gathering the cohort's queries and scattering its outputs back. Everything else stays one batch:
the QKV projection, the KV-cache write (the wrapped backend's own, over the whole batch), the MLP
or MoE layers and sampling. On any other step (no plan, prefill tokens, speculative tokens, a
batch the worker padded, metadata fields a split does not carry) the wrapped backend runs
unchanged: one ``getattr`` per layer is what the wrapper adds.

vLLM resolves backends by name through ``AttentionBackendEnum``; ``install`` points the platform's
decoder backends (``WRAPPED``) at classes of this module (``Cohort_CPU_ATTN`` and so on, built on
first use around the enum's default class). CUDA graphs cannot hold a split that changes per step,
so the wrapped builder declares none: with cohorts on, attention runs outside CUDA graphs
(vLLM's piecewise mode), which its decode steps would otherwise capture.

A backend whose builder keeps state across ``build()`` calls cannot be split this way unless that
state is shown to survive three builds in one step; ``REFUSED`` names those never wrapped, whose
steps run whole (``CodaWorker`` says so when the model uses one).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import Any

import torch

from coda.integrations.vllm.cohort_plan import STEP

#: decoder attention backends of the CPU and CUDA platforms that ``install`` wraps
WRAPPED = ("CPU_ATTN", "FLASH_ATTN", "TRITON_ATTN")
#: backends never wrapped, and why: a split step there is not shown to be correct (no test runs them)
REFUSED = {
    "FLASHINFER": "its metadata builder plans one decode wrapper that every build() shares, so in a split step, which builds "
                  "three times, each cohort would run with the last build's plan",
}
PREFIX = "Cohort_"
#: ``CommonAttentionMetadata`` fields a cohort's metadata carries, sliced to its requests
_SLICED = frozenset({"query_start_loc", "query_start_loc_cpu", "seq_lens", "num_reqs", "num_actual_tokens", "max_query_len",
                     "max_seq_len", "block_table_tensor", "slot_mapping", "causal", "positions", "is_prefilling",
                     "seq_lens_cpu_upper_bound"})


def _cohort_rows(cm: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(short rows, long rows) of this metadata under the step's plan, or None to run it as one batch."""
    n, cut = STEP.batch, STEP.cut
    if cut is None or cm.num_reqs != n or cm.num_actual_tokens != n or cm.max_query_len != 1 or cm.causal is not True:
        return None
    for f in dataclasses.fields(cm):
        if f.name in _SLICED or f.name.startswith("_"):
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        if getattr(cm, f.name) is not default:
            return None  # a field a cohort would have to slice and does not know how
    lens = cm.seq_lens_cpu_upper_bound if cm.seq_lens_cpu_upper_bound is not None else cm.seq_lens.cpu()
    order = torch.argsort(lens[:n], stable=True)
    return order[:cut], order[cut:]


def _cohort_metadata(cm: Any, rows: torch.Tensor) -> Any:
    """``cm`` restricted to ``rows`` (one query token each)."""
    dev = cm.seq_lens.device
    on_dev = rows.to(dev)
    k = len(rows)
    starts = torch.arange(k + 1, dtype=cm.query_start_loc.dtype)
    lens_cpu = cm.seq_lens_cpu_upper_bound[rows] if cm.seq_lens_cpu_upper_bound is not None else cm.seq_lens.cpu()[rows]
    fresh = {f.name: f.default for f in dataclasses.fields(cm) if f.name.startswith("_") and f.default is not dataclasses.MISSING}
    return dataclasses.replace(
        cm, **fresh,
        query_start_loc=starts.to(dev), query_start_loc_cpu=starts, seq_lens=cm.seq_lens[on_dev], num_reqs=k, num_actual_tokens=k,
        max_query_len=1, max_seq_len=int(lens_cpu.max()), block_table_tensor=cm.block_table_tensor[on_dev],
        slot_mapping=cm.slot_mapping[on_dev], positions=None if cm.positions is None else cm.positions[on_dev],
        is_prefilling=None if cm.is_prefilling is None else cm.is_prefilling[on_dev],
        seq_lens_cpu_upper_bound=None if cm.seq_lens_cpu_upper_bound is None else lens_cpu,
    )


@functools.cache
def cohort_backend(base: type) -> type:
    """``base`` (an ``AttentionBackend`` class) whose builder and implementation split planned steps;
    a ``REFUSED`` backend raises."""
    if base.get_name() in REFUSED:
        raise ValueError(f"{base.get_name()} is not wrapped for cohorts: {REFUSED[base.get_name()]}")
    from vllm.v1.attention.backend import AttentionCGSupport

    base_builder, base_impl = base.get_builder_cls(), base.get_impl_cls()

    class Builder(base_builder):  # type: ignore[misc,valid-type]
        supports_update_block_table = False

        @classmethod
        def get_cudagraph_support(cls, *args: Any, **kwargs: Any) -> Any:
            return AttentionCGSupport.NEVER

        def build(self, common_prefix_len: int, common_attn_metadata: Any, *args: Any, **kwargs: Any) -> Any:
            meta = super().build(common_prefix_len, common_attn_metadata, *args, **kwargs)
            rows = _cohort_rows(common_attn_metadata)
            if rows is not None:
                meta.coda_cohorts = tuple(
                    (
                        r.to(common_attn_metadata.seq_lens.device),
                        super(Builder, self).build(common_prefix_len, _cohort_metadata(common_attn_metadata, r), *args, **kwargs),
                    )
                    for r in rows
                )
                STEP.mark_split()
            return meta

    class Impl(base_impl):  # type: ignore[misc,valid-type]
        def forward(
            self,
            layer: Any,
            query: torch.Tensor,
            key: torch.Tensor | None,
            value: torch.Tensor | None,
            kv_cache: torch.Tensor,
            attn_metadata: Any,
            output: torch.Tensor | None = None,
            **kwargs: Any,
        ) -> torch.Tensor:
            cohorts = getattr(attn_metadata, "coda_cohorts", None)
            if cohorts is None:
                return super().forward(layer, query, key, value, kv_cache, attn_metadata, output=output, **kwargs)
            assert output is not None, "cohort attention writes into the layer's output buffer"
            for rows, meta in cohorts:
                part = output.new_empty((len(rows), *output.shape[1:]))
                super().forward(
                    layer,
                    query[rows],
                    None if key is None else key[rows],
                    None if value is None else value[rows],
                    kv_cache,
                    meta,
                    output=part,
                    **kwargs,
                )
                output.index_copy_(0, rows, part)
            return output

    Builder.__name__ = Builder.__qualname__ = f"Cohort{base_builder.__name__}"
    Impl.__name__ = Impl.__qualname__ = f"Cohort{base_impl.__name__}"
    return type(
        f"Cohort{base.__name__}",
        (base,),
        {
            "__doc__": f"{base.__name__} with cohort-split decode steps (coda.integrations.vllm.cohort_backend)",
            "get_builder_cls": staticmethod(lambda: Builder),
            "get_impl_cls": staticmethod(lambda: Impl),
        },
    )


def __getattr__(name: str) -> type:
    """``Cohort_<MEMBER>``: the wrapper of ``AttentionBackendEnum.<MEMBER>``'s default class (what
    ``install`` registers, and vLLM imports by that name)."""
    if not name.startswith(PREFIX):
        raise AttributeError(name)
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return cohort_backend(resolve_obj_by_qualname(AttentionBackendEnum[name.removeprefix(PREFIX)].value))


def refusal(backends: Iterable[type]) -> str | None:
    """One line for the ``REFUSED`` backends among ``backends`` (the model's layers'), whose steps
    run whole; None when there are none."""
    names = sorted({b.get_name() for b in backends} & REFUSED.keys())
    if not names:
        return None
    return "; ".join(f"Coda: cohort attention refuses {n} ({REFUSED[n]}): its steps run whole, unsplit" for n in names)


def install() -> list[str]:
    """Point the platform's decoder backends (``WRAPPED``) at their cohort wrappers, in this process;
    the names wrapped. Call it before the model is built (``CodaWorker`` does, at its start)."""
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    names = [n for n in WRAPPED if n in AttentionBackendEnum.__members__]
    for n in names:
        register_backend(AttentionBackendEnum[n], f"{__name__}.{PREFIX}{n}")
    cached = getattr(selector, "_cached_get_attn_backend", None)
    if cached is not None:  # a backend chosen before (the same process) must be chosen again
        cached.cache_clear()
    return names
