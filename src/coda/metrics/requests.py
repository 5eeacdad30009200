"""Serving metrics with one definition for the simulator and the benchmark harness.

Throughput counts what *finished* inside the measurement window [t0, t1] (so work deferred past
the window never inflates it), divided by the window length. Latencies are over the requests
that became *ready* inside the window and completed, and, when the run's end is known, those it cut
off (*unfinished*: still waiting or streaming), each censored at the run's end: a request still
waiting counts with the wait it had so far, so ``ttft_max_s`` and every other latency column is a
lower bound on the true one whenever ``latency_censored`` is above zero. A request meets its SLO when its TTFT and
its mean inter-token gap are both within their SLOs. Two views of decode speed are reported:
ITL is per request, ``(e2e - ttft) / (output_tokens - 1)``, with percentiles over requests (what
AIPerf and GuideLLM call inter-token latency and vLLM's benchmark calls TPOT); TBT percentiles
pool every inter-token gap of every measured request, where tokens that arrive together (one
streamed chunk, one simulated step of several) are one gap followed by zeros. Goodput = SLO-meeting
requests / offered requests (ready in window),
so rejecting or never finishing a request counts against it. A request *stalled* when it waited
more than ``STALL_S`` for its first token or never finished. Task (whole-session) metrics are
``coda.metrics.tasks``'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from coda.metrics.tasks import task_summary, tasks
from coda.workload.stats import useful_tokens

LATENCY_KEYS = ("ttft", "e2e")
# What an agent's operator reads beside throughput (request tails, then task metrics), in table order.
OPERATOR_KEYS = (
    "ttft_p99_s",
    "ttft_max_s",
    "stalled",
    "tasks",
    "tasks_censored",
    "task_time_p50_s",
    "task_time_p95_s",
    "task_time_p99_s",
    "slowdown_p50",
    "slowdown_p95",
    "slowdown_p99",
    "slowdown_jain",
)
STALL_S = 60.0  # assumed: the wait after which an agent's user gives up on a response
#: the replay's reasons for a request cut off when the run stopped (``coda.bench.replay``)
RUN_ENDED = ("run_ended", "interrupted")


@dataclass(frozen=True, slots=True)
class Window:
    start_s: float
    end_s: float

    @property
    def length_s(self) -> float:
        return max(self.end_s - self.start_s, 1e-9)


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs: Sequence[float]) -> list[float | None]:
    """Quantiles of a weighted sample (lower interpolation on the weighted CDF)."""
    if values.size == 0 or weights.sum() <= 0:
        return [None for _ in qs]
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cdf = np.cumsum(w) / w.sum()
    return [float(v[min(int(np.searchsorted(cdf, q, side="left")), v.size - 1)]) for q in qs]


def _pct(arr: np.ndarray, p: float) -> float | None:
    return float(np.percentile(arr, p)) if arr.size else None


def column(records: Sequence[Mapping[str, Any]], key: str, default: float = math.nan) -> np.ndarray:
    """One field of every record as floats, ``default`` where it is missing or None."""
    return np.array([default if r.get(key) is None else r[key] for r in records], dtype=float)


def cut_off(records: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Requests the run's end cut off: neither completed nor refused (the simulator's ``unfinished``),
    or failed only because the replay stopped (``RUN_ENDED``)."""
    return np.array([r.get("finish_s") is None and (r.get("state") not in ("rejected", "failed") or r.get("reason") in RUN_ENDED)
                     for r in records], dtype=bool)


