"""Fit an operators profile to one measured setup (``coda profile fit --operators DIR --setup S --tp N``).

A setup is a GPU and a model measured one layer at a time (the shared profiles folder's
format: ``S_tpN_<kind>.csv`` and ``S_meta.yaml``). What is fitted, each with rows kept out:

* dense and per-sequence operators: a linear spline on a fixed ladder of knots, least squares on
  relative error; every fourth measured count is held out;
* the MoE block: ``fixed + expert x distinct experts + pair x routed tokens``, non-negative
  least squares on relative error; every fourth row held out;
* attention: the kernel model's six constants (``coda.profiling.fit``) on pure-decode and
  prefill rows, then per regime a bilinear correction of log(measured / kernel) on a coarse
  log2 grid (ridge-regularised); every fifth row held out, of every regime.

The shipped fit is the one trained without the held-out rows, so the held-out errors it carries
describe it exactly.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from coda.cost.geometry import ELEMENTWISE, GEMMS, PER_SEQUENCE, STEP_OPS, Geometry
from coda.cost.profile import Profile
from coda.errors import CodaError, reading
from coda.profiling import catalog
from coda.profiling.fit import Hardware, fit_constants, pack, predict
from coda.profiling.hf_config import read_config
from coda.profiling.measured import Batch, read_attention

MODELS_DIR = Path(__file__).with_name("models")
TOKEN_KNOTS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1280, 1536, 1792, 2048)
SEQUENCE_KNOTS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 144, 160, 192, 224, 256)
#: log2 knots of the attention corrections per regime: decode (batch, mean context), prefill
#: (new, new + cached), mixed (new, decode batch, mean decode context)
RESIDUAL_KNOTS = {
    "decode": ((0, 2, 4, 6, 8), (4, 6, 8, 10, 12, 14)),
    "prefill": ((4, 6, 8, 10, 11), (4, 6, 8, 10, 12, 14)),
    "mixed": ((4, 8, 11), (0, 2, 4, 6, 8), (4, 6, 8, 10, 12, 14)),
}
RIDGE = 1e-2
#: times each dense operator runs per layer (input and post-attention norms)
LAYER_COUNTS = {"layernorm": 2}
SOURCE = "LLMServingSim's profiler (casys-kaist/LLMServingSim, MIT), vLLM with FlashAttention, one layer at a time"


@dataclass(frozen=True, slots=True)
class Setup:
    """The files and description of one measured setup."""

    folder: Path
    name: str
    tp: int
    meta: dict[str, Any]

    def csv(self, kind: str, tp: int | None = None) -> Path:
        return self.folder / f"{self.name}_tp{tp or self.tp}_{kind}.csv"

    @property
    def gpu(self) -> str:
        return str(self.meta.get("hardware") or self.name.split("_", 1)[0])


def open_setup(folder: Path, name: str, tp: int) -> Setup:
    meta_path = folder / f"{name}_meta.yaml"
    if not folder.is_dir():
        raise CodaError(f"--operators {folder}: no such folder (pass the folder of the measured CSVs and meta.yaml files)")
    if not meta_path.is_file():
        found = sorted(p.name.removesuffix("_meta.yaml") for p in folder.glob("*_meta.yaml"))
        raise CodaError(f"--setup {name}: no {meta_path.name} in {folder}; setups there: {', '.join(found) or 'none'}")
    try:
        meta = yaml.safe_load(meta_path.read_text()) or {}
    except yaml.YAMLError as err:
        raise CodaError(f"{meta_path}: not valid YAML: {str(err).splitlines()[0]}") from None
    tps = meta.get("tp_degrees") or [1]
    if tp not in tps:
        raise CodaError(f"--tp {tp}: {name} was measured at TP {', '.join(map(str, tps))}; pick one of them (or derive another TP)")
    setup = Setup(folder, name, tp, meta)
    for kind in ("dense", "per_sequence", "attention"):
        if not setup.csv(kind).is_file():
            raise CodaError(f"--setup {name} --tp {tp}: {setup.csv(kind).name} is missing in {folder}")
    return setup


def model_geometry(setup: Setup, model_config: Path | None) -> Geometry:
    """The measured model's geometry: a given config.json, or the shipped one named by meta.yaml."""
    if model_config is not None:
        return read_config(model_config)
    model = str(setup.meta.get("model", "")).rsplit("/", 1)[-1]
    for path in sorted(MODELS_DIR.glob("*.json"), key=lambda p: -len(p.stem)):
        if model.startswith(path.stem):
            return read_config(path)
    raise CodaError(f"{setup.name}: no config.json shipped for model {model!r}; pass --model-config PATH")


