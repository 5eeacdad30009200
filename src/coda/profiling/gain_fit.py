"""Fit the paired cohort-gain model (``coda.cost.paired``) to measured pairs, held out by shape.

The regression: z = ln(T_full / (T_short + T_long)) by least squares on the cut's features,
linear in the context-length ratio and a full quadratic in the cut fraction, the cohorts' log2
totals and the long cohort's log2 maximum (the short cohort's maximum is the long one's over the
ratio). A quadratic because the gain is not monotone in batch size: FA2 stops splitting KV past a
batch size, and there a few long requests left alone make the tail a split removes. The ratio
enters linearly because the shared files vary it only at one batch shape.

Held out: whole shape groups (n, nb, kv_big / kvs, every short context) in K folds. The residual
bound is a quantile of the held-out residuals of z; its level is the smallest (from 95%) at which
each fold, judged with the bound computed from the other folds' residuals alone, leaves the
measured gain at or above the conservative one on the target share of held-out shapes. That
coverage, which neither the fit nor the bound saw, is the one reported.

The domain is what the pairs span: batch sizes, contexts, each feature's range, and the fit's
leverage (a cut whose leverage exceeds every measured pair's combines the features as no pair
did: the usual test for hidden extrapolation in regression, e.g. Montgomery, Peck and Vining,
*Introduction to Linear Regression Analysis*, on h_00 > h_max).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from coda.cost.cohorts import cut_features
from coda.cost.paired import gain_of_log_speedup, term_matrix
from coda.errors import CodaError
from coda.profiling.pairs import PairSet, gain_summary

QUADRATIC = ("cut_fraction", "log2_short_total", "log2_long_total", "log2_long_max")
TERMS = ("log2_ratio", *QUADRATIC, *(f"{a}*{b}" for a, b in itertools.combinations_with_replacement(QUADRATIC, 2)))
FOLDS = 5
TARGET_COVERAGE = 0.95  # the share of held-out shapes the conservative gain must not exceed (the Coda paper's 95%)
QUANTILE_STEP = 0.005  # assumed: fine enough that the level found is within half a percent of the least one


def grouped_folds(groups: Sequence[Hashable], k: int, seed: int) -> np.ndarray:
    """The fold of each row: groups shuffled with ``seed`` and dealt round-robin, each whole in one fold."""
    distinct = sorted(set(groups))
    if len(distinct) < k:
        raise CodaError(f"{len(distinct)} shape groups cannot fill {k} folds; measure more shapes or pass fewer --folds")
    fold_of = dict(zip(distinct, np.random.default_rng(seed).permutation(len(distinct)) % k))
    return np.array([fold_of[g] for g in groups])


def least_squares(x: np.ndarray, z: np.ndarray) -> tuple[float, np.ndarray]:
    """(intercept, coefficients) of z on the columns of ``x``."""
    design = np.column_stack([np.ones(len(z)), x])
    rank = np.linalg.matrix_rank(design)
    if rank < design.shape[1]:
        raise CodaError(f"the pairs determine only {rank} of the model's {design.shape[1]} constants; measure more shapes")
    coef = np.linalg.lstsq(design, z, rcond=None)[0]
    return float(coef[0]), coef[1:]


def design_r_inverse(x: np.ndarray) -> np.ndarray:
    """R^-1 of the QR of the design (a column of ones, then ``x``): a row's leverage (its hat value)
    is |row R^-1|^2, a sum of squares rather than a difference of large products."""
    r = np.linalg.qr(np.column_stack([np.ones(len(x)), x]), mode="r")
    return scipy.linalg.solve_triangular(r, np.eye(r.shape[0]))


def held_out_predictions(x: np.ndarray, z: np.ndarray, folds: np.ndarray) -> np.ndarray:
    """z of each row predicted by the fit on the other folds."""
    out = np.empty(len(z))
    for j in np.unique(folds):
        test = folds == j
        b0, b = least_squares(x[~test], z[~test])
        out[test] = b0 + x[test] @ b
    return out


def cross_fold_bounds(residuals: np.ndarray, folds: np.ndarray, q: float) -> np.ndarray:
    """The residual bound each row is judged with: the ``q`` quantile of the other folds' residuals."""
    out = np.empty(len(residuals))
    for j in np.unique(folds):
        test = folds == j
        out[test] = np.quantile(residuals[~test], q, method="higher")
    return out


def choose_quantile(residuals: np.ndarray, folds: np.ndarray, target: float) -> tuple[float, float]:
    """(level, cross-fold coverage): the least level from ``target`` up whose coverage reaches it."""
    for q in np.arange(target, 1.0 + QUANTILE_STEP / 2, QUANTILE_STEP):
        q = round(min(float(q), 1.0), 6)
        cov = float(np.mean(residuals <= cross_fold_bounds(residuals, folds, q)))
        if cov >= target:
            return q, cov
    raise CodaError(f"held-out coverage stays below {target:.0%} even at the largest residual: the features do not explain these pairs")


