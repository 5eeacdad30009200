"""Summary statistics of a workload, comparable with the published TraceLab statistics."""

from __future__ import annotations

from typing import Any

import numpy as np

from coda.workload.schema import Workload, session_prompts


def useful_tokens(round_index: Any, prompt: Any, new_input: Any, output: Any) -> Any:
    """Tokens a request does useful work on (the Coda paper's useful throughput): its output and the
    input it appends; on a session's first round its whole prompt, since the shared system prompt is
    that session's input once. A reused prefix is not counted again. Works on scalars and arrays."""
    return new_input + output + np.where(np.asarray(round_index) == 0, np.asarray(prompt) - new_input, 0)


def workload_duration_s(workload: Workload) -> float:
    """Arrival window: the generator's declared duration, else the span of ready times."""
    declared = workload.meta.get("duration_s")
    if declared:
        return float(declared)
    times = [s.start_s for s in workload.sessions]
    times += [r.at_s for s in workload.sessions for r in s.rounds if r.at_s is not None]
    span = max(times) - min(times)
    return span if span > 0 else 1.0


def workload_stats(workload: Workload) -> dict[str, Any]:
    """Growth, tool-time, follow-up, prefix-reuse and size statistics (keys are a stable API)."""
    growth: list[float] = []
    tool_calls: list[float] = []
    tool_rounds: list[float] = []
    finals: list[int] = []
    rounds = followups = 0
    reused = prompt_total = useful = output = 0
    for s in workload.sessions:
        prompts = list(session_prompts(s))
        first = prompts[0][1]
        growth.append(max(p for _, p in prompts) / max(first, 1))
        finals.append(prompts[-1][1] + s.rounds[-1].output_tokens)
        for i, ((prefix, prompt), rnd) in enumerate(zip(prompts, s.rounds)):
            rounds += 1
            useful += int(useful_tokens(i, prompt, rnd.new_input_tokens, rnd.output_tokens))
            output += rnd.output_tokens
            followups += rnd.kind == "tool_followup"
            reused += prefix
            prompt_total += prompt
            tool_calls.extend(t.duration_s for t in rnd.tools)
            if rnd.tool_duration_s > 0:
                tool_rounds.append(rnd.tool_duration_s)
    tools = np.array(tool_calls if tool_calls else tool_rounds, dtype=float)
    g = np.array(growth)

    def q(arr: np.ndarray, p: float) -> float | None:
        return float(np.percentile(arr, p)) if arr.size else None

    duration = workload_duration_s(workload)
    return {
        "sessions": len(workload.sessions),
        "requests": rounds,
        "request_rate": rounds / duration,
        "duration_s": duration,
        "rounds_per_session_mean": rounds / max(len(workload.sessions), 1),
        "growth_p50": q(g, 50),
        "growth_p90": q(g, 90),
        "growth_p99": q(g, 99),
        "growth_ge4_frac": float((g >= 4).mean()) if g.size else None,
        "tool_p50_s": q(tools, 50),
        "tool_p90_s": q(tools, 90),
        "tool_p95_s": q(tools, 95),
        "tool_p99_s": q(tools, 99),
        "tool_source": "tool calls" if tool_calls else "round tool intervals",
        "followup_frac": followups / max(rounds, 1),
        "prefix_reuse": reused / max(prompt_total, 1),
        "final_context_mean": float(np.mean(finals)) if finals else 0.0,
        "prompt_tokens_mean": prompt_total / max(rounds, 1),
        "output_tokens_mean": output / max(rounds, 1),
        # What a server that completes every request would report as useful / output throughput.
        "useful_output_ratio": useful / max(output, 1),
    }
