"""Workload characterization: the measured properties Coda's design rests on (the Coda paper's Findings 1-8).

Two replays of the workload in the simulator, each with the SSD tier on as in the Coda paper's
characterization:
- a policy-neutral one with the ``vllm`` system (round-robin, FCFS, one attention launch) gives
  where resumed requests find their reusable KV (F1), their preparation paths (F2), their startup
  cost (F3) and, through ``DecodeMix``, the composition of decode batches (F5-F7);
- one with the ``smetric`` system (session affinity with a load guard) gives, through
  ``RoutingOpportunity``, how often routing leaves a choice that context compatibility could make (F8).
F4 (context growth, tool-call durations) comes from the workload itself. Only requests that became
ready, and steps and routing decisions that happened, inside the measurement window count.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coda.eval.characterize_observe import DecodeMix, RoutingOpportunity
from coda.policy.routing import SMetric
from coda.shell.build import build_policies
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sim.results import SimResult
from coda.workload.schema import Workload, session_prompts
from coda.workload.stats import workload_stats

PATHS = ("hbm", "dram", "ssd", "recompute")
TIERS = ("hbm", "dram", "ssd")
TOP_SHARES = (0.01, 0.05, 0.10, 0.20)  # longest-first fractions of tool calls
Progress = Callable[[str, float], None]


@dataclass
class Characterization:
    """``findings`` is what ``findings.json`` holds; ``series`` are the distributions the figures draw."""

    findings: dict[str, Any]
    series: dict[str, np.ndarray] = field(default_factory=dict)


def _q(values: np.ndarray, p: float) -> float | None:
    return float(np.percentile(values, p)) if values.size else None


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


# --- F1-F3: where resumed requests find their KV, and what preparing it costs ------------------
def resumed_records(result: SimResult) -> list[dict[str, Any]]:
    """Measured requests that continue a session and were admitted (they have a preparation path)."""
    return [r for r in result.records if r["measured"] and r["round"] > 0 and r["path"]]


def tier_findings(records: list[dict[str, Any]], chunk_tokens: int) -> dict[str, Any]:
    """F1: reusable prefix tokens of resumed requests at admission, by the tier holding them.

    ``not_resident`` is the reusable prefix found in no tier (to recompute); prefixes are counted
    in whole KV chunks, as the simulator matches them."""
    tokens = {t: float(sum(r[f"{t}_hit_tokens"] for r in records)) for t in TIERS}
    reusable = [min(r["reusable_tokens"], r["prompt_tokens"] - 1) // chunk_tokens * chunk_tokens for r in records]
    held = [sum(r[f"{t}_hit_tokens"] for t in TIERS) for r in records]
    tokens["not_resident"] = float(sum(max(0, u - h) for u, h in zip(reusable, held)))
    total = sum(tokens.values())
    return {
        "requests": len(records),
        "tokens": tokens,
        "token_share": {k: _share(v, total) for k, v in tokens.items()},
        "definition": "reusable prefix tokens of resumed requests (round > 0) at their first admission, by tier; "
        "not_resident = reusable chunks found in no tier",
    }


def path_findings(records: list[dict[str, Any]]) -> dict[str, Any]:
    """F2: share of resumed requests per preparation path."""
    counts = {p: sum(r["path"] == p for r in records) for p in PATHS}
    return {"requests": len(records), "counts": counts, "share": {p: _share(c, len(records)) for p, c in counts.items()}}


def startup_findings(records: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """F3: startup cost (admission to first token: KV restore/load, then prefill of missing and new
    tokens, as the replay ran them) per path, and each path's share of the total."""
    clean = [r for r in records if not r["preemptions"] and r["first_token_s"] is not None]
    per: dict[str, np.ndarray] = {}
    out: dict[str, Any] = {}
    for p in PATHS:
        rs = [r for r in clean if r["path"] == p]
        total = np.array([r["first_token_s"] - r["admitted_s"] for r in rs])
        restore = np.array([r["state_ready_s"] - r["admitted_s"] for r in rs])
        per[p] = total
        out[p] = {
            "requests": len(rs),
            "p50_s": _q(total, 50),
            "p95_s": _q(total, 95),
            "mean_s": float(total.mean()) if total.size else None,
            "mean_restore_s": float(restore.mean()) if restore.size else None,
            "mean_prefill_s": float((total - restore).mean()) if total.size else None,
        }
    grand = sum(float(v.sum()) for v in per.values())
    for p in PATHS:
        out[p]["share_of_total"] = _share(float(per[p].sum()), grand)
    return {
        "paths": out,
        "total_s": grand,
        "excluded_preempted": len(records) - len(clean),
        "definition": "first token minus admission of resumed requests: H2D restore / SSD load wait, then prefill "
        "of the missing prefix and the new input; requests preempted at least once are left out",
    }, per


