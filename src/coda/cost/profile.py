"""Cost profiles: the GPU, the model, the KV tiers and the links of one worker, with provenance.

A profile is a JSON file validated by pydantic. Every numeric constant must carry a provenance
entry (``datasheet: ...``, ``paper: ...``, ``measured: ...``, ``fitted: ...``, ``assumed: ...``)
under the same dotted name in ``provenance``; a profile without it does not load. A
``cohort_gain`` section is self-contained and carries its own provenance.
"""

from __future__ import annotations

import json
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, PositiveFloat, PositiveInt, ValidationError, model_validator

from coda.cost.cohorts import CUT_FEATURES
from coda.cost.geometry import Geometry
from coda.errors import CodaError, invalid, read_document
from coda.strict import StrictModel

GiB = 1024**3


class CollectiveCost(StrictModel):
    """Seconds of one collective call: ``floor_s + bus bytes / bus_bw_bytes_s``, where bus bytes are
    nccl-tests' (all-reduce: 2 (n - 1) / n x the message; all-gather, reduce-scatter: (n - 1) / n x
    the gathered total), so one pair of constants serves every group size."""

    floor_s: float = Field(ge=0, description="time of a call that moves (almost) nothing: launch and synchronisation")
    bus_bw_bytes_s: PositiveFloat = Field(description="bus bandwidth a large call reaches")


class LinkSpec(StrictModel):
    """The GPU-to-GPU link that tensor and expert parallelism communicate over (``coda.cost.parallel``):
    its datasheet bandwidth and the measured cost of the collectives vLLM runs on it."""

    kind: Literal["nvlink", "pcie"]
    generation: str = Field(description="e.g. PCIe Gen5 x16, NVLink 4")
    bus_bw_bytes_s: PositiveFloat = Field(description="datasheet, per GPU and direction (not used for timing: the collectives below are)")
    p2p: bool = Field(description="GPUs read each other's memory directly (vLLM's custom all-reduce needs it)")
    nccl: CollectiveCost = Field(description="NCCL's all-reduce, all-gather and reduce-scatter")
    custom_allreduce: CollectiveCost | None = Field(None, description="vLLM's custom all-reduce (needs p2p)")
    custom_max_bytes: PositiveInt = Field(8 * 1024 * 1024, description="vLLM's custom all-reduce takes messages below this (its max_size)")

    @model_validator(mode="after")
    def _custom_needs_p2p(self) -> LinkSpec:
        if self.custom_allreduce is not None and not self.p2p:
            raise ValueError("custom_allreduce needs p2p: vLLM disables its custom all-reduce without peer access")
        return self


class GpuSpec(StrictModel):
    name: str
    hbm_bw_bytes_s: PositiveFloat
    peak_flops: PositiveFloat = Field(description="dense bf16 tensor FLOP/s")
    num_sms: PositiveInt
    memory_bytes: PositiveFloat | None = Field(None, description="device memory (KV capacity from gpu_memory_utilization)")
    link: LinkSpec | None = Field(None, description="GPU-to-GPU link (tensor parallelism)")
    # Assumed shares of the peaks: only the analytic roofline uses them; measured profiles carry none.
    mem_efficiency: float | None = Field(None, gt=0, le=1, description="achievable share of HBM bandwidth for streaming reads")
    compute_efficiency: float | None = Field(None, gt=0, le=1, description="achieved share of peak FLOP/s in dense/MoE GEMMs")
    attn_compute_efficiency: float | None = Field(None, gt=0, le=1, description="achieved share of peak FLOP/s in prefill attention")


class ModelSpec(StrictModel):
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
    hidden_size: PositiveInt | None = Field(None, description="needed under tensor parallelism (all-reduce bytes)")

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes


class TierSpec(StrictModel):
    hbm_kv_bytes: PositiveFloat = Field(description="usable HBM for KV per worker")
    dram_kv_bytes: float = Field(ge=0, description="DRAM KV store per node (shared by its workers)")
    ssd_kv_bytes: float = Field(ge=0, description="SSD KV store per node (0 = none)")
    workers_per_node: PositiveInt


class LinkCurve(StrictModel):
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


class Overheads(StrictModel):
    step_s: float = Field(ge=0, description="fixed time per engine step (scheduling, sampling, launch)")
    decode_per_request_s: float = Field(ge=0, description="attention cost per decoding request per step")
    attn_launch_per_layer_s: float = Field(ge=0, description="launch cost of one attention kernel per layer")