def censored_latencies(records: Sequence[Mapping[str, Any]], run_end_s: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each record's TTFT and E2E, and the mask of those censored: a request cut off by the run's end
    (``cut_off``) counts as ending at ``run_end_s``, its first token too when none had come, so
    each censored value is at most the true one. Without ``run_end_s``, no request is censored and
    unfinished ones stay NaN."""
    ready, first, finish = column(records, "ready_s"), column(records, "first_token_s"), column(records, "finish_s")
    cut = cut_off(records) if run_end_s is not None else np.zeros(len(records), dtype=bool)
    ttft = np.where(cut & np.isnan(first), run_end_s if run_end_s is not None else np.nan, first) - ready
    e2e = np.where(cut, run_end_s if run_end_s is not None else np.nan, finish) - ready
    return ttft, e2e, cut


def summarize(
    records: Sequence[Mapping[str, Any]],
    window: Window,
    *,
    ttft_slo_s: float,
    tbt_slo_s: float,
    gaps: tuple[np.ndarray, np.ndarray] | None = None,
    decode_concurrency: float | None = None,
    run_end_s: float | None = None,
    alone_s: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, Any]:
    """The metrics docs/simulator.md defines (section Metrics), from per-request records.

    ``records`` carry ``ready_s``, ``first_token_s``, ``finish_s``, ``output_tokens``,
    ``prompt_tokens``, ``new_input_tokens``, ``round``, ``tbt_mean_s`` (the request's
    ``(finish - first) / (output_tokens - 1)``, its ITL) and, where known, ``*_hit_tokens`` and
    ``state``. ``gaps``: (values, weights) of pooled inter-token gaps;
    without it, each record's ``gaps_s`` list is pooled. With ``run_end_s`` (when the run
    stopped) the records also carry ``session_id`` and ``session_rounds`` and the task metrics are
    added, slowdowns too when ``alone_s`` gives each session's time alone through each round, and
    the requests the run's end cut off count in the TTFT and E2E columns, censored there
    (``censored_latencies``; ``latency_censored`` counts them).
    """
    ready = column(records, "ready_s")
    finish = column(records, "finish_s")
    out = column(records, "output_tokens", 0.0)
    prompt = column(records, "prompt_tokens", 0.0)
    new_in = column(records, "new_input_tokens", 0.0)
    rnd = column(records, "round", 1.0)
    tbt = column(records, "tbt_mean_s")
    state = np.array([r.get("state", "completed") for r in records], dtype=object)
    completed = np.array([s == "completed" and r.get("finish_s") is not None for s, r in zip(state, records)], dtype=bool)
    t0, t1 = window.start_s, window.end_s
    W = window.length_s

    offered = (ready >= t0) & (ready <= t1)
    done_in = completed & (finish >= t0) & (finish <= t1)
    ttft, e2e, cut = censored_latencies(records, run_end_s)
    slo_ok = within_slo(completed, ttft, tbt, out, ttft_slo_s, tbt_slo_s)
    useful = useful_tokens(rnd, prompt, new_in, out)

    lat = offered & completed
    res: dict[str, Any] = {
        "output_tps": float(out[done_in].sum() / W),
        "slo_tps": float(out[done_in & slo_ok].sum() / W),
        "useful_tps": float(useful[done_in].sum() / W),
        "request_tps": float(done_in.sum() / W),
        "offered": int(offered.sum()),
        "completed": int(lat.sum()),
        "unfinished": int((offered & ~completed & ~np.isin(state, ("rejected", "failed"))).sum()),
        "rejected": int((offered & (state == "rejected")).sum()),
        "failed": int((offered & (state == "failed")).sum()),
        "slo_met": int((offered & slo_ok).sum()),
        "goodput": float((offered & slo_ok).sum() / max(offered.sum(), 1)),
        "stalled": int((offered & (~completed | ~(ttft <= STALL_S))).sum()),
    }
    waits = offered & (completed | cut)
    res["latency_censored"] = int((offered & cut).sum())
    itl = tbt[lat & (out > 1) & ~np.isnan(tbt)]  # the record's tbt_mean_s is (finish - first) / (out - 1)
    for name, arr in (("ttft", ttft[waits]), ("e2e", e2e[waits]), ("itl", itl)):
        for p in (50, 90, 95, 99):
            res[f"{name}_p{p}_s"] = _pct(arr, p)
        res[f"{name}_mean_s"] = float(arr.mean()) if arr.size else None
    res["ttft_max_s"] = float(ttft[waits].max()) if waits.any() else None
    if gaps is None:
        pooled = [g for r, m in zip(records, lat) if m for g in (r.get("gaps_s") or ())]
        gaps = (np.array(pooled, dtype=float), np.ones(len(pooled)))
    q = weighted_quantiles(gaps[0], gaps[1], (0.5, 0.95, 0.99))
    res["tbt_p50_s"], res["tbt_p95_s"], res["tbt_p99_s"] = q
    res["tbt_mean_s"] = float(np.average(gaps[0], weights=gaps[1])) if gaps[0].size and gaps[1].sum() > 0 else None
    hits = {k: column(records, f"{k}_hit_tokens", 0.0) for k in ("hbm", "dram", "ssd")}
    denom = max(prompt[lat].sum(), 1.0)
    res["reuse_rate"] = float(sum(h[lat].sum() for h in hits.values()) / denom)
    res["reuse_hbm"] = float(hits["hbm"][lat].sum() / denom)
    res["reuse_store"] = float((hits["dram"][lat].sum() + hits["ssd"][lat].sum()) / denom)
    if decode_concurrency is not None:
        res["decode_concurrency"] = decode_concurrency
    if run_end_s is not None:
        res.update(task_summary(tasks(records, t0, t1, run_end_s), alone_s))
    return res


def within_slo(
    completed: np.ndarray, ttft: np.ndarray, itl: np.ndarray, out: np.ndarray, ttft_slo_s: float, tbt_slo_s: float
) -> np.ndarray:
    """Requests that meet both SLOs: completed, TTFT within its bound and, when they decode more than
    one token, their mean inter-token gap within the TBT bound."""
    return completed & (ttft <= ttft_slo_s) & ((out <= 1) | (np.nan_to_num(itl, nan=np.inf) <= tbt_slo_s))



def t_quantile(df: int, level: float = 0.95) -> float:
    """Two-sided Student-t critical value for ``df`` degrees of freedom (scipy's exact inverse CDF):
    a normal 1.96 understates small-sample intervals at every df, by 14% at df 10."""
    from scipy.special import stdtrit

    return float(stdtrit(df, 0.5 + level / 2))


def mean_ci(values: Iterable[float | None]) -> dict[str, float | None]:
    """Mean and 95% confidence half-width (Student t, n - 1 df) over seeds."""
    arr = np.array([v for v in values if v is not None], dtype=float)
    if arr.size == 0:
        return {"mean": None, "ci95": None, "n": 0}
    if arr.size == 1:
        return {"mean": float(arr[0]), "ci95": None, "n": 1}
    half = t_quantile(arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size)
    return {"mean": float(arr.mean()), "ci95": float(half), "n": int(arr.size)}


class RatioCI(NamedTuple):
    """A ratio of sums and its 95% interval (None where it is undefined)."""

    ratio: float | None
    lo: float | None
    hi: float | None


def ratio_ci(num: Sequence[float], den: Sequence[float]) -> RatioCI:
    """Ratio of sums over paired seeds (``num[i]`` and ``den[i]`` ran on the same seed) with a
    jackknife 95% interval: leave one seed out, standard error of the leave-one-out ratios, t with
    n - 1 df. A ratio of sums is not a mean, so its interval cannot come from ``mean_ci``."""
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"ratio_ci needs paired samples, got {a.size} and {b.size}")
    if b.sum() == 0:
        return RatioCI(None, None, None)
    r = float(a.sum() / b.sum())
    n = a.size
    loo_den = b.sum() - b
    if n < 2 or np.any(loo_den == 0):
        return RatioCI(r, None, None)
    loo = (a.sum() - a) / loo_den
    se = math.sqrt((n - 1) / n * float(((loo - loo.mean()) ** 2).sum()))
    half = t_quantile(n - 1) * se
    return RatioCI(r, r - half, r + half)