@dataclass(frozen=True, slots=True)
class GainFit:
    section: dict[str, Any]  # the profile's ``cohort_gain`` section
    held_out: dict[str, Any]  # ``gain_summary`` of the held-out predictions and bounds


def pair_features(pairs: PairSet) -> dict[str, np.ndarray]:
    rows = [cut_features(p.contexts(), np.array([p.cut])) for p in pairs.pairs]
    return {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}


def fit_gain(pairs: PairSet, *, folds: int = FOLDS, seed: int = 0, target: float = TARGET_COVERAGE,
             terms: Sequence[str] = TERMS) -> GainFit:
    """The ``cohort_gain`` section fitted on every pair, with its grouped held-out evaluation."""
    if not pairs.pairs:
        raise CodaError(f"{pairs.fitted_on}: no pure-decode row could be paired with measured cohorts")
    feats = pair_features(pairs)
    x = term_matrix(feats, terms)
    z = np.array([p.log_speedup for p in pairs.pairs])
    fold = grouped_folds(pairs.groups(), folds, seed)
    z_held = held_out_predictions(x, z, fold)
    resid = z_held - z
    q, coverage = choose_quantile(resid, fold, target)
    measured = pairs.gains()
    predicted = gain_of_log_speedup(z_held)
    conservative = gain_of_log_speedup(z_held - cross_fold_bounds(resid, fold, q))
    summary = gain_summary(measured, predicted, conservative)
    intercept, coef = least_squares(x, z)
    r_inv = design_r_inverse(x)
    used = sorted({f for t in terms for f in t.split("*")})
    ctx = np.concatenate([p.contexts() for p in pairs.pairs])
    s = pairs.scale
    section = {
        "kind": "paired",
        "version": 1,
        "terms": list(terms),
        "intercept": intercept,
        "coefficients": coef.tolist(),
        "residual_bound": float(np.quantile(resid, q, method="higher")),
        "quantile": q,
        "held_out": {
            "folds": folds,
            "seed": seed,
            "groups": len(set(pairs.groups())),
            "shapes": len(z),
            "coverage": coverage,
            "gain_mae": summary["gain_mae"],
            "conservative_positive": summary["conservative_positive"],
        },
        "domain": {
            "batch_min": min(p.n for p in pairs.pairs),
            "batch_max": max(p.n for p in pairs.pairs),
            "context_min": int(ctx.min()),
            "context_max": int(ctx.max()),
            "features": {k: (float(feats[k].min()), float(feats[k].max())) for k in used},
            "design_r_inverse": r_inv.tolist(),
            "leverage_max": float(np.max(np.sum((np.column_stack([np.ones(len(z)), x]) @ r_inv) ** 2, axis=1))),
        },
        "fitted_on": pairs.fitted_on,
        "provenance": (f"fitted: least squares on {len(z)} measured full-versus-cohort pairs of {pairs.fitted_on} "
                       f"({sum(p.interpolated for p in pairs.pairs)} with a cohort interpolated in batch size; skewed launches divided "
                       f"by {s.factor:.4f}, the median skew-file / uniform-table time over {s.shapes} shapes both measured); "
                       f"bound: the {q:.3f} quantile of residuals held out by shape group, {folds} folds"),
    }
    return GainFit(section, summary)


def transferred(section: dict[str, Any], source: str, target: str) -> dict[str, Any]:
    """A ``cohort_gain`` section fitted for profile ``source`` labelled for profile ``target``:
    transferred, not measured there. One transferred again keeps the profile it was fitted for."""
    origin = section.get("transferred_from") or source
    prov = section["provenance"]
    fitted = prov[prov.index("fitted:"):] if "fitted:" in prov else prov
    return {**section, "transferred_from": origin, "provenance": f"transferred: fitted for {origin}, not measured on {target}; {fitted}"}


def fit_report(pairs: PairSet, fit: GainFit, unpaired: dict[str, Any]) -> dict[str, Any]:
    """What ``coda profile fit-gain`` prints: the pairing (time base, interpolation) and the held-out
    numbers next to the ``unpaired`` bounds' on the same pairs."""
    s, loo = pairs.scale, np.abs(pairs.interpolation)
    return {
        "pairs": len(pairs.pairs),
        "skipped": pairs.skipped,
        "interpolated": sum(p.interpolated for p in pairs.pairs),
        "time_base": {"ratio": s.factor, "shapes": s.shapes, "p10": s.p10, "p90": s.p90, "max_deviation": s.max_deviation},
        "interpolation_leave_one_out": {"points": int(len(loo)), "median": float(np.median(loo)) if len(loo) else None,
                                        "p90": float(np.percentile(loo, 90)) if len(loo) else None},
        "quantile": fit.section["quantile"],
        "residual_bound": fit.section["residual_bound"],
        "paired_held_out": fit.held_out,
        "unpaired": unpaired,
    }