class AttentionDomain(StrictModel):
    """Where the attention constants were measured; predictions outside are extrapolated."""

    context_min: PositiveInt
    context_max: PositiveInt
    batch_min: PositiveInt
    batch_max: PositiveInt

    def contains(self, n: int, cmin: int, cmax: int) -> bool:
        return self.batch_min <= n <= self.batch_max and self.context_min <= cmin and cmax <= self.context_max


class ResidualBounds(StrictModel):
    """Relative error bounds of predicted attention time from held-out rows: measured time lies
    in [predicted x (1 - lower), predicted x (1 + upper)] for the stated share of them."""

    lower: float = Field(ge=0, lt=1)
    upper: float = Field(ge=0)
    quantile: float = Field(gt=0, le=1)
    held_out_rows: PositiveInt


class HeldOut(StrictModel):
    """The measured groups kept out of the fit: whole batch sizes and every batch reaching
    ``context_from`` tokens (the latter checks the model's extrapolation to longer contexts)."""

    batches: list[PositiveInt]
    context_from: PositiveInt


class AttentionSpec(StrictModel):
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


class StepDomain(StrictModel):
    """Where a step model was measured; the simulator may go beyond it (extrapolation)."""

    prefill_tokens_max: PositiveInt
    cached_tokens_max: int = Field(ge=0)
    decode_batch_max: PositiveInt
    decode_context_max: PositiveInt


class StepFit(StrictModel):
    """How well the step model explains its own measurements (|predicted / measured - 1|)."""

    samples: PositiveInt
    prefill_median_err: float = Field(ge=0)
    prefill_max_err: float = Field(ge=0)
    decode_median_err: float = Field(ge=0)
    decode_max_err: float = Field(ge=0)
    loo_err: float = Field(ge=0, description="leave-one-out median error, the worse of prefill's and decode's")


class ContendedSteps(StrictModel):
    """Steps of an engine whose cores are oversubscribed: on vLLM-CPU every engine process (API
    server, EngineCore, the forward pass's OpenMP thread) wants a core while it serves, so once the
    engines that serve at once want more cores than the machine has, each step waits its turn for
    a core. Measured as the same shapes as the step model, timed with the whole engine squeezed onto
    one core; a contended step lasts ``base_s + scale x`` the uncontended one (least squares over
    the paired shapes)."""

    base_s: float = Field(ge=0, description="contended step = base_s + scale x uncontended step (fitted on paired shapes)")
    scale: float = Field(ge=1, description="see base_s")
    engine_cores: float = Field(gt=0, description="cores an engine keeps busy while it serves alone (its CPU over wall time, measured)")
    cores: PositiveInt = Field(description="cores the simulated engines share (the measured machine's)")
    fit_median_err: float = Field(ge=0, description="median relative error of the fit over the paired shapes")

    def contended(self, serving: int) -> bool:
        """Whether ``serving`` engines at once want more cores than there are."""
        return serving * self.engine_cores > self.cores


class HostCosts(StrictModel):
    """The engine's host CPU beside its forward pass (API server, tokenizer, detokenizer, SSE
    framing, the scheduler's Python), measured through the API (``coda profile measure --endpoint``):
    CPU time per request, per prompt token, per streamed output token and per step. With
    ``shares_cores`` (vLLM-CPU, one core per worker) it serializes with the forward pass, so it
    lengthens the steps it runs beside; without, it overlaps them up to a core's worth (a GPU
    engine), so a step lasts the longer of the two (``coda.cost.host.HostModel``)."""

    request_s: float = Field(ge=0, description="CPU per request the engine receives while it runs steps (HTTP, request set-up)")
    prompt_token_s: float = Field(ge=0, description="CPU per prompt token of such a request (tokenization)")
    output_token_s: float = Field(ge=0, description="CPU per streamed output token beyond the step model's unstreamed decodes (SSE)")
    step_s: float = Field(ge=0, description="CPU per step of a streaming batch beyond the step model's unstreamed decodes")
    shares_cores: bool = Field(description="host work serializes with the forward pass (True) or overlaps it (False)")
    contended: ContendedSteps | None = Field(None, description="steps when the engines serving at once oversubscribe the cores")


