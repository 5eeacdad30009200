"""The agent burst on real engines: Coda's gateway and scheduler against ``vllm-router`` and plain
vLLM, at multiples of the knee, in one run.

Workload: agent sessions of the synthetic generator (``coda.workload.synth``) scaled to what a
CPU engine serves (``--token-scale`` of every token count, ``--tool-scale`` of every tool and think
time, at most ``--max-rounds`` rounds a session), so contexts grow round by round, sessions pause
for tools and their continuations hit the prefix cache; a ``--cold-share`` of the requests are
single-round sessions with a long prompt of their own (``--cold-tokens``), the cache misses that
stall continuations queued behind them. Sessions arrive in bursts: a Poisson process whose arrivals
are packed into the first ``--burst-duty`` of every ``--burst-period-s``.

Knee: a closed-loop concurrency sweep (``--sweep``: sessions at a time) on plain engines, on a
seed of its own; the knee is the highest concurrency whose goodput is within 5% of the best, and
its load is the session arrival rate it sustained. Loads are multiples of that rate (``--loads``),
replayed open loop (sessions arrive at their start times; each round follows its predecessor's
response plus the tool time), so the simulator can replay the same sessions.

Configurations (``--configs``), interleaved within each repeat, each on freshly started engines:

- ``plain``: the client spreads requests round robin over the engines; vLLM's FCFS scheduler;
- ``vllm-router``: ``vllm-router --policy cache_aware`` (PyPI) in front; FCFS;
- ``coda-gateway``: ``coda serve`` in front (its defaults, KV events, the engine's tokenizer); FCFS;
- ``coda``: ``coda serve`` and ``CodaScheduler`` with Tiered-Aging alone; ``coda+tiers``,
  ``coda+retention``, ``coda+cohorts`` turn one engine mechanism on over it (a one-factor ablation);
  controls run only when named: ``coda-gateway+tiers`` (vLLM's FCFS with the same host store),
  ``coda+hold`` (W_max binds a request that does not fit too), and the doors' admission on FCFS
  engines: ``coda-gateway+session``, ``coda-gateway+queue_limit``, ``coda-gateway+kv_threshold``
  (admitperf's, through its adapter) and ``vllm-router+limit`` (its concurrency limit at the engines' seats), each door told the seats;
- ``coda-tail``: ``coda serve`` and the ``coda-tail`` preset in the engine, every mechanism on.

Per configuration and load, over ``--repeats`` repeats (seeds ``--seed``, +1, ...): medians with
95% bootstrap intervals of goodput (SLO-meeting over offered), TTFT p50/p95 of continuations and
of cold requests, the longest wait, session completion p50/p99, the engines' prefix-cache hit rate
and preemptions, requests shed (rejected) and deferred, the door's CPU, and, to say why, the
engines' CPU and vLLM's gauges (running, waiting, KV use); for the door, goodput and session goodput
on the symmetric denominator (``coda.metrics.offered``, paced by the engine's profile measured here
or ``--alone-profile``), admitted TTFT p95, and from `coda serve`'s /metrics the seconds an engine
sat idle while the door held requests, the refusals made while one was idle, and the most requests
in flight on one engine; ratios of medians against
``vllm-router`` and ``plain`` with bootstrap intervals. Writes a table, ``rows.csv``,
``result.json`` and ``burst.png`` (goodput and continuation TTFT p95 against load), and keeps every
replay's requests and the engines' and gateway's logs under ``logs/``; each finished replay is
saved at once (``progress.json``), so a run given the same ``--out`` resumes.

Simulator: on real engines, ``coda profile measure --endpoint`` measures one plain engine before the
sweep, and ``coda sim`` replays the identical sessions and loads with that profile for every
configuration it models (``SIM_SYSTEMS``), with each statistic's error. ``--simulate PROFILE`` runs
the scenario in the simulator alone (``make run``).

    python benchmarks/agent_burst.py                      # 2 vLLM-CPU workers, every configuration
    python benchmarks/agent_burst.py --quick              # 3 configurations, 2 loads, 1 repeat
    python benchmarks/agent_burst.py --endpoints http://gpu0:8000,http://gpu1:8000 --configs plain,vllm-router,coda-gateway
    python benchmarks/agent_burst.py --simulate vllm-cpu-tiny   # no engines
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the vLLM-CPU harness lives with the integration tests

from coda import __version__  # noqa: E402
from coda.bench.client import Attempt, Endpoint  # noqa: E402
from coda.bench.doors import (  # noqa: E402
    PEER,
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
from coda.bench.replay import BenchConfig, Replay  # noqa: E402
from coda.bench.report import csv_text, knee  # noqa: E402
from coda.bench.run import alone_s, summary_of  # noqa: E402
from coda.engines.launch import FakeEngineProcess  # noqa: E402
from coda.engines.vllm_cpu import BLOCK as REAL_BLOCK  # noqa: E402
from coda.metrics.offered import symmetric_summary  # noqa: E402
from coda.metrics.requests import Window  # noqa: E402
from coda.sim.config import SloConfig  # noqa: E402
from coda.workload.schema import Round, Session, Workload  # noqa: E402
from coda.workload.synth import TRACELAB_ROUNDS_PER_SESSION, SynthSpec, synthesize  # noqa: E402

# --- configurations --------------------------------------------------------------------------
TA_ONLY = {"system": "coda", "tiers": False, "policies": {"state": "tiered_aging", "execution": "full", "eviction": "lru"}}
#: vLLM-CPU's host store for the tiers mechanism (DRAM); 400 MB holds every session's KV of this scenario
HOST_STORE = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"spec_name": "HostOffloadingSpec", "spec_module_path": "coda.integrations.vllm.host_offload",
                                            "cpu_bytes_to_use": 400_000_000}}
SCHEDULER_CLS = "coda.integrations.vllm.scheduler.CodaScheduler"
WORKER_CLS = "coda.integrations.vllm.worker.CodaWorker"


@dataclass(frozen=True)
class Setup:
    """A configuration: the door in front of the engines and what runs inside them."""

    door: str  # "none" (round robin in the client), PEER, or "coda"
    scheduler: dict[str, Any] | None = None  # CODA_SCHEDULER_CONFIG; None: vLLM's own scheduler
    tiers: bool = False  # the host-store connector
    cohorts: bool = False  # CodaWorker
    ingress: str | None = None  # the door's ingress policy (None: its default, admit everything)
    #: the door is told the engines' seats: ``coda serve`` its backends' max_num_seqs, vllm-router its concurrency limit
    seats: bool = False

    @property
    def in_engine(self) -> bool:
        """Whether the configuration changes the engines (so they must be started here)."""
        return self.scheduler is not None or self.tiers or self.cohorts


CONFIGS: dict[str, Setup] = {
    "plain": Setup("none"),
    PEER: Setup(PEER),
    "coda-gateway": Setup("coda"),
    "coda": Setup("coda", TA_ONLY),
    "coda+tiers": Setup("coda", {**TA_ONLY, "tiers": True}, tiers=True),
    "coda+retention": Setup("coda", {**TA_ONLY, "policies": {**TA_ONLY["policies"], "eviction": "tool_aware"}}),
    "coda+cohorts": Setup("coda", {**TA_ONLY, "policies": {**TA_ONLY["policies"], "execution": "cohort"}}, cohorts=True),
    # controls, run when named: vLLM's FCFS with the same host store (what the store gives without Coda's order)
    "coda-gateway+tiers": Setup("coda", tiers=True),
    # the door's admission on FCFS engines: Coda's session admission, and admitperf's kv_threshold through its adapter
    "coda-gateway+session": Setup("coda", ingress="session", seats=True),
    "coda-gateway+kv_threshold": Setup("coda", ingress="admitperf_kv_threshold", seats=True),
    "coda-gateway+queue_limit": Setup("coda", ingress="queue_limit", seats=True),
    # the peer's own admission: vllm-router's concurrency limit at the engines' seats, its queue in front
    "vllm-router+limit": Setup(PEER, seats=True),
    # W_max binds a request that does not fit too: memory drains for it (beyond the Coda paper's rule)
    "coda+hold": Setup(
        "coda", {**TA_ONLY, "policies": {**TA_ONLY["policies"], "state": {"name": "tiered_aging", "params": {"hold_queue": True}}}}
    ),
    "coda-tail": Setup("coda", {"system": "coda-tail"}, tiers=True, cohorts=True),
}
#: what runs without ``--configs``: the door, engine and mechanism ablation; the controls below run when named
NAMED_ONLY = ("coda-gateway+tiers", "coda-gateway+session", "coda-gateway+kv_threshold", "coda-gateway+queue_limit", "vllm-router+limit",
              "coda+hold")
DEFAULT_CONFIGS = tuple(c for c in CONFIGS if c not in NAMED_ONLY)
QUICK_CONFIGS = ("plain", PEER, "coda-tail")
BASELINES = (PEER, "plain")
#: what a `coda serve` door's /metrics say of a replay (``benchmarks.proxies.door_metrics``)
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
#: the metrics compared with each baseline as ratios of medians
RATIO_METRICS = ("goodput", "ttft_p95_continuation_s", "ttft_p95_cold_s", "max_wait_s", "session_p99_s")
BOOTSTRAP = 2000


# --- the workload ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    """What the sessions look like (independent of load)."""

    token_scale: float = 0.05
    tool_scale: float = 0.05
    max_rounds: int = 8
    cold_share: float = 0.05
    cold_tokens: int = 2048
    cold_output: int = 16
    burst_period_s: float = 10.0
    burst_duty: float = 0.3
    window_s: float = 30.0

    def __post_init__(self) -> None:
        checks = (
            (0 < self.token_scale <= 1, "--token-scale must be in (0, 1]"),
            (self.tool_scale > 0, "--tool-scale must be > 0"),
            (self.max_rounds >= 1, "--max-rounds must be >= 1"),
            (0 <= self.cold_share < 1, "--cold-share must be in [0, 1)"),
            (self.cold_tokens >= 1, "--cold-tokens must be >= 1"),
            (self.burst_period_s > 0, "--burst-period-s must be > 0"),
            (0 < self.burst_duty <= 1, "--burst-duty must be in (0, 1]"),
            (self.window_s > 0, "--window-s must be > 0"),
        )
        bad = [msg for ok, msg in checks if not ok]
        if bad:
            raise ValueError("; ".join(bad))


def burst_workload(sc: Scenario, sessions_per_s: float, seed: int) -> Workload:
    """Agent sessions arriving at ``sessions_per_s`` on average over the window, in bursts, plus cold sessions."""
    synth = synthesize(
        SynthSpec(
            rate=sessions_per_s * TRACELAB_ROUNDS_PER_SESSION, duration=sc.window_s, seed=seed, tokens=sc.token_scale, tools=sc.tool_scale
        )
    )
    agents = [
        Session(session_id=s.session_id, start_s=burst_time(sc, s.start_s), rounds=s.rounds[: sc.max_rounds], prefix_group=s.prefix_group)
        for s in synth.sessions
    ]
    requests = sum(len(s.rounds) for s in agents)
    n_cold = round(sc.cold_share * requests / (1 - sc.cold_share))
    rng = np.random.default_rng([seed, 1])
    cold = [
        Session(
            session_id=f"cold{seed}-{i:04d}",
            start_s=burst_time(sc, float(t)),
            prefix_group=f"cold{seed}-{i:04d}",
            rounds=[Round(new_input_tokens=sc.cold_tokens, output_tokens=sc.cold_output, kind="user")],
        )
        for i, t in enumerate(rng.uniform(0.0, sc.window_s, n_cold))
    ]
    sessions = sorted(agents + cold, key=lambda s: (s.start_s, s.session_id))
    meta = {
        **{k: v for k, v in synth.meta.items() if k != "choices"},
        "sessions_per_s": sessions_per_s,
        "scenario": vars(sc),
        "cold_sessions": n_cold,
        "agent_sessions": len(agents),
    }
    return Workload(sessions=sessions, meta=meta)


def burst_time(sc: Scenario, t: float) -> float:
    """A start time packed into the first ``burst_duty`` of its ``burst_period_s``: the count per period is kept."""
    period = math.floor(t / sc.burst_period_s)
    return round(period * sc.burst_period_s + (t - period * sc.burst_period_s) * sc.burst_duty, 6)


def is_cold(session_id: str) -> bool:
    return session_id.startswith("cold")


# --- the engines and the door ----------------------------------------------------------------
@dataclass
class Engines:
    urls: list[str]
    events: list[tuple[int, int]] | None  # (pub, replay) ports of each engine's KV events
    fresh: bool
    groups: list[int] = field(default_factory=list)  # each started vLLM server's process group (its API server and engine core)


@contextlib.contextmanager
def start_engines(setup: Setup, args: argparse.Namespace, tmp: Path, model: Path | None, tag: str) -> Iterator[Engines]:
    """Fresh engines for one configuration (fake ones with ``--fake``), or the ``--endpoints`` as they are."""
    if args.endpoints:
        yield Engines(args.endpoints, None, False)
        return
    if args.fake:
        with contextlib.ExitStack() as stack:
            procs = [stack.enter_context(FakeEngineProcess("--speedup", str(args.fake_speedup))) for _ in range(args.workers)]
            yield Engines([p.url for p in procs], None, True)
        return
    from tests.integration.vllm.support import free_port, vllm_servers

    assert model is not None
    ports = [(free_port(), free_port()) for _ in range(args.workers)]
    base = [
        "--block-size",
        str(REAL_BLOCK),
        "--num-gpu-blocks-override",
        str(args.kv_blocks),
        "--max-model-len",
        str(args.max_model_len),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
    ]
    if setup.scheduler is not None:
        base += ["--scheduler-cls", SCHEDULER_CLS]
    if setup.tiers:
        base += ["--kv-transfer-config", json.dumps(HOST_STORE)]
    if setup.cohorts:
        base += ["--worker-cls", WORKER_CLS]
    cpus = os.cpu_count() or 1
    envs = [
        {
            "VLLM_CPU_OMP_THREADS_BIND": str(i % cpus),  # one core each
            **({"CODA_SCHEDULER_CONFIG": json.dumps(setup.scheduler)} if setup.scheduler is not None else {}),
        }
        for i in range(args.workers)
    ]
    logs = [args.logs / f"{tag}-engine{i}.log" for i in range(args.workers)]
    procs: list[Any] = []
    with vllm_servers(model, [[*base, *kv_events_args(pub, rep)] for pub, rep in ports], envs=envs, logs=logs, procs=procs) as urls:
        yield Engines(urls, ports, True, [p.pid for p in procs])  # each server leads its own process group


@contextlib.contextmanager
def door(
    setup: Setup, engines: Engines, tmp: Path, model: Path | None, peer: Path | None, tag: str, args: argparse.Namespace
) -> Iterator[tuple[list[str], int | None]]:
    """The URLs the client sends to and the door's pid (None without one)."""
    if setup.door == "none":
        yield engines.urls, None
    elif setup.door == PEER:
        assert peer is not None
        limit = peer_limit(args.max_num_seqs * len(engines.urls)) if setup.seats else []
        with vllm_router(peer, engines.urls, args.logs / f"{tag}-{PEER}.log", limit) as proxy:
            yield [proxy.url], proxy.pid
    else:
        (tmp / tag).mkdir(exist_ok=True)
        # an ingress policy's default thresholds come from the engines' seats, which vLLM does not publish
        seats = args.max_num_seqs if setup.seats else None
        log = args.logs / f"{tag}-coda-serve.log"
        with coda_serve(engines.urls, engines.events, tmp / tag, model, log, ingress=setup.ingress, max_num_seqs=seats) as proxy:
            yield [proxy.url], proxy.pid


