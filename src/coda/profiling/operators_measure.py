"""Measure one layer's operators of a model geometry on this GPU with PyTorch and Triton (no vLLM):
the files ``coda profile fit --operators`` reads (the shared profiles folder's format).

``coda profile measure --model-config config.json [--tp N] --out DIR`` writes, for the
geometry's per-rank shapes at TP ``N`` (random bf16 weights, one layer, times in microseconds):

* ``<GPU>_<model>_tpN_dense.csv`` (``layer,tokens,time_us``): the matrix multiplies (``qkv_proj``,
  ``o_proj``, ``gate_up_proj``, ``down_proj``) as ``torch.matmul``, the norms as
  ``torch.nn.functional.rms_norm``, SiLU-and-multiply, rotary embedding, the embedding lookup;
* ``..._per_sequence.csv`` (``layer,sequences,time_us``): ``lm_head`` and the sampler (softmax
  over the whole vocabulary and one multinomial draw per sequence);
* ``..._attention.csv`` (``prefill_chunk,kv_prefill,n_decode,kv_decode,time_us``): decode batches
  on exact contexts with the Triton split-KV kernel of ``coda.profiling.measure`` (FA2's grid and
  split rule), prefill chunks with PyTorch's ``scaled_dot_product_attention`` (causal, GQA), and
  mixed batches as the two launched back to back (vLLM runs one varlen kernel there; the fit's
  mixed correction absorbs the difference, which is why that regime is measured at all);
* ``..._moe.csv`` (``tokens,activated_experts,time_us``) for an MoE model: the router, then for each
  activated expert its gate-up and down multiplies on its tokens (uniform routing);
* ``<GPU>_<model>_meta.yaml``: the GPU's identity (CUDA's name, the catalog key the fit looks up,
  SMs, memory), PyTorch, Triton and CUDA versions, the geometry and the grids.

Shapes are measured from small to large until ``budget_s`` is spent (8 minutes by default on a
GPU), each warmed up and its median of repeats kept (``coda.profiling.measure.Timer``). On a CPU
(``--device cpu``) the same code runs a tiny grid as a smoke test.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from coda.cost.geometry import ELEMENTWISE, GEMMS, Geometry, Rank, expected_experts
from coda.errors import CodaError
from coda.profiling import catalog
from coda.profiling.measure import DecodeBench, Timer, _torch, write_csv

GRIDS: dict[str, dict[str, Any]] = {
    "cuda": {
        "tokens": [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1280, 1536, 1792, 2048],
        "sequences": [1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 256],
        "decode_batches": [1, 2, 4, 8, 16, 32, 64, 128, 256],
        "contexts": [16, 64, 256, 1024, 2048, 4096, 8192, 16384],
        "decode_tokens_max": 1 << 21,  # batch x context, so that the grid fits the budget and the memory
        "chunks": [16, 32, 64, 128, 256, 512, 1024, 2048],
        "kv_prefill": [0, 64, 256, 1024, 4096, 16384],
        "mixed": {"chunks": [16, 128, 1024], "batches": [1, 4, 16, 64], "contexts": [256, 2048, 8192]},
        "warmup": 3,
        "repeats": 10,
    },
    "cpu": {
        "tokens": [1, 4, 16],
        "sequences": [1, 4],
        "decode_batches": [1, 4],
        "contexts": [16, 64],
        "decode_tokens_max": 1 << 10,
        "chunks": [16, 32],
        "kv_prefill": [0, 64],
        "mixed": {"chunks": [16], "batches": [2], "contexts": [32]},
        "warmup": 1,
        "repeats": 3,
    },
}


class LayerBench:
    """Random bf16 tensors of one layer's per-rank shapes and a callable per operator and count."""

    def __init__(self, torch: Any, device: str, rank: Rank) -> None:
        self.torch, self.device, self.rank, self.g = torch, device, rank, rank.g
        self.dtype = torch.bfloat16 if device == "cuda" else torch.float32

    def _rand(self, *shape: int) -> Any:
        return self.torch.randn(*shape, device=self.device, dtype=self.dtype)

    def dense(self, op: str, tokens: int) -> Callable[[], Any]:
        torch, g, r = self.torch, self.g, self.rank
        F = torch.nn.functional
        if op in GEMMS or op == "lm_head":
            n, k = r.gemm(op)
            x, w = self._rand(tokens, k), self._rand(k, n)
            return lambda: torch.matmul(x, w)
        if op in ("layernorm", "final_layernorm"):
            x, w = self._rand(tokens, g.hidden_size), self._rand(g.hidden_size)
            return lambda: F.rms_norm(x, (g.hidden_size,), w, 1e-6)
        if op == "act_fn":
            width = g.intermediate_size // r.tp
            x = self._rand(tokens, 2 * width)
            return lambda: F.silu(x[:, :width]) * x[:, width:]
        if op == "qk_norm":
            x, w = self._rand(tokens * (r.q_heads + r.kv_heads), g.head_dim), self._rand(g.head_dim)
            return lambda: F.rms_norm(x, (g.head_dim,), w, 1e-6)
        if op == "rotary_emb":
            half = g.head_dim // 2
            x = self._rand(tokens, r.q_heads + r.kv_heads, g.head_dim)
            cos, sin = self._rand(tokens, 1, half), self._rand(tokens, 1, half)

            def rotate() -> Any:
                a, b = x[..., :half], x[..., half:]
                return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

            return rotate
        if op == "embedding":
            table = self._rand(g.vocab_size // r.tp, g.hidden_size)
            ids = torch.randint(0, g.vocab_size // r.tp, (tokens,), device=self.device)
            return lambda: F.embedding(ids, table)
        if op == "sampler":
            logits = torch.randn(tokens, g.vocab_size, device=self.device, dtype=torch.float32)
            return lambda: torch.multinomial(torch.softmax(logits, dim=-1), 1)
        raise KeyError(op)

    def moe(self, tokens: int, experts: int) -> Callable[[], Any]:
        """The router and ``experts`` experts sharing the step's ``tokens x experts_per_token`` pairs."""
        torch, g = self.torch, self.g
        F = torch.nn.functional
        width = g.moe_intermediate_size // self.rank.tp
        x, router = self._rand(tokens, g.hidden_size), self._rand(g.hidden_size, g.num_experts)
        per = np.diff(np.linspace(0, tokens * g.experts_per_token, experts + 1).round().astype(int))
        ins = [self._rand(max(1, int(n)), g.hidden_size) for n in per]
        up = [self._rand(g.hidden_size, 2 * width) for _ in per]
        down = [self._rand(width, g.hidden_size) for _ in per]

        def block() -> Any:
            torch.topk(torch.matmul(x, router), g.experts_per_token, dim=-1)
            for a, u, d in zip(ins, up, down):
                h = torch.matmul(a, u)
                torch.matmul(F.silu(h[:, :width]) * h[:, width:], d)

        return block


def _device_identity(torch: Any, device: str) -> dict[str, Any]:
    if device != "cuda":
        return {"gpu": "CPU", "hardware": "CPU"}
    props = torch.cuda.get_device_properties(0)
    name = torch.cuda.get_device_name(0)
    return {"gpu": name, "hardware": catalog.gpu_key(name) or name.replace(" ", ""), "sms": props.multi_processor_count,
            "memory_bytes": int(props.total_memory), "compute_capability": f"{props.major}.{props.minor}",
            "cuda_version": torch.version.cuda}


def run(
    out: Path, geometry: Geometry, *, tp: int = 1, device: str = "cuda", budget_s: float = 480.0, model_name: str | None = None
) -> list[Path]:
    """Measure the operator files of ``geometry`` at TP ``tp`` until ``budget_s`` is spent; the files written."""
    torch = _torch()
    if device == "cuda" and not torch.cuda.is_available():
        raise CodaError("--device cuda: no CUDA device visible to PyTorch; use --device cpu for the smoke test")
    grid, rank = GRIDS[device], geometry.ranks(tp)
    timer = Timer(torch, device, grid["warmup"], grid["repeats"])
    layer = LayerBench(torch, device, rank)
    attention = DecodeBench(torch, device, rank.kv_heads, rank.q_heads, geometry.head_dim)
    deadline = time.monotonic() + budget_s
    identity = _device_identity(torch, device)
    setup = f"{identity['hardware']}_{model_name or geometry.name}"
    out.mkdir(parents=True, exist_ok=True)

    def us(fn: Callable[[], Any]) -> float:
        return round(timer(fn) * 1e6, 4)

    def left() -> bool:
        return time.monotonic() < deadline

    dense_ops = [op for op in (*GEMMS, *ELEMENTWISE) if rank.has(op)] + ["embedding", "final_layernorm"]
    dense = [[op, n, us(layer.dense(op, n))] for n in grid["tokens"] for op in dense_ops if left()]
    per_seq = [[op, n, us(layer.dense(op, n))] for n in grid["sequences"] for op in ("lm_head", "sampler") if left()]
    att: list[list[Any]] = []
    for c in grid["contexts"]:
        for b in grid["decode_batches"]:
            if b * c <= grid["decode_tokens_max"] and left():
                att.append([0, 0, b, c, us(attention.launch(np.full(b, c)))])
    for kv in grid["kv_prefill"]:
        for n in grid["chunks"]:
            if left():
                att.append([n, kv, 0, 0, us(attention.prefill(n, kv))])
    mixed = grid["mixed"]
    for n in mixed["chunks"]:
        for b in mixed["batches"]:
            for c in mixed["contexts"]:
                if left():
                    pre, dec = attention.prefill(n, 0), attention.launch(np.full(b, c))
                    att.append([n, 0, b, c, us(lambda pre=pre, dec=dec: (pre(), dec()))])
    files = [
        write_csv(out / f"{setup}_tp{tp}_dense.csv", ["layer", "tokens", "time_us"], dense),
        write_csv(out / f"{setup}_tp{tp}_per_sequence.csv", ["layer", "sequences", "time_us"], per_seq),
        write_csv(out / f"{setup}_tp{tp}_attention.csv", ["prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"], att),
    ]
    if geometry.moe_layers:
        moe = []
        for n in grid["tokens"]:
            experts = max(1, round(expected_experts(n, geometry.num_experts, geometry.experts_per_token)))
            if left():
                moe.append([n, experts, us(layer.moe(n, experts))])
        files.append(write_csv(out / f"{setup}_tp{tp}_moe.csv", ["tokens", "activated_experts", "time_us"], moe))
    meta = {
        **identity,
        "model": model_name or geometry.name,
        "architecture": geometry.architecture,
        "variant": "bf16" if device == "cuda" else "float32 (CPU smoke test)",
        "tp_degrees": [tp],
        "profiled_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "measured_with": f"coda profile measure --model-config: PyTorch {torch.__version__}"
        + (f", Triton {_triton_version()}" if device == "cuda" else ""),
        "budget_s": budget_s,
        "completed": left(),
        "geometry": geometry.model_dump(),
        "grids": {k: v for k, v in grid.items() if k not in ("warmup", "repeats")},
        "measurement_iterations": grid["repeats"],
    }
    meta_path = out / f"{setup}_meta.yaml"
    meta_path.write_text(yaml.safe_dump(meta, sort_keys=False))
    return [*files, meta_path]


def _triton_version() -> str:
    import triton

    return str(triton.__version__)