class StepModel(StrictModel):
    """An engine's step time measured through its API (``coda profile measure --endpoint``):

    step = fixed_s + token_s x (prefill tokens + decodes) + seq_s x (prefill chunks + decodes)
           + prefill_pair_s x sum of new x (cached + (new + 1) / 2) + decode_context_s x decode contexts.

    ``api_latency_s`` + ``api_text_token_s`` x prompt tokens + (``api_stream_s`` +
    ``api_stream_token_s`` x prompt tokens) x requests running is what a client of text prompts
    waits beyond the engine's steps (request in and tokenized, first token out, while the server
    streams for the others); the simulator charges it before the request reaches the scheduler
    (``EmpiricalCost.request_s``).
    """

    fixed_s: float = Field(ge=0, description="per step, whatever its batch (scheduling, sampling, launch)")
    token_s: float = Field(ge=0, description="per token computed (weights, MLP): prefill tokens and one per decode")
    seq_s: float = Field(ge=0, description="per sequence in the step (input preparation, sampling)")
    prefill_pair_s: float = Field(ge=0, description="per (new token, attended token) pair of causal prefill attention")
    decode_context_s: float = Field(ge=0, description="per context token a decode attends to")
    api_latency_s: float = Field(ge=0, description="client-observed latency outside the engine's steps")
    api_id_token_s: float = Field(ge=0, description="API latency per token of a token-id prompt (parsing)")
    api_text_token_s: float = Field(ge=0, description="API latency per token of a text prompt (tokenization)")
    api_stream_s: float = Field(
        0.0, ge=0, description="API latency per request the engine is running at arrival (the server streams for them)"
    )
    api_stream_token_s: float = Field(0.0, ge=0, description="API latency per prompt token and per request running at arrival")
    kv_bytes_per_token: PositiveInt
    block_tokens: PositiveInt = Field(description="the engine's KV block size (use it as the simulator's chunk_tokens)")
    kv_capacity_tokens: PositiveInt = Field(description="KV the engine holds (blocks x block size)")
    max_model_len: PositiveInt
    domain: StepDomain
    fit: StepFit
    host: HostCosts | None = Field(None, description="host CPU that delays the steps; none measured charges nothing")


class Curve(StrictModel):
    """Seconds of one operator as a piecewise-linear function of its count (tokens or sequences),
    fitted at ``knots``; past the last knot it goes on with the last slope (extrapolated)."""

    knots: list[float] = Field(min_length=2)
    seconds: list[float] = Field(min_length=2)

    @model_validator(mode="after")
    def _shape(self) -> Curve:
        if len(self.knots) != len(self.seconds) or any(b <= a for a, b in zip(self.knots, self.knots[1:])):
            raise ValueError("knots must increase and match seconds one for one")
        return self


class HeldOutError(StrictModel):
    """|predicted / measured - 1| over the measured rows a fit did not see."""

    rows: PositiveInt
    median: float = Field(ge=0)
    p90: float = Field(ge=0)


class MoeSpec(StrictModel):
    """One MoE block on one rank: fixed_s + expert_s x distinct experts touched + pair_s x routed
    (token, expert) pairs. The expert term reads weights, the pair term computes."""

    fixed_s: float = Field(ge=0)
    expert_s: float = Field(ge=0)
    pair_s: float = Field(ge=0)
    tokens_max: PositiveInt = Field(description="largest step measured (beyond: extrapolated)")


class Residual(StrictModel):
    """log(measured / kernel model) of attention, multilinear in the log2 of its axes between the
    knots and held at the edge value beyond them; ``values`` in C order over ``axes``."""

    axes: list[list[float]] = Field(min_length=1)
    values: list[float]

    @model_validator(mode="after")
    def _shape(self) -> Residual:
        if any(len(a) < 2 for a in self.axes) or len(self.values) != int(np.prod([len(a) for a in self.axes])):
            raise ValueError("each axis needs two knots and values one per grid point")
        return self


class OperatorAttention(StrictModel):
    """Attention: the kernel model (skew, split rule, any context) times a fitted correction per
    regime toward the measured grid: decode (batch, mean context), prefill (new tokens, new +
    cached), mixed (new tokens, decode batch, mean decode context)."""

    kernel: AttentionSpec
    decode: Residual
    prefill: Residual
    mixed: Residual


class OperatorsSpec(StrictModel):
    """The measured operators of one layer on one rank, fitted (``coda profile fit --operators``)."""

    layer: dict[str, Curve] = Field(description="dense operators of one layer, by the step's tokens")
    layer_counts: dict[str, PositiveInt] = Field(description="how many times each runs per layer")
    step: dict[str, Curve] = Field(description="operators run once per step, by the step's tokens")
    per_sequence: dict[str, Curve] = Field(description="lm_head and sampler, by the step's sequences")
    moe: MoeSpec | None = None
    attention: OperatorAttention
    tokens_max: PositiveInt = Field(description="largest step measured (beyond: extrapolated)")
    sequences_max: PositiveInt
    held_out: dict[str, HeldOutError] = Field(description="per operator, rows kept out of the fit")