class RoundRobin(Endpoint):
    """The plain configuration's client side: each request to the next engine in turn, no door."""

    def __init__(self, urls: Sequence[str], **kwargs: Any) -> None:
        super().__init__(urls[0], **kwargs)
        self.endpoints = [Endpoint(u, **kwargs) for u in urls]
        self._turn = 0

    async def send(self, body: bytes, headers: dict[str, str], shard: int = 0) -> Attempt:
        e = self.endpoints[self._turn % len(self.endpoints)]
        self._turn += 1
        return await e.send(body, headers, shard)

    async def close(self) -> None:
        for e in self.endpoints:
            await e.close()
        await super().close()


class SpreadReplay(Replay):
    """``coda bench``'s replay over several engines without a door."""

    def __init__(self, workload: Workload, config: BenchConfig, urls: Sequence[str]) -> None:
        super().__init__(workload, config)
        self.urls = list(urls)

    def endpoint(self, shards: int) -> Endpoint:
        cfg = self.config
        return RoundRobin(self.urls, model=cfg.model, api=cfg.api, ignore_eos=cfg.ignore_eos, timeout_s=cfg.timeout_s, shards=shards)


# --- one run -----------------------------------------------------------------------------------
def bench_config(
    args: argparse.Namespace, targets: list[str], engine_urls: list[str], model: Path | None, seed: int,
    max_concurrency: int | None = None, profile: str | None = None
) -> BenchConfig:
    """``profile``: the engine's cost profile, for each session's time alone (slowdowns, the symmetric denominator's pace)."""
    return BenchConfig(
        endpoint=targets[0],
        model=None if args.endpoints else args.model_name,
        api="completions",
        duration_s=args.scenario.window_s,
        drain_s=args.drain_s,
        tokenizer=str(model) if model else args.tokenizer,
        scrape_metrics=True,
        metrics_endpoints=tuple(engine_urls),
        seed=seed,
        max_concurrency=max_concurrency,
        profile=profile,
        slo=SloConfig(ttft_s=args.slo_ttft_s, tbt_s=args.slo_tbt_s),
    )


