"""Measure the CSVs ``coda profile fit`` reads, on the local GPU or CPU (PyTorch, and Triton on a GPU).

Decode attention runs on exact context vectors, never padded (padding would invent cohort
gains): on a GPU a Triton split-KV kernel that lays out its grid and picks its split count the
way FlashAttention-2 does (so the ``fa2-split`` model describes what was measured); on a CPU,
as a smoke test, PyTorch's nested-jagged ``scaled_dot_product_attention`` with each KV head's
query group as the query rows (GQA packed, as FA2 does for decode). Each shape is warmed up,
repeated and its median kept; shapes stop once ``budget_s`` is spent, so the GPU run fits in
8 minutes. Outputs: ``<GPU>_<model>_tp1_attention.csv`` (base grid and prefill rows),
``..._skew.csv`` (LLMServingSim's skew format, pure decode), ``cohorts.csv`` (full batch vs
its two cohorts on context vectors sampled from the synthetic coding-agent workload),
``h2d.csv`` (pinned host-to-device copies, GPU only) and ``hardware.json``.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from coda.cost import kernels
from coda.errors import CodaError
from coda.machine import machine, this_process
from coda.profiling import catalog

MODEL = "Qwen3-Coder-30B-A3B-Instruct-FP8"


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise CodaError("profile measure needs PyTorch (pip install torch); the cost model itself does not") from None
    return torch


class Timer:
    """Median seconds of a callable after warm-up: CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, torch: Any, device: str, warmup: int, repeats: int) -> None:
        self.torch, self.device, self.warmup, self.repeats = torch, device, warmup, repeats

    def __call__(self, fn: Callable[[], Any]) -> float:
        for _ in range(self.warmup):
            fn()
        samples = []
        for _ in range(self.repeats):
            if self.device == "cuda":
                start = self.torch.cuda.Event(enable_timing=True)
                end = self.torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e-3)
            else:
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
        return statistics.median(samples)


