"""Does a skewed decode batch cost vLLM-CPU's attention more than its two cohorts? Whole against split, paired.

Run with vLLM-CPU's Python (``make vllm-env``)::

    .venv-vllm/bin/python benchmarks/cpu_cohort_split.py [--repeats 15] [--calls 3] [--threads 1] [--seed 0]

A cohort split can pay only where the kernel costs a skewed batch more than its cohorts (a GPU
kernel's waves and KV splits follow the longest context; ``benchmarks/gpu_cohort_split.py``). This
asks it of vLLM-CPU's kernel (its C++ ``cpu_attention_with_kv_cache``, bf16 KV in 32-token blocks)
on the decode batches the agent burst's engines run: 2-16 requests, contexts of a few hundred to
about 4,000 tokens, on the burst's tiny Llama and, for a real model's shape, one Llama-3.1-8B layer.
Two-level batches are cut between their levels; agent-like ones at the largest ratio between
neighbouring contexts among the cuts the ``cohort`` policy may take (both cohorts at least
``max(m_min, ceil(rho n))`` requests; a batch of 2 or 3, which the policy never splits, at its
largest ratio).

Each repetition times, in an order shuffled per repetition, ``--calls`` calls of: the whole batch's
forward (one layer); the split as Coda's backend runs it (each cohort's queries gathered, the kernel
on each, the outputs scattered back); the two cohorts' launches alone (T_short + T_long, the pair a
gain model compares); the step's metadata build (the kernel's scheduler metadata) and the two more
a split step builds. Ratios are taken within a repetition (paired), and reported as the median
[min, max] over repetitions; below 1, splitting pays. ``step`` is the whole engine step's attention
(every layer's forward and the builds) split against whole.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import vllm
from cohort_backend_overhead import BLOCK, Layer, block_table, cpu_impl, metadata
from vllm.v1.attention.backends import cpu_attn
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

from coda.integrations.vllm.cohort_backend import cohort_backend
from coda.machine import machine
from coda.policy.execution import Cohort

SHORT, LONG = 256, 4096  # the agent burst's decode contexts span about this range
COHORT = {f.name: f.default for f in dataclasses.fields(Cohort)}  # the policy's defaults (m_min, rho)
BATCHES = (2, 4, 8, 16)


@dataclass(frozen=True)
class Geometry:
    name: str
    heads: int
    kv_heads: int
    dim: int
    layers: int


GEOMETRIES = (Geometry("tiny Llama (the burst's engines)", 4, 4, 64, 2), Geometry("Llama-3.1-8B", 32, 8, 128, 32))


def policy_cut(ctx: list[int]) -> int:
    """The cut between the most distant neighbouring contexts among those the ``cohort`` policy admits."""
    srt, n = np.sort(ctx), len(ctx)
    m = max(COHORT["m_min"], math.ceil(COHORT["rho"] * n))
    cuts = np.arange(m, n - m + 1) if m <= n - m else np.arange(1, n)
    return int(cuts[np.argmax(srt[cuts] / srt[cuts - 1])])


def batches(rng: random.Random) -> list[tuple[str, list[int], int]]:
    """(kind, contexts in the batch's order, cut) per batch: a two-level one per size, cut between
    its levels, and two agent-like ones (log-uniform contexts)."""
    out = []
    for n in BATCHES:
        kinds = [("two-level", [SHORT] * (n // 2) + [LONG] * (n - n // 2))]
        kinds += [("agent", [round(SHORT * (LONG / SHORT) ** rng.random()) for _ in range(n)]) for _ in range(2)]
        for kind, ctx in kinds:
            rng.shuffle(ctx)  # the engine's batch order is its requests' arrival, not their contexts'
            out.append((kind, ctx, n // 2 if kind == "two-level" else policy_cut(ctx)))
    return out


def timed(fns: dict[str, Callable[[], object]], calls: int, order: list[str]) -> dict[str, float]:
    """Per-call microseconds of each function, ``calls`` calls each, in ``order``."""
    out = {}
    for k in order:
        f = fns[k]
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        out[k] = (time.perf_counter() - t0) / calls * 1e6
    return out


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def measure(g: Geometry, ctx: list[int], cut: int, repeats: int, calls: int, rng: random.Random, gen: torch.Generator) -> dict:
    """One batch: the paired ratios of every repetition, the median whole forward, and the split's largest output difference."""
    isa = cpu_attn._get_attn_isa(torch.bfloat16, BLOCK, g.dim, "auto")
    base = cpu_impl(cpu_attn.CPUAttentionBackendImpl, g.heads, g.kv_heads, g.dim)
    wrapped = cpu_impl(cohort_backend(CPUAttentionBackend).get_impl_cls(), g.heads, g.kv_heads, g.dim)
    table = block_table(ctx)
    kv = torch.randn((int(table.max()) + 1, g.kv_heads, BLOCK, 2 * g.dim), generator=gen, dtype=torch.bfloat16)
    q = torch.randn((len(ctx), g.heads, g.dim), generator=gen, dtype=torch.bfloat16)
    layer = Layer(isa)
    order = torch.argsort(torch.tensor(ctx), stable=True)
    rows = order[:cut], order[cut:]  # the cut shortest contexts, then the rest, as the backend takes them

    def build(sub: torch.Tensor | None = None) -> object:
        part = ctx if sub is None else [ctx[i] for i in sub.tolist()]
        return metadata(part, table if sub is None else table[sub], g.heads, g.kv_heads, g.dim, isa)

    whole_meta, split_meta = build(), build()
    split_meta.coda_cohorts = [(r, build(r)) for r in rows]
    parts = [(q[r].contiguous(), m, torch.empty(len(r), g.heads * g.dim, dtype=torch.bfloat16)) for r, m in split_meta.coda_cohorts]
    out_whole = torch.empty(len(ctx), g.heads * g.dim, dtype=torch.bfloat16)
    out_split = torch.empty_like(out_whole)
    fns: dict[str, Callable[[], object]] = {
        "whole": lambda: base.forward(layer, q, None, None, kv, whole_meta, out_whole),
        "split": lambda: wrapped.forward(layer, q, None, None, kv, split_meta, output=out_split),
        "cohorts": lambda: [base.forward(layer, pq, None, None, kv, m, po) for pq, m, po in parts],
        "build": build,
        "cohort builds": lambda: [build(r) for r in rows],
    }
    for f in fns.values():
        f()
    diff = float((out_whole.float() - out_split.float()).abs().max())
    keys = list(fns)
    ratios: dict[str, list[float]] = {"cohorts": [], "split": [], "step": []}
    whole_us = []
    for _ in range(repeats):
        rng.shuffle(keys)
        t = timed(fns, calls, keys)
        ratios["cohorts"].append(t["cohorts"] / t["whole"])
        ratios["split"].append(t["split"] / t["whole"])
        whole_step = g.layers * t["whole"] + t["build"]
        ratios["step"].append((g.layers * t["split"] + t["build"] + t["cohort builds"]) / whole_step)
        whole_us.append(t["whole"])
    return {"ratios": ratios, "whole_us": statistics.median(whole_us), "diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15, help="paired repetitions per batch")
    ap.add_argument("--calls", type=int, default=3, help="calls of each variant per repetition")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the burst's engines bind one core each)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    host = machine()
    print(f"cohort split on vLLM-CPU's attention: vLLM {vllm.__version__}, torch {torch.__version__} ({args.threads} thread(s)); "
          f"{host['cpu']} x {host['cpus']}, load average {os.getloadavg()[0]:.2f} at the start; {args.repeats} repetitions x "
          f"{args.calls} calls, seed {args.seed}; bf16 KV in {BLOCK}-token blocks")
    print("ratios split/whole, median [min, max] over paired repetitions (below 1: splitting pays)")
    rng, gen = random.Random(args.seed), torch.Generator().manual_seed(args.seed)
    shapes = batches(rng)
    pays = []
    for g in GEOMETRIES:
        print(f"{g.name}: heads {g.heads}/{g.kv_heads} x {g.dim}, {g.layers} layers a step")
        for kind, ctx, cut in shapes:
            r = measure(g, ctx, cut, args.repeats, args.calls, rng, gen)
            med = {k: statistics.median(v) for k, v in r["ratios"].items()}
            pays.append(med["cohorts"] < 1)
            print(f"  n={len(ctx):2d} {kind:9s} cut {cut:2d} contexts {min(ctx)}..{max(ctx)} (mean {np.mean(ctx):.0f}): "
                  f"whole {r['whole_us']:8.1f} us; cohorts {spread(r['ratios']['cohorts'])}; split {spread(r['ratios']['split'])}; "
                  f"step {spread(r['ratios']['step'])}; split output off by {r['diff']:.2g}")
    print(f"batches where the two cohorts' launches cost less than the whole one (median): {sum(pays)} of {len(pays)}; "
          f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