def replay_once(
    workload: Workload, cfg: BenchConfig, targets: list[str], door_pid: int | None, engines: Engines, records: Path, gateway: str | None
) -> dict[str, Any]:
    """One replay; its metrics (the keys of ``METRICS``), why requests failed or were refused,
    and the bench summary. Every request's record goes to ``records`` (JSON lines). ``gateway``:
    the URL of a `coda serve` door, whose /metrics give ``DOOR_COUNTS`` (the idle time and refusals
    of this replay; the peak since the door started)."""
    rep = SpreadReplay(workload, cfg, targets) if len(targets) > 1 else Replay(workload, cfg)
    alone = alone_s(workload, cfg)
    c0 = cpu_s(door_pid) if door_pid else 0.0
    e0 = [group_cpu_s(g) for g in engines.groups]
    before = door_metrics(gateway) if gateway else None
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
    return {
        **metrics_of(rep.records, window, s, door_cpu),
        "engine_cpu_pct": engine_cpu,
        **({"goodput_symmetric": fair["goodput"], "slo_rps_symmetric": fair["slo_rps"], "session_goodput": fair["session_goodput"],
            "sessions_completed": fair["sessions_completed"]} if fair else {}),
        **({"idle_while_held_s": counts["idle_while_held_s"] - before["idle_while_held_s"],
            "refused_while_idle": counts["refused_while_idle"] - before["refused_while_idle"],
            "inflight_peak": counts["inflight_peak"]} if counts and before else {}),
        "agent_sessions_per_s": len(agents) / window.length_s,
        "not_served": dict(reasons.most_common()),
        "summary": s,
    }


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def metrics_of(records: Sequence[dict[str, Any]], window: Window, s: dict[str, Any], door_cpu: float | None) -> dict[str, Any]:
    """This benchmark's metrics of one run: the bench summary's, TTFT split into continuations (an
    agent session's later rounds) and cold requests, and the engines' counters summed."""
    done = [r for r in records if r["state"] == "completed" and window.start_s <= r["ready_s"] <= window.end_s]
    cont = [r["first_token_s"] - r["ready_s"] for r in done if not is_cold(r["session_id"]) and r["round"] > 0]
    cold = [r["first_token_s"] - r["ready_s"] for r in done if is_cold(r["session_id"])]
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


# --- statistics ----------------------------------------------------------------------------------
def median_ci(values: Sequence[float | None], rng: np.random.Generator) -> tuple[float | None, list[float] | None]:
    """Median and its 95% percentile-bootstrap interval (None with fewer than two values)."""
    arr = np.array([v for v in values if v is not None], dtype=float)
    if arr.size == 0:
        return None, None
    if arr.size == 1:
        return float(arr[0]), None
    boot = np.median(rng.choice(arr, size=(BOOTSTRAP, arr.size)), axis=1)
    return float(np.median(arr)), [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]


