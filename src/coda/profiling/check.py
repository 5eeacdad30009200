"""Check a profile against a measured skew CSV: skew ratios, uniform times, and a baseline.

For every row the ratio ``t_skew / t_mean`` is predicted and compared with the measured one;
the naive baseline predicts each regime's median measured ratio for every row of that regime
(an oracle constant, so beating it means the model explains the variation, not just the level).
Uniform-batch times (``t_mean``, ``t_max``: the base grid) are compared directly. Rows in the
profile's held-out groups are reported apart: those are the numbers that validate the model.
Cohort gains measured by pairing rows (the long cohort measured as a uniform batch of ``nb`` at
``kv_big``, the short one as ``n - nb`` at ``kvs``) check the conservative bounds' coverage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from coda.cost.model import KernelCost, build_cost_model
from coda.cost.operators import OperatorCost
from coda.cost.profile import Profile
from coda.errors import CodaError
from coda.profiling.measured import Batch, SkewRow, read_skew


def layer_s(cost: KernelCost | OperatorCost, b: Batch) -> float:
    """Predicted seconds of one layer's attention for a measured batch."""
    if b.prefill:
        attn = cost.varlen_attention_s(list(b.prefill), b.decodes)
    else:
        attn = cost.decode_attention_s(b.decodes)
    return attn / cost.kernel.layers


def _ratio_stats(pred: np.ndarray, meas: np.ndarray, base: np.ndarray) -> dict[str, float]:
    err = np.abs(pred - meas)
    return {
        "n": int(len(meas)),
        "ratio_mae": float(err.mean()) if len(err) else float("nan"),
        "ratio_p90_abs_err": float(np.percentile(err, 90)) if len(err) else float("nan"),
        "baseline_ratio_mae": float(np.abs(base - meas).mean()) if len(err) else float("nan"),
    }


def _time_err(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.median(np.abs(pred / meas - 1.0)) * 100.0) if len(meas) else float("nan")


def check_skew(profile: Profile, skew: Path) -> dict[str, Any]:
    """The ``coda profile check`` object for one skew CSV."""
    cost = build_cost_model(profile)
    if not isinstance(cost, (KernelCost, OperatorCost)):
        raise CodaError(f"profile {profile.name}: no attention model to check; fit one with `coda profile fit`")
    rows = read_skew(skew)
    att = profile.attention or profile.operators.attention.kernel  # type: ignore[union-attr]
    held = np.array([r.n in att.held_out.batches or r.kv_big >= att.held_out.context_from for r in rows])
    regime = np.array([r.regime for r in rows])
    t = {k: np.array([layer_s(cost, getattr(r, k)) for r in rows]) for k in ("mean", "max", "skew")}
    m = {k: np.array([getattr(r, k).seconds for r in rows]) for k in ("mean", "max", "skew")}
    pr, mr = t["skew"] / t["mean"], m["skew"] / m["mean"]
    base = np.zeros(len(rows))
    for reg in set(regime):
        base[regime == reg] = np.median(mr[regime == reg])
    extrap = np.array([not cost.kernel.in_domain(r.skew.decodes) or not cost.kernel.in_domain(r.max.decodes) for r in rows])

    def block(mask: np.ndarray) -> dict[str, Any]:
        out = _ratio_stats(pr[mask], mr[mask], base[mask])
        grid_p = np.concatenate([t["mean"][mask], t["max"][mask]])
        grid_m = np.concatenate([m["mean"][mask], m["max"][mask]])
        out["time_median_abs_pct_err"] = _time_err(grid_p, grid_m)
        out["skew_time_median_abs_pct_err"] = _time_err(t["skew"][mask], m["skew"][mask])
        out["extrapolated"] = int(extrap[mask].sum())
        return out

    result = block(np.ones(len(rows), dtype=bool))
    result["regime_breakdown"] = {reg: block(regime == reg) for reg in sorted(set(regime))}
    result["held_out"] = {reg: block(held & (regime == reg)) for reg in sorted(set(regime))}
    result["coverage"] = gain_coverage(cost, rows, held)
    result["profile"] = profile.name
    result["baseline"] = "per-regime median measured ratio (oracle constant)"
    return result


def gain_coverage(cost: KernelCost | OperatorCost, rows: list[SkewRow], held: np.ndarray) -> dict[str, Any]:
    """Measured vs conservative cohort gain on pure rows whose two cohorts were also measured."""
    uniform = {(r.n, r.kv_big): r.max.seconds for r in rows if r.regime == "pure"}
    out: dict[str, list[tuple[float, float, float, bool]]] = {"all": [], "held_out": []}
    for r, h in zip(rows, held):
        short, long = uniform.get((r.n - r.nb, r.kvs)), uniform.get((r.nb, r.kv_big))
        if r.regime != "pure" or short is None or long is None:
            continue
        measured = (r.skew.seconds - short - long) / r.skew.seconds
        gb = cost.cohort_gain_bounds(r.skew.decodes, np.array([r.n - r.nb]), 0.0)
        item = (measured, float(gb.predicted[0]), float(gb.conservative[0]), bool(gb.in_domain))
        out["all"].append(item)
        if h:
            out["held_out"].append(item)

    def summary(items: list[tuple[float, float, float, bool]]) -> dict[str, Any]:
        if not items:
            return {"shapes": 0}
        meas, pred, cons, _ = (np.array(x) for x in zip(*items))
        return {
            "shapes": len(items),
            "covered": float(np.mean(meas >= cons)),
            "measured_gain_median": float(np.median(meas)),
            "measured_gain_max": float(np.max(meas)),
            "predicted_gain_mae": float(np.mean(np.abs(pred - meas))),
            "conservative_positive": int(np.sum(cons > 0)),
        }

    return {k: summary(v) for k, v in out.items()}
