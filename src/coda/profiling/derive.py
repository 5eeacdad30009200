"""Predict an unmeasured model, or another TP degree, on a measured GPU (``coda profile derive``).

Each operator of the target comes from the measured operator of the same name (a template of
the same kind where the source model has none: the GEMM nearest in weight bytes, the layer
norm for an elementwise operator), through its roofline time on this GPU (max of FLOPs over
peak FLOP/s and bytes over peak bandwidth, datasheet figures):

* a GEMM, lm_head and the sampler at the same count, scaled by the ratio of roofline times
  above the GPU's launch floor (the shortest operator measured, which does not scale):
  ``t_target(n) = floor + (t_source(n) - floor) x roofline_target(n) / roofline_source(n)``
  (a GEMM's efficiency depends on its shape more than on its amount of work);
* an elementwise operator at the count where the source does the same work (the same bytes:
  the same working set, so the measurement's cache behaviour carries over), scaled as above
  from the nearest measured end when the target's work lies beyond the measured range.

The MoE block scales its per-expert term by expert bytes and its per-token term by expert
FLOPs; a GPU measured without an MoE model gets them from its largest GEMM's achieved
bandwidth and FLOP/s. Attention keeps the GPU's fitted kernel constants and corrections and
takes the target's heads per rank. ``validate`` predicts a measured setup's CSV rows from a
derived profile: the errors that say whether the scaling holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from coda.cost.geometry import ELEMENTWISE, GEMMS, STEP_OPS, Geometry, Rank
from coda.cost.model import build_cost_model
from coda.cost.operators import OperatorCost
from coda.cost.profile import Profile
from coda.errors import CodaError
from coda.profiling.measured import read_attention
from coda.profiling.operator_fit import Setup, errors, open_setup, read_table

MATMULS = (*GEMMS, "lm_head", "sampler")  # scaled at the same count: a GEMM's efficiency depends on its shape, not its work alone
FAMILIES = {"gemm": GEMMS, "elementwise": ELEMENTWISE + STEP_OPS, "per_sequence": ("lm_head", "sampler")}


def roofline_s(rank: Rank, op: str, n: float, peak_flops: float, bw: float) -> float:
    flops, nbytes = rank.work(op, n)
    return max(flops / peak_flops, nbytes / bw)


def template(op: str, source: Rank, available: dict[str, Any], target: Rank) -> str:
    """The measured operator a target operator is scaled from."""
    if op in available and source.has(op):
        return op
    if op in GEMMS:
        want = target.work(op, 1)[1]
        gemms = [g for g in GEMMS if g in available and source.has(g)]
        return min(gemms, key=lambda g: abs(np.log(source.work(g, 1)[1] / want)))
    return "layernorm"


def derive(src: Profile, target: Geometry, tp: int, *, name: str | None = None, source_note: str = "") -> dict[str, Any]:
    """An operators profile for ``target`` at ``tp`` on the GPU of the operators profile ``src``."""
    if src.kind != "operators" or src.operators is None or src.geometry is None or src.gpu is None:
        raise CodaError(f"--gpu {src.name}: a {src.kind} profile; derive needs an operators profile (coda profile fit --operators)")
    if tp > 1 and src.gpu.link is None:
        raise CodaError(f"--tp {tp}: profile {src.name} names no GPU link (gpu.link) for the all-reduces")
    gpu, ops = src.gpu, src.operators
    s_rank, t_rank = src.geometry.ranks(src.tp), target.ranks(tp)
    floor = min(min(c.seconds) for c in (*ops.layer.values(), *ops.step.values()))

    def scaled(op: str, base: str, curve: Any) -> dict[str, list[float]]:
        roof_s = np.array([roofline_s(s_rank, base, n, gpu.peak_flops, gpu.hbm_bw_bytes_s) for n in curve.knots])
        t_s = np.array(curve.seconds)
        out = []
        for n in curve.knots:
            roof = roofline_s(t_rank, op, n, gpu.peak_flops, gpu.hbm_bw_bytes_s)
            if op not in MATMULS and roof_s[0] <= roof <= roof_s[-1]:  # the same working set: its time, cache effects and all
                out.append(float(np.exp(np.interp(np.log(roof), np.log(roof_s), np.log(t_s)))))
            else:  # scale by the roofline ratio, above the floor: at the same count, or from the nearest measured end
                end = int(np.argmin(np.abs(np.array(curve.knots) - n))) if op in MATMULS else (0 if roof < roof_s[0] else -1)
                out.append(floor + max(t_s[end] - floor, 0.0) * roof / roof_s[end])
        return {"knots": list(curve.knots), "seconds": out}

    notes: dict[str, str] = {}
    layer = {}
    for op in (*GEMMS, *ELEMENTWISE):
        if not t_rank.has(op):
            continue
        base = template(op, s_rank, ops.layer, t_rank)
        layer[op] = scaled(op, base, ops.layer[base])
        notes[f"operators.layer.{op}"] = f"derived: {src.name}'s {base} scaled by roofline time (FLOPs, bytes) to {target.name} at TP {tp}"
    step = {op: scaled(op, op, c) for op, c in ops.step.items()}
    seqs = {op: scaled(op, op, c) for op, c in ops.per_sequence.items()}
    for op in (*step, *seqs):
        section = "step" if op in step else "per_sequence"
        notes[f"operators.{section}.{op}"] = f"derived: {src.name}'s {op} scaled by roofline time to {target.name} at TP {tp}"
    moe = _moe(src, s_rank, t_rank, floor, notes) if target.moe_layers else None
    data = src.model_dump()
    # A paired gain section describes the measured model's attention; the derived one has another.
    data["cohort_gain"] = None
    data.update({
        "name": name or f"{src.name.split('-')[0]}-{target.name.lower().replace('.', '')}" + (f"-tp{tp}" if tp > 1 else ""),
        "description": (f"{gpu.name} serving {target.name} at TP {tp}, derived from the measured operators of {src.name} "
                        f"({src.geometry.name} at TP {src.tp}) by scaling each with its FLOPs and bytes; not measured{source_note}."),
        "tp": tp,
        "geometry": target.model_dump(),
    })
    total, _ = target.params()
    assert gpu.memory_bytes is not None
    data["tiers"]["hbm_kv_bytes"] = max(1.0, 0.9 * gpu.memory_bytes - total * target.weight_bytes / tp)
    data["operators"] = {**data["operators"], "layer": layer, "step": step, "per_sequence": seqs, "moe": moe, "held_out": {},
                         "layer_counts": {op: ops.layer_counts.get(op, 1) for op in layer}}
    prov = {
        k: v
        for k, v in src.provenance.items()
        if not k.startswith(
            ("geometry.", "operators.layer", "operators.step", "operators.per_sequence", "operators.moe", "operators.held_out", "tp")
        )
    }
    prov.update(notes)
    prov.update(
        {
            f"operators.layer_counts.{op}": src.provenance.get(f"operators.layer_counts.{op}", "model structure: once per layer")
            for op in layer
        }
    )
    for k, v in target.model_dump().items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            prov[f"geometry.{k}"] = f"model card: {target.name} config.json"
    if tp > 1:
        prov["tp"] = "given: coda profile derive --tp"
    for k in ("decode", "prefill", "mixed"):
        prov[f"operators.attention.{k}"] = (
            f"assumed: {src.name}'s correction of the kernel model on this GPU ({src.provenance.get(f'operators.attention.{k}', '')})"
        )
    prov["tiers.hbm_kv_bytes"] = "derived: 90% of GPU memory minus the weights per rank (vLLM's activation peak not subtracted)"
    data["provenance"] = prov
    Profile.model_validate(data)
    return data


def _moe(src: Profile, s_rank: Rank, t_rank: Rank, floor: float, notes: dict[str, str]) -> dict[str, Any]:
    ops = src.operators
    assert ops is not None
    t_flops, t_bytes = t_rank.expert_work()
    if ops.moe is not None and s_rank.g.moe_layers:
        s_flops, s_bytes = s_rank.expert_work()
        m = ops.moe
        note = f"derived: {src.name}'s measured MoE block scaled by expert bytes and FLOPs"
        out = {
            "fixed_s": m.fixed_s,
            "expert_s": m.expert_s * t_bytes / s_bytes,
            "pair_s": m.pair_s * t_flops / s_flops,
            "tokens_max": m.tokens_max,
        }
    else:
        big = max((g for g in GEMMS if g in ops.layer and s_rank.has(g)), key=lambda g: s_rank.work(g, 1)[1])
        curve = ops.layer[big]
        bw = s_rank.work(big, curve.knots[0])[1] / max(curve.seconds[0] - floor, 1e-9)
        flops = s_rank.work(big, curve.knots[-1])[0] / max(curve.seconds[-1] - floor, 1e-9)
        note = f"derived: no MoE measured on this GPU; the bandwidth and FLOP/s {src.name}'s {big} reaches, applied to each expert"
        out = {"fixed_s": floor, "expert_s": t_bytes / bw, "pair_s": t_flops / flops, "tokens_max": ops.tokens_max}
    for k in out:
        notes[f"operators.moe.{k}"] = note
    return out


# --- validation ------------------------------------------------------------------------------
def validate(profile: Profile, folder: Path, setup_name: str, tp: int) -> dict[str, dict[str, float]]:
    """Per operator family, |predicted / measured - 1| of a profile against a measured setup's rows."""
    setup = open_setup(folder, setup_name, tp)
    cost = build_cost_model(profile)
    if not isinstance(cost, OperatorCost):
        raise CodaError(f"profile {profile.name}: validate needs an operators profile")
    ops = profile.operators
    assert ops is not None
    pairs: dict[str, list[tuple[float, float]]] = {f: [] for f in (*FAMILIES, "attention decode", "attention prefill", "attention mixed")}
    for kind, table, count in (("dense", {**ops.layer, **ops.step}, "tokens"), ("per_sequence", ops.per_sequence, "sequences")):
        for op, (x, t) in read_table(setup.csv(kind), count, ("layer", count, "time_us")).items():
            if op not in table:
                continue
            curve = np.array(table[op].knots), np.array(table[op].seconds)
            family = next(f for f, members in FAMILIES.items() if op in members)
            pairs[family] += list(zip(np.interp(x, *curve), t))
    _attention_pairs(cost, setup, pairs)
    return {f: errors(np.array([p for p, _ in v]), np.array([m for _, m in v])) for f, v in pairs.items() if v}