def ratio_ci(num: Sequence[float | None], den: Sequence[float | None], rng: np.random.Generator) -> tuple[float | None, list[float] | None]:
    """Ratio of medians and its 95% interval, each side resampled on its own (None where a median is 0 or missing)."""
    a = np.array([v for v in num if v is not None], dtype=float)
    b = np.array([v for v in den if v is not None], dtype=float)
    if a.size == 0 or b.size == 0 or np.median(b) == 0:
        return None, None
    point = float(np.median(a) / np.median(b))
    if a.size < 2 or b.size < 2:
        return point, None
    ma = np.median(rng.choice(a, size=(BOOTSTRAP, a.size)), axis=1)
    mb = np.median(rng.choice(b, size=(BOOTSTRAP, b.size)), axis=1)
    ok = mb != 0
    r = ma[ok] / mb[ok]
    return point, [float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))]


def rows_of(runs: dict[tuple[str, float], list[dict[str, Any]]], seed: int) -> list[dict[str, Any]]:
    """One row per configuration and load: medians with intervals, then ratios against each baseline present."""
    rng = np.random.default_rng(seed)
    rows = []
    for (config, load), reps in runs.items():
        row: dict[str, Any] = {"config": config, "load": load, "repeats": len(reps)}
        for key in METRICS:
            row[key], row[f"{key}_ci95"] = median_ci([r.get(key) for r in reps], rng)
        for base in BASELINES:
            other = runs.get((base, load))
            if other is None or base == config:
                continue
            for key in RATIO_METRICS:
                name = f"{key}_vs_{base.replace('-', '_')}"
                row[name], row[f"{name}_ci95"] = ratio_ci([r[key] for r in reps], [r[key] for r in other], rng)
        rows.append(row)
    return rows


# --- the simulator on the same sessions ------------------------------------------------------------
#: the configurations the simulator replays, as its settings: a system preset and policy overrides,
#: and a DRAM tier where the engine has a host store. The simulator has no model of vllm-router.
SIM_SYSTEMS: dict[str, dict[str, Any]] = {
    "plain": {"system": "vllm", "dram": False},
    "coda-gateway": {"system": "coda-route-only", "dram": False},
    "coda-gateway+tiers": {"system": "coda-route-only", "dram": True},
    "coda": {"system": "coda", "policies": {"execution": "full", "eviction": "lru"}, "dram": False},
    "coda+tiers": {"system": "coda", "policies": {"execution": "full", "eviction": "lru"}, "dram": True},
    "coda+retention": {"system": "coda", "policies": {"execution": "full", "eviction": "tool_aware"}, "dram": False},
    "coda+cohorts": {"system": "coda", "policies": {"execution": "cohort", "eviction": "lru"}, "dram": False},
    "coda+hold": {
        "system": "coda",
        "policies": {"state": {"name": "tiered_aging", "params": {"hold_queue": True}}, "execution": "full", "eviction": "lru"},
        "dram": False,
    },
    "coda-tail": {"system": "coda-tail", "dram": True},
}
#: the statistics whose simulated error is reported, and the ones with a target (|error| <= SIM_TARGET)
#: (every engine-side metric: not the arrival rate, nor what only a real door sheds, defers, fails or spends, nor
#: the gauges, which only real engines publish)
SIM_LEFT_OUT = ("offered_rps", "shed", "deferred", "failed", "door_cpu_pct", "engine_cpu_pct", *ENGINE_GAUGES, *DOOR_COUNTS, *SYMMETRIC)
SIM_ERROR_METRICS = tuple(m for m in METRICS if m not in SIM_LEFT_OUT)
SIM_TARGETED = ("goodput", "ttft_p50_s")
SIM_TARGET = 0.10


def measure_profile(url: str, out: Path, args: argparse.Namespace) -> Path:
    """``coda profile measure --endpoint`` on one of the engines: its step costs through its API, fitted into a profile."""
    from tests.integration.vllm.replay import KV_BYTES_PER_TOKEN, coda

    coda(
        "profile",
        "measure",
        "--endpoint",
        url,
        "--out",
        str(out),
        "--name",
        out.stem,
        "--kv-bytes-per-token",
        str(KV_BYTES_PER_TOKEN),
        "--repeats",
        str(args.profile_repeats),
        "--output-tokens",
        "32",
        "--max-batch",
        str(min(8, args.max_num_seqs)),
        "--note",
        f"vLLM-CPU tiny model, block {REAL_BLOCK}, {args.kv_blocks} KV blocks, {args.max_num_seqs} sequences, "
        f"{args.max_num_batched_tokens}-token budget, one core",
    )
    return out


def simulate_one(args: argparse.Namespace, config: str, profile: str, workload: Workload, seed: int) -> dict[str, Any]:
    """One configuration on one workload in ``coda sim``, with the engines' settings; this benchmark's metrics."""
    from coda.api import simulate
    from coda.sim.config import SimConfig

    cfg = SimConfig.model_validate(
        {
            **SIM_SYSTEMS[config],
            "workers": args.workers,
            "profile": profile,
            "chunk_tokens": REAL_BLOCK,
            "num_gpu_blocks": args.kv_blocks,
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "warmup_s": 0.0,
            "drain_s": args.drain_s,
            "seed": seed,
            "slo": {"ttft_s": args.slo_ttft_s, "tbt_s": args.slo_tbt_s},
        }
    )
    res = simulate(workload, cfg)
    s = res.summary()
    window = Window(*s["window_s"])
    m = metrics_of(res.records, window, s, None)
    done = [r for r in res.records if r["state"] == "completed" and window.start_s <= r["ready_s"] <= window.end_s]
    prompt = sum(r["prompt_tokens"] for r in done)
    m["prefix_hit_rate"] = sum(r["hbm_hit_tokens"] + r["dram_hit_tokens"] + r["ssd_hit_tokens"] for r in done) / prompt if prompt else None
    m["preemptions"] = sum(r["preemptions"] for r in res.records)
    return m


def simulate_runs(args: argparse.Namespace, profile: str, rate: float) -> dict[str, Any]:
    """Every (configuration the simulator models, load, repeat) of the run, replayed in ``coda sim``
    on the identical sessions."""
    runs: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for config in (c for c in args.configs if c in SIM_SYSTEMS):
        for load in args.loads:
            for rep in range(args.repeats):
                wl = burst_workload(args.scenario, load * rate, load_seed(args.seed + rep, load))
                runs.setdefault((config, load), []).append(simulate_one(args, config, profile, wl, args.seed + rep))
    return {"runs": runs, "rows": rows_of(runs, args.seed)}