class EngineTime(StrictModel):
    """The engine's own time around the kernels: per step (scheduling, input preparation) and per
    request before it reaches the scheduler (the API server's work). Measured through an API
    (``coda profile measure --endpoint``), or zero where nothing was measured (its provenance says)."""

    step_s: float = Field(ge=0)
    request_s: float = Field(ge=0)


class GainDomain(StrictModel):
    """Where a paired gain model was measured: batch sizes, contexts, the range of each cut feature
    over the measured pairs, and the leverage of the fit's design (a cut inside every range may
    still combine them as no measured pair did, a hidden extrapolation: its leverage then exceeds
    the largest of the measured pairs'). Outside it the model does not answer (no split)."""

    batch_min: PositiveInt
    batch_max: PositiveInt
    context_min: PositiveInt
    context_max: PositiveInt
    features: dict[str, tuple[float, float]] = Field(description="measured (min, max) of each feature the terms use")
    design_r_inverse: list[list[float]] = Field(
        description="R^-1 of the QR of the fit's design (intercept, then the terms): leverage = |x R^-1|^2"
    )
    leverage_max: PositiveFloat = Field(description="the largest leverage among the measured pairs")

    @model_validator(mode="after")
    def _ordered(self) -> GainDomain:
        bad = [k for k, (lo, hi) in self.features.items() if lo > hi]
        if self.batch_min > self.batch_max or self.context_min > self.context_max or bad:
            raise ValueError(f"each range needs min <= max{' (features: ' + ', '.join(bad) + ')' if bad else ''}")
        return self


class GainHeldOut(StrictModel):
    """How the paired model did on whole shape groups kept out of its fit (grouped K-fold)."""

    folds: int = Field(ge=2)
    seed: int = Field(ge=0, description="of the random assignment of groups to folds")
    groups: PositiveInt = Field(description="shape groups (n, nb, kv_big / kvs)")
    shapes: PositiveInt
    coverage: float = Field(ge=0, le=1, description="share of held-out shapes whose measured gain is at least the conservative one")
    gain_mae: float = Field(ge=0, description="mean |predicted - measured| relative gain")
    conservative_positive: int = Field(ge=0, description="held-out shapes with a positive conservative gain")


class CohortGainSpec(StrictModel):
    """A paired cohort-gain model (``coda.cost.paired``), fitted on measured full-versus-cohort
    pairs (``coda profile fit-gain``); any profile kind may carry one. Self-contained: its
    numbers carry their provenance in ``provenance`` (not in the profile's), so the section can
    move to another profile as it is (``coda profile transfer-gain``, which labels it).

    The model predicts z = ln(T_full / (T_short + T_long)) = intercept + sum of coefficient x
    term, each term a product of ``CUT_FEATURES`` written ``a*b``; relative gain = 1 - exp(-z).
    The conservative gain uses z - ``residual_bound``, the ``quantile`` of held-out residuals.
    """

    kind: Literal["paired"]
    version: Literal[1]
    terms: list[str] = Field(min_length=1)
    intercept: float
    coefficients: list[float]
    residual_bound: float = Field(ge=0)
    quantile: float = Field(gt=0, le=1)
    held_out: GainHeldOut
    domain: GainDomain
    fitted_on: str = Field(min_length=1, description="the measured files the pairs came from")
    transferred_from: str | None = Field(None, description="the profile it was fitted for, when it was not fitted for this one")
    provenance: str

    @model_validator(mode="after")
    def _consistent(self) -> CohortGainSpec:
        if len(self.coefficients) != len(self.terms) or len(set(self.terms)) != len(self.terms):
            raise ValueError("terms must be distinct and match coefficients one for one")
        unknown = sorted({f for t in self.terms for f in t.split("*")} - set(CUT_FEATURES))
        if unknown:
            raise ValueError(f"unknown feature(s) {', '.join(unknown)}; known: {', '.join(CUT_FEATURES)}")
        width = len(self.terms) + 1
        if len(self.domain.design_r_inverse) != width or any(len(row) != width for row in self.domain.design_r_inverse):
            raise ValueError(f"domain.design_r_inverse must be {width} x {width} (the intercept and each term)")
        missing = sorted({f for t in self.terms for f in t.split("*")} - self.domain.features.keys())
        if missing:
            raise ValueError(f"domain.features lacks the measured range of {', '.join(missing)}")
        prefix = "fitted:" if self.transferred_from is None else "transferred:"
        if not self.provenance.startswith(prefix):
            raise ValueError(f"provenance must start with {prefix!r} ({'no ' if self.transferred_from is None else ''}transferred_from)")
        return self


