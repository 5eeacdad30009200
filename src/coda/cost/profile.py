"""Cost profiles: the GPU, the model, the KV tiers and the links of one worker, with provenance.

A profile is a JSON file validated by pydantic. Every numeric constant must carry a provenance
entry (``datasheet: ...``, ``paper: ...``, ``measured: ...``, ``fitted: ...``, ``assumed: ...``)
under the same dotted name in ``provenance``; a profile without it does not load.
"""

from __future__ import annotations

import json
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError, model_validator

from coda.errors import CodaError, invalid

GiB = 1024**3


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSpec(_Strict):
    name: str
    hbm_bw_bytes_s: PositiveFloat
    peak_flops: PositiveFloat = Field(description="dense bf16 tensor FLOP/s")
    num_sms: PositiveInt
    mem_efficiency: float = Field(gt=0, le=1, description="achievable share of HBM bandwidth for streaming reads")
    compute_efficiency: float = Field(gt=0, le=1, description="achieved share of peak FLOP/s in dense/MoE GEMMs")
    attn_compute_efficiency: float = Field(gt=0, le=1, description="achieved share of peak FLOP/s in prefill attention")


class ModelSpec(_Strict):
    name: str
    num_layers: PositiveInt
    num_q_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    kv_dtype_bytes: PositiveInt
    active_params: PositiveFloat = Field(description="parameters used per token (FLOPs = 2 x this)")
    dense_weight_bytes: float = Field(ge=0, description="weights read every step whatever the batch (attention, router, lm_head)")
    num_experts: int = Field(ge=0, description="routed experts per MoE layer (0 = dense model)")
    experts_per_token: int = Field(ge=0)
    expert_bytes: float = Field(ge=0, description="bytes of one expert in one layer")

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes


class TierSpec(_Strict):
    hbm_kv_bytes: PositiveFloat = Field(description="usable HBM for KV per worker")
    dram_kv_bytes: float = Field(ge=0, description="DRAM KV store per node (shared by its workers)")
    ssd_kv_bytes: float = Field(ge=0, description="SSD KV store per node (0 = none)")
    workers_per_node: PositiveInt


