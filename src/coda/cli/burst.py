"""``coda burst``: the agent burst on any rung of the evaluation ladder (``coda.bench.ladder``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from coda.cli import app, out_dir, require, sweep_options
from coda.cli.sim import JobsOpt, RayOpt, ResumeOpt
from coda.errors import CodaError


def _numbers(text: str | None, option: str, kind: type = float) -> tuple | None:
    if text is None:
        return None
    try:
        return tuple(kind(x) for x in text.split(","))
    except ValueError:
        what = "integers" if kind is int else "numbers"
        example = "1,2,4,8" if kind is int else "0.5,1,2,4"
        raise CodaError(f"{option} {text}: takes comma-separated {what}, e.g. {option} {example}") from None


@app.command()
def burst(
    simulate: Annotated[str | None, typer.Option("--simulate", metavar="PROFILE",
                                                 help="the simulator alone on this cost profile "
                                                      "(the default rung: vllm-cpu-tiny-contended)")] = None,
    fake: Annotated[bool, typer.Option("--fake", help="coda fake-engine workers (checks the harness, not engines)")] = False,
    vllm_cpu: Annotated[int | None, typer.Option("--vllm-cpu", metavar="N", help="N vLLM-CPU workers started here, one core each")] = None,
    endpoints: Annotated[str | None, typer.Option("--endpoints", help="comma-separated base URLs of running OpenAI-compatible engines "
                                                  "(not restarted; only configurations that leave the engines as they are)")] = None,
    configs: Annotated[str | None, typer.Option("--configs", help="comma-separated configurations (an unknown one lists them)")] = None,
    loads: Annotated[str | None, typer.Option("--loads", help="multiples of the knee (default 0.5,1,2,4; simulated 0.5,2)")] = None,
    repeats: Annotated[int | None, typer.Option("--repeats", help="repeats per configuration and load (default 3; --quick 1)")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="engines: sessions at a time of the knee sweep (default 1,2,4,8)")] = None,
    sim_sweep: Annotated[str | None, typer.Option("--sim-sweep", help="simulator: session arrival rates of the knee sweep "
                                                  "(default 0.25,0.5,0.75,1,1.5,2)")] = None,
    knee_sessions_per_s: Annotated[float | None, typer.Option("--knee-sessions-per-s", help="skip the sweep: the knee's rate")] = None,
    workers: Annotated[int, typer.Option("--workers", help="workers (simulated or fake; --vllm-cpu N sets it for real ones)")] = 2,
    fake_speedup: Annotated[float, typer.Option("--fake-speedup", help="--fake: virtual seconds per wall second")] = 20.0,
    kv_blocks: Annotated[int, typer.Option("--kv-blocks", help="KV blocks per engine (32 tokens each): small, so sessions compete")] = 128,
    max_model_len: Annotated[int, typer.Option("--max-model-len", help="within the KV blocks (vLLM holds one block back)")] = 4000,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs")] = 16,
    max_num_batched_tokens: Annotated[int, typer.Option("--max-num-batched-tokens", help="the engines' token budget per step")] = 2048,
    window_s: Annotated[float | None, typer.Option("--window-s", help="arrival window of each run, s (default 30)")] = None,
    drain_s: Annotated[float | None, typer.Option("--drain-s", help="time after the window for its requests, s")] = None,
    variant: Annotated[str | None, typer.Option("--variant", help="named sessions: tool-pauses (the published tool times unscaled, "
                                                "every tool call written by the engine); the options below go over it")] = None,
    token_scale: Annotated[float | None, typer.Option("--token-scale", help="share of every token count of the synthetic sessions "
                                                      "(default 0.05)")] = None,
    tool_scale: Annotated[float | None, typer.Option("--tool-scale", help="share of every tool and think time (default 0.05)")] = None,
    max_rounds: Annotated[int | None, typer.Option("--max-rounds", help="rounds a session at most (default 8)")] = None,
    cold_share: Annotated[float | None, typer.Option("--cold-share", help="share of requests that are cold long prompts "
                                                     "(default 0.05)")] = None,
    cold_tokens: Annotated[int | None, typer.Option("--cold-tokens", help="a cold prompt's tokens (default 2048)")] = None,
    burst_period_s: Annotated[float | None, typer.Option("--burst-period-s", help="arrivals come in bursts once per this period "
                                                         "(default 10)")] = None,
    burst_duty: Annotated[float | None, typer.Option("--burst-duty", help="share of each period the burst's arrivals span "
                                                     "(default 0.3)")] = None,
    slo_ttft_s: Annotated[float, typer.Option("--slo-ttft-s", help="TTFT SLO (assumed: an agent step's interactive bound)")] = 2.0,
    slo_tbt_s: Annotated[float, typer.Option("--slo-tbt-s", help="mean inter-token gap SLO")] = 0.2,
    tokenizer: Annotated[str | None, typer.Option("--tokenizer", help="--endpoints: the engines' tokenizer.json, to size prompts")] = None,
    no_sim: Annotated[bool, typer.Option("--no-sim", help="on engines: skip the simulator's replay of the same sessions")] = False,
    alone_profile: Annotated[Path | None, typer.Option("--alone-profile", help="the engine's cost profile whose time alone paces a "
                                                       "refused session's unsent rounds in the symmetric denominator")] = None,
    profile_repeats: Annotated[int | None, typer.Option("--profile-repeats", help="measurements per shape of the engine's profile")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    peer_venv: Annotated[Path, typer.Option("--peer-venv", help="where vllm-router's virtual environment is made")] = Path("runs/peers"),
    out: Annotated[Path | None, typer.Option("--out", "-o", help="output folder (default runs/agent-burst/<time>); finished cells are "
                                             "kept there and a run given the same --out resumes")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="3 configurations, loads 1x and 4x, 1 repeat, 20 s windows")] = False,
    as_json: Annotated[bool, typer.Option("--json", help='print {"rows": [...]} and the rest of result.json on stdout')] = False,
    jobs: JobsOpt = None,
    ray: RayOpt = None,
    resume: ResumeOpt = True,
) -> None:
    """Bursts of coding-agent sessions below and above the knee: Coda's configurations against
    plain vLLM and vllm-router, on one rung of the ladder (default: the simulator)."""
    from coda.bench.burst import (
        CONFIGS,
        DEFAULT_CONFIGS,
        QUICK_CONFIGS,
        SIM_CONFIGS,
        SIM_PROFILE,
        SIM_SWEEP,
        EngineSettings,
        Scenario,
        inert_on,
        left_out,
        sessions_of,
    )
    from coda.bench.burst_report import finish
    from coda.bench.ladder import Bench, Rung, run
    from coda.console import err_console
    from coda.cost.profile import load_profile
    from coda.sim.config import SloConfig

    given = [name for name, on in (("--simulate", simulate), ("--fake", fake), ("--vllm-cpu", vllm_cpu), ("--endpoints", endpoints)) if on]
    if len(given) > 1:
        raise CodaError(f"{' and '.join(given)}: give one rung of the ladder")
    kind = "fake" if fake else "vllm-cpu" if vllm_cpu else "endpoints" if endpoints else "simulate"
    profile = simulate or SIM_PROFILE
    if kind == "simulate":
        try:
            sim_profile = load_profile(profile)  # a bad name fails now, in one line
        except CodaError as err:
            raise CodaError(f"--simulate {profile}: {err}") from None
    elif jobs not in (None, 1) or ray is not None:
        raise CodaError("--jobs/--ray: on engines the replays share the machine's engines and run one at a time; drop them")
    if vllm_cpu is not None:
        workers = vllm_cpu
    names = tuple(configs.split(",")) if configs else QUICK_CONFIGS if quick else DEFAULT_CONFIGS
    dropped: dict[str, str] = {}
    if kind == "simulate":  # the simulator has no model of some (an unknown name stays, for Scenario to refuse)
        names = tuple(c for c in names if c in SIM_CONFIGS or c not in CONFIGS)
        if not configs:  # the default set runs only configurations whose mechanisms can act on this profile
            dropped = left_out(names, inert_on(sim_profile))
            names = tuple(c for c in names if c not in dropped)
    if kind in ("fake", "endpoints") and any(CONFIGS[c].in_engine for c in names if c in CONFIGS):
        raise CodaError("--endpoints/--fake: the engines are not started here, so only plain, vllm-router and the coda-gateway "
                        "configurations run; pass --configs")
    default_loads = "0.5,2" if kind == "simulate" else "1,4" if quick else "0.5,1,2,4"
    scenario = Scenario(
        sessions=sessions_of(variant, token_scale=token_scale, tool_scale=tool_scale, max_rounds=max_rounds, cold_share=cold_share,
                             cold_tokens=cold_tokens, burst_period_s=burst_period_s, burst_duty=burst_duty,
                             window_s=window_s or (20.0 if quick else 30.0)),
        engine=EngineSettings(workers=workers, kv_blocks=kv_blocks, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens),
        configs=names,
        loads=_numbers(loads or default_loads, "--loads"),
        repeats=repeats or (1 if quick else 3),
        seed=seed,
        sweep=_numbers(sweep or ("2,4,8" if quick else "1,2,4,8"), "--sweep", int),
        sim_sweep=_numbers(sim_sweep, "--sim-sweep") if sim_sweep else SIM_SWEEP,
        knee_sessions_per_s=knee_sessions_per_s,
        drain_s=drain_s if drain_s is not None else 15.0 if quick else 30.0,
        slo=SloConfig(ttft_s=slo_ttft_s, tbt_s=slo_tbt_s),
    )
    if alone_profile is not None:
        load_profile(str(alone_profile))
    if kind != "simulate":
        require("matplotlib")
    for name, why in dropped.items():  # said once the command line is known to be good
        err_console.print(f"{name} left out: {why} (name it in --configs to run it anyway)", highlight=False, soft_wrap=True)
    rung = Rung(kind=kind, profile=profile if kind == "simulate" else None, endpoints=tuple(endpoints.split(",")) if endpoints else (),
                fake_speedup=fake_speedup, tokenizer=tokenizer, replay_in_sim=not no_sim,
                alone_profile=str(alone_profile) if alone_profile else None, profile_repeats=profile_repeats or (1 if quick else 3),
                peer_venv=peer_venv)
    folder = out_dir(out or Path("runs") / "agent-burst" / time.strftime("%Y%m%d-%H%M%S"))
    bench = Bench(scenario, rung, folder, sweep_options(jobs, ray, resume, folder))
    t0 = time.perf_counter()
    result = run(bench)
    result["wall_s"] = time.perf_counter() - t0
    finish(bench, result, as_json)