class Machine(StrictModel):
    """The machine a profile was measured on (``coda.machine``): its hardware and the
    measured software, never its paths, host name or kernel build; ``None`` where not known."""

    cpu: str
    cpus: PositiveInt
    memory_gib: float | None = None
    gpu: str | None = None
    os: str
    python: str | None = None
    torch: str | None = None
    vllm: str | None = None


MEASURED_SECTIONS = ("step_model",)
MODEL_SECTIONS = ("gpu", "model", "overheads", "h2d", "d2h", "ssd_read")
OPERATOR_SECTIONS = ("gpu", "geometry", "operators", "engine", "h2d", "d2h", "ssd_read")


class Profile(StrictModel):
    name: str
    description: str
    kind: Literal["analytic", "fitted", "measured", "operators"]
    tp: PositiveInt = Field(1, description="tensor-parallel degree of a worker: operators and KV are per rank")
    gpu: GpuSpec | None = None
    model: ModelSpec | None = None
    geometry: Geometry | None = None
    tiers: TierSpec
    h2d: LinkCurve | None = None
    d2h: LinkCurve | None = None
    ssd_read: LinkCurve | None = None
    overheads: Overheads | None = None
    attention: AttentionSpec | None = None
    step_model: StepModel | None = None
    operators: OperatorsSpec | None = None
    engine: EngineTime | None = None
    cohort_gain: CohortGainSpec | None = None
    machine: Machine | None = Field(None, description="the machine it was measured on, where `coda profile measure` knows it")
    provenance: dict[str, str]

    @model_validator(mode="after")
    def _sections_of_its_kind(self) -> Profile:
        """Analytic and fitted profiles describe hardware and model; measured ones a step model."""
        if self.kind == "measured":
            if self.step_model is None or self.attention is not None:
                raise ValueError("a measured profile needs a step_model section and no attention section")
            return self
        if self.kind == "operators":
            missing = [s for s in OPERATOR_SECTIONS if getattr(self, s) is None]
            if missing or self.step_model is not None or self.model is not None:
                raise ValueError(f"an operators profile needs {', '.join(missing) or 'no step_model and no model section'}")
            if self.tp > 1 and self.gpu.link is None:  # type: ignore[union-attr]
                raise ValueError(f"tp={self.tp} needs gpu.link (the link the all-reduces cross)")
            return self
        missing = [s for s in MODEL_SECTIONS if getattr(self, s) is None]
        if missing or self.step_model is not None:
            raise ValueError(f"{self.kind} profiles need {', '.join(missing) or 'no step_model section'}")
        g = self.gpu
        if None in (g.mem_efficiency, g.compute_efficiency, g.attn_compute_efficiency):  # type: ignore[union-attr]
            raise ValueError("the analytic model needs gpu.mem_efficiency, compute_efficiency and attn_compute_efficiency")
        if self.tp > 1 and (g.link is None or self.model.hidden_size is None):  # type: ignore[union-attr]
            raise ValueError(f"tp={self.tp} needs gpu.link and model.hidden_size (the all-reduces)")
        return self

    @model_validator(mode="after")
    def _every_constant_has_provenance(self) -> Profile:
        missing = [k for k in _numeric_fields(self) if k not in self.provenance]
        if missing:
            raise ValueError(f"provenance missing for: {', '.join(missing)} (say where each number comes from)")
        return self

    def provenance_of(self, field: str) -> str:
        return self.provenance[field]

    def engine_time_note(self) -> str:
        """Where the engine's own time per step and per request comes from (printed with results)."""
        if self.engine is not None:
            return f"per step {self.engine.step_s:g} s, per request {self.engine.request_s:g} s: {self.provenance['engine.step_s']}"
        if self.step_model is not None:
            return "measured through the engine's API: step_model.fixed_s per step, api_latency_s + api_text_token_s x prompt per request"
        return f"per step overheads.step_s ({self.provenance.get('overheads.step_s', '')}); none per request"

    def beyond_measured(self, max_tokens: int, max_sequences: int, max_context: int) -> list[str]:
        """What a run with these engine limits and this largest request extrapolates, in words."""
        out = []
        if self.operators is not None:
            ops, dom = self.operators, self.operators.attention.kernel.domain
            if max_tokens > ops.tokens_max:
                out.append(f"steps up to {max_tokens} tokens, operators measured to {ops.tokens_max}")
            if max_sequences > ops.sequences_max:
                out.append(f"up to {max_sequences} sequences a step, lm_head and sampler measured to {ops.sequences_max}")
            if max_context > dom.context_max:
                out.append(f"contexts up to {max_context} tokens, attention measured to {dom.context_max}")
        elif self.step_model is not None:
            dom = self.step_model.domain
            if max_context > dom.decode_context_max:
                out.append(f"contexts up to {max_context} tokens, decodes measured to {dom.decode_context_max}")
        elif self.attention is not None and max_context > self.attention.domain.context_max:
            out.append(f"contexts up to {max_context} tokens, attention measured to {self.attention.domain.context_max}")
        return out

    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token on one rank."""
        if self.step_model is not None:
            return self.step_model.kv_bytes_per_token
        if self.geometry is not None:
            return self.geometry.kv_bytes_per_token(self.tp)
        assert self.model is not None  # every kind has one of the three
        return self.model.kv_bytes_per_token // min(self.tp, self.model.num_kv_heads)

    def device_memory_bytes(self) -> float | None:
        return self.gpu.memory_bytes if self.gpu is not None else None

    def weight_bytes_per_rank(self) -> float | None:
        """Weights one rank holds (what vLLM subtracts from its memory before sizing the KV)."""
        if self.geometry is not None:
            return self.geometry.params()[0] * self.geometry.weight_bytes / self.tp
        if self.model is not None:
            m = self.model
            return (m.dense_weight_bytes + m.num_experts * m.expert_bytes * m.num_layers) / self.tp
        return None


def _numeric_fields(profile: Profile) -> list[str]:
    """Dotted names of every number a profile states; an operator's fitted table (a curve, a
    residual grid) is one entry, named by the table."""
    out: list[str] = ["tp"] if profile.tp > 1 else []  # one rank per worker needs no source

    def walk(prefix: str, data: dict) -> None:
        for key, value in data.items():
            name = f"{prefix}.{key}"
            if isinstance(value, dict) and not is_table(value):
                walk(name, value)
            elif isinstance(value, dict) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
                out.append(name)

    for section in ("gpu", "model", "geometry", "tiers", "overheads", "attention", "step_model", "operators", "engine"):
        if getattr(profile, section) is not None:
            walk(section, getattr(profile, section).model_dump())
    out += [link for link in ("h2d", "d2h", "ssd_read") if getattr(profile, link) is not None]
    return out


def is_table(value: dict) -> bool:
    """Whether a profile value is a fitted table (a curve or a correction grid), one constant as a whole."""
    return {"knots", "seconds"} <= value.keys() or {"axes", "values"} <= value.keys()


BUILTIN_DEFAULT = "a100-qwen3coder30b-fp8-calibrated"


def builtin_profiles() -> list[str]:
    folder = resources.files("coda.cost") / "profiles"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def profile_data(name_or_path: str | Path = BUILTIN_DEFAULT) -> dict:
    """The JSON object of a built-in profile (by name) or of a profile file (by path), unvalidated:
    what a command that rewrites one section starts from."""
    text: str
    source = str(name_or_path)
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise CodaError(f"profile {source}: no such file; built-in profiles: {', '.join(builtin_profiles())}")
        text = read_document(path, "profile")
    else:
        res = resources.files("coda.cost") / "profiles" / f"{source}.json"
        if not res.is_file():
            raise CodaError(f"unknown profile {source!r}; built-in profiles: {', '.join(builtin_profiles())}, or a path to a .json file")
        text = res.read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise CodaError(f"profile {source}: not valid JSON at line {err.lineno}: {err.msg}") from None


def validate_profile(data: dict, source: str) -> Profile:
    """``data`` as a profile, or a one-line error naming ``source`` and the offending field."""
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        raise invalid(f"profile {source}", err) from None


def load_profile(name_or_path: str | Path = BUILTIN_DEFAULT) -> Profile:
    """Load a built-in profile by name or a profile JSON file by path."""
    return validate_profile(profile_data(name_or_path), str(name_or_path))
