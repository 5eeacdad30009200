"""Synthetic coding-agent workload, deterministic from a seed.

Calibrated to the published statistics of the TraceLab corpus (357,161 rounds, 4,281 sessions,
as the Coda paper reports them) and of the GitHub Copilot coding-agent trace in the Azure Public
Dataset; the sources are cited in the README's References. The joint structure
is generative, not just the marginals: a session starts from a system prompt shared with its
agent (prefix group) plus a task context, and every round appends its output and then the tool
results (or a user message) to one growing context. The session's growth target max/first is
drawn from the published growth distribution; its number of rounds follows from how many
appends of realistic size that growth takes, so long-growing sessions really live for many
rounds and accumulate KV state.

Choices that the published statistics do not fix are stated in ``SYNTH_CHOICES`` and printed
with the workload's metadata.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from coda.workload.schema import Round, Session, ToolCall, Workload

# Published TraceLab statistics, as the Coda paper reports them (README: References).
TRACELAB_ROUNDS_PER_SESSION = 357_161 / 4_281
TRACELAB_FOLLOWUP_FRAC = 0.8789
TRACELAB_TOOL_CALLS_PER_TOOL_ROUND = 432_510 / (357_161 * TRACELAB_FOLLOWUP_FRAC)

# Quantile knots (p, value) of log-linear inverse CDFs. Interior knots are published; the ends
# are stated assumptions (p=0 and p=1 of a heavy tail are not in any statistic).
GROWTH_KNOTS = ((0.0, 1.0), (0.1121, 1.0), (0.4536, 4.0), (0.5, 4.45), (0.9, 13.96), (0.99, 37.77), (1.0, 60.0))
TOOL_KNOTS = ((0.0, 0.005), (0.1, 0.03), (0.5, 0.209), (0.9, 8.866), (0.95, 30.013), (0.99, 180.002), (1.0, 600.0))

# Prefix groups: the agent's system prompt + tool schemas, shared by all its sessions.
PREFIX_GROUPS = (("claude-code", 0.5, 15_000), ("codex", 0.3, 6_912), ("aider", 0.2, 3_000))

SYNTH_CHOICES = {
    "rounds_per_session": "derived from each session's growth target; mean calibrated to 357,161/4,281 = 83.4 (TraceLab)",
    "growth": "max/first context per session from the published quantiles p50 4.45x, p90 13.96x, p99 37.77x, "
    "54.64% >= 4x, 11.2% single-round (3,801 of 4,281 multi-round), stratified over sessions",
    "tool_duration": "per call from the published quantiles p50 0.209 s, p90 8.866 s, p95 30.0 s, p99 180 s; "
    "1 + Poisson(0.38) calls per tool round (432,510 calls / 313,913 follow-ups); calls of a round run in "
    "parallel, so the round's tool interval is its longest call",
    "think_time": "lognormal, median 15 s, sigma 0.8 (TraceLab sample user gaps: 6.3, 18.4, 19.9 s)",
    "first_context": "agent system prompt (claude-code 15K, codex 6.9K from the TraceLab sample, aider 3K; assumed) "
    "+ task context lognormal median 1.5K",
    "context_cap": "200K tokens: a session whose growth target would pass it redraws its agent and task context",
    "prefix_breaks": "5% of later rounds re-send the context tail after a uniform point (cache-breaking edit), "
    "calibrated to the published 97.55% token-weighted prefix reuse",
    "followup_frac": "each later round is a user turn with the probability that gives 87.89% tool follow-ups",
}

OUTPUT_SIGMA = 1.0
# Output length by workload shape: the mean of a lognormal (sigma OUTPUT_SIGMA). Each round's
# appended total is fixed by the growth target, so a shorter output leaves more to its tool results.
SHAPES = {
    "tracelab": (
        170.0,
        "lognormal, mean 170, sigma 1.0: calibrated so that the workload's useful/output token ratio (initial "
        "prompt once + appended input + output, over output) is ~12.6, within the Coda paper's 11.7-13.9 for CacheWise "
        "on M1-M3 (Table 1; TraceLab agent rounds are mostly tool calls with short outputs); TraceLab sample rounds range 49-2,475",
    ),
    "copilot": (527.0, "lognormal, mean 527 (Copilot-agent mean completion), sigma 1.0; TraceLab sample rounds range 49-2,475"),
}
THINK_MEDIAN_S = 15.0
THINK_SIGMA = 0.8
TASK_CONTEXT_MEDIAN = 1_500.0
TASK_CONTEXT_SIGMA = 1.0
USER_MSG_MEDIAN = 60.0
USER_MSG_SIGMA = 1.0
TOOL_RESULT_SIGMA = 1.3
MIN_TOOL_RESULT = 16
CONTEXT_CAP = 200_000
# Mean tokens appended per round (output + tool result); calibrated so the mean round count
# matches TraceLab's 83.4 given the growth and first-context distributions above.
APPEND_PER_ROUND = 640.0
# Cache-breaking edits: a round re-sends its context's tail after a uniformly drawn point (the
# TraceLab sample's Codex session does this at round 3). The agent loop alone reuses about
# 1 - 2/rounds of prompt tokens; these breaks bring reuse to the published 97.55%.
BREAK_PROB = 0.05

# Tool names by duration band, so a tool-aware predictor has something real to learn.
TOOL_BANDS = (
    (0.1, (("Read", 0.35), ("Edit", 0.25), ("Grep", 0.2), ("Glob", 0.1), ("Write", 0.1))),
    (3.0, (("Bash", 0.5), ("Grep", 0.2), ("Read", 0.15), ("Edit", 0.15))),
    (30.0, (("Bash", 0.55), ("WebFetch", 0.2), ("WebSearch", 0.25))),
    (math.inf, (("Bash", 0.6), ("Task", 0.4))),
)


@dataclass(frozen=True, slots=True)
class SynthSpec:
    """Parameters of a synthetic workload: target request rate, arrival window, seed.

    ``tokens`` scales every token count (prompts, appends, outputs, the context cap) and ``tools``
    every tool and think time, so the same session structure fits a small engine (a 4-8K context)
    and a short run; at 1 (the default) the calibrated workload is unchanged. ``shape`` chooses the
    output lengths (``SHAPES``): ``tracelab`` agent rounds, or ``copilot`` completions.
    """

    rate: float
    duration: float
    seed: int = 0
    tokens: float = 1.0
    tools: float = 1.0
    shape: str = "tracelab"

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if not (self.duration > 0 and math.isfinite(self.duration)):
            raise ValueError(f"duration must be > 0 s, got {self.duration}")
        if not 0 < self.tokens <= 1:
            raise ValueError(f"tokens must be a scale in (0, 1], got {self.tokens}")
        if not (self.tools > 0 and math.isfinite(self.tools)):
            raise ValueError(f"tools must be a time scale > 0, got {self.tools}")
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {self.shape!r}")


def log_quantile(knots: tuple[tuple[float, float], ...], u: np.ndarray) -> np.ndarray:
    """Inverse CDF through quantile knots, log-linear in value between knots."""
    ps = np.array([k[0] for k in knots])
    logq = np.log([k[1] for k in knots])
    return np.exp(np.interp(u, ps, logq))


def _lognormal_with_mean(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    return rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, size)


def _tool_names(rng: np.random.Generator, durations: np.ndarray) -> list[str]:
    names = []
    for d in durations:
        for bound, choices in TOOL_BANDS:
            if d < bound:
                labels, probs = zip(*choices)
                names.append(str(labels[rng.choice(len(labels), p=probs)]))
                break
    return names


def _tokens(n: float, scale: float) -> int:
    """A token count scaled (at least one token); exact at scale 1."""
    return max(1, round(n * scale))


def _session(
    rng: np.random.Generator,
    sid: str,
    start: float,
    growth_u: float,
    token_scale: float = 1.0,
    tool_scale: float = 1.0,
    output_mean: float = SHAPES["tracelab"][0],
) -> Session:
    growth = float(log_quantile(GROWTH_KNOTS, np.array([growth_u]))[0])
    # Draw the agent and task context; a draw whose growth would pass the context cap is redrawn
    # (long-growing sessions start small), so the growth distribution is kept, not clipped.
    for _ in range(32):
        g_idx = rng.choice(len(PREFIX_GROUPS), p=[w for _, w, _ in PREFIX_GROUPS])
        group, _, sys_tokens = PREFIX_GROUPS[g_idx]
        sys_tokens = _tokens(sys_tokens, token_scale)
        task = int(rng.lognormal(math.log(TASK_CONTEXT_MEDIAN * token_scale), TASK_CONTEXT_SIGMA))
        first = sys_tokens + max(_tokens(16, token_scale), task)
        if growth * first <= CONTEXT_CAP * token_scale:
            break
    growth = min(growth, CONTEXT_CAP * token_scale / first)
    appended_total = (growth - 1.0) * first
    n_rounds = max(1, int(round(appended_total / (APPEND_PER_ROUND * token_scale))) + 1) if growth > 1.0001 else 1

    outputs = np.clip(
        np.rint(_lognormal_with_mean(rng, output_mean * token_scale, OUTPUT_SIGMA, n_rounds)), 1, _tokens(16_384, token_scale)
    ).astype(int)
    q_user = (1 - TRACELAB_FOLLOWUP_FRAC - 1 / TRACELAB_ROUNDS_PER_SESSION) / (1 - 1 / TRACELAB_ROUNDS_PER_SESSION)
    is_user = rng.random(n_rounds) < q_user
    is_user[0] = True

    # Appended input of rounds 1..n-1: user messages are short; tool results fill the growth.
    new_inputs = np.zeros(n_rounds, dtype=int)
    user_msgs = np.rint(rng.lognormal(math.log(USER_MSG_MEDIAN * token_scale), USER_MSG_SIGMA, n_rounds)).astype(int) + 1
    tool_w = rng.lognormal(0.0, TOOL_RESULT_SIGMA, n_rounds)
    later = np.arange(n_rounds) >= 1
    tool_rounds = later & ~is_user
    fixed = int(outputs[:-1].sum() + user_msgs[later & is_user].sum())
    residual = appended_total - fixed
    if tool_rounds.any():
        min_tool = _tokens(MIN_TOOL_RESULT, token_scale)
        min_total = min_tool * int(tool_rounds.sum())
        share = tool_w[tool_rounds] / tool_w[tool_rounds].sum()
        new_inputs[tool_rounds] = min_tool + np.floor(share * max(0.0, residual - min_total)).astype(int)
    new_inputs[later & is_user] = user_msgs[later & is_user]

    breaks = rng.random(n_rounds) < BREAK_PROB
    break_at = rng.random(n_rounds)
    rounds: list[Round] = []
    context = 0
    for i in range(n_rounds):
        followed_by_tool = i + 1 < n_rounds and not is_user[i + 1]
        followed_by_user = i + 1 < n_rounds and is_user[i + 1]
        tools: list[ToolCall] = []
        tool_s = think_s = 0.0
        if followed_by_tool:
            k = 1 + int(rng.poisson(TRACELAB_TOOL_CALLS_PER_TOOL_ROUND - 1))
            raw = log_quantile(TOOL_KNOTS, rng.random(k))  # names follow the unscaled duration's band
            durs = raw * tool_scale
            tools = [ToolCall(name=n, duration_s=round(float(d), 4)) for n, d in zip(_tool_names(rng, raw), durs)]
            tool_s = round(float(durs.max()), 4)
        elif followed_by_user:
            think_s = round(float(rng.lognormal(math.log(THINK_MEDIAN_S), THINK_SIGMA)) * tool_scale, 3)
        if i == 0:
            rounds.append(
                Round(
                    new_input_tokens=first - sys_tokens,
                    output_tokens=int(outputs[0]),
                    kind="user",
                    prefix_tokens=sys_tokens,
                    tool_duration_s=tool_s,
                    think_time_s=think_s,
                    tools=tools,
                )
            )
        else:
            prefix = None
            appended = int(new_inputs[i])
            if breaks[i]:
                prefix = sys_tokens + int(break_at[i] * (context - sys_tokens))
                appended += context - prefix
            rounds.append(
                Round(
                    new_input_tokens=appended,
                    output_tokens=int(outputs[i]),
                    kind="user" if is_user[i] else "tool_followup",
                    prefix_tokens=prefix,
                    tool_duration_s=tool_s,
                    think_time_s=think_s,
                    tools=tools,
                )
            )
        last = rounds[-1]
        context = (context if last.prefix_tokens is None else last.prefix_tokens) + last.new_input_tokens + last.output_tokens
    return Session(session_id=sid, start_s=round(start, 6), rounds=rounds, prefix_group=group)


def synthesize(spec: SynthSpec) -> Workload:
    """Generate sessions arriving as a Poisson process sized to hit ``spec.rate`` requests/s."""
    rng = np.random.default_rng(spec.seed)
    # A Poisson process conditioned on its count: n = expected sessions, arrival times uniform
    # order statistics. The request rate then varies only with the sessions' round counts.
    n = max(1, round(spec.rate * spec.duration / TRACELAB_ROUNDS_PER_SESSION))
    starts = np.sort(rng.uniform(0.0, spec.duration, n)).tolist()
    # Stratified growth draws: small workloads still follow the published quantiles.
    growth_u = (rng.permutation(n) + rng.random(n)) / max(n, 1)
    output_mean, output_source = SHAPES[spec.shape]
    sessions = [
        _session(rng, f"s{spec.seed}-{i:05d}", starts[i], float(growth_u[i]), spec.tokens, spec.tools, output_mean) for i in range(n)
    ]
    meta = {
        "source": "synth",
        "rate": spec.rate,
        "duration_s": spec.duration,
        "seed": spec.seed,
        **({"token_scale": spec.tokens} if spec.tokens != 1 else {}),
        **({"tool_time_scale": spec.tools} if spec.tools != 1 else {}),
        "shape": spec.shape,
        "choices": {**SYNTH_CHOICES, "output_tokens": output_source},
    }
    return Workload(sessions=sessions, meta=meta)