def _attention_pairs(cost: OperatorCost, setup: Setup, pairs: dict[str, list[tuple[float, float]]]) -> None:
    layers = cost.rank.g.num_layers
    for b in read_attention(setup.csv("attention")):
        if b.prefill:
            pred = cost.varlen_attention_s(list(b.prefill), b.decodes)
        else:
            pred = cost.decode_attention_s(b.decodes)
        label = {"pure": "attention decode", "prefill": "attention prefill", "mixed": "attention mixed"}[b.regime]
        pairs[label].append((pred / layers, b.seconds))


def measured_steps(profile: Profile, folder: Path, setup_name: str, tp: int) -> list[tuple[str, float, float]]:
    """Whole per-rank steps of a measured setup, predicted and measured, without collectives and
    MoE blocks (the TP files time neither): for each pure-decode and single-chunk prefill row of the
    attention file, the measured step is the sum the files give at its token and sequence counts
    (every dense operator of every layer, the per-step operators, lm_head and sampler, attention
    times layers) and the predicted one the profile's. Returns (regime, predicted s, measured s)."""
    setup = open_setup(folder, setup_name, tp)
    cost = build_cost_model(profile)
    if not isinstance(cost, OperatorCost):
        raise CodaError(f"profile {profile.name}: measured_steps needs an operators profile")
    g, ops = cost.rank.g, profile.operators
    assert ops is not None
    dense = read_table(setup.csv("dense"), "tokens", ("layer", "tokens", "time_us"))
    per_seq = read_table(setup.csv("per_sequence"), "sequences", ("layer", "sequences", "time_us"))

    def at(table: dict[str, tuple[np.ndarray, np.ndarray]], op: str, n: int) -> float | None:
        x, t = table[op]
        hit = np.flatnonzero(x == n)
        return float(t[hit[0]]) if len(hit) else None

    def weight(op: str) -> int:
        if op in STEP_OPS:
            return 1
        return ops.layer_counts.get(op, 1) * (g.dense_layers if op in ("gate_up_proj", "down_proj", "act_fn") else g.num_layers)

    out = []
    for b in read_attention(setup.csv("attention")):
        if b.regime == "mixed" or len(b.prefill) > 1:
            continue
        tokens = len(b.decodes) + sum(n for n, _ in b.prefill)
        seqs = len(b.decodes) + len(b.prefill)
        parts = [(at(dense, op, tokens), weight(op)) for op in dense if cost.rank.has(op)]
        parts += [(at(per_seq, op, seqs), 1) for op in per_seq]
        if any(t is None for t, _ in parts):
            continue
        measured = sum(t * w for t, w in parts if t is not None)
        measured += b.seconds * g.num_layers
        rank_ops = cost.operators_s(tokens, seqs) - cost.moe_s(tokens) - (cost.comm.step_s(tokens, seqs) if cost.comm else 0.0)
        attention = cost.varlen_attention_s(list(b.prefill), b.decodes) if b.prefill else cost.decode_attention_s(b.decodes)
        out.append(("decode" if b.regime == "pure" else "prefill", rank_ops + attention, measured))
    return out
