"""Check a profile against a measured skew CSV: skew ratios, uniform times, and a baseline.

For every row the ratio ``t_skew / t_mean`` is predicted and compared with the measured one;
the naive baseline predicts each regime's median measured ratio for every row of that regime
(an oracle constant, so beating it means the model explains the variation, not just the level).
Uniform-batch times (``t_mean``, ``t_max``: the base grid) are compared directly. Rows in the
profile's held-out groups are reported apart: those are the numbers that validate the model.
Cohort gains measured by pairing rows with uniform batches of their cohorts (``coda.profiling.pairs``)
check the conservative bounds' coverage: the cost model's own (unpaired) and the paired section's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from coda.cost.cohorts import GainBounds
from coda.cost.model import KernelCost, build_cost_model
from coda.cost.operators import OperatorCost
from coda.cost.profile import Profile
from coda.errors import CodaError
from coda.profiling.measured import Batch, read_skew
from coda.profiling.pairs import PairSet, gain_summary, pairs_of


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


def check_skew(profile: Profile, skew: Path, attention: Path | None = None) -> dict[str, Any]:
    """The ``coda profile check`` object for one skew CSV; cohort gains pair it with ``attention``
    (the same setup's attention CSV) when given, else with its own uniform batches."""
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
    pairs = pairs_of(rows, skew, attention)
    held_pairs = np.array([p.n in att.held_out.batches or p.kv_big >= att.held_out.context_from for p in pairs.pairs], dtype=bool)
    result["coverage"] = gain_coverage(cost, pairs, held_pairs)
    result["profile"] = profile.name
    result["baseline"] = "per-regime median measured ratio (oracle constant)"
    return result


def bounds_on_pairs(bounds: Callable[..., GainBounds], pairs: PairSet, mask: np.ndarray | None = None) -> dict[str, Any]:
    """``gain_summary`` of a model's gain bounds (``cohort_gain_bounds`` or ``unpaired_gain_bounds``,
    without a launch allowance) on the measured pairs in ``mask``, counting those out of its domain apart."""
    mask = np.ones(len(pairs.pairs), dtype=bool) if mask is None else mask
    got = [bounds(p.contexts(), np.array([p.cut]), 0.0) for p in pairs.pairs]
    inside = np.array([gb.in_domain and np.isfinite(gb.predicted[0]) for gb in got], dtype=bool) & mask
    pred, cons = (np.array([getattr(gb, k)[0] for gb in got]) for k in ("predicted", "conservative"))
    return gain_summary(pairs.gains()[inside], pred[inside], cons[inside]) | {"out_of_domain": int(np.sum(mask & ~inside))}


def gain_coverage(cost: KernelCost | OperatorCost, pairs: PairSet, held: np.ndarray) -> dict[str, Any]:
    """Measured vs predicted and conservative cohort gains on measured pairs: the cost model's own
    (unpaired) bounds, and the paired section's where the profile carries one."""
    out: dict[str, Any] = {
        "pairs": {
            "source": pairs.fitted_on,
            "shapes": len(pairs.pairs),
            "skipped": pairs.skipped,
            "interpolated": sum(p.interpolated for p in pairs.pairs),
            "time_base_ratio": pairs.scale.factor,
        },
        "unpaired": {
            "all": bounds_on_pairs(cost.unpaired_gain_bounds, pairs),
            "held_out": bounds_on_pairs(cost.unpaired_gain_bounds, pairs, held),
        },
        "paired": None,
    }
    section = cost.profile.cohort_gain
    if section is not None:
        out["paired"] = {
            "all": bounds_on_pairs(cost.cohort_gain_bounds, pairs),
            "section_held_out": section.held_out.model_dump(),
            "fitted_on": section.fitted_on,
            "transferred_from": section.transferred_from,
        }
    return out
