"""Split against full decode attention on a GPU: the measurements the paired cohort-gain model fits.

    python benchmarks/gpu_cohort_split.py --out runs/gpu-split            # a GPU: under 5 minutes
    python benchmarks/gpu_cohort_split.py --device cpu --quick --out /tmp/s  # the CPU smoke run
    TRITON_INTERPRET=1 python benchmarks/gpu_cohort_split.py --device cpu --quick --dtype fp16 --out /tmp/s
                                                                          # and the Triton kernel, interpreted on the CPU

Needs PyTorch (and Triton on the GPU) only: no vLLM, no Coda. One attention layer of a model's
geometry (by default Qwen3-30B-A3B's: 32 query heads, 4 KV heads of 128; bf16 KV in 16-token
pages, as vLLM's GPU backends page it) runs pure-decode batches with the kernels available:

- ``triton``: a paged split-KV decode kernel in this file (flash-decoding), whose split count per
  launch follows FlashAttention-2's heuristic for decode (``fa2_num_splits``): it depends on the
  batch's size and its longest context, which is what a cohort split changes;
- ``flash_attn``: FlashAttention-2's own ``flash_attn_with_kvcache`` where the package is installed;
- ``torch`` (the CPU smoke run, and the reference every kernel is checked against first): each
  request's pages gathered and attended with PyTorch's SDPA.

It writes, per kernel, what ``coda profile fit-gain`` reads (a setup's two files, named as the
shared operator profiles are):

- ``<gpu>_<model>_tp1_skew.csv``: two-level skewed batches (``n`` requests, ``nb`` of them at
  ``kv_big``, the rest at ``kvs``): the skewed launch, and uniform launches at the mean and at
  ``kv_big``;
- ``<gpu>_<model>_tp1_attention.csv``: every uniform launch measured (the cohorts of each skewed
  batch among them), so pairing needs no interpolation;

and ``agent_mixes.jsonl``: batches drawn from an agent-like context distribution (or
``--contexts``), each full and at up to nine cuts, split in place (queries gathered, two launches,
outputs scattered back, as Coda's backend does), with the measured gain of each cut. Then::

    coda profile fit-gain --skew OUT/triton/<gpu>_<model>_tp1_skew.csv --profile <the setup's profile> --out fitted.json

Every time is the median of ``--reps`` launches after warm-up (CUDA events on a GPU); the run stops
taking new shapes once ``--budget-s`` is spent and says so.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU smoke run
    triton = None

PAGE = 16  # vLLM's GPU backends' default block size
FA2_PAGE = 256  # FlashAttention-2's paged KV needs pages of a multiple of 256 tokens
SKEW_HEADER = ("regime", "n", "nb", "ratio", "skew", "pc", "kp", "kvs", "kv_big", "kv_mean", "t_mean_us", "t_max_us", "t_skew_us", "alpha")
ATTENTION_HEADER = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")


@dataclass(frozen=True)
class Geometry:
    q_heads: int
    kv_heads: int
    head_dim: int

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads


# --- the paged KV pool ------------------------------------------------------------------------------
class Pool:
    """bf16 K and V pages, ``[pages, page, kv_heads, head_dim]`` each, filled once with random values;
    a batch's requests get pages in a random order (as a paged cache hands them out)."""

    def __init__(self, tokens: int, page: int, g: Geometry, device: str, seed: int, dtype: torch.dtype) -> None:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.page, self.dtype = page, dtype
        pages = tokens // page + 256
        shape = (pages, page, g.kv_heads, g.head_dim)
        self.k = torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
        self.v = torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
        self.order = torch.randperm(pages, generator=gen)
        self.device = device

    def table(self, contexts: list[int]) -> torch.Tensor:
        width = max(-(-c // self.page) for c in contexts)
        table = torch.zeros(len(contexts), width, dtype=torch.int32)
        start = 0
        for i, c in enumerate(contexts):
            k = -(-c // self.page)
            table[i, :k] = self.order[start:start + k]
            start += k
        assert start <= len(self.order), "the pool is smaller than the batch; raise --max-batch-tokens"
        return table.to(self.device)


# --- kernels ----------------------------------------------------------------------------------------
def fa2_num_splits(batch: int, kv_heads: int, max_context: int, sms: int, head_dim: int, max_splits: int = 128) -> int:
    """FlashAttention-2's ``num_splits_heuristic`` for a decode launch (queries of one KV head packed
    into one block row): the fewest splits within 85% of the best wave efficiency."""
    ctas = batch * kv_heads
    if ctas >= 0.8 * sms:
        return 1
    block_n = 256 if head_dim <= 64 else (128 if head_dim <= 128 else 64)
    n_blocks = -(-max_context // block_n)
    max_splits = min(max_splits, sms, n_blocks)

    def eligible(s: int) -> bool:
        return s == 1 or -(-n_blocks // s) != -(-n_blocks // (s - 1))

    eff = [(ctas * s / sms) / math.ceil(ctas * s / sms) if eligible(s) else 0.0 for s in range(1, max_splits + 1)]
    best = max(eff, default=0.0)
    return next((s for s in range(1, max_splits + 1) if eligible(s) and eff[s - 1] >= 0.85 * best), 1)


if triton is not None:

    @triton.jit
    def _split_kernel(q, k, v, table, lens, o_part, m_part, l_part, scale, tokens_per_split,
                      s_qb, s_qh, s_kp, s_ks, s_kh, s_tb, s_ob, s_oh, s_os, s_mb, s_mh,
                      GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr):
        b, kvh, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        seqlen = tl.load(lens + b)
        start = sp * tokens_per_split
        end = tl.minimum(start + tokens_per_split, seqlen)
        rows = tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, D)
        heads = kvh * GROUP + rows
        qv = tl.load(q + b * s_qb + heads[:, None] * s_qh + dims[None, :], mask=rows[:, None] < GROUP, other=0.0)
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_sum = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, D], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            offs = n0 + tl.arange(0, BLOCK_N)
            valid = offs < end
            page = tl.load(table + b * s_tb + offs // PAGE_SIZE, mask=valid, other=0)
            base = page * s_kp + (offs % PAGE_SIZE) * s_ks + kvh * s_kh
            kt = tl.load(k + base[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
            vt = tl.load(v + base[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
            s = tl.dot(qv, tl.trans(kt)) * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l_sum = l_sum * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            m = m_new
        keep = rows < GROUP
        tl.store(o_part + b * s_ob + heads[:, None] * s_oh + sp * s_os + dims[None, :], acc, mask=keep[:, None])
        tl.store(m_part + b * s_mb + heads * s_mh + sp, m, mask=keep)
        tl.store(l_part + b * s_mb + heads * s_mh + sp, l_sum, mask=keep)

    @triton.jit
    def _combine_kernel(o_part, m_part, l_part, out, splits, s_ob, s_oh, s_os, s_mb, s_mh, s_b, s_h,
                        D: tl.constexpr, SPLITS_PAD: tl.constexpr):
        b, h = tl.program_id(0), tl.program_id(1)
        sp = tl.arange(0, SPLITS_PAD)
        ok = sp < splits
        m = tl.load(m_part + b * s_mb + h * s_mh + sp, mask=ok, other=float("-inf"))
        lsum = tl.load(l_part + b * s_mb + h * s_mh + sp, mask=ok, other=0.0)
        m_max = tl.max(m, 0)
        w = tl.where(ok & (m > float("-inf")), tl.exp(m - m_max), 0.0)
        dims = tl.arange(0, D)
        o = tl.load(o_part + b * s_ob + h * s_oh + sp[:, None] * s_os + dims[None, :], mask=ok[:, None], other=0.0)
        res = tl.sum(o * w[:, None], 0) / tl.sum(lsum * w, 0)
        tl.store(out + b * s_b + h * s_h + dims, res.to(out.dtype.element_ty))


class Batch:
    """One decode launch's inputs: queries, the page table, the contexts."""

    def __init__(self, pool: Pool, g: Geometry, contexts: list[int], seed: int) -> None:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.contexts = contexts
        self.q = torch.randn((len(contexts), g.q_heads, g.head_dim), generator=gen).to(device=pool.device, dtype=pool.dtype)
        self.table = pool.table(contexts)
        self.lens = torch.tensor(contexts, dtype=torch.int32, device=pool.device)
        self.out = torch.empty_like(self.q)

    def rows(self, idx: torch.Tensor) -> Batch:
        """A cohort: the same requests' rows (pages unchanged)."""
        sub = object.__new__(Batch)
        sub.contexts = [self.contexts[i] for i in idx.tolist()]
        sub.q, sub.table, sub.lens = self.q[idx], self.table[idx], self.lens[idx]
        sub.out = torch.empty_like(sub.q)
        return sub


def triton_attention(pool: Pool, g: Geometry, sms: int) -> Callable[[Batch], torch.Tensor]:
    def run(batch: Batch) -> torch.Tensor:
        n = len(batch.contexts)
        splits = fa2_num_splits(n, g.kv_heads, max(batch.contexts), sms, g.head_dim)
        per_split = -(-max(batch.contexts) // splits)
        per_split = -(-per_split // 64) * 64
        o_part = torch.empty((n, g.q_heads, splits, g.head_dim), dtype=torch.float32, device=pool.device)
        m_part = torch.empty((n, g.q_heads, splits), dtype=torch.float32, device=pool.device)
        l_part = torch.empty_like(m_part)
        _split_kernel[(n, g.kv_heads, splits)](
            batch.q, pool.k, pool.v, batch.table, batch.lens, o_part, m_part, l_part, g.head_dim ** -0.5, per_split,
            batch.q.stride(0), batch.q.stride(1), pool.k.stride(0), pool.k.stride(1), pool.k.stride(2), batch.table.stride(0),
            o_part.stride(0), o_part.stride(1), o_part.stride(2), m_part.stride(0), m_part.stride(1),
            GROUP=g.group, GROUP_PAD=max(16, triton.next_power_of_2(g.group)), D=g.head_dim, BLOCK_N=64, PAGE_SIZE=pool.page)
        _combine_kernel[(n, g.q_heads)](o_part, m_part, l_part, batch.out, splits, o_part.stride(0), o_part.stride(1), o_part.stride(2),
                                        m_part.stride(0), m_part.stride(1), batch.out.stride(0), batch.out.stride(1),
                                        D=g.head_dim, SPLITS_PAD=triton.next_power_of_2(splits))
        return batch.out
    return run


def flash_attn_attention(pool: Pool, g: Geometry) -> Callable[[Batch], torch.Tensor]:
    from flash_attn import flash_attn_with_kvcache

    def run(batch: Batch) -> torch.Tensor:
        return flash_attn_with_kvcache(batch.q.unsqueeze(1), pool.k, pool.v, cache_seqlens=batch.lens, block_table=batch.table,
                                       causal=True).squeeze(1)
    return run


def torch_attention(pool: Pool, g: Geometry) -> Callable[[Batch], torch.Tensor]:
    def run(batch: Batch) -> torch.Tensor:
        for i, c in enumerate(batch.contexts):
            pages = batch.table[i, : -(-c // pool.page)].long()
            k = pool.k[pages].reshape(-1, g.kv_heads, g.head_dim)[:c].transpose(0, 1).float()
            v = pool.v[pages].reshape(-1, g.kv_heads, g.head_dim)[:c].transpose(0, 1).float()
            q = batch.q[i].float().view(g.kv_heads, g.group, g.head_dim)
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v)  # each KV head with its group of queries
            batch.out[i] = o.reshape(g.q_heads, g.head_dim).to(batch.out.dtype)
        return batch.out
    return run


# --- timing -------------------------------------------------------------------------------------------
def timer(device: str, reps: int) -> Callable[[Callable[[], object]], float]:
    """Median microseconds of ``reps`` calls after three warm-up calls."""
    def median_us(fn: Callable[[], object]) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    return median_us


def split_in_place(run: Callable[[Batch], torch.Tensor], batch: Batch, cut: int) -> Callable[[], object]:
    """What Coda's backend does on a split step: gather each cohort's queries, launch, scatter back."""
    order = torch.argsort(batch.lens, stable=True)
    cohorts = [(order[:cut], batch.rows(order[:cut])), (order[cut:], batch.rows(order[cut:]))]

    def step() -> object:
        for idx, sub in cohorts:
            sub.q = batch.q.index_select(0, idx)
            batch.out.index_copy_(0, idx, run(sub))
        return batch.out
    return step


class Uniform:
    """Uniform launches (``n`` requests at one context), each measured once."""

    def __init__(self, pool: Pool, g: Geometry, run: Callable[[Batch], torch.Tensor], median_us: Callable[[Callable[[], object]], float],
                 seed: int) -> None:
        self.pool, self.g, self.run, self.median_us, self.seed = pool, g, run, median_us, seed
        self.times: dict[tuple[int, int], float] = {}

    def __call__(self, n: int, ctx: int) -> float:
        if (n, ctx) not in self.times:
            b = Batch(self.pool, self.g, [ctx] * n, self.seed)
            self.times[(n, ctx)] = self.median_us(lambda: self.run(b))
        return self.times[(n, ctx)]


# --- the grids ------------------------------------------------------------------------------------------
def skew_grid(quick: bool, max_tokens: int) -> Iterator[tuple[int, int, int, int]]:
    """(n, nb, kvs, kv_big): batch sizes, long shares, short contexts and context ratios."""
    ns, fracs, kvss, ratios = ((4,), (0.5,), (32, 64), (2, 4)) if quick else \
        ((4, 8, 16, 32, 64, 128), (0.125, 0.25, 0.5), (128, 512, 2048), (2, 4, 8, 16, 32))
    for n in ns:
        for frac in fracs:
            nb = max(1, round(n * frac))
            for kvs in kvss:
                for r in ratios:
                    if (n - nb) * kvs + nb * kvs * r <= max_tokens and n * kvs * r <= max_tokens:
                        yield n, nb, kvs, kvs * r


def agent_contexts(rng: np.random.Generator, n: int, given: list[int] | None) -> list[int]:
    """An agent-like decode batch: a coding agent's context grows over a session from a few thousand
    tokens to tens of thousands, so contexts are log-normal (median 6K, sigma 1.1, 256 to 128K:
    assumed, not fitted) unless ``--contexts`` gives a sample to draw from."""
    if given:
        return [int(x) for x in rng.choice(given, size=n)]
    return [int(x) for x in np.clip(rng.lognormal(math.log(6000), 1.1, size=n), 256, 131072)]


def label(gpu: str) -> str:
    """The GPU's name as the shared profiles' file names write it (``NVIDIA H200`` -> ``H200``)."""
    return re.sub(r"[^A-Za-z0-9]", "", gpu.replace("NVIDIA", "")) or "GPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--model", default="Qwen3-30B-A3B", help="names the files; the geometry comes from the three flags below")
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument(
        "--budget-s", type=float, default=240.0, help="stop taking new shapes after this long (the run's goal: under 5 minutes)"
    )
    ap.add_argument("--max-batch-tokens", type=int, default=1 << 20, help="context tokens in one batch, at most (sizes the KV pool)")
    ap.add_argument("--contexts", type=Path, help="a file of decode contexts, one per line, to draw the agent mixes from")
    ap.add_argument(
        "--dtype", choices=("bf16", "fp16"), default="bf16", help="of the KV cache and queries (Triton's CPU interpreter needs fp16)"
    )
    ap.add_argument("--quick", action="store_true", help="a small grid (the CPU smoke run)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA device is visible; run on a GPU, or pass --device cpu for the smoke run")
    if args.q_heads % args.kv_heads:
        raise SystemExit(f"error: --q-heads {args.q_heads} is not a multiple of --kv-heads {args.kv_heads}")
    t_start = time.monotonic()
    g = Geometry(args.q_heads, args.kv_heads, args.head_dim)
    if args.quick:
        g = Geometry(4, 2, 64) if args.device == "cpu" else g
    max_tokens = min(args.max_batch_tokens, 1 << 14) if args.quick else args.max_batch_tokens
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine()
    sms = torch.cuda.get_device_properties(0).multi_processor_count if args.device == "cuda" else 1
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    kernels: dict[str, tuple[Pool, Callable[[Batch], torch.Tensor]]] = {}
    pool = Pool(max_tokens, PAGE, g, args.device, args.seed, dtype)
    if args.device == "cuda" or os.environ.get("TRITON_INTERPRET") == "1" and triton is not None:
        kernels["triton"] = (pool, triton_attention(pool, g, sms))
    if args.device == "cuda":
        try:
            fa_pool = Pool(max_tokens, FA2_PAGE, g, args.device, args.seed, dtype)
            kernels["flash_attn"] = (fa_pool, flash_attn_attention(fa_pool, g))
        except ImportError:
            print("flash_attn is not installed: its kernel is not measured")
    else:
        kernels["torch"] = (pool, torch_attention(pool, g))
    for name, (pool, run) in kernels.items():
        check = Batch(pool, g, [37, 500, 1200, 64], args.seed)
        expected = torch_attention(pool, g)(check).float().clone()
        err = float((run(check).float() - expected).abs().max())
        print(f"{name}: largest difference from the PyTorch reference on a 4-request batch: {err:.3g}")
        if err > 0.05:  # bf16 inputs and output: a few ulps of values near 1
            raise SystemExit(f"error: kernel {name} disagrees with the reference by {err:.3g}; its timings would mean nothing")
    median_us = timer(args.device, args.reps)
    meta = {
        "gpu": gpu,
        "sms": sms,
        "torch": torch.__version__,
        "triton": getattr(triton, "__version__", None),
        "device": args.device,
        "model": args.model,
        "geometry": vars(g),
        "page_tokens": {k: p.page for k, (p, _) in kernels.items()},
        "kv_dtype": args.dtype,
        "reps": args.reps,
        "seed": args.seed,
        "grid": "quick" if args.quick else "full",
        "kernels": list(kernels),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    stopped = None
    for name, (pool, run) in kernels.items():
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        stem = f"{label(gpu) if args.device == 'cuda' else 'CPU'}_{args.model}_tp1"
        uniform_us = Uniform(pool, g, run, median_us, args.seed)

        with (out / f"{stem}_skew.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(SKEW_HEADER)
            for n, nb, kvs, kvb in skew_grid(args.quick, max_tokens):
                if time.monotonic() - t_start > args.budget_s:
                    stopped = f"budget of {args.budget_s:g} s spent during {name}'s skew grid"
                    break
                skewed = Batch(pool, g, [kvb] * nb + [kvs] * (n - nb), args.seed)
                t_skew = median_us(lambda: run(skewed))  # noqa: B023 - timed at once
                mean = max(1, round(((n - nb) * kvs + nb * kvb) / n))
                t_mean, t_max = uniform_us(n, mean), uniform_us(n, kvb)
                uniform_us(n - nb, kvs)
                uniform_us(nb, kvb)
                alpha = (t_skew - t_mean) / (t_max - t_mean) if t_max != t_mean else 0.0
                w.writerow(
                    (
                        "pure",
                        n,
                        nb,
                        round(nb / n, 4),
                        kvb / kvs,
                        0,
                        0,
                        kvs,
                        kvb,
                        mean,
                        round(t_mean, 3),
                        round(t_max, 3),
                        round(t_skew, 3),
                        round(alpha, 4),
                    )
                )
        with (out / f"{stem}_attention.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(ATTENTION_HEADER)
            for (n, ctx), t in sorted(uniform_us.times.items()):
                w.writerow((0, 0, n, ctx, round(t, 3)))
        rng = np.random.default_rng(args.seed)
        given = [int(x) for x in args.contexts.read_text().split()] if args.contexts else None
        with (out / "agent_mixes.jsonl").open("w") as f:
            for n in (4,) if args.quick else (16, 32, 64, 128):
                for _ in range(1 if args.quick else 6):
                    if time.monotonic() - t_start > args.budget_s:
                        stopped = stopped or f"budget of {args.budget_s:g} s spent during {name}'s agent mixes"
                        break
                    ctx = agent_contexts(rng, n, given)
                    while sum(ctx) > max_tokens:
                        ctx = agent_contexts(rng, n, given)
                    batch = Batch(pool, g, ctx, args.seed)
                    full = median_us(lambda: run(batch))  # noqa: B023 - timed at once
                    m = max(1, math.ceil(0.35 * n))
                    cuts = sorted({int(c) for c in np.linspace(m, n - m, num=min(9, n - 2 * m + 1))}) if n - m >= m else []
                    split = {k: median_us(split_in_place(run, batch, k)) for k in cuts}
                    f.write(
                        json.dumps(
                            {
                                "n": n,
                                "contexts": sorted(ctx),
                                "full_us": round(full, 3),
                                "split_us": {str(k): round(t, 3) for k, t in split.items()},
                                "gain": {str(k): round((full - t) / full, 4) for k, t in split.items()},
                            }
                        )
                        + "\n"
                    )
        (out / "meta.json").write_text(
            json.dumps(meta | {"stopped_early": stopped, "elapsed_s": round(time.monotonic() - t_start, 1)}, indent=1)
        )
        print(
            f"{name}: wrote {out}/{stem}_skew.csv, {stem}_attention.csv ({len(uniform_us.times)} uniform launches), "
            "agent_mixes.jsonl, meta.json"
        )
    print(f"done in {time.monotonic() - t_start:.0f} s on {gpu}" + (f"; stopped early: {stopped}" if stopped else ""))


if __name__ == "__main__":
    main()