class DecodeBench:
    """Builds one decode batch on exact contexts and returns a callable that runs its attention."""

    def __init__(self, torch: Any, device: str, kv_heads: int, q_heads: int, head_dim: int) -> None:
        self.torch, self.device = torch, device
        self.h, self.g, self.d = kv_heads, q_heads // kv_heads, head_dim
        self.dtype = torch.bfloat16 if device == "cuda" else torch.float32
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 1
        self._triton = _triton_split_kv() if device == "cuda" else None

    def launch(self, contexts: np.ndarray) -> Callable[[], Any]:
        torch = self.torch
        ctx = [int(c) for c in contexts]
        total = sum(ctx)
        k = torch.randn(total, self.h, self.d, device=self.device, dtype=self.dtype)
        v = torch.randn(total, self.h, self.d, device=self.device, dtype=self.dtype)
        q = torch.randn(len(ctx), self.h, self.g, self.d, device=self.device, dtype=self.dtype)
        if self._triton is not None:
            cu = torch.tensor(np.concatenate([[0], np.cumsum(ctx)]), device=self.device, dtype=torch.int32)
            blocks = -(-max(ctx) // 128)
            splits = kernels.fa2_num_splits(len(ctx) * self.h, 2 * self.sms, blocks)
            return lambda: self._triton(q, k, v, cu, splits)
        import torch.nn.functional as F

        offsets = torch.tensor(np.concatenate([[0], np.cumsum(ctx)]), dtype=torch.int64)
        qn = torch.nested.nested_tensor_from_jagged(
            q.transpose(1, 2).reshape(-1, self.h, self.d).contiguous(), torch.arange(0, len(ctx) * self.g + 1, self.g)
        )
        kn = torch.nested.nested_tensor_from_jagged(k, offsets)
        vn = torch.nested.nested_tensor_from_jagged(v, offsets)
        return lambda: F.scaled_dot_product_attention(qn.transpose(1, 2), kn.transpose(1, 2), vn.transpose(1, 2))

    def prefill(self, new: int, cached: int) -> Callable[[], Any]:
        """One sequence: ``new`` causal queries over ``cached + new`` keys (one sequence, no padding)."""
        torch = self.torch
        import torch.nn.functional as F
        from torch.nn.attention.bias import causal_lower_right

        hq = self.h * self.g
        q = torch.randn(1, hq, new, self.d, device=self.device, dtype=self.dtype)
        k = torch.randn(1, self.h, cached + new, self.d, device=self.device, dtype=self.dtype)
        v = torch.randn(1, self.h, cached + new, self.d, device=self.device, dtype=self.dtype)
        mask = causal_lower_right(new, cached + new)
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def _triton_split_kv() -> Callable[..., Any]:
    """A Triton split-KV decode kernel with FA2's grid (split fastest, then head, then request)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def split_kernel(
        Q,
        K,
        V,
        CU,
        OA,
        LA,
        MA,
        scale,
        n_req,
        H: tl.constexpr,
        G: tl.constexpr,
        GP: tl.constexpr,
        D: tl.constexpr,
        BN: tl.constexpr,
        NS,
    ):
        split = tl.program_id(0)
        zh = tl.program_id(1)
        req = zh // H
        h = zh % H
        start = tl.load(CU + req)
        length = tl.load(CU + req + 1) - start
        nb = (length + BN - 1) // BN
        per = (nb + NS - 1) // NS
        b0 = split * per
        b1 = tl.minimum(nb, b0 + per)
        rows = tl.arange(0, GP)
        dims = tl.arange(0, D)
        q = tl.load(Q + ((req * H + h) * G + rows[:, None]) * D + dims[None, :], mask=rows[:, None] < G, other=0.0)
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        for b in range(b0, b1):
            cols = b * BN + tl.arange(0, BN)
            valid = cols < length
            kv_off = ((start + cols[:, None]) * H + h) * D + dims[None, :]
            k = tl.load(K + kv_off, mask=valid[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            v = tl.load(V + kv_off, mask=valid[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        base = (split * n_req + req) * H + h
        tl.store(OA + (base * GP + rows[:, None]) * D + dims[None, :], acc)
        tl.store(LA + base * GP + rows, l_i)
        tl.store(MA + base * GP + rows, m_i)

    def run(q: Any, k: Any, v: Any, cu: Any, splits: int) -> Any:
        n, h, g, d = q.shape
        gp = max(16, triton.next_power_of_2(g))
        oa = torch.empty(splits, n, h, gp, d, device=q.device, dtype=torch.float32)
        la = torch.empty(splits, n, h, gp, device=q.device, dtype=torch.float32)
        ma = torch.empty(splits, n, h, gp, device=q.device, dtype=torch.float32)
        split_kernel[(splits, n * h)](q, k, v, cu, oa, la, ma, 1.0 / math.sqrt(d), n, H=h, G=g, GP=gp, D=d, BN=128, NS=splits)
        if splits == 1:
            return oa[0] / la[0][..., None]
        m = ma.amax(0)
        w = torch.exp(ma - m)
        return (oa * w[..., None]).sum(0) / (la * w).sum(0)[..., None]

    return run


def _plan(device: str) -> dict[str, Any]:
    if device == "cuda":
        return {
            "batches": [1, 2, 4, 8, 16, 32, 64, 128, 256],
            "contexts": [128, 512, 2048, 8192, 16384, 32768],
            "skew_n": [8, 16, 32, 64, 128, 256],
            "skew_kvs": [512, 2048, 8192],
            "prefill": [(512, 0), (2048, 0), (8192, 0), (2048, 8192), (8192, 16384), (8192, 65536)],
            "cohort_vectors": 24,
            "cohort_n": [16, 64, 128, 256],
            "warmup": 3,
            "repeats": 10,
        }
    return {
        "batches": [1, 2, 4],
        "contexts": [16, 64, 256],
        "skew_n": [4],
        "skew_kvs": [16, 64],
        "prefill": [(32, 0), (32, 64)],
        "cohort_vectors": 2,
        "cohort_n": [6],
        "warmup": 1,
        "repeats": 3,
    }


def _sampled_contexts(rng: np.random.Generator, n: int, cap: int, seed: int) -> np.ndarray:
    """Decode contexts drawn from the synthetic coding-agent workload's prompt sizes."""
    from coda.workload.schema import session_prompts
    from coda.workload.synth import SynthSpec, synthesize

    wl = synthesize(SynthSpec(rate=1.0, duration=300.0, seed=seed))
    sizes = [prompt for sess in wl.sessions for _, prompt in session_prompts(sess)]
    pool = np.clip(np.array(sizes, dtype=np.int64), 1, cap)
    return rng.choice(pool, size=n)


def run(out: Path, *, device: str = "cuda", budget_s: float = 420.0, seed: int = 0, model: str = MODEL) -> list[Path]:
    """Measure everything the plan lists until ``budget_s`` is spent; returns the files written."""
    torch = _torch()
    if device == "cuda" and not torch.cuda.is_available():
        raise CodaError("--device cuda: no CUDA device visible to PyTorch; use --device cpu for the smoke test")
    if model not in catalog.MODELS:
        raise CodaError(f"--model {model!r}: unknown model; known: {', '.join(catalog.MODELS)}")
    spec = catalog.MODELS[model]["spec"]
    plan = _plan(device)
    bench = DecodeBench(torch, device, spec["num_kv_heads"], spec["num_q_heads"], spec["head_dim"])
    timer = Timer(torch, device, plan["warmup"], plan["repeats"])
    deadline = time.monotonic() + budget_s
    rng = np.random.default_rng(seed)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    gpu = catalog.gpu_key(name) or name.replace(" ", "")
    prefix = f"{gpu}_{model}_tp1"
    out.mkdir(parents=True, exist_ok=True)

    def t(contexts: np.ndarray) -> float:
        return timer(bench.launch(contexts)) * 1e6

    att_rows: list[list[Any]] = []
    for n in plan["batches"]:
        for c in plan["contexts"]:
            if time.monotonic() > deadline:
                break
            att_rows.append([0, 0, n, c, round(t(np.full(n, c)), 4)])
    for new, cached in plan["prefill"]:
        if time.monotonic() < deadline:
            att_rows.append([new, cached, 0, 0, round(timer(bench.prefill(new, cached)) * 1e6, 4)])
    skew_rows: list[list[Any]] = []
    for n in plan["skew_n"]:
        for kvs in plan["skew_kvs"]:
            for nb in sorted({1, max(1, n // 8), n // 2, n - max(1, n // 8)}):
                if time.monotonic() > deadline or not 0 < nb < n:
                    continue
                big = 4 * kvs
                mean = (nb * big + (n - nb) * kvs) / n
                tm, tx = t(np.full(n, round(mean))), t(np.full(n, big))
                ts = t(np.array([big] * nb + [kvs] * (n - nb)))
                alpha = (ts - tm) / (tx - tm) if tx != tm else 0.0
                skew_rows.append(
                    ["pure", n, nb, round(nb / n, 4), 4.0, 0, 0, kvs, big, mean, round(tm, 4), round(tx, 4), round(ts, 4), round(alpha, 4)]
                )
    cohort_rows: list[list[Any]] = []
    cap = max(plan["contexts"])
    for j in range(plan["cohort_vectors"]):
        n = plan["cohort_n"][j % len(plan["cohort_n"])]
        if time.monotonic() > deadline:
            break
        ctx = np.sort(_sampled_contexts(rng, n, cap, seed + j))
        full = t(ctx)
        for frac in (0.35, 0.5, 0.65):
            cut = min(n - 1, max(1, round(frac * n)))
            cohort_rows.append([n, cut, " ".join(map(str, ctx.tolist())), round(full, 4), round(t(ctx[:cut]), 4), round(t(ctx[cut:]), 4)])
    h2d_rows: list[list[Any]] = []
    if device == "cuda":
        for size in [2**p for p in range(16, 31, 2)]:
            if time.monotonic() > deadline:
                break
            host = torch.empty(size, dtype=torch.uint8).pin_memory()
            dev = torch.empty(size, dtype=torch.uint8, device="cuda")
            h2d_rows.append([size, timer(lambda dev=dev, host=host: dev.copy_(host, non_blocking=True))])
    files = [
        write_csv(out / f"{prefix}_attention.csv", ["prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"], att_rows),
        write_csv(
            out / f"{prefix}_skew.csv",
            ["regime", "n", "nb", "ratio", "skew", "pc", "kp", "kvs", "kv_big", "kv_mean", "t_mean_us", "t_max_us", "t_skew_us", "alpha"],
            skew_rows,
        ),
        write_csv(out / "cohorts.csv", ["n", "cut", "contexts", "t_full_us", "t_short_us", "t_long_us"], cohort_rows),
    ]
    if h2d_rows:
        files.append(write_csv(out / "h2d.csv", ["bytes", "seconds"], h2d_rows))
    hw = {
        "device": name,
        "gpu": gpu,
        "model": model,
        "kernel": "triton split-KV (FA2 grid and split heuristic)" if device == "cuda" else "nested-jagged SDPA (CPU smoke test)",
        "machine": machine(**this_process()),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        hw |= {"sms": props.multi_processor_count, "memory_bytes": props.total_memory}
    (out / "hardware.json").write_text(json.dumps(hw, indent=2) + "\n")
    return [*files, out / "hardware.json"]


def write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path
