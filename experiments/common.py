"""Shared harness for the evaluation experiments (docs/evaluation.md).

Every number an experiment prints comes from ``run_cell``: one simulation of one system on one
workload and seed, with read-only instrumentation attached (nothing here changes a policy's
decision; wrappers call the policy and only count what it did). Aggregation follows docs/simulator.md (Metrics):
means with 95% Student-t intervals over seeds, gains as ratios of sums over seeds; the interval
of a ratio of sums is a jackknife over seeds (``coda.metrics.ratio_ci``).

Run from the repository root with the project's venv:  python experiments/<script>.py
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from coda.cost.model import build_cost_model
from coda.cost.profile import load_profile
from coda.errors import CodaError
from coda.metrics.requests import mean_ci, ratio_ci, summarize
from coda.policy.contracts import StatePolicy
from coda.policy.eviction import ToolAware
from coda.policy.execution import Cohort
from coda.policy.registry import register
from coda.policy.routing import ContextCompatible, SMetric, candidates, context_distance, least_loaded_of
from coda.policy.spec import PoliciesOverride
from coda.policy.state import FewestBlocks, TieredAging
from coda.shell.build import build_policies
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sim.observe import SimObserver
from coda.sweep import Cell, SweepOptions, file_digest, profile_digest, run_cells
from coda.sweep.arguments import add_sweep_arguments, sweep_options
from coda.workload.schema import Round, Session, ToolCall, Workload
from coda.workload.stats import workload_duration_s
from experiments.paper import PaperWorkload

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "runs" / "experiments"
SEEDS = [0, 1, 2, 3, 4]
#: how the experiments' sweeps run; ``run_experiments`` sets it from the command line
SWEEP = SweepOptions(store=OUT / "cells")

# Experiment-only variants (never shipped): a shipped preset with a policies block over it, one
# factor at a time. A cell names a variant (or a preset) as its system.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "cachewise-lru": ("cachewise", {"eviction": "lru"}),
    "ta-lru": ("cachewise", {"state": "tiered_aging", "eviction": "lru"}),
    "fifo-ta-evict": ("cachewise", {"state": "fifo"}),
    "fifo-cohort": ("cachewise", {"state": "fifo", "execution": "cohort", "eviction": "lru"}),
    "cachewise+cohort": ("cachewise", {"execution": "cohort"}),
    # multi-worker: the coda router with CacheWise's admission, and smetric with it
    "coda-route+fb": ("coda", {"state": "fewest_blocks", "execution": "full"}),
    "smetric+fb": ("cachewise", {"router": "smetric"}),
    # Tiered-Aging's rules with the cost counted in HBM blocks: with tau = inf that is fewest-blocks
    # with the starvation guard (its W_max branch cannot fire while the guard is on)
    "cw-guarded": ("cachewise", {"state": {"name": "tiered_aging", "params": {"cost_unit": "blocks", "tau_s": math.inf}}}),
    "cw-aged-blocks": ("cachewise", {"state": {"name": "tiered_aging", "params": {"cost_unit": "blocks"}}}),
}


class OracleToolAware(ToolAware):
    """Tool-aware reclaim told the true remaining tool (or user) time of each session (experiment
    only: the best any tool-aware predictor could do). Bound to its simulation once it is built."""

    sim: Simulation | None = None

    def score(self, owner: int, out: Any) -> float:
        assert self.sim is not None, "bind the oracle to its simulation (sim.eviction.sim = sim)"
        return self.sim.oracle_remaining_s(owner)


register("eviction", "oracle_tool_aware", OracleToolAware)


# --- workloads ------------------------------------------------------------------------------
PAPER_SINGLE = {"M1": PaperWorkload("M1", 3, 0.25), "M2": PaperWorkload("M2", 5, 0.25), "M3": PaperWorkload("M3", 7, 0.25)}
PAPER_MULTI = {"Q1": PaperWorkload("Q1", 3), "Q2": PaperWorkload("Q2", 5), "Q3": PaperWorkload("Q3", 7)}
DURATION_S = 3600.0
WARMUP_S = 1200.0


def paper_workload(label: str, seed: int) -> Workload:
    """M1-M3 / Q1-Q3 exactly as ``python -m experiments.paper paper-single|paper-multi`` builds them;
    also ``m<r>`` / ``q<r>`` for other rates r (m9 = a quarter of the sessions of the 9 req/s
    workload, built like M1-M3; q9 = all of them)."""
    return _paper_def(label).build(seed, DURATION_S)


def _paper_def(label: str) -> PaperWorkload:
    wl = {**PAPER_SINGLE, **PAPER_MULTI}.get(label)
    if wl is None:
        if label[:1] not in ("m", "q"):
            raise ValueError(f"workload label {label!r}: M1-M3, Q1-Q3, m<rate> or q<rate>")
        wl = PaperWorkload(label, float(label[1:]), 0.25 if label[0] == "m" else None)
    return wl


def describe_workload(label: str) -> str:
    return f"{label} = {_paper_def(label).describe(DURATION_S)} (seed = run seed)"


def scale_tools(wl: Workload, factor: float) -> Workload:
    """Every tool call (and so every round's tool interval) ``factor`` times as long; think times kept."""
    sessions = []
    for s in wl.sessions:
        rounds = [
            dataclasses_replace_round(r, tool_duration_s=r.tool_duration_s * factor,
                                      tools=[ToolCall(name=t.name, duration_s=t.duration_s * factor) for t in r.tools])
            for r in s.rounds
        ]
        sessions.append(Session(session_id=s.session_id, start_s=s.start_s, rounds=rounds, prefix_group=s.prefix_group, tenant=s.tenant))
    return Workload(sessions=sessions, meta={**wl.meta, "tool_scale": factor}, block_tokens=wl.block_tokens)


def constant_tools(wl: Workload) -> Workload:
    """Every tool interval replaced by the workload's mean tool interval (same total tool time, no tail)."""
    durs = [r.tool_duration_s for s in wl.sessions for r in s.rounds if r.tools]
    mean = float(np.mean(durs))
    sessions = []
    for s in wl.sessions:
        rounds = [
            dataclasses_replace_round(r, tool_duration_s=mean, tools=[ToolCall(name=t.name, duration_s=mean) for t in r.tools])
            if r.tools
            else r
            for r in s.rounds
        ]
        sessions.append(Session(session_id=s.session_id, start_s=s.start_s, rounds=rounds, prefix_group=s.prefix_group, tenant=s.tenant))
    return Workload(sessions=sessions, meta={**wl.meta, "tools": f"constant {mean:.3f} s"}, block_tokens=wl.block_tokens)


def scale_tokens(wl: Workload, factor: float) -> Workload:
    """Every token count (system prompt, appended input, cache-break prefixes and outputs) times
    ``factor``; tool and think times kept. Every context scales by ``factor``, so batches keep
    their max/min context ratios (the heterogeneity cohorts act on) while, e.g. with 1/13, the
    200K context cap becomes about 15.4K, inside the fitted profiles' measured domain (16,384)."""
    sessions = []
    for s in wl.sessions:
        rounds: list[Round] = []
        context = 0
        for i, r in enumerate(s.rounds):
            new = max(1, int(round(r.new_input_tokens * factor)))
            prefix = None if r.prefix_tokens is None else int(round(r.prefix_tokens * factor))
            if i > 0 and prefix is not None:
                prefix = min(prefix, context)
            out = max(1, int(round(r.output_tokens * factor)))
            rounds.append(dataclasses_replace_round(r, new_input_tokens=new, prefix_tokens=prefix, output_tokens=out))
            reused = prefix if prefix is not None else (context if i > 0 else 0)
            context = reused + new + out
        sessions.append(Session(session_id=s.session_id, start_s=s.start_s, rounds=rounds, prefix_group=s.prefix_group, tenant=s.tenant))
    return Workload(sessions=sessions, meta={**wl.meta, "token_scale": factor}, block_tokens=wl.block_tokens)


def dataclasses_replace_round(r: Round, **kw: Any) -> Round:
    fields = {f: getattr(r, f) for f in r.__struct_fields__}
    fields.update(kw)
    return Round(**fields)


# --- instrumentation (read-only) ------------------------------------------------------------
NOT_ADMITTED = ("hold: oldest does not fit, admit nothing", "nothing fits", "none", "empty")
#: Tiered-Aging's default W_max, the bound a probe counts long waits against for a policy without one
DEFAULT_W_MAX_S: float = next(f.default for f in dataclasses.fields(TieredAging) if f.name == "w_max_s")  # type: ignore[assignment]


class StateProbe(SimObserver):
    """Observer of state-admission decisions: which rule of the run's policy decided (its own
    ``explain`` on the same snapshot), and how its choice relates to FCFS and to fewest-blocks on
    that snapshot."""

    def __init__(self, policy: StatePolicy, window: tuple[float, float] = (0.0, math.inf)) -> None:
        self.policy = policy
        self.window = window
        self.w_max_s = policy.w_max_s if isinstance(policy, TieredAging) else DEFAULT_W_MAX_S
        self.fb = FewestBlocks()
        self.branches: Counter[str] = Counter()
        self.decisions = 0
        self.same_as_fcfs = 0
        self.same_as_fb = 0
        self.chosen_extra = 0.0
        self.fb_extra = 0.0
        self.chosen_dram_tokens = 0.0
        self.head_wait_over_wmax = 0
        self.queue_len = 0

    def on_admission(self, worker: int, snap: Any, idx: int | None) -> None:
        n = len(snap)
        if n == 0 or not self.window[0] <= snap.now_s <= self.window[1]:
            return
        choice = self.policy.explain(snap)  # the rule that made the decision
        self.decisions += 1
        self.queue_len += n
        wait = snap.now_s - snap.ready_s
        self.branches[choice.rule] += 1
        if wait[0] >= self.w_max_s:
            self.head_wait_over_wmax += 1
        fb = self.fb.choose(snap)
        if idx is not None:
            self.same_as_fcfs += idx == 0
            self.same_as_fb += fb == idx
            self.chosen_extra += float(snap.extra_blocks[idx])
            self.chosen_dram_tokens += float(snap.dram_tokens[idx])
            if fb is not None:
                self.fb_extra += float(snap.extra_blocks[fb])

    def report(self) -> dict[str, Any]:
        admitted = self.decisions - sum(v for k, v in self.branches.items() if k in NOT_ADMITTED)
        d = max(self.decisions, 1)
        a = max(admitted, 1)
        return {
            "decisions": self.decisions,
            "branches": {k: v / d for k, v in sorted(self.branches.items())},
            "admissions_equal_fcfs": self.same_as_fcfs / a,
            "admissions_equal_fewest_blocks": self.same_as_fb / a,
            "mean_extra_blocks_chosen": self.chosen_extra / a,
            "mean_extra_blocks_fewest_blocks_choice": self.fb_extra / a,
            "mean_dram_tokens_chosen": self.chosen_dram_tokens / a,
            "w_max_s": self.w_max_s,
            "head_waited_w_max_share": self.head_wait_over_wmax / d,
            "mean_frontier_len": self.queue_len / d,
        }


class StepProbe(SimObserver):
    """Observer of executed batches: pure-decode steps, cohort splits, attention time saved
    (cost model of the run, full launch vs the plan executed), and a shadow cohort policy on
    batches that ran as one launch (what ``cohort`` would have done there)."""

    worker_fields: frozenset[str] = frozenset()

    def __init__(self, cost: Any, window: tuple[float, float] = (0.0, math.inf), shadow_cohort: bool = True) -> None:
        self.cost = cost
        self.window = window
        self.shadow = Cohort(cost) if shadow_cohort and hasattr(cost, "cohort_gain_bounds") else None
        self.decode_steps = 0
        self.eligible_steps = 0  # n >= 4 and max/min >= 1.5
        self.in_domain_steps = 0
        self.split_steps = 0
        self.shadow_split_steps = 0
        self.busy_s = 0.0
        self.decode_s = 0.0
        self.attn_full_s = 0.0
        self.attn_plan_s = 0.0
        self.shadow_saved_s = 0.0
        self.uniform_gap_s = 0.0  # attention above a near-uniform batch of the same size and total context
        self.batch_sizes: list[int] = []
        self.ratios: list[float] = []
        self._domain = getattr(cost, "in_domain", None)

    def on_route(self, snap: Any, chosen: int) -> None:
        pass

    def on_step(self, worker: int, start_s: float, durs: np.ndarray, prefills: Sequence, ctx: np.ndarray, plan: Any) -> None:
        k = len(durs)
        if not self.window[0] <= start_s <= self.window[1]:
            return
        self.busy_s += float(durs.sum())
        if prefills or len(ctx) == 0:
            return
        self.decode_steps += k
        self.decode_s += float(durs.sum())
        n = len(ctx)
        ratio = float(ctx.max() / max(ctx.min(), 1))
        self.batch_sizes.append(n)
        self.ratios.append(ratio)
        if n >= 4 and ratio >= 1.5:
            self.eligible_steps += k
            if self._domain is not None and self._domain(ctx):
                self.in_domain_steps += k
        full = self.cost.decode_attention_s(ctx)
        self.attn_full_s += full * k
        tot = int(ctx.sum())
        uni = np.full(n, tot // n, dtype=np.int64)
        uni[: tot - (tot // n) * n] += 1
        self.uniform_gap_s += (full - self.cost.decode_attention_s(uni)) * k
        if plan is not None:
            self.split_steps += k
            self.attn_plan_s += self.cost.cohort_attention_s(ctx, plan) * k
        else:
            self.attn_plan_s += full * k
            if self.shadow is not None and n >= 4:
                sp = self.shadow.plan(ctx)
                if sp is not None:
                    self.shadow_split_steps += k
                    self.shadow_saved_s += (full - self.cost.cohort_attention_s(ctx, sp)) * k

    def report(self) -> dict[str, Any]:
        bs = np.array(self.batch_sizes) if self.batch_sizes else np.zeros(1)
        rt = np.array(self.ratios) if self.ratios else np.ones(1)
        return {
            "decode_steps": self.decode_steps,
            "eligible_share": self.eligible_steps / max(self.decode_steps, 1),
            "in_domain_share": self.in_domain_steps / max(self.decode_steps, 1),
            "split_share": self.split_steps / max(self.decode_steps, 1),
            "shadow_split_share": self.shadow_split_steps / max(self.decode_steps, 1),
            "attn_share_of_decode_time": self.attn_full_s / max(self.decode_s, 1e-12),
            "skew_penalty_share_of_busy": self.uniform_gap_s / max(self.busy_s, 1e-12),
            "skew_penalty_of_attention": self.uniform_gap_s / max(self.attn_full_s - self.uniform_gap_s, 1e-12),
            "attn_saved_share_of_busy": (self.attn_full_s - self.attn_plan_s) / max(self.busy_s, 1e-12),
            "shadow_attn_saved_share_of_busy": self.shadow_saved_s / max(self.busy_s, 1e-12),
            "decode_time_share": self.decode_s / max(self.busy_s, 1e-12),
            "batch_p50": float(np.median(bs)),
            "ratio_p50": float(np.median(rt)),
        }


class RouteProbe(SimObserver):
    """Observer of routing decisions: which rule of the coda router decides (re-evaluated on the
    same snapshot with the router's own methods), whether the context rule changes the outcome
    against the least-loaded fallback, the chosen worker's load above the minimum, and the
    load spread across workers at each decision."""

    worker_fields = frozenset({"match", "decode_contexts"})

    def __init__(self, window: tuple[float, float] = (0.0, math.inf)) -> None:
        self.window = window
        self.coda = ContextCompatible()
        self.smetric = SMetric()
        self.kinds: Counter[str] = Counter()
        self.decisions = 0
        self.excess_load = 0.0
        self.spread_req = 0.0
        self.spread_kv = 0.0
        self.kv_max_over_mean = 0.0
        self.smetric_differs = 0
        self.d_chosen: list[float] = []
        self.d_smetric: list[float] = []

    def on_step(self, *a: Any) -> None:
        pass

    def on_route(self, snap: Any, chosen: int) -> None:
        if not self.window[0] <= snap.now_s <= self.window[1]:
            return
        self.decisions += 1
        ws = candidates(snap)
        loads = np.array([w.active_requests for w in ws])
        kv = np.array([w.active_kv_blocks for w in ws], dtype=float)
        self.excess_load += snap.workers[chosen].active_requests - loads.min()
        self.spread_req += loads.max() - loads.min()
        self.spread_kv += kv.max() - kv.min()
        self.kv_max_over_mean += kv.max() / kv.mean() if kv.mean() > 0 else 1.0
        rule = self.coda.explain(snap)
        if rule.rule == "context compatible":
            same = rule.worker_id == least_loaded_of(ws).worker_id
            self.kinds["context rule, same as least loaded" if same else "context rule, differs from least loaded"] += 1
        else:
            self.kinds[rule.rule] += 1
        sm = self.smetric.route(snap)
        if sm != chosen:
            self.smetric_differs += 1
            L = snap.request.prompt_tokens
            a, b = snap.workers[chosen].decode_contexts, snap.workers[sm].decode_contexts
            if a and b:
                self.d_chosen.append(context_distance(a, L))
                self.d_smetric.append(context_distance(b, L))

    def report(self) -> dict[str, Any]:
        d = max(self.decisions, 1)
        return {
            "decisions": self.decisions,
            "kinds": {k: v / d for k, v in sorted(self.kinds.items())},
            "mean_load_above_min": self.excess_load / d,
            "mean_load_spread": self.spread_req / d,
            "mean_kv_blocks_spread": self.spread_kv / d,
            "mean_kv_max_over_mean": self.kv_max_over_mean / d,
            "differs_from_smetric": self.smetric_differs / d,
            "mean_distance_chosen": float(np.mean(self.d_chosen)) if self.d_chosen else None,
            "mean_distance_smetric": float(np.mean(self.d_smetric)) if self.d_smetric else None,
        }


# --- one cell -------------------------------------------------------------------------------
METRICS = (
    "output_tps",
    "slo_tps",
    "useful_tps",
    "request_tps",
    "goodput",
    "ttft_p50_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "tbt_p50_s",
    "tbt_p95_s",
    "tbt_mean_s",
    "e2e_p50_s",
    "e2e_p95_s",
    "e2e_p99_s",
    "reuse_hbm",
    "reuse_store",
    "decode_concurrency",
    "preemptions",
    "offered",
    "completed",
    "unfinished",
)


def run_cell(
    workload: Workload,
    system: str,
    seed: int,
    *,
    workers: int = 1,
    probes: Sequence[str] = ("state", "step"),
    slo_pairs: Sequence[tuple[float, float]] = (),
    **overrides: Any,
) -> dict[str, Any]:
    """One simulation with read-only probes; returns metrics, probe reports and per-worker shares.
    ``system``: a preset or a name of ``VARIANTS``; ``policies`` in ``overrides`` lays a block over it."""
    preset, block = VARIANTS.get(system, (system, {}))
    policies = PoliciesOverride.model_validate(block).then(PoliciesOverride.model_validate(overrides.pop("policies", {})))
    cfg = SimConfig(system=preset, workers=workers, seed=seed, warmup_s=overrides.pop("warmup_s", WARMUP_S)).with_overrides(
        policies=policies, **overrides
    )
    observers: list[Any] = []
    step = route = None
    cost = build_cost_model(load_profile(cfg.profile))
    win = (cfg.warmup_s, workload_duration_s(workload))  # the simulator's measurement window
    if "step" in probes:
        step = StepProbe(cost, win)
        observers.append(step)
    if "route" in probes:
        route = RouteProbe(win)
        observers.append(route)
    state = StateProbe(build_policies(cfg.policy_spec, cost, kinds=("state",)).state, win) if "state" in probes else None
    if state is not None:
        observers.append(state)
    sim = Simulation(workload, cfg, cost=cost, observers=observers)
    if isinstance(sim.eviction, OracleToolAware):
        sim.eviction.sim = sim
    t0 = time.perf_counter()
    res = sim.run()
    wall = time.perf_counter() - t0
    summ = res.summary()
    out: dict[str, Any] = {m: summ.get(m) for m in METRICS}
    out["wall_s"] = wall
    out["resumed_paths"] = summ["resumed_paths"]
    out["shadow"] = summ["shadow"]
    out["hbm_used_frac_mean"] = (
        float(np.mean(res.sim.recorder.samples["hbm_used_frac"])) if res.sim.recorder.samples["hbm_used_frac"] else None
    )
    w = res.sim.window
    samples = res.sim.recorder.samples
    ts = np.array(samples["t_s"])
    sel = (ts >= w.start_s) & (ts <= w.end_s)
    ttft = np.array([r["ttft_s"] for r in res.records if r["measured"] and r["ttft_s"] is not None])
    out["ttft_max_s"] = float(ttft.max()) if ttft.size else None
    out["ttft_over_60s"] = int((ttft > 60).sum()) + int(summ.get("unfinished") or 0)
    out["waiting_mean"] = float(np.mean(np.array(samples["waiting"])[sel])) if sel.any() else None
    for ttft, tbt in slo_pairs:
        s = summarize(res.records, w, ttft_slo_s=ttft, tbt_slo_s=tbt, gaps=res.sim.recorder.gaps())
        out[f"slo_tps@{ttft:g}/{tbt:g}"] = s["slo_tps"]
    if state is not None:
        out["state_probe"] = state.report()
    if step is not None:
        out["step_probe"] = step.report()
    if route is not None:
        out["route_probe"] = route.report()
    if workers > 1:
        per = Counter()
        for r in res.records:
            if r["finish_s"] is not None and w.start_s <= r["finish_s"] <= w.end_s:
                per[r["worker"]] += r["output_tokens"]
        tot = sum(per.values()) or 1
        shares = sorted((per[i] / tot for i in range(workers)), reverse=True)
        out["worker_output_shares"] = shares
    out["config"] = {
        "system": system,
        "seed": seed,
        "workers": workers,
        "profile": cfg.profile,
        "hbm_kv_gib": cfg.hbm_kv_gib,
        "policies": sim.policies.spec.describe(),
        "slo": cfg.slo.model_dump(),
        "warmup_s": cfg.warmup_s,
    }
    return out


# --- aggregation ----------------------------------------------------------------------------
def fmt_gain(num: Sequence[float], den: Sequence[float]) -> str:
    r, lo, hi = ratio_ci(num, den)
    if lo is None:
        return f"{(r - 1) * 100:+.1f}%"
    return f"{(r - 1) * 100:+.1f}% [{(lo - 1) * 100:+.1f}, {(hi - 1) * 100:+.1f}]"


def fmt_ci(values: Iterable[float | None], digits: int = 1, scale: float = 1.0) -> str:
    ci = mean_ci(v * scale for v in values if v is not None)
    if ci["mean"] is None:
        return "-"
    return f"{ci['mean']:.{digits}f}" + (f" ± {ci['ci95']:.{digits}f}" if ci["ci95"] is not None else "")


def col(rows: list[dict[str, Any]], key: str) -> list[float]:
    out = []
    for r in rows:
        if key in r:
            out.append(r[key])
            continue
        v: Any = r
        for k in key.split("."):
            v = v.get(k) if isinstance(v, dict) else None
        out.append(v)
    return out


def mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [v for v in col(rows, key) if v is not None]
    return float(np.mean(vals)) if vals else None


def save(name: str, payload: Any) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    p = OUT / f"{name}.json"
    p.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return p


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_experiments(experiments: dict[str, Callable[[], str]], argv: Sequence[str], prefix: str = "") -> None:
    """Run the named experiments (all when none is named) with the sweep options of ``argv``
    (``--jobs N``, ``--ray [ADDRESS]``, ``--no-resume``), print each report and keep it as
    ``runs/experiments/<prefix><name>.md``. Finished cells are kept in ``runs/experiments/cells``."""
    import argparse

    global SWEEP
    ap = argparse.ArgumentParser(description="experiments: " + ", ".join(experiments))
    ap.add_argument("names", nargs="*", metavar="EXPERIMENT", help="default: all")
    add_sweep_arguments(ap)
    args = ap.parse_args(list(argv))
    names = args.names or list(experiments)
    for n in names:
        if n not in experiments:
            raise SystemExit(f"unknown experiment {n!r}; valid: {', '.join(experiments)}")
    SWEEP = sweep_options(args, OUT / "cells")
    for n in names:
        log(f"== {n}")
        try:
            text = experiments[n]()
        except CodaError as err:
            raise SystemExit(f"error: {err}") from None
        print(text + "\n", flush=True)
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{prefix}{n}.md").write_text(text + "\n")


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


#: a row of an experiment's table: (workload label, system, ``run_cell`` keywords, workload transform or None)
GridRow = tuple[str, str, Mapping[str, Any], Callable[[Workload], Workload] | None]


def _identity(fn: Callable[..., Any] | None) -> str | None:
    """What a workload builder or transform computes, for cell keys: its source and bound values."""
    if fn is None:
        return None
    if isinstance(fn, functools.partial):
        return f"{_identity(fn.func)}(*{fn.args!r}, **{fn.keywords!r})"
    try:
        source = inspect.getsource(fn).strip()
    except (OSError, TypeError):
        source = ""
    bound = [c.cell_contents for c in fn.__closure__ or ()] + list(fn.__defaults__ or ())
    return f"{fn.__module__}.{fn.__qualname__}: {source} {bound!r}"


def _grid_cell(
    build: Callable[[str, int], Workload],
    label: str,
    transform: Callable[[Workload], Workload] | None,
    system: str,
    seed: int,
    over: dict[str, Any],
) -> dict[str, Any]:
    wl = build(label, seed)
    return run_cell(transform(wl) if transform is not None else wl, system, seed, **over)


def run_grid(
    rows: Mapping[str, GridRow], name: str, seeds: Sequence[int] = SEEDS, build: Callable[[str, int], Workload] = paper_workload
) -> dict[str, list[dict[str, Any]]]:
    """Every row on every seed as one sweep (``SWEEP``: local processes or Ray, finished cells
    kept and resumed); ``build(label, seed)`` makes a row's workload. A cell's key holds its row,
    seed, workload (label, builder and transform), overrides, cost profile's content and this
    harness's source."""
    harness = file_digest(__file__)
    cells = []
    for row, (label, system, over, transform) in rows.items():
        profile = profile_digest(over.get("profile") or SimConfig.model_fields["profile"].default)
        for seed in seeds:
            config = {
                "cell": "experiment",
                "experiment": name,
                "row": row,
                "workload": label,
                "build": _identity(build),
                "transform": _identity(transform),
                "system": system,
                "variant": VARIANTS.get(system),
                "overrides": dict(over),
                "seed": seed,
                "profile": profile,
                "harness": harness,
            }
            cells.append(
                Cell(f"{row} seed {seed}", config, functools.partial(_grid_cell, build, label, transform, system, seed, dict(over)))
            )
    flat = iter(run_cells(cells, SWEEP, title=name))
    return {row: [next(flat) for _ in seeds] for row in rows}
