"""A Hugging Face ``config.json`` read into a ``Geometry``: the model half of a profile.

Covers the decoder-only families vLLM serves with standard attention: Llama, Mistral, Qwen2/3
(dense and MoE), Mixtral, Gemma and the like, with the text model of a multimodal config taken
from ``text_config``. Multi-head latent attention (DeepSeek V2/V3) and hybrid attention models
are refused: their KV and attention shapes are not what the operator model charges.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coda.cost.geometry import Geometry
from coda.errors import CodaError, read_document

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "float8_e4m3fn": 1, "int8": 1}
UNSUPPORTED = {"kv_lora_rank": "multi-head latent attention (DeepSeek-style)", "layer_types": "hybrid attention layers"}


def read_config(path: Path, *, name: str | None = None, kv_dtype_bytes: int = 2) -> Geometry:
    """The geometry of the model whose ``config.json`` is at ``path``."""
    if not path.is_file():
        raise CodaError(f"--model-config {path}: no such file (pass the model's config.json)")
    try:
        raw = json.loads(read_document(path, "--model-config"))
    except json.JSONDecodeError as err:
        raise CodaError(f"--model-config {path}: not valid JSON at line {err.lineno}: {err.msg}") from None
    if not isinstance(raw, dict):
        raise CodaError(f"--model-config {path}: the top level must be an object (a Hugging Face config.json)")
    return geometry_of(raw, source=str(path), name=name or raw.get("_name_or_path") or path.parent.name, kv_dtype_bytes=kv_dtype_bytes)


def geometry_of(raw: dict[str, Any], *, source: str, name: str, kv_dtype_bytes: int = 2) -> Geometry:
    cfg = {**raw, **raw["text_config"]} if isinstance(raw.get("text_config"), dict) else raw
    for key, what in UNSUPPORTED.items():
        if cfg.get(key) and not (key == "layer_types" and set(cfg[key]) <= {"full_attention"}):
            raise CodaError(f"{source}: {key}: {what} is not modelled; the operator model covers standard (grouped-query) attention")

    def need(key: str, *alts: str) -> int:
        for k in (key, *alts):
            if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool):
                return int(cfg[k])
        raise CodaError(f"{source}: {key}: missing or not an integer; a config.json of a decoder-only model has it")

    layers, hidden, heads = need("num_hidden_layers", "n_layer"), need("hidden_size", "n_embd"), need("num_attention_heads", "n_head")
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
    per_token = int(cfg.get("num_experts_per_tok") or 0)
    if experts and not per_token:
        raise CodaError(f"{source}: num_experts_per_tok: a mixture-of-experts config needs it")
    moe_width = int(cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size") if experts else 0) or 0)
    moe_layers = 0
    if experts:
        step = int(cfg.get("decoder_sparse_step") or 1)
        dense_only = set(cfg.get("mlp_only_layers") or []) | set(range(int(cfg.get("first_k_dense_replace") or 0)))
        moe_layers = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    shared = (
        int(cfg.get("shared_expert_intermediate_size") or 0)
        or int(cfg.get("n_shared_experts") or cfg.get("num_shared_experts") or 0) * moe_width
    )
    weight_bytes = _weight_bytes(cfg, source)
    try:
        return Geometry(
            name=str(name),
            architecture=str(cfg.get("model_type") or "unknown"),
            num_layers=layers,
            hidden_size=hidden,
            num_q_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=need("intermediate_size") if not experts or moe_layers < layers else int(cfg.get("intermediate_size") or 0),
            vocab_size=need("vocab_size"),
            num_experts=experts,
            experts_per_token=per_token,
            moe_intermediate_size=moe_width,
            shared_expert_intermediate_size=shared,
            moe_layers=moe_layers,
            qk_norm=str(cfg.get("model_type", "")).startswith("qwen3"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            weight_bytes=weight_bytes,
            kv_dtype_bytes=kv_dtype_bytes,
        )
    except ValueError as err:
        raise CodaError(f"{source}: {str(err).splitlines()[0]}") from None


def _weight_bytes(cfg: dict[str, Any], source: str) -> float:
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method", "")).lower()
        if method == "fp8":
            return 1.0
        bits = quant.get("bits") or quant.get("w_bit")
        if isinstance(bits, int) and bits > 0:
            return bits / 8.0
        raise CodaError(f"{source}: quantization_config: quant_method {method!r} without bits; give an fp8 or a bits= config")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise CodaError(f"{source}: torch_dtype {dtype!r}: unknown; use one of {', '.join(DTYPE_BYTES)}")
    return float(DTYPE_BYTES[dtype])