def simulated_knee(args: argparse.Namespace, profile: str) -> dict[str, Any]:
    """The knee in the simulator: plain at each of ``--sim-sweep`` session arrival rates, open loop."""
    levels = []
    for rate in args.sim_sweep:
        m = simulate_one(args, "plain", profile, burst_workload(args.scenario, rate, args.seed + 1000), args.seed + 1000)
        levels.append({"sessions_per_s": rate, "goodput": m["goodput"], "offered_rps": m["offered_rps"]})
    k = knee([{"rate": lv["sessions_per_s"], "goodput": lv["goodput"]} for lv in levels], "rate")
    return {
        "levels": levels,
        "knee_sessions_per_s": k,
        "at_top": k == max(args.sim_sweep),
        "rule": "highest session arrival rate whose goodput (plain, simulated) is within 5% of the best",
    }


def run_simulated(args: argparse.Namespace) -> dict[str, Any]:
    """The agent burst in the simulator alone: the knee, then every configuration it models at every load."""
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=Console(stderr=True), transient=True) as prog:
        prog.add_task("simulating the knee sweep, then every configuration at every load", total=None)
        knee_result = simulated_knee(args, args.simulate)
        sim = simulate_runs(args, args.simulate, knee_result["knee_sessions_per_s"])
    return {"knee": knee_result, "runs": {f"{c}@{lo:g}": v for (c, lo), v in sim["runs"].items()}, "rows": sim["rows"]}


def sim_errors(real_rows: Sequence[dict[str, Any]], sim_rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each simulated median against the measured one: sim / measured - 1 (None where either is missing or measured is 0)."""
    real = {(r["config"], r["load"]): r for r in real_rows}
    out = []
    for row in sim_rows:
        meas = real[(row["config"], row["load"])]
        err: dict[str, Any] = {"config": row["config"], "load": row["load"]}
        for key in SIM_ERROR_METRICS:
            a, b = row[key], meas[key]
            err[key] = a / b - 1.0 if a is not None and b else None
        err["targets_met"] = all(err[k] is not None and abs(err[k]) <= SIM_TARGET for k in SIM_TARGETED)
        out.append(err)
    return out


def load_seed(seed: int, load: float) -> int:
    """The workload seed of a repeat's seed at a load: each load draws sessions of its own."""
    return seed * 100 + round(load * 10)


# --- the run -----------------------------------------------------------------------------------
def measure_knee(
    args: argparse.Namespace, tmp: Path, model: Path | None, peer: Path | None, tick: Any, profile: Path | None
) -> dict[str, Any]:
    """The concurrency sweep on plain engines: per level, goodput and the session arrival rate it
    sustained; first, with ``profile``, the engine's profile measured on one of them."""
    sc = args.scenario
    # enough sessions that no slot runs dry (each level starts from the first session again)
    workload = burst_workload(sc, 2.0 * max(args.sweep), args.seed + 1000)
    levels = []
    setup = CONFIGS["plain"]
    with start_engines(setup, args, tmp, model, "sweep") as eng, door(setup, eng, tmp, model, peer, "sweep", args) as (targets, pid):
        if profile is not None:
            tick("measuring the engine's profile (coda profile measure --endpoint)")
            measure_profile(eng.urls[0], profile, args)
        for c in args.sweep:
            tick(f"knee sweep: {c} sessions at a time")
            cfg = bench_config(args, targets, eng.urls, model, args.seed + 1000, max_concurrency=c)
            run = replay_once(workload, cfg, targets, pid, eng, args.logs / f"sweep-c{c}.requests.jsonl", None)
            levels.append(
                {
                    "concurrency": c,
                    "goodput": run["goodput"],
                    "offered_rps": run["offered_rps"],
                    "sessions_per_s": run["agent_sessions_per_s"],
                    "ttft_p95_continuation_s": run["ttft_p95_continuation_s"],
                }
            )
    k = knee([{"rate": lv["concurrency"], "goodput": lv["goodput"]} for lv in levels], "rate")
    at = next((lv for lv in levels if lv["concurrency"] == k), None)
    if at is None or not at["sessions_per_s"]:
        raise SystemExit(f"knee sweep: no level completed a request within the SLO ({levels}); check the engines' logs or the SLO")
    return {
        "levels": levels,
        "knee_concurrency": k,
        "knee_sessions_per_s": at["sessions_per_s"],
        "knee_rps": at["offered_rps"],
        "rule": "highest concurrency whose goodput is within 5% of the best; its load: the sessions it started per second",
        "at_top": k == max(args.sweep),
        "at_bottom": k == min(args.sweep),
    }


#: what a run has finished so far, rewritten after every replay: a run given the same ``--out`` starts from it
PROGRESS = "progress.json"


class Saved:
    """The finished replays of a run (and its knee), kept on disk as they finish so that an
    interrupted run loses at most the replay in flight; a run given the same ``--out`` reads them back."""

    def __init__(self, path: Path, knee: dict[str, Any] | None = None, done: dict[str, dict[str, Any]] | None = None) -> None:
        self.path = path
        self.knee = knee
        self.done = done or {}

    @classmethod
    def load(cls, path: Path, args: argparse.Namespace) -> Saved:
        """The progress under ``path``; empty without one. One written for another scenario or
        engine settings is refused: its replays would not be comparable."""
        if not path.exists():
            return cls(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            refuse(f"--out: cannot read {path} ({err}); remove it to start over, or pass a new --out")
        if data.get("settings") != settings_of(args):
            refuse(f"--out: {path} holds replays run with other settings ({data.get('settings')}); pass a new --out")
        knee, given = data.get("knee"), args.knee_sessions_per_s
        if knee is not None and given is not None and not math.isclose(knee["knee_sessions_per_s"], given):
            refuse(f"--knee-sessions-per-s {given:g}: {path} holds replays at a knee of "
                   f"{knee['knee_sessions_per_s']:g} sessions/s; give that, or pass a new --out")
        return cls(path, knee, data.get("done"))

    @staticmethod
    def key(config: str, load: float, rep: int) -> str:
        return f"{config}@{load:g}#{rep}"

    def save(self, args: argparse.Namespace) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"settings": settings_of(args), "knee": self.knee, "done": self.done}, indent=1) + "\n")
        tmp.replace(self.path)