# --- F4: context growth and tool time -------------------------------------------------------
def growth_findings(workload: Workload) -> tuple[dict[str, Any], np.ndarray]:
    """F4a: max/first prompt per session (how much a session's context grows)."""
    g = np.array([max(p for _, p in ps) / max(ps[0][1], 1) for ps in (list(session_prompts(s)) for s in workload.sessions)])
    multi = np.array([len(s.rounds) > 1 for s in workload.sessions])
    return {
        "sessions": int(g.size),
        "multi_round_sessions": int(multi.sum()),
        **{f"p{p}": _q(g, p) for p in (50, 90, 99)},
        "max": float(g.max()) if g.size else None,
        "ge4_share": float((g >= 4).mean()) if g.size else None,
        "definition": "largest prompt / first prompt per session (all sessions)",
    }, g


def tool_findings(workload: Workload) -> tuple[dict[str, Any], np.ndarray]:
    """F4b: tool-call durations and how much of all tool time the longest calls hold."""
    d = np.array([t.duration_s for s in workload.sessions for r in s.rounds for t in r.tools], dtype=float)
    if d.size == 0:
        return {"calls": 0, "note": "the workload records no tool calls"}, d
    desc = np.sort(d)[::-1]
    cum = np.cumsum(desc) / desc.sum()
    top = {f"top_{int(f * 100)}pct_calls_time_share": float(cum[max(int(np.ceil(f * d.size)) - 1, 0)]) for f in TOP_SHARES}
    holding = {f"calls_share_holding_{int(s * 100)}pct_time": float((np.searchsorted(cum, s) + 1) / d.size) for s in (0.5, 0.8, 0.9)}
    return {
        "calls": int(d.size),
        "total_s": float(d.sum()),
        **{f"p{p}_s": _q(d, p) for p in (50, 90, 95, 99)},
        **top,
        **holding,
        "definition": "wall latency of every tool call; shares sort calls longest first",
    }, d


# --- F5-F7: decode-batch composition ----------------------------------------------------------
def decode_findings(mix: DecodeMix) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, np.ndarray]]:
    ratios, cvs = mix.ratios(), mix.cvs()
    f5 = {
        "iterations": int(ratios.size),
        **{f"ge{k}x_share": float((ratios >= k).mean()) if ratios.size else None for k in (2, 4, 8)},
        "ratio_p50": _q(ratios, 50),
        "ratio_p95": _q(ratios, 95),
        "cv_p50": _q(cvs, 50),
        "cv_p95": _q(cvs, 95),
        "cv_mean": float(cvs.mean()) if cvs.size else None,
        "definition": "executed iterations with >= 2 decoding requests (pure or with prefill): max/min decode context, "
        "and the coefficient of variation (std/mean) of the decode contexts",
    }
    f6 = {
        "iterations": mix.steps,
        "execution_s": mix.time_s,
        "pure_decode_iteration_share": _share(mix.pure_steps, mix.steps),
        "pure_decode_time_share": _share(mix.pure_time_s, mix.time_s),
        "multi_request_pure_decode_iteration_share": _share(mix.multi_pure_steps, mix.steps),
        "multi_request_pure_decode_time_share": _share(mix.multi_pure_time_s, mix.time_s),
        "definition": "executed engine iterations in the window; pure-decode = no prefill chunk",
    }
    gap, weight = mix.run_gaps()
    order = np.argsort(gap)
    cdf = np.cumsum(weight[order]) / weight.sum() if weight.size else weight

    def wq(p: float) -> float | None:
        return float(gap[order][np.searchsorted(cdf, p)]) if gap.size else None

    f7 = {
        "iterations": mix.multi_pure_steps,
        "attention_observed_s": mix.attn_observed_s,
        "attention_uniform_s": mix.attn_uniform_s,
        "attention_gap": _share(mix.attn_observed_s, mix.attn_uniform_s) - 1 if mix.attn_uniform_s > 0 else None,
        "gap_share_of_execution": _share(mix.attn_observed_s - mix.attn_uniform_s, mix.multi_pure_time_s),
        "per_iteration_ratio_p50": wq(0.5),
        "per_iteration_ratio_p95": wq(0.95),
        "cost_model": type(mix.cost).__name__,
        "definition": "multi-request pure-decode iterations: the cost model's decode attention time of the observed "
        "contexts vs a near-uniform batch with the same request count and total tokens (ratio of sums); "
        "gap_share_of_execution = that difference over these iterations' execution time",
    }
    return f5, f6, f7, {"ratios": ratios, "cvs": cvs, "gap": gap, "gap_weight": weight}


