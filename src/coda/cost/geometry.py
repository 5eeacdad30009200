"""A model's shape (what its Hugging Face ``config.json`` says) and what each operator of one
layer reads and computes on one tensor-parallel rank.

The operator profile charges measured operators; when a model or a TP degree was not measured,
``coda profile derive`` scales each measured operator by the ratio of these FLOPs and bytes
(``coda.profiling.derive``). Under TP, attention heads, MLP and expert widths, the vocabulary
and the KV heads are split across ranks as vLLM splits them (KV heads replicated when there
are fewer than ranks); norms, rotary and the router are not split.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

#: dense operators of one layer that are matrix multiplies (their weights are read every step)
GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
#: dense operators of one layer that touch activations only
ELEMENTWISE = ("layernorm", "act_fn", "rotary_emb", "qk_norm")
#: operators that run once per step, not per layer
STEP_OPS = ("embedding", "final_layernorm")
PER_SEQUENCE = ("lm_head", "sampler")


class Geometry(BaseModel):
    """The shape of a decoder-only transformer, dense or mixture-of-experts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    architecture: str = Field(description="config.json model_type")
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_q_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    intermediate_size: NonNegativeInt = Field(description="dense MLP width (0: every layer is MoE)")
    vocab_size: PositiveInt
    num_experts: NonNegativeInt = Field(0, description="routed experts per MoE layer (0: dense model)")
    experts_per_token: NonNegativeInt = 0
    moe_intermediate_size: NonNegativeInt = 0
    shared_expert_intermediate_size: NonNegativeInt = Field(0, description="always-active expert width, 0 if none")
    moe_layers: NonNegativeInt = Field(0, description="layers whose MLP is the MoE block")
    qk_norm: bool = Field(False, description="per-head RMSNorm of queries and keys (Qwen3)")
    tie_word_embeddings: bool = False
    weight_bytes: float = Field(gt=0, description="bytes per weight (2: bf16, 1: FP8)")
    kv_dtype_bytes: PositiveInt = 2
    activation_bytes: PositiveInt = 2

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    def ranks(self, tp: int) -> Rank:
        return Rank(self, tp)

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV bytes per token on one rank (K and V, every layer)."""
        return 2 * self.num_layers * self.ranks(tp).kv_heads * self.head_dim * self.kv_dtype_bytes

    def params(self) -> tuple[float, float]:
        """(all weights, weights used per token) in parameters, for the whole model."""
        h = self.hidden_size
        attn = h * (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim + self.num_q_heads * self.head_dim * h
        mlp = 3 * h * self.intermediate_size
        expert = 3 * h * self.moe_intermediate_size
        shared = 3 * h * self.shared_expert_intermediate_size
        router = h * self.num_experts
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        total = self.num_layers * attn + self.dense_layers * mlp + self.moe_layers * (self.num_experts * expert + shared + router) + embed
        active = (
            self.num_layers * attn + self.dense_layers * mlp + self.moe_layers * (self.experts_per_token * expert + shared + router) + embed
        )
        return float(total), float(active)


@dataclass(frozen=True, slots=True)
class Rank:
    """Per-rank shapes of a model under tensor parallelism of degree ``tp``."""

    g: Geometry
    tp: int

    @property
    def q_heads(self) -> int:
        return max(1, self.g.num_q_heads // self.tp)

    @property
    def kv_heads(self) -> int:
        return max(1, self.g.num_kv_heads // self.tp)

    def gemm(self, op: str) -> tuple[int, int]:
        """(output width N, input width K) of a layer's matrix multiply on this rank."""
        g, d = self.g, self.g.head_dim
        if op == "qkv_proj":
            return (self.q_heads + 2 * self.kv_heads) * d, g.hidden_size
        if op == "o_proj":
            return g.hidden_size, self.q_heads * d
        if op == "gate_up_proj":
            return 2 * g.intermediate_size // self.tp, g.hidden_size
        if op == "down_proj":
            return g.hidden_size, g.intermediate_size // self.tp
        if op == "lm_head":
            return g.vocab_size // self.tp, g.hidden_size
        raise KeyError(op)

    def width(self, op: str) -> float:
        """Activation elements read and written per token by an elementwise or per-step operator."""
        g, d = self.g, self.g.head_dim
        if op in ("layernorm", "final_layernorm"):
            return 2.0 * g.hidden_size
        if op == "act_fn":
            return 3.0 * g.intermediate_size / self.tp  # gate and up in, their product out
        if op == "rotary_emb":
            return 2.0 * (self.q_heads + self.kv_heads) * d
        if op == "qk_norm":
            return 2.0 * (self.q_heads + self.kv_heads) * d
        if op == "embedding":
            return float(g.hidden_size)
        if op == "sampler":
            return float(g.vocab_size)  # the full vocabulary's logits of each sequence
        raise KeyError(op)

    def has(self, op: str) -> bool:
        """Whether the model runs this dense operator at all."""
        if op in ("gate_up_proj", "down_proj", "act_fn"):
            return self.g.intermediate_size > 0 and self.g.dense_layers > 0
        if op == "qk_norm":
            return self.g.qk_norm
        return True

    def work(self, op: str, count: float) -> tuple[float, float]:
        """(FLOPs, bytes) of an operator at ``count`` tokens (sequences for lm_head and sampler)."""
        g = self.g
        if op in GEMMS or op == "lm_head":
            n, k = self.gemm(op)
            return 2.0 * count * n * k, n * k * g.weight_bytes + count * (n + k) * g.activation_bytes
        if op == "embedding":
            return 0.0, count * self.width(op) * g.activation_bytes * 2
        width = self.width(op)
        return count * width, count * width * (4 if op == "sampler" else g.activation_bytes)

    def expert_work(self) -> tuple[float, float]:
        """(FLOPs per routed token, weight bytes) of one expert on this rank."""
        g = self.g
        width = g.moe_intermediate_size / self.tp
        return 2.0 * 3 * g.hidden_size * width, 3 * g.hidden_size * width * g.weight_bytes


def expected_experts(tokens: float, experts: int, per_token: int) -> float:
    """Expected distinct experts that ``tokens`` tokens touch under uniform top-k routing."""
    if experts == 0 or tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - per_token / experts) ** tokens)