def refuse(message: str) -> NoReturn:
    """A usage mistake: one line on stderr and exit status 2, as the command line's own errors."""
    print(f"agent_burst.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """What makes two replays comparable: the scenario, the engines, the SLO and the seed."""
    return {
        "scenario": vars(args.scenario),
        "workers": args.workers,
        "engines": "endpoints" if args.endpoints else "fake" if args.fake else "vllm-cpu",
        "kv_blocks": args.kv_blocks,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "drain_s": args.drain_s,
        "slo": [args.slo_ttft_s, args.slo_tbt_s],
        "seed": args.seed,
        "alone_profile": str(args.alone_profile) if args.alone_profile else None,
    }


def run_all(args: argparse.Namespace, tmp: Path, model: Path | None, peer: Path | None, profile: Path | None) -> dict[str, Any]:
    """The knee (and the profile), then every repeat of every configuration at every load; with
    ``profile``, the simulator's replay of the same sessions and its errors. Each finished replay
    is saved at once (``PROGRESS``); what is saved there is not run again."""
    saved = Saved.load(args.out / PROGRESS, args)
    sweep = saved.knee is None and args.knee_sessions_per_s is None
    runs_per_config = len(args.loads)
    total = (1 if sweep else 0) + args.repeats * len(args.configs) * runs_per_config
    runs: dict[tuple[str, float], list[dict[str, Any]]] = {}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as prog:
        task = prog.add_task("starting", total=total)

        def tick(what: str, advance: int = 0) -> None:
            prog.update(task, description=what, advance=advance)

        if saved.knee is not None:
            knee_result = saved.knee
        elif sweep:
            knee_result = measure_knee(args, tmp, model, peer, tick, profile)
            tick("knee measured", 1)
        else:
            knee_result = {"knee_sessions_per_s": args.knee_sessions_per_s, "rule": "given (--knee-sessions-per-s)", "levels": []}
        if profile is not None and not profile.exists():
            with start_engines(CONFIGS["plain"], args, tmp, model, "profile") as eng:
                tick("measuring the engine's profile (coda profile measure --endpoint)")
                measure_profile(eng.urls[0], profile, args)
        saved.knee = knee_result
        saved.save(args)
        # the unloaded pace of the symmetric denominator: a given profile, else the one measured here (else tool times alone)
        pace = str(args.alone_profile) if args.alone_profile else str(profile) if profile is not None else None
        rate = knee_result["knee_sessions_per_s"]
        for rep in range(args.repeats):
            seed = args.seed + rep
            for config in args.configs:
                setup = CONFIGS[config]
                tag = f"{config}-r{rep}"
                kept = [saved.done.get(Saved.key(config, load, rep)) for load in args.loads]
                if all(kept):
                    for load, run in zip(args.loads, kept):
                        runs.setdefault((config, load), []).append(run)
                    tick(f"repeat {rep + 1}/{args.repeats} {config}: kept from {saved.path}", runs_per_config)
                    continue
                tick(f"repeat {rep + 1}/{args.repeats} {config}: starting engines")
                with (
                    start_engines(setup, args, tmp, model, tag) as eng,
                    door(setup, eng, tmp, model, peer, tag, args) as (targets, pid),
                ):
                    for load in args.loads:
                        tick(f"repeat {rep + 1}/{args.repeats} {config} at {load:g}x the knee")
                        workload = burst_workload(args.scenario, load * rate, load_seed(seed, load))
                        cfg = bench_config(args, targets, eng.urls, model, seed, profile=pace)
                        run = replay_once(workload, cfg, targets, pid, eng, args.logs / f"{tag}-{load:g}x.requests.jsonl",
                                          targets[0] if setup.door == "coda" else None)
                        run.pop("summary")
                        runs.setdefault((config, load), []).append(run)
                        saved.done[Saved.key(config, load, rep)] = run
                        saved.save(args)
                        tick(f"repeat {rep + 1}/{args.repeats} {config} at {load:g}x done", 1)
    rows = rows_of(runs, args.seed)
    result = {"knee": knee_result, "runs": {f"{c}@{lo:g}": v for (c, lo), v in runs.items()}, "rows": rows,
              "symmetric_pace": f"time alone under cost profile {pace}" if pace else "tool and think times alone (no cost profile)"}
    if profile is not None:
        sim = simulate_runs(args, str(profile), rate)
        result["sim"] = {
            "profile": json.loads(profile.read_text()),
            "rows": sim["rows"],
            "errors": sim_errors(rows, sim["rows"]),
            "target": f"|sim / measured - 1| <= {SIM_TARGET:g} for {', '.join(SIM_TARGETED)}",
            "settings": "the engines' block size, KV blocks, sequences and token budget; no DRAM tier",
        }
    return result


# --- output ------------------------------------------------------------------------------------
def fmt(v: Any, ci: Any = None) -> str:
    if v is None:
        return "-"
    text = f"{v:.3g}" if isinstance(v, float) else str(v)
    return text + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "")


TABLE = (
    ("goodput", "goodput"),
    ("ttft_p50_continuation_s", "cont TTFT p50 s"),
    ("ttft_p95_continuation_s", "cont TTFT p95 s"),
    ("ttft_p50_cold_s", "cold TTFT p50 s"),
    ("ttft_p95_cold_s", "cold TTFT p95 s"),
    ("max_wait_s", "max wait s"),
    ("session_p50_s", "session p50 s"),
    ("session_p99_s", "session p99 s"),
    ("prefix_hit_rate", "prefix hit"),
    ("preemptions", "preempt"),
    ("shed", "shed"),
    ("deferred", "deferred"),
    ("door_cpu_pct", "door CPU %"),
    ("engine_cpu_pct", "engine CPU %"),
)


#: the door's columns: what admission is for (the symmetric measures) and what says it wasted or overfilled
DOOR_TABLE = (
    ("goodput_symmetric", "goodput (symmetric)"),
    ("session_goodput", "session goodput"),
    ("sessions_completed", "sessions done"),
    ("slo_rps_symmetric", "SLO req/s"),
    ("ttft_p95_s", "admitted TTFT p95 s"),
    ("idle_while_held_s", "idle while held s"),
    ("refused_while_idle", "refused while idle"),
    ("inflight_peak", "peak in flight (one engine)"),
)


COMPACT = (
    ("goodput", "goodput"),
    ("ttft_p95_continuation_s", "cont TTFT p95 s"),
    ("goodput_vs_plain", "goodput vs plain"),
    ("ttft_p95_continuation_s_vs_plain", "cont TTFT p95 vs plain"),
    ("max_wait_s", "max wait s"),
)


def show(result: dict[str, Any], compact: bool = False) -> None:
    """The table (``compact``: goodput and continuation TTFT p95 with their ratios to plain), the ratios and the simulator's errors."""
    con = Console(width=None if sys.stdout.isatty() else 240)
    con.print(result["provenance"], highlight=False, soft_wrap=True)
    k = result["knee"]
    if k.get("levels"):
        con.print(
            "knee sweep (plain): "
            + "; ".join(
                (f"{lv['concurrency']} at a time: " if "concurrency" in lv else "")
                + f"{fmt(lv['sessions_per_s'])} sessions/s: goodput {fmt(lv['goodput'])}"
                for lv in k["levels"]
            ),
            highlight=False,
        )
    con.print(
        f"knee: {fmt(k['knee_sessions_per_s'])} sessions/s ({k['rule']})"
        + (
            "; the knee is the sweep's top level: raise --sweep"
            if k.get("at_top")
            else "; the knee is the sweep's lowest level: the engines miss the SLO at the lightest load tried "
            "(lower --sweep or loosen the SLO)"
            if k.get("at_bottom")
            else ""
        ),
        highlight=False,
    )
    cols = COMPACT if compact else TABLE
    table = Table("config", "load", *(label for _, label in cols))
    for row in result["rows"]:
        table.add_row(row["config"], f"{row['load']:g}x", *(fmt(row.get(key), row.get(f"{key}_ci95")) for key, _ in cols))
    con.print(table)
    if not compact and "symmetric_pace" in result:
        door_table = Table("config", "load", *(label for _, label in DOOR_TABLE),
                           title=f"the door: symmetric denominator paced by {result['symmetric_pace']} (docs/bench.md); "
                           f"each engine has {result['config']['max_num_seqs']} seats")
        for row in result["rows"]:
            door_table.add_row(row["config"], f"{row['load']:g}x", *(fmt(row.get(k), row.get(f"{k}_ci95")) for k, _ in DOOR_TABLE))
        con.print(door_table)
    if compact:
        con.print(f"every column of every row: {result['out']}/rows.csv", highlight=False)
        return
    ratios = Table("config", "load", *(f"{m} vs {b}" for b in BASELINES for m in ("goodput", "ttft_p95_continuation_s")))
    for row in result["rows"]:
        cells = []
        for b in BASELINES:
            for m in ("goodput", "ttft_p95_continuation_s"):
                name = f"{m}_vs_{b.replace('-', '_')}"
                cells.append(fmt(row.get(name), row.get(f"{name}_ci95")))
        ratios.add_row(row["config"], f"{row['load']:g}x", *cells)
    con.print(ratios)
    sim = result.get("sim")
    if sim:
        fit = sim["profile"]["step_model"]["fit"]
        con.print(
            f"simulator: coda sim on the same sessions, profile measured through the API in this run ({sim['profile']['description']}; "
            f"fit error: prefill median {fit['prefill_median_err']:.3f}, decode median {fit['decode_median_err']:.3f}); settings: "
            f"{sim['settings']}; error = sim / measured - 1; target {sim['target']}",
            highlight=False,
            soft_wrap=True,
        )
        errs = Table("config", "load", *SIM_ERROR_METRICS, "targets met")
        for e in sim["errors"]:
            errs.add_row(
                e["config"],
                f"{e['load']:g}x",
                *(f"{e[k]:+.2f}" if e[k] is not None else "-" for k in SIM_ERROR_METRICS),
                "yes" if e["targets_met"] else "no",
            )
        con.print(errs)
    con.print(f"wrote {result['out']}", highlight=False)


def plot(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = sorted((r for r in rows if r["config"] == config), key=lambda r: r["load"])
        x = [r["load"] for r in mine]
        for ax, key in zip(axes, ("goodput", "ttft_p95_continuation_s")):
            y = [r[key] if r[key] is not None else np.nan for r in mine]
            err = np.array(
                [[r[key] - r[f"{key}_ci95"][0], r[f"{key}_ci95"][1] - r[key]] if r.get(f"{key}_ci95") else [0.0, 0.0] for r in mine]
            ).T
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=config)
    axes[0].set_ylabel("goodput (SLO-meeting / offered)")
    axes[0].set_ylim(0, 1.05)
    axes[1].set_ylabel("continuation TTFT p95 (s)")
    for ax in axes:
        ax.set_xlabel("load (x the knee)")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--configs",
        help=f"comma-separated, of {', '.join(CONFIGS)} (default: all but {', '.join(NAMED_ONLY)}; --quick: {', '.join(QUICK_CONFIGS)})",
    )
    ap.add_argument("--loads", help="multiples of the knee (default 0.5,1,2,4; --quick: 1,4)")
    ap.add_argument("--repeats", type=int, help="repeats per configuration and load (default 3; --quick: 1)")
    ap.add_argument("--sweep", help="sessions at a time of the knee sweep (default 1,2,4,8; --quick: 2,4,8)")
    ap.add_argument("--knee-sessions-per-s", type=float, help="skip the sweep: the knee's session arrival rate")
    ap.add_argument("--workers", type=int, default=2, help="vLLM-CPU workers started per configuration, one core each")
    ap.add_argument("--endpoints", help="comma-separated base URLs of running OpenAI-compatible engines instead (not restarted)")
    ap.add_argument("--fake", action="store_true", help="coda fake-engine workers instead of vLLM (checks the harness, not engines)")
    ap.add_argument("--fake-speedup", type=float, default=20.0, help="--fake: virtual seconds per wall second")
    ap.add_argument("--kv-blocks", type=int, default=128, help="KV blocks per engine (32 tokens each): small, so sessions compete")
    ap.add_argument("--max-model-len", type=int, default=4000, help="within the KV blocks (vLLM holds one block back)")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048, help="the engines' token budget per step")
    ap.add_argument("--window-s", type=float, help="arrival window of each run, seconds (default 30; --quick: 20)")
    ap.add_argument("--drain-s", type=float, help="time after the window for its requests to finish (default 30; --quick: 15)")
    ap.add_argument("--token-scale", type=float, default=Scenario.token_scale)
    ap.add_argument("--tool-scale", type=float, default=Scenario.tool_scale)
    ap.add_argument("--max-rounds", type=int, default=Scenario.max_rounds)
    ap.add_argument("--cold-share", type=float, default=Scenario.cold_share, help="share of requests that are cold long prompts")
    ap.add_argument("--cold-tokens", type=int, default=Scenario.cold_tokens)
    ap.add_argument("--burst-period-s", type=float, default=Scenario.burst_period_s, help="arrivals come in bursts once per this period")
    ap.add_argument("--burst-duty", type=float, default=Scenario.burst_duty, help="share of each period the burst's arrivals span")
    ap.add_argument("--slo-ttft-s", type=float, default=2.0, help="TTFT SLO (assumed: an agent step's interactive bound on this engine)")
    ap.add_argument("--slo-tbt-s", type=float, default=0.2, help="mean inter-token gap SLO")
    ap.add_argument("--tokenizer", help="--endpoints: the engines' tokenizer.json (or its directory), to size prompts in their tokens")
    ap.add_argument(
        "--simulate",
        metavar="PROFILE",
        help="no engines: the same scenario in the simulator alone, on this cost profile "
        "(e.g. vllm-cpu-tiny, or a profile this benchmark measured); default loads 0.5,2",
    )
    ap.add_argument("--sim-sweep", help="--simulate: session arrival rates of the simulated knee sweep (default 1,2,4,8,16,32,64)")
    ap.add_argument("--no-sim", dest="sim", action="store_false", help="skip the simulator's replay of the same sessions")
    ap.add_argument(
        "--alone-profile",
        type=Path,
        help="the engine's cost profile (a JSON this benchmark measured) whose time alone paces a refused session's unsent "
        "rounds in the symmetric denominator (docs/bench.md); default: the profile measured in this run (none with --no-sim: "
        "then tool and think times alone pace them, which charges a refused session the most)",
    )
    ap.add_argument("--profile-repeats", type=int, help="measurements per shape of the engine's profile (default 3; --quick: 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peer-venv", type=Path, default=ROOT / "runs" / "peers", help="where vllm-router's virtual environment is made")
    ap.add_argument(
        "--out",
        type=Path,
        help=f"output folder (default runs/agent-burst/<time>); every finished replay is saved there ({PROGRESS}) as it "
        "finishes, and a run given an --out that holds one resumes it: the knee and those replays are kept",
    )
    ap.add_argument(
        "--quick", action="store_true", help="3 configurations, loads 1x and 4x, 1 repeat, a 3-level sweep, 20 s windows, 15 s drains"
    )
    ap.add_argument("--json", action="store_true", help='print {"rows": [...]} (and the rest of result.json) on stdout')
    args = ap.parse_args(argv)
    args.loads_arg = args.loads
    q = args.quick
    args.configs = args.configs.split(",") if args.configs else list(QUICK_CONFIGS if q else DEFAULT_CONFIGS)
    bad = [c for c in args.configs if c not in CONFIGS]
    if bad:
        ap.error(f"--configs: unknown {', '.join(bad)}; valid: {', '.join(CONFIGS)}")
    try:
        args.loads = [float(x) for x in (args.loads or ("1,4" if q else "0.5,1,2,4")).split(",")]
        args.sweep = [int(x) for x in (args.sweep or ("2,4,8" if q else "1,2,4,8")).split(",")]
    except ValueError:
        ap.error(
            "--loads takes numbers (multiples of the knee) and --sweep integers, comma-separated, e.g. --loads 0.5,1,2,4 --sweep 1,2,4,8"
        )
    if args.simulate:
        from coda.cost.profile import load_profile
        from coda.errors import CodaError

        try:
            load_profile(args.simulate)
        except CodaError as err:
            ap.error(f"--simulate: {err}")
        args.configs = [c for c in args.configs if c in SIM_SYSTEMS]
        args.loads = [float(x) for x in args.loads_arg.split(",")] if args.loads_arg else [0.5, 2.0]
        args.sim_sweep = [float(x) for x in (args.sim_sweep or "1,2,4,8,16,32,64").split(",")]
    if args.alone_profile:
        from coda.cost.profile import load_profile
        from coda.errors import CodaError

        try:
            load_profile(str(args.alone_profile))
        except CodaError as err:
            ap.error(f"--alone-profile: {err}")
    args.repeats = args.repeats or (1 if q else 3)
    args.profile_repeats = args.profile_repeats or (1 if q else 3)
    args.endpoints = args.endpoints.split(",") if args.endpoints else None
    if (args.endpoints or args.fake) and any(CONFIGS[c].in_engine for c in args.configs):
        ap.error("--endpoints/--fake: the engines are not started here, so only plain, vllm-router and coda-gateway run; pass --configs")
    window = args.window_s or (20.0 if q else Scenario.window_s)
    args.drain_s = args.drain_s if args.drain_s is not None else (15.0 if q else 30.0)
    try:
        args.scenario = Scenario(
            token_scale=args.token_scale,
            tool_scale=args.tool_scale,
            max_rounds=args.max_rounds,
            cold_share=args.cold_share,
            cold_tokens=args.cold_tokens,
            burst_period_s=args.burst_period_s,
            burst_duty=args.burst_duty,
            window_s=window,
        )
    except ValueError as err:
        ap.error(str(err))
    args.model_name = "coda-fake" if args.fake else "tiny"
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    out = args.out = args.out or ROOT / "runs" / "agent-burst" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    args.logs = out / "logs"
    args.logs.mkdir(exist_ok=True)
    if args.simulate:
        t0 = time.perf_counter()
        result = run_simulated(args)
        result["wall_s"] = time.perf_counter() - t0
        finish(args, out, result, f"the simulator alone ({args.workers} workers, profile {args.simulate}, the engines' settings below)")
        return
    needs_peer = any(CONFIGS[c].door == PEER for c in args.configs)
    peer = peer_python(PEER_VERSION, args.peer_venv / f"{PEER}-{PEER_VERSION}") if needs_peer else None
    with tempfile.TemporaryDirectory(prefix="agent-burst-") as d:
        tmp = Path(d)
        real = not (args.fake or args.endpoints)
        model = None
        if real:
            from tests.integration.vllm.replay import word_tokenizer

            from tests.integration.vllm.support import build_tiny_model

            model = word_tokenizer(build_tiny_model(tmp / "model"))
        t0 = time.perf_counter()
        profile = out / "vllm-cpu-burst.json" if real and args.sim and any(c in SIM_SYSTEMS for c in args.configs) else None
        result = run_all(args, tmp, model, peer, profile)
        result["wall_s"] = time.perf_counter() - t0
    engines = (
        "the given --endpoints"
        if args.endpoints
        else f"{args.workers} coda fake-engine workers"
        if args.fake
        else f"{args.workers} vLLM-CPU workers (tiny random Llama built here, one core each, {args.kv_blocks} KV blocks of {REAL_BLOCK} "
        f"tokens, max {args.max_num_seqs} sequences, prefix caching, KV events)"
    )
    finish(args, out, result, engines)