class LinkCurve(_Strict):
    """Transfer time as a piecewise-linear function of bytes; past the last point, the last slope."""

    points: list[tuple[float, float]] = Field(min_length=2, description="(bytes, seconds), increasing")

    @model_validator(mode="after")
    def _increasing(self) -> LinkCurve:
        xs = [p[0] for p in self.points]
        ys = [p[1] for p in self.points]
        if any(b <= a for a, b in zip(xs, xs[1:])) or any(b < a for a, b in zip(ys, ys[1:])) or ys[-1] <= ys[-2]:
            raise ValueError("points must increase in bytes, not decrease in seconds, and end with a positive slope")
        return self

    @cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray, float]:
        xs = np.array([p[0] for p in self.points], dtype=float)
        ys = np.array([p[1] for p in self.points], dtype=float)
        return xs, ys, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])

    def seconds(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        xs, ys, slope = self._arrays
        if nbytes >= xs[-1]:
            return float(ys[-1] + (nbytes - xs[-1]) * slope)
        return float(np.interp(nbytes, xs, ys))


class Overheads(_Strict):
    step_s: float = Field(ge=0, description="fixed time per engine step (scheduling, sampling, launch)")
    decode_per_request_s: float = Field(ge=0, description="attention cost per decoding request per step")
    attn_launch_per_layer_s: float = Field(ge=0, description="launch cost of one attention kernel per layer")


class AttentionDomain(_Strict):
    """Where the attention constants were measured; predictions outside are extrapolated."""

    context_min: PositiveInt
    context_max: PositiveInt
    batch_min: PositiveInt
    batch_max: PositiveInt

    def contains(self, n: int, cmin: int, cmax: int) -> bool:
        return self.batch_min <= n <= self.batch_max and self.context_min <= cmin and cmax <= self.context_max


class ResidualBounds(_Strict):
    """Relative error bounds of predicted attention time from held-out rows: measured time lies
    in [predicted x (1 - lower), predicted x (1 + upper)] for the stated share of them."""

    lower: float = Field(ge=0, lt=1)
    upper: float = Field(ge=0)
    quantile: float = Field(gt=0, le=1)
    held_out_rows: PositiveInt


class HeldOut(_Strict):
    """The measured groups kept out of the fit: whole batch sizes and every batch reaching
    ``context_from`` tokens (the latter checks the model's extrapolation to longer contexts)."""

    batches: list[PositiveInt]
    context_from: PositiveInt


class AttentionSpec(_Strict):
    """Kernel-level decode attention (``coda.cost.kernels``): a handful of physical constants."""

    family: Literal["fa2-split", "balanced"]
    ctas_per_sm: PositiveInt = Field(description="attention CTAs resident per SM (shared memory / CTA)")
    block_n: PositiveInt = Field(description="KV tokens per block of the split kernel")
    mem_efficiency: float = Field(gt=0, le=1, description="share of peak HBM bandwidth the kernel reaches")
    cta_bw_bytes_s: PositiveFloat = Field(description="most one CTA can stream (per-SM cap)")
    cta_overhead_s: float = Field(ge=0, description="fixed time of one CTA at the per-CTA rate")
    launch_s: float = Field(ge=0, description="fixed time of one attention launch, per layer")
    per_request_s: float = Field(ge=0, description="time per request in a launch, per layer")
    combine_s: float = Field(ge=0, description="extra time when a launch splits KV (combine kernel), per layer")
    bounds: ResidualBounds
    domain: AttentionDomain
    held_out: HeldOut


class StepDomain(_Strict):
    """Where a step model was measured; the simulator may go beyond it (extrapolation)."""

    prefill_tokens_max: PositiveInt
    cached_tokens_max: int = Field(ge=0)
    decode_batch_max: PositiveInt
    decode_context_max: PositiveInt


class StepFit(_Strict):
    """How well the step model explains its own measurements (|predicted / measured - 1|)."""

    samples: PositiveInt
    prefill_median_err: float = Field(ge=0)
    prefill_max_err: float = Field(ge=0)
    decode_median_err: float = Field(ge=0)
    decode_max_err: float = Field(ge=0)
    loo_err: float = Field(ge=0, description="leave-one-out median error, the worse of prefill's and decode's")


class StepModel(_Strict):
    """An engine's step time measured through its API (``coda profile measure --endpoint``):

    step = fixed_s + token_s x (prefill tokens + decodes) + seq_s x (prefill chunks + decodes)
           + prefill_pair_s x sum of new x (cached + (new + 1) / 2) + decode_context_s x decode contexts.

    ``api_latency_s`` + ``api_text_token_s`` x prompt tokens is what a client of text prompts waits
    beyond the engine's steps (request in and tokenized, first token out); the simulator does not
    charge it, comparisons with a client's TTFT add it (``EmpiricalCost.api_s``).
    """

    fixed_s: float = Field(ge=0, description="per step, whatever its batch (scheduling, sampling, launch)")
    token_s: float = Field(ge=0, description="per token computed (weights, MLP): prefill tokens and one per decode")
    seq_s: float = Field(ge=0, description="per sequence in the step (input preparation, sampling)")
    prefill_pair_s: float = Field(ge=0, description="per (new token, attended token) pair of causal prefill attention")
    decode_context_s: float = Field(ge=0, description="per context token a decode attends to")
    api_latency_s: float = Field(ge=0, description="client-observed latency outside the engine's steps")
    api_id_token_s: float = Field(ge=0, description="API latency per token of a token-id prompt (parsing)")
    api_text_token_s: float = Field(ge=0, description="API latency per token of a text prompt (tokenization)")
    kv_bytes_per_token: PositiveInt
    block_tokens: PositiveInt = Field(description="the engine's KV block size (use it as the simulator's chunk_tokens)")
    kv_capacity_tokens: PositiveInt = Field(description="KV the engine holds (blocks x block size)")
    max_model_len: PositiveInt
    domain: StepDomain
    fit: StepFit


MEASURED_SECTIONS = ("step_model",)
MODEL_SECTIONS = ("gpu", "model", "overheads", "h2d", "d2h", "ssd_read")


class Profile(_Strict):
    name: str
    description: str
    kind: Literal["analytic", "fitted", "measured"]
    gpu: GpuSpec | None = None
    model: ModelSpec | None = None
    tiers: TierSpec
    h2d: LinkCurve | None = None
    d2h: LinkCurve | None = None
    ssd_read: LinkCurve | None = None
    overheads: Overheads | None = None
    attention: AttentionSpec | None = None
    step_model: StepModel | None = None
    provenance: dict[str, str]

    @model_validator(mode="after")
    def _sections_of_its_kind(self) -> Profile:
        """Analytic and fitted profiles describe hardware and model; measured ones a step model."""
        if self.kind == "measured":
            if self.step_model is None or self.attention is not None:
                raise ValueError("a measured profile needs a step_model section and no attention section")
            return self
        missing = [s for s in MODEL_SECTIONS if getattr(self, s) is None]
        if missing or self.step_model is not None:
            raise ValueError(f"{self.kind} profiles need {', '.join(missing) or 'no step_model section'}")
        return self

    @model_validator(mode="after")
    def _every_constant_has_provenance(self) -> Profile:
        missing = [k for k in _numeric_fields(self) if k not in self.provenance]
        if missing:
            raise ValueError(f"provenance missing for: {', '.join(missing)} (say where each number comes from)")
        return self

    def provenance_of(self, field: str) -> str:
        return self.provenance[field]


def _numeric_fields(profile: Profile) -> list[str]:
    out: list[str] = []

    def walk(prefix: str, data: dict) -> None:
        for key, value in data.items():
            if isinstance(value, dict):
                walk(f"{prefix}.{key}", value)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                out.append(f"{prefix}.{key}")

    for section in ("gpu", "model", "tiers", "overheads", "attention", "step_model"):
        if getattr(profile, section) is not None:
            walk(section, getattr(profile, section).model_dump())
    out += [link for link in ("h2d", "d2h", "ssd_read") if getattr(profile, link) is not None]
    return out


BUILTIN_DEFAULT = "a100-qwen3coder30b-fp8"


def builtin_profiles() -> list[str]:
    folder = resources.files("coda.cost") / "profiles"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_profile(name_or_path: str | Path = BUILTIN_DEFAULT) -> Profile:
    """Load a built-in profile by name or a profile JSON file by path."""
    text: str
    source = str(name_or_path)
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise CodaError(f"profile {source}: no such file; built-in profiles: {', '.join(builtin_profiles())}")
        text = path.read_text()
    else:
        res = resources.files("coda.cost") / "profiles" / f"{source}.json"
        if not res.is_file():
            raise CodaError(f"unknown profile {source!r}; built-in profiles: {', '.join(builtin_profiles())}, or a path to a .json file")
        text = res.read_text()
    try:
        return Profile.model_validate(json.loads(text))
    except json.JSONDecodeError as err:
        raise CodaError(f"profile {source}: not valid JSON at line {err.lineno}: {err.msg}") from None
    except ValidationError as err:
        raise invalid(f"profile {source}", err) from None