# --- reading ---------------------------------------------------------------------------------
def read_table(path: Path, key: str, columns: tuple[str, ...]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``layer,<key>,time_us`` rows by layer: (counts, seconds), sorted by count."""
    with reading(path, "measured CSV"), path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise CodaError(f"{path}: missing column(s) {', '.join(missing)}; expected {','.join(columns)}")
        rows: dict[str, list[tuple[float, float]]] = {}
        for line, row in enumerate(reader, start=2):
            try:
                n, t = float(row[key]), float(row["time_us"])
            except (TypeError, ValueError):
                raise CodaError(
                    f"{path}:{line}: {key}/time_us: {row.get(key)!r}, {row.get('time_us')!r} are not numbers; fix or delete the row"
                ) from None
            if n <= 0 or t <= 0:
                raise CodaError(f"{path}:{line}: {key} and time_us must be positive")
            rows.setdefault(row["layer"], []).append((n, t * 1e-6))
    if not rows:
        raise CodaError(f"{path}: no rows")
    out = {}
    for layer, pts in rows.items():
        a = np.array(sorted(pts))
        out[layer] = (a[:, 0], a[:, 1])
    return out


def read_moe(path: Path) -> np.ndarray:
    """``tokens,activated_experts,time_us`` rows as an array (tokens, experts, seconds)."""
    with reading(path, "measured CSV"), path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in ("tokens", "activated_experts", "time_us") if c not in (reader.fieldnames or [])]
        if missing:
            raise CodaError(f"{path}: missing column(s) {', '.join(missing)}; expected tokens,activated_experts,time_us")
        out = []
        for line, row in enumerate(reader, start=2):
            try:
                out.append((float(row["tokens"]), float(row["activated_experts"]), float(row["time_us"]) * 1e-6))
            except (TypeError, ValueError):
                raise CodaError(f"{path}:{line}: a value is not a number; fix or delete the row") from None
    if not out:
        raise CodaError(f"{path}: no rows")
    return np.array(out)


# --- fitting ---------------------------------------------------------------------------------
def errors(pred: np.ndarray, meas: np.ndarray) -> dict[str, float]:
    e = np.abs(pred / meas - 1.0)
    return {"rows": int(len(e)), "median": float(np.median(e)), "p90": float(np.quantile(e, 0.9))}


def hat_basis(x: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Linear-spline basis: column j is the hat function of knot j (last slope continues beyond)."""
    out = np.zeros((len(x), len(knots)))
    for i, v in enumerate(x):
        j = int(np.clip(np.searchsorted(knots, v) - 1, 0, len(knots) - 2))
        t = (v - knots[j]) / (knots[j + 1] - knots[j])
        out[i, j], out[i, j + 1] = 1.0 - t, t
    return out


def fit_curve(x: np.ndarray, t: np.ndarray, ladder: tuple[int, ...]) -> tuple[dict[str, list[float]], dict[str, float]]:
    """A linear spline through the ladder's knots inside the measured range, fitted on three rows
    of four; its held-out error on the fourth."""
    knots = np.array([k for k in ladder if x.min() <= k <= x.max()] or [x.min(), x.max()], dtype=float)
    if knots[0] > x.min():
        knots = np.concatenate([[x.min()], knots])
    if knots[-1] < x.max():
        knots = np.concatenate([knots, [x.max()]])
    held = np.arange(len(x)) % 4 == 2
    train = ~held
    basis = hat_basis(x[train], knots) / t[train, None]
    coef, *_ = np.linalg.lstsq(basis, np.ones(train.sum()), rcond=None)
    coef = np.maximum(coef, 0.0)
    return {"knots": knots.tolist(), "seconds": coef.tolist()}, errors(hat_basis(x[held], knots) @ coef, t[held])


def fit_moe(rows: np.ndarray, per_token: int) -> tuple[np.ndarray, dict[str, float]]:
    """(fixed, per expert, per routed pair) seconds on three rows of four; error on the fourth."""
    x = np.stack([np.ones(len(rows)), rows[:, 1], rows[:, 0] * per_token], axis=1)
    held = np.arange(len(rows)) % 4 == 3
    coef = _nnls_rel(x[~held], rows[~held, 2])
    return coef, errors(x[held] @ coef, rows[held, 2])


def _nnls_rel(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error (exact search over the active columns)."""
    best, best_err = np.zeros(x.shape[1]), np.inf
    for mask in range(1, 2 ** x.shape[1]):
        cols = [j for j in range(x.shape[1]) if mask >> j & 1]
        coef, *_ = np.linalg.lstsq(x[:, cols] / t[:, None], np.ones(len(t)), rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(x.shape[1])
        full[cols] = coef
        err = float(np.sum((x @ full / t - 1.0) ** 2))
        if err < best_err:
            best, best_err = full, err
    return best


def grid_basis(points: np.ndarray, axes: list[np.ndarray]) -> np.ndarray:
    """Multilinear basis over a grid of knots (points clipped to it), C order over the axes."""
    out = np.ones((len(points), 1))
    for d, knots in enumerate(axes):
        b = hat_basis(np.clip(points[:, d], knots[0], knots[-1]), knots)
        out = (out[:, :, None] * b[:, None, :]).reshape(len(points), -1)
    return out


def fit_residual(points: np.ndarray, r: np.ndarray, regime: str) -> dict[str, Any]:
    """Multilinear log-correction on the regime's knots, ridge toward zero where rows are few."""
    axes = [np.array(k, dtype=float) for k in RESIDUAL_KNOTS[regime]]
    b = grid_basis(points, axes)
    a = np.vstack([b, np.sqrt(RIDGE) * np.eye(b.shape[1])])
    coef, *_ = np.linalg.lstsq(a, np.concatenate([r, np.zeros(b.shape[1])]), rcond=None)
    return {"axes": [k.tolist() for k in axes], "values": coef.tolist()}


def residual_at(res: dict[str, Any], points: np.ndarray) -> np.ndarray:
    return grid_basis(points, [np.array(k) for k in res["axes"]]) @ np.array(res["values"])


def regime_points(batches: list[Batch]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Row indices and log2 coordinates of each regime's correction."""
    out = {}
    for regime, label in (("pure", "decode"), ("prefill", "prefill"), ("mixed", "mixed")):
        idx = np.array([i for i, b in enumerate(batches) if b.regime == regime], dtype=int)
        pts = []
        for i in idx:
            b = batches[i]
            mean = max(1.0, float(b.decodes.mean())) if len(b.decodes) else 1.0
            if regime == "pure":
                pts.append((b.batch, mean))
            elif regime == "prefill":
                pts.append((b.prefill[0][0], sum(b.prefill[0])))
            else:
                pts.append((b.prefill[0][0], b.batch, mean))
        out[label] = (idx, np.log2(np.maximum(np.array(pts, dtype=float).reshape(len(idx), -1), 1.0)))
    return out


def kernel_layer_s(batches: list[Batch], consts: np.ndarray, ip: np.ndarray) -> np.ndarray:
    """Per-layer kernel-model seconds of measured batches of any regime."""
    from coda.cost import kernels

    fp = np.array(consts)
    none = np.empty(0, dtype=np.int64)
    out = np.empty(len(batches))
    for i, b in enumerate(batches):
        if b.prefill:
            new = np.array([b.prefill[0][0]], dtype=np.int64)
            cached = np.array([b.prefill[0][1]], dtype=np.int64)
            out[i] = kernels.varlen_layer_s(b.decodes if len(b.decodes) else none, new, cached, fp, ip)
        else:
            out[i] = kernels.decode_layer_s(b.decodes, fp, ip)
    return out


def fit_attention(path: Path, hw: Hardware) -> tuple[dict[str, Any], dict[str, dict[str, float]], int]:
    """Kernel constants and regime corrections, and their held-out errors per regime."""
    grid = read_attention(path)
    held = np.arange(len(grid)) % 5 == 4
    train = [b for b, h in zip(grid, held) if not h and b.regime in ("pure", "prefill")]
    ip = hw.int_params()
    consts, _ = fit_constants(pack(train, ip), hw)
    kern = kernel_layer_s(grid, consts, ip)
    meas = np.array([b.seconds for b in grid])
    fixes, errs = {}, {}
    for regime, (idx, pts) in regime_points(grid).items():
        h = held[idx]
        tr, te = idx[~h], idx[h]
        fixes[regime] = fit_residual(pts[~h], np.log(meas[tr] / kern[tr]), regime)
        pred = kern[te] * np.exp(residual_at(fixes[regime], pts[h]))
        errs[regime] = errors(pred, meas[te])
        errs[f"{regime} (kernel model alone)"] = errors(kern[te], meas[te])
    pure = [b for b in grid if b.regime == "pure"]
    kernel = {
        "family": hw.family,
        "ctas_per_sm": hw.ctas_per_sm,
        "block_n": hw.block_n,
        "mem_efficiency": consts[0] * hw.token_head_bytes() / hw.hbm_bw_bytes_s,
        "cta_bw_bytes_s": consts[1] * hw.token_head_bytes(),
        "cta_overhead_s": consts[2] / consts[1],
        "launch_s": consts[3],
        "per_request_s": consts[4],
        "combine_s": consts[5],
        "bounds": _bounds(pure, consts, ip),
        "held_out": {"batches": [64], "context_from": max(b.max_context for b in pure)},
        "domain": {
            "context_min": int(min(int(b.decodes.min()) for b in pure)),
            "context_max": int(max(b.max_context for b in pure)),
            "batch_min": int(min(b.batch for b in pure)),
            "batch_max": int(max(b.batch for b in pure)),
        },
    }
    return {"kernel": kernel, **fixes}, errs, len(train)


def _bounds(pure: list[Batch], consts: np.ndarray, ip: np.ndarray) -> dict[str, Any]:
    """Residual bounds of the kernel model for cohort gains: central 95% of measured/predicted - 1
    over the decode batches of size 64 and those reaching the largest context."""
    top = max(b.max_context for b in pure)
    test = [b for b in pure if b.batch == 64 or b.max_context >= top]
    p = pack(test, ip)
    rel = p.seconds / predict(p, consts, ip) - 1.0
    return {
        "lower": max(0.0, -float(np.quantile(rel, 0.025))),
        "upper": max(0.0, float(np.quantile(rel, 0.975))),
        "quantile": 0.95,
        "held_out_rows": len(test),
    }


# --- the profile -----------------------------------------------------------------------------
def fit_operators(
    folder: Path, setup_name: str, tp: int, base: Profile, *, model_config: Path | None = None, name: str | None = None
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """An operators profile (JSON-ready) for one setup, and the held-out errors per operator."""
    setup = open_setup(folder, setup_name, tp)
    if setup.gpu not in catalog.GPUS:
        raise CodaError(f"{setup.name}: unknown GPU {setup.gpu!r}; known: {', '.join(catalog.GPUS)}")
    gpu = catalog.GPUS[setup.gpu]
    geo = model_geometry(setup, model_config)
    rank = geo.ranks(tp)
    dense = read_table(setup.csv("dense"), "tokens", ("layer", "tokens", "time_us"))
    per_seq = read_table(setup.csv("per_sequence"), "sequences", ("layer", "sequences", "time_us"))
    held: dict[str, dict[str, float]] = {}
    layer, step, seqs = {}, {}, {}
    for op, (x, t) in dense.items():
        curve, err = fit_curve(x, t, TOKEN_KNOTS)
        if op in STEP_OPS:
            step[op], held[f"step.{op}"] = curve, err
        elif op in GEMMS or op in ELEMENTWISE:
            layer[op], held[f"layer.{op}"] = curve, err
        else:
            raise CodaError(
                f"{setup.csv('dense')}: layer {op!r} is not an operator the model knows ({', '.join(GEMMS + ELEMENTWISE + STEP_OPS)})"
            )
    for op, (x, t) in per_seq.items():
        if op not in PER_SEQUENCE:
            raise CodaError(f"{setup.csv('per_sequence')}: layer {op!r} is not lm_head or sampler")
        seqs[op], held[f"per_sequence.{op}"] = fit_curve(x, t, SEQUENCE_KNOTS)
    missing = [op for op in (*GEMMS, *ELEMENTWISE) if rank.has(op) and op not in layer]
    if missing:
        raise CodaError(f"{setup.csv('dense')}: no rows for {', '.join(missing)}, which {geo.name} runs")
    moe, moe_note = None, ""
    if geo.moe_layers:
        moe, held, moe_note = _moe(setup, geo, held)
    hw = Hardware(
        gpu["spec"]["hbm_bw_bytes_s"],
        gpu["spec"]["num_sms"],
        rank.q_heads,
        rank.kv_heads,
        geo.head_dim,
        geo.kv_dtype_bytes,
        "fa2-split",
        catalog.ctas_per_sm(setup.gpu),
    )
    attention, att_err, n_att = fit_attention(setup.csv("attention"), hw)
    held.update({f"attention.{k}": v for k, v in att_err.items() if "alone" not in k})
    reference = {f"attention.{k}": v for k, v in att_err.items() if "alone" in k}
    tokens_max = int(max(x.max() for x, _ in dense.values()))
    ops = {
        "layer": layer,
        "layer_counts": {op: LAYER_COUNTS.get(op, 1) for op in layer},
        "step": step,
        "per_sequence": seqs,
        "moe": moe,
        "attention": attention,
        "tokens_max": tokens_max,
        "sequences_max": int(max(x.max() for x, _ in per_seq.values())),
        "held_out": held,
    }
    data = assemble(base, setup, geo, gpu, ops, name=name, n_attention=n_att, moe_note=moe_note)
    Profile.model_validate(data)
    return data, {**held, **reference}


def _moe(setup: Setup, geo: Geometry, held: dict[str, dict[str, float]]) -> tuple[dict[str, Any], dict[str, dict[str, float]], str]:
    path, note = setup.csv("moe"), ""
    if not path.is_file():
        one = setup.csv("moe", tp=1)
        if not one.is_file():
            raise CodaError(f"{setup.name}: {geo.name} is a mixture of experts but {path.name} is missing")
        path, note = one, f"; measured at TP 1 and scaled to TP {setup.tp} (each expert's width per rank)"
    rows = read_moe(path)
    coef, err = fit_moe(rows, geo.experts_per_token)
    if note:
        coef = coef * np.array([1.0, 1.0 / setup.tp, 1.0 / setup.tp])
    else:
        held = {**held, "moe": err}
    return {"fixed_s": coef[0], "expert_s": coef[1], "pair_s": coef[2], "tokens_max": int(rows[:, 0].max())}, held, note


def assemble(
    base: Profile,
    setup: Setup,
    geo: Geometry,
    gpu: dict[str, Any],
    ops: dict[str, Any],
    *,
    name: str | None,
    n_attention: int,
    moe_note: str,
) -> dict[str, Any]:
    tp = setup.tp
    spec = {k: v for k, v in gpu["spec"].items() if not k.endswith("efficiency")}
    total, _ = geo.params()
    weights = total * geo.weight_bytes / tp
    slug = geo.name.lower().replace(".", "").replace("llama-", "llama")
    files = f"{setup.name}_tp{tp}_*.csv and {setup.name}_meta.yaml"
    how = setup.meta.get("measured_with") or f"{SOURCE}; vLLM {setup.meta.get('vllm_version', '?')}"
    measured = f"measured: {files} ({how}, profiled {setup.meta.get('profiled_at', '?')})"
    data: dict[str, Any] = {
        "name": name or f"{setup.gpu.lower()}-{slug}" + (f"-tp{tp}" if tp > 1 else ""),
        "description": (
            f"{spec['name']} serving {geo.name} at TP {tp}: every operator fitted to {files} ({how}). No engine-time measurement on "
            "this GPU: a step is the sum of its measured kernels (scheduler, sampling loop and API server not included). Host links, "
            f"DRAM and SSD tiers assumed (copied from {base.name})."
        ),
        "kind": "operators",
        "tp": tp,
        "gpu": spec,
        "geometry": geo.model_dump(),
        "tiers": {**base.tiers.model_dump(), "hbm_kv_bytes": max(1.0, 0.9 * spec["memory_bytes"] - weights)},
        "h2d": base.h2d.model_dump() if base.h2d else None,
        "d2h": base.d2h.model_dump() if base.d2h else None,
        "ssd_read": base.ssd_read.model_dump() if base.ssd_read else None,
        "operators": ops,
        "engine": {"step_s": 0.0, "request_s": 0.0},
    }
    prov = {
        k: f"assumed: copied from profile {base.name} ({base.provenance.get(k, '')})"
        for k in ("h2d", "d2h", "ssd_read", "tiers.dram_kv_bytes", "tiers.ssd_kv_bytes", "tiers.workers_per_node")
    }
    prov.update({k: v for k, v in gpu["provenance"].items() if not k.endswith("efficiency")})
    prov["tiers.hbm_kv_bytes"] = (
        "derived: 90% of GPU memory (vLLM's default gpu_memory_utilization) minus the weights per rank; vLLM also "
        "subtracts its measured activation peak, which only an engine's log states (pass num_gpu_blocks)"
    )
    if tp > 1:
        prov["tp"] = f"measured: the setup's TP {tp} files"
    for k, v in geo.model_dump().items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            prov[f"geometry.{k}"] = f"model card: {geo.name} config.json"
    for section in ("layer", "step", "per_sequence"):
        for op, err in ((op, ops["held_out"].get(f"{section}.{op}")) for op in ops[section]):
            prov[f"operators.{section}.{op}"] = f"fitted: {measured}; linear spline, held-out median error {err['median']:.3f}"
    for op in ops["layer_counts"]:
        prov[f"operators.layer_counts.{op}"] = (
            "model structure: vLLM runs the input and post-attention norms per layer"
            if op == "layernorm"
            else "model structure: once per layer"
        )
    prov["operators.tokens_max"] = prov["operators.sequences_max"] = f"{measured}; the largest count measured"
    for k in ("fixed_s", "expert_s", "pair_s", "tokens_max"):
        if ops["moe"] is not None:
            prov[f"operators.moe.{k}"] = f"fitted: {measured}{moe_note}"
    att = ops["attention"]
    fit_note = f"fitted: {measured}; {n_attention} pure-decode and prefill rows"
    for k, v in att["kernel"].items():
        if isinstance(v, dict):
            for kk, vv in v.items():
                if isinstance(vv, (int, float)):
                    prov[f"operators.attention.kernel.{k}.{kk}"] = f"{fit_note} ({k})"
        elif isinstance(v, (int, float)):
            prov[f"operators.attention.kernel.{k}"] = fit_note
    for regime in ("decode", "prefill", "mixed"):
        e = ops["held_out"][f"attention.{regime}"]
        prov[f"operators.attention.{regime}"] = (
            f"fitted: {measured}; log-correction of the kernel model, held-out median error {e['median']:.3f}"
        )
    for k in ops["held_out"]:
        for stat in ("rows", "median", "p90"):
            prov[f"operators.held_out.{k}.{stat}"] = "fit: rows kept out of the fit"
    prov["engine.step_s"] = prov["engine.request_s"] = (
        "not measured: no engine-time measurement on this GPU; 0 is used, so a step is the sum of its measured kernels (measure an "
        "engine with `coda profile measure --endpoint`)"
    )
    data["provenance"] = prov
    return data