def finish(args: argparse.Namespace, out: Path, result: dict[str, Any], engines: str) -> None:
    """Provenance, result.json, rows.csv, burst.png, and the table (or the JSON) on stdout."""
    result["provenance"] = (
        f"agent burst on {engines}; configs {','.join(args.configs)}; loads {args.loads} x the knee; {args.repeats} "
        f"repeats (seeds {args.seed}..{args.seed + args.repeats - 1}; knee sweep seed {args.seed + 1000}); scenario "
        f"{vars(args.scenario)}; SLO TTFT <= {args.slo_ttft_s} s, mean TBT <= {args.slo_tbt_s} s (assumed); coda "
        f"{__version__}{'' if args.simulate else f', {PEER} {PEER_VERSION}'}; engine settings: {args.kv_blocks} KV blocks "
        f"of {REAL_BLOCK} tokens, {args.max_num_seqs} sequences, {args.max_num_batched_tokens}-token budget; {os.cpu_count()} "
        f"CPUs {platform.machine()}; wall {result['wall_s']:.0f} s"
    )
    result["config"] = {k: (str(v) if isinstance(v, Path) else vars(v) if isinstance(v, Scenario) else v) for k, v in vars(args).items()}
    result["out"] = str(out)
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "rows.csv").write_text(csv_text(result["rows"]))
    plot(out / "burst.png", result["rows"])
    if args.json:
        print(json.dumps(result))
    else:
        show(result, compact=bool(args.simulate))


if __name__ == "__main__":
    main()
