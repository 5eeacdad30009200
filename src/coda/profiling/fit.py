"""Fit a profile's attention constants to measured batches, keeping grouped data out of the fit.

Three constants enter the kernel model non-linearly (the bandwidth share the kernel reaches, the
most one CTA can stream, a CTA's fixed work) and are searched on a log grid then refined; the
three fixed costs (launch, per request, combine) are linear and solved by least squares on
relative error for each candidate, kept non-negative. Pure-decode batches and single prefill
chunks are fitted (a prefill CTA does the same tile work per KV block as a decode CTA, and
uniform decode grids alone cannot pin the per-CTA cap); mixed batches are predicted from the
same constants and reported by ``check``.
Held-out groups (whole batch sizes, and every batch reaching the largest contexts) give the
residual bounds the conservative cohort gain uses.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coda.cost import kernels
from coda.cost.profile import Profile
from coda.errors import CodaError
from coda.profiling import catalog
from coda.profiling.measured import Batch, hardware_of, read_attention, read_skew

BOUND_QUANTILE = 0.95  # two-sided: 2.5% of held-out rows below the lower bound, 2.5% above the upper


@dataclass(frozen=True, slots=True)
class Hardware:
    """What the kernel model needs of the GPU and of one rank's attention, and the packed int constants."""

    hbm_bw_bytes_s: float
    num_sms: int
    q_heads: int
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: int
    family: str
    ctas_per_sm: int
    block_n: int = 128

    @classmethod
    def of(cls, gpu: str, model: str, family: str) -> Hardware:
        """A catalog GPU with a catalog model's attention shape."""
        g, m = catalog.GPUS[gpu]["spec"], catalog.MODELS[model]["spec"]
        return cls(g["hbm_bw_bytes_s"], g["num_sms"], m["num_q_heads"], m["num_kv_heads"], m["head_dim"], m["kv_dtype_bytes"], family,
                   catalog.ctas_per_sm(gpu))

    def token_head_bytes(self) -> float:
        return 2.0 * self.head_dim * self.kv_dtype_bytes

    def int_params(self) -> np.ndarray:
        fam = kernels.FAMILY_BALANCED if self.family == "balanced" else kernels.FAMILY_FA2
        return np.array([self.num_sms * self.ctas_per_sm, 2 * self.num_sms, self.kv_heads, self.q_heads, self.block_n, fam], dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Packed:
    """Pure-decode batches flattened for ``kernels.decode_layers_s``, then single prefill chunks."""

    flat: np.ndarray
    offsets: np.ndarray
    new: np.ndarray
    cached: np.ndarray
    n: np.ndarray  # requests per launch
    split: np.ndarray  # 1.0 where FA2 splits the batch (a combine kernel follows)
    seconds: np.ndarray


def pack(batches: list[Batch], ip: np.ndarray) -> Packed:
    dec = [b for b in batches if b.regime == "pure"]
    pre = [b for b in batches if b.regime == "prefill"]
    flat = np.concatenate([b.decodes for b in dec] or [np.empty(0, dtype=np.int64)]).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum([b.batch for b in dec])]).astype(np.int64)
    n = np.array([b.batch for b in dec] + [1] * len(pre), dtype=float)
    fa2 = ip[kernels.I_FAMILY] == kernels.FAMILY_FA2
    split = [
        float(
            fa2
            and kernels.fa2_num_splits(
                b.batch * int(ip[kernels.I_KV_HEADS]), int(ip[kernels.I_SMS2]), -(-b.max_context // int(ip[kernels.I_BLOCK_N]))
            )
            > 1
        )
        for b in dec
    ]
    new = np.array([b.prefill[0][0] for b in pre], dtype=np.int64)
    cached = np.array([b.prefill[0][1] for b in pre], dtype=np.int64)
    return Packed(flat, offsets, new, cached, n, np.array(split + [0.0] * len(pre)), np.array([b.seconds for b in dec + pre]))


def _kernel_s(p: Packed, fp: np.ndarray, ip: np.ndarray) -> np.ndarray:
    return np.concatenate([kernels.decode_layers_s(p.flat, p.offsets, fp, ip), kernels.prefill_layers_s(p.new, p.cached, fp, ip)])


def _fixed_costs(kern: np.ndarray, p: Packed) -> np.ndarray:
    """Non-negative (launch, per request, combine) minimising squared relative error."""
    cols = [np.ones_like(kern), p.n, p.split]
    active = [0, 1, 2] if p.split.any() else [0, 1]
    while True:
        x = np.stack([cols[i] for i in active], axis=1) / p.seconds[:, None]
        coef, *_ = np.linalg.lstsq(x, (p.seconds - kern) / p.seconds, rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            out = np.zeros(3)
            out[active] = np.maximum(coef, 0.0)
            return out
        active = [a for a, c in zip(active, coef) if c >= 0] or [0]


def predict(p: Packed, consts: np.ndarray, ip: np.ndarray) -> np.ndarray:
    """Per-layer seconds for packed batches; ``consts`` = (B, b, c0, launch, per request, combine)."""
    kern = _kernel_s(p, np.array([*consts[:3], 0.0, 0.0, 0.0]), ip)
    return kern + consts[3] + consts[4] * p.n + consts[5] * p.split


def _score(p: Packed, bw: float, rate: float, c0: float, ip: np.ndarray) -> tuple[float, np.ndarray]:
    kern = _kernel_s(p, np.array([bw, rate, c0, 0.0, 0.0, 0.0]), ip)
    fixed = _fixed_costs(kern, p)
    pred = kern + fixed[0] + fixed[1] * p.n + fixed[2] * p.split
    return float(np.mean(np.abs(pred / p.seconds - 1.0))), np.array([bw, rate, c0, *fixed])


def fit_constants(train: Packed, hw: Hardware) -> tuple[np.ndarray, float]:
    """(B, b, c0 in token-heads/s and token-heads, launch, per request, combine), train error."""
    tok = hw.token_head_bytes()
    peak = hw.hbm_bw_bytes_s / tok
    per_sm = peak / hw.num_sms
    ip = hw.int_params()
    best = (np.inf, np.zeros(6))
    for eff, rel, c0 in itertools.product(np.geomspace(0.1, 1.0, 11), np.geomspace(0.1, 10.0, 13), (0.0, 32.0, 128.0)):
        err, consts = _score(train, peak * eff, per_sm * rel, c0, ip)
        if err < best[0]:
            best = (err, consts)
    err, consts = best
    steps = np.array([0.15, 0.15, 0.5])  # log-steps for B and b, relative step for c0
    x = np.array([np.log(consts[0]), np.log(consts[1]), consts[2]])
    while steps[0] > 0.005:
        improved = False
        for i, sign in itertools.product(range(3), (1.0, -1.0)):
            y = x.copy()
            y[i] += sign * (steps[i] if i < 2 else max(8.0, abs(y[2])) * steps[i])
            if i == 2 and y[2] < 0:
                continue
            if np.exp(y[0]) > peak:
                continue
            e2, c2 = _score(train, float(np.exp(y[0])), float(np.exp(y[1])), float(y[2]), ip)
            if e2 < err:
                err, consts, x, improved = e2, c2, y, True
        if not improved:
            steps /= 2.0
    return consts, err


def _hardware(paths: list[Path], gpu: str | None, model: str | None) -> tuple[str, str]:
    names = {hardware_of(p) for p in paths} - {None}
    if len(names) > 1:
        raise CodaError(
            f"the CSVs come from different setups ({', '.join(sorted('/'.join(n) for n in names if n))}); fit one profile per GPU and model"
        )
    found = next(iter(names)) if names else (None, None)
    gpu = gpu or found[0]
    model = model or found[1]
    if gpu not in catalog.GPUS:
        raise CodaError(f"--gpu {gpu!r}: unknown GPU; known: {', '.join(catalog.GPUS)} (or name the CSV <GPU>_<model>_tp1_<kind>.csv)")
    if model not in catalog.MODELS:
        raise CodaError(f"--model {model!r}: unknown model; known: {', '.join(catalog.MODELS)}")
    return gpu, model


def held_out(b: Batch, batches: list[int], context_from: int) -> bool:
    """In a held-out group: its batch size, or reaching ``context_from`` (a prefill counts its keys)."""
    if b.regime == "prefill":
        return sum(b.prefill[0]) >= context_from
    return b.batch in batches or b.max_context >= context_from


def fit_profile(
    attention: Path | None,
    skew: Path | None,
    base: Profile,
    *,
    gpu: str | None = None,
    model: str | None = None,
    family: str = "fa2-split",
    holdout_batches: tuple[int, ...] = (64,),
    holdout_context_from: int | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """A profile (as JSON-ready dict) whose attention section is fitted to the CSVs."""
    if attention is None and skew is None:
        raise CodaError("profile fit: pass --attention CSV and/or --skew CSV")
    paths = [p for p in (attention, skew) if p is not None]
    for p, kind in ((attention, "attention"), (skew, "skew")):
        if p is not None and not p.is_file():
            raise CodaError(f"{kind} CSV {p}: no such file (pass the path of a measured CSV)")
    gpu, model = _hardware(paths, gpu, model)
    pure: list[Batch] = []
    prefill: list[Batch] = []
    if attention is not None:
        grid = read_attention(attention)
        pure += [b for b in grid if b.regime == "pure"]
        prefill += [b for b in grid if b.regime == "prefill"]
    if skew is not None:
        for row in read_skew(skew):
            if row.regime == "pure":
                pure += [row.mean, row.max, row.skew]
    if len(pure) < 8:
        raise CodaError(f"profile fit: {len(pure)} pure-decode batches in {', '.join(map(str, paths))}; need at least 8")
    ctx_from = holdout_context_from or max(b.max_context for b in pure)
    hw = Hardware.of(gpu, model, family)
    ip = hw.int_params()
    train = [b for b in pure + prefill if not held_out(b, list(holdout_batches), ctx_from)]
    test = [b for b in pure if held_out(b, list(holdout_batches), ctx_from)]
    if len(train) < 8 or not test:
        raise CodaError(
            f"profile fit: the held-out groups leave {len(train)} batches to fit and {len(test)} to check; "
            "change --holdout-batch / --holdout-context"
        )
    consts, train_err = fit_constants(pack(train, ip), hw)
    pt = pack(test, ip)
    rel = pt.seconds / predict(pt, consts, ip) - 1.0
    lo = max(0.0, -float(np.quantile(rel, (1 - BOUND_QUANTILE) / 2)))
    hi = max(0.0, float(np.quantile(rel, 1 - (1 - BOUND_QUANTILE) / 2)))
    return _assemble(
        base,
        gpu,
        model,
        hw,
        consts,
        train_err,
        float(np.mean(np.abs(rel))),
        (lo, hi, len(test)),
        pure,
        list(holdout_batches),
        ctx_from,
        paths,
        len(train),
        name,
    )


def _assemble(base, gpu, model, hw, consts, train_err, test_err, bounds, pure, hb, ctx_from, paths, n_train, name) -> dict[str, Any]:
    g = catalog.GPUS[gpu]
    m = catalog.MODELS[model]
    tok = hw.token_head_bytes()
    src = ", ".join(p.name for p in paths)
    fitted = (
        f"fitted: {src}, {n_train} pure-decode and prefill batches "
        f"(held out: batch {', '.join(map(str, hb))} and contexts >= {ctx_from}); "
        f"train mean |rel err| {train_err:.3f}, held-out {test_err:.3f}"
    )
    data = base.model_dump()
    data["name"] = name or f"{gpu.lower()}-{model.lower()}"
    data["description"] = (
        f"{g['spec']['name']} serving {m['spec']['name']}: attention fitted to {src}; "
        f"tiers, links and step overhead assumed (copied from {base.name})."
    )
    data["kind"] = "fitted"
    data["gpu"] = dict(g["spec"])
    data["model"] = dict(m["spec"])
    weights = m["spec"]["dense_weight_bytes"] + m["spec"]["num_experts"] * m["spec"]["expert_bytes"] * m["spec"]["num_layers"]
    data["tiers"]["hbm_kv_bytes"] = max(1.0, 0.9 * g["spec"]["memory_bytes"] - weights)
    lo, hi, n_test = bounds
    data["attention"] = {
        "family": hw.family,
        "ctas_per_sm": hw.ctas_per_sm,
        "block_n": hw.block_n,
        "mem_efficiency": consts[0] * tok / g["spec"]["hbm_bw_bytes_s"],
        "cta_bw_bytes_s": consts[1] * tok,
        "cta_overhead_s": consts[2] / consts[1],
        "launch_s": consts[3],
        "per_request_s": consts[4],
        "combine_s": consts[5],
        "bounds": {"lower": lo, "upper": hi, "quantile": BOUND_QUANTILE, "held_out_rows": n_test},
        "domain": {
            "context_min": int(min(int(b.decodes.min()) for b in pure)),
            "context_max": int(max(b.max_context for b in pure)),
            "batch_min": int(min(b.batch for b in pure)),
            "batch_max": int(max(b.batch for b in pure)),
        },
        "held_out": {"batches": hb, "context_from": ctx_from},
    }
    prov = {k: v for k, v in base.provenance.items() if not k.startswith(("gpu.", "model.", "attention."))}
    for k in (
        "h2d",
        "d2h",
        "ssd_read",
        "tiers.dram_kv_bytes",
        "tiers.ssd_kv_bytes",
        "tiers.workers_per_node",
        "overheads.step_s",
        "overheads.decode_per_request_s",
        "overheads.attn_launch_per_layer_s",
    ):
        prov[k] = f"assumed: copied from profile {base.name} ({base.provenance.get(k, '')})"
    prov.update(g["provenance"])
    prov.update(m["provenance"])
    prov["tiers.hbm_kv_bytes"] = "derived: 90% of GPU memory minus the weights"
    smem = g["smem_per_sm_bytes"] // 1024
    prov |= {
        "attention.ctas_per_sm": f"derived: {catalog.FA2_SPLIT_CTA_SMEM_BYTES // 1024} KiB of shared memory per split-KV CTA "
        f"(head_dim 128), {smem} KiB per SM",
        "attention.block_n": "FlashAttention-2 split-KV kernel: kBlockN = 128 for head_dim 128",
        "attention.mem_efficiency": fitted,
        "attention.cta_bw_bytes_s": fitted,
        "attention.cta_overhead_s": fitted,
        "attention.launch_s": fitted,
        "attention.per_request_s": fitted,
        "attention.combine_s": fitted,
        "attention.bounds.lower": f"held-out: {(1 - BOUND_QUANTILE) / 2:.1%} quantile of measured/predicted - 1 "
        f"over {n_test} held-out batches",
        "attention.bounds.upper": f"held-out: {1 - (1 - BOUND_QUANTILE) / 2:.1%} quantile of measured/predicted - 1 "
        f"over {n_test} held-out batches",
        "attention.bounds.quantile": "fit setting: central share of held-out residuals inside the bounds",
        "attention.bounds.held_out_rows": "fit: held-out pure-decode batches",
        "attention.domain.context_min": f"measured: {src}",
        "attention.domain.context_max": f"measured: {src}",
        "attention.domain.batch_min": f"measured: {src}",
        "attention.domain.batch_max": f"measured: {src}",
        "attention.held_out.context_from": "fit setting: the largest measured context",
    }
    data["provenance"] = prov
    Profile.model_validate(data)
    return data