def routing_findings(opp: RoutingOpportunity) -> dict[str, Any]:
    """F8: how often SMetric's constraints leave several equally good workers, and how often the
    most context-compatible one is not the one chosen."""
    tot = {k: sum(c[k] for c in opp.by_kind.values()) for k in ("decisions", "multi_eligible", "comparable", "differs")}
    gaps = np.array(opp.distance_gaps)
    return {
        "decisions": opp.decisions,
        "multi_eligible_share": _share(tot["multi_eligible"], tot["decisions"]),
        "comparable_share": _share(tot["comparable"], tot["decisions"]),
        "differs_share": _share(tot["differs"], tot["decisions"]),
        "differs_share_of_multi_eligible": _share(tot["differs"], tot["multi_eligible"]),
        "by_decision": opp.by_kind,
        "distance_gap_p50": _q(gaps, 50),
        "smetric": {"slack": opp.smetric.slack, "ratio": opp.smetric.ratio},
        "definition": "routing decisions in the window of an smetric replay; eligible = workers with the chosen "
        "worker's HBM match within the load bound (affinity decisions) or within the load bound (others); "
        "comparable = >= 2 eligible and all report decode contexts; differs = the smallest context_distance "
        "(ties by load, id) is not the chosen worker; distance gap in mean |log2| units",
    }


# --- the whole characterization -------------------------------------------------------------
def _replay(workload: Workload, config: SimConfig, observer: DecodeMix | RoutingOpportunity, label: str,
            progress: Progress | None) -> SimResult:
    sim = Simulation(workload, config, observers=[observer])
    observer.bind(sim.cost, sim.window)
    result = sim.run((lambda f: progress(label, f)) if progress else None)
    return result


def characterize(
    workload: Workload, base: SimConfig, *, workload_info: dict[str, Any], progress: Progress | None = None
) -> Characterization:
    """Run both replays and compute F1-F8. ``base`` sets workers, profile, warm-up and the rest;
    the system and the SSD tier are set here."""
    timing: dict[str, float] = {}
    t0 = time.perf_counter()
    neutral_cfg = base.with_overrides(system="vllm", ssd=True)
    mix = DecodeMix()
    neutral = _replay(workload, neutral_cfg, mix, "replay vllm (F1-F3, F5-F7)", progress)
    timing["replay_vllm_s"] = time.perf_counter() - t0
    resumed = resumed_records(neutral)
    f3, startup = startup_findings(resumed)
    f4g, growth = growth_findings(workload)
    f4t, tools = tool_findings(workload)
    f5, f6, f7, decode = decode_findings(mix)
    findings: dict[str, Any] = {
        "workload": {**workload_info, "stats": workload_stats(workload), "meta": workload.meta},
        "f1_tiers": tier_findings(resumed, neutral_cfg.chunk_tokens),
        "f2_paths": path_findings(resumed),
        "f3_startup_cost": f3,
        "f4_growth": f4g,
        "f4_tools": f4t,
        "f5_heterogeneity": f5,
        "f6_decode_dominance": f6,
        "f7_uniform_gap": f7,
    }
    window = neutral.sim.window
    config: dict[str, Any] = {
        "replay_vllm": neutral.config_block(),
        "cost_model": type(neutral.sim.cost).__name__,
        "seed": base.seed,
        "window_s": [window.start_s, window.end_s],
    }
    if base.workers >= 2:
        t1 = time.perf_counter()
        routed_cfg = base.with_overrides(system="smetric", ssd=True)
        smetric = build_policies(routed_cfg.policy_spec, kinds=("router",)).router  # the run's router
        assert isinstance(smetric, SMetric)
        opp = RoutingOpportunity(smetric)
        routed = _replay(workload, routed_cfg, opp, "replay smetric (F8)", progress)
        findings["f8_routing_opportunity"] = routing_findings(opp)
        config["replay_smetric"] = routed.config_block()
        timing["replay_smetric_s"] = time.perf_counter() - t1
    else:
        findings["f8_routing_opportunity"] = {"skipped": "routing needs at least 2 workers; pass --workers 2 or more"}
    config["timing_s"] = timing
    findings["config"] = config
    series = {"startup_" + p: v for p, v in startup.items()} | {"growth": growth, "tools": tools} | decode
    return Characterization(findings, series)
