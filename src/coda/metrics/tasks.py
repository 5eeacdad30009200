"""Task metrics: an agent's unit of work is its whole session, not one request.

A task's completion time runs from its first request's ready time to the finish of its last
round. Which tasks are measured follows the request convention of ``coda.metrics.requests``: a session is
measured when its first request became ready inside the measurement window. A measured session
whose last round has not completed by the end of the run (still running, never sent because the
run ended, or abandoned after a rejection or a failure) is *censored*: it counts with its time so
far, up to the end of the run, which is a lower bound on what its user waited, and the number of
censored tasks is reported beside the quantiles. Slowdown divides a task's completion time by the
same session's time alone on an idle worker (``alone_times_s``), through the same round: a
censored task is compared with its time alone through the last round it sent (rounds an abandoned
session never sent are not its work so far) plus, when that round had finished, the idle time from
its finish to the end of the run (its tool or think time, which alone would pass the same), so a
task cut off by the end of the run reads below 1 only by what was left of that round. Jain's index
over the slowdowns
says how evenly the wait was shared: 1 when every task was slowed alike, 1/n when one task took it
all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from coda.workload.schema import Session, next_ready_s, session_prompts

if TYPE_CHECKING:
    from coda.cost.model import CostModel

TASK_QUANTILES = (50, 95, 99)


@dataclass(frozen=True, slots=True)
class Task:
    """One measured session: its completion time (censored or not), whether it was censored, how
    many rounds it sent and, censored after its last sent round finished, the idle time since."""

    session_id: str
    time_s: float
    censored: bool
    rounds_sent: int
    idle_tail_s: float = 0.0


def tasks(records: Sequence[Mapping[str, Any]], start_s: float, end_s: float, run_end_s: float) -> list[Task]:
    """Measured sessions (first request ready in ``[start_s, end_s]``) with their completion times.

    A session is complete when the record of its last round (``round == session_rounds - 1``) has
    completed; otherwise it is censored at ``run_end_s``.
    """
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    last: dict[str, Mapping[str, Any]] = {}  # each session's last sent round
    for r in records:
        sid = str(r["session_id"])
        if r["round"] == 0:
            first[sid] = r["ready_s"]
        if r.get("reason") != "session_abandoned" and (sid not in last or r["round"] > last[sid]["round"]):
            last[sid] = r
        if r["round"] == r["session_rounds"] - 1 and r.get("state", "completed") == "completed" and r.get("finish_s") is not None:
            done[sid] = r["finish_s"]
    out = []
    for sid, ready in first.items():
        if not start_s <= ready <= end_s:
            continue
        finish = done.get(sid)
        end = last.get(sid)
        sent = end["round"] + 1 if end else 0
        if finish is not None:
            out.append(Task(sid, finish - ready, False, sent))
            continue
        ended = end.get("finish_s") if end and end.get("state", "completed") == "completed" else None
        out.append(Task(sid, max(run_end_s, ready) - ready, True, sent, max(run_end_s - ended, 0.0) if ended is not None else 0.0))
    return out


def jain_index(values: Iterable[float]) -> float | None:
    """Jain's fairness index ``(sum x)^2 / (n sum x^2)``: 1 for equal values, 1/n when one value holds everything."""
    x = np.asarray(list(values), dtype=float)
    if x.size == 0 or not np.any(x):
        return None
    x = x / x.max()  # scale-free, and no square under- or overflows
    return float(x.sum() ** 2 / (x.size * np.square(x).sum()))


def task_summary(tasks_: Sequence[Task], alone_s: Mapping[str, Sequence[float]] | None) -> dict[str, Any]:
    """Quantiles of completion time and, with ``alone_s`` (each session's ``alone_times_s``), of
    slowdown, and Jain's index over the slowdowns; the counts of measured and censored tasks."""
    times = np.array([t.time_s for t in tasks_], dtype=float)
    res: dict[str, Any] = {"tasks": len(tasks_), "tasks_censored": sum(t.censored for t in tasks_)}
    for p in TASK_QUANTILES:
        res[f"task_time_p{p}_s"] = float(np.percentile(times, p)) if times.size else None
    slow = None
    if alone_s is not None:
        slow = np.array(
            [t.time_s / (alone_s[t.session_id][t.rounds_sent - 1] + t.idle_tail_s) for t in tasks_ if t.rounds_sent], dtype=float
        )
    for p in TASK_QUANTILES:
        res[f"slowdown_p{p}"] = float(np.percentile(slow, p)) if slow is not None and slow.size else None
    res["slowdown_jain"] = jain_index(slow) if slow is not None else None
    return res


def alone_times_s(
    session: Session,
    cost: CostModel,
    *,
    chunk_tokens: int,
    max_num_batched_tokens: int,
    decode_run_max: int = 1024,
    time_scale: float = 1.0,
) -> list[float]:
    """The session's time alone on an idle worker from its first ready time to the end of each
    round (the last is its completion time alone), from the cost model without simulating.

    Assumptions, each what the simulator's worker does for a lone request: every round is sent
    when the previous one ends plus its tool and think time (``next_ready_s``, scaled); the engine's
    per-request time (``cost.request_s``) comes first; the prompt is prefilled in steps of at most
    ``max_num_batched_tokens`` over its cached prefix, in whole chunks of ``chunk_tokens`` and never
    the prompt's last token. The cached prefix is the round's reused prefix: on the first round a
    shared system prompt (the worker is warm for the session's prefix group, its best case, so
    that slowdown >= 1), later the session's own previous context, as far as it holds KV (all but
    the previous round's last sampled token; traces whose block hashes reuse other sessions'
    content are treated alike). The context fits in HBM (the simulator checks each request does),
    so nothing is evicted or restored. The first token comes with the step that ends the prefill,
    each further token with one decode step at batch 1, in runs of at most ``decode_run_max``
    steps as the simulator advances them (``cost.decode_steps_s`` interpolates step times within
    a run, so shorter runs would change the sum). With a step cost linear in a step's tokens (the
    roofline) no simulated run is faster; under a step cost that is not linear in them (the calibrated
    kernel model) a differently split prefill can run slightly faster (0.02% seen), so slowdowns
    just under 1 are possible there.
    """
    C = chunk_tokens
    first = session.rounds[0]
    start = (first.at_s if first.at_s is not None else session.start_s) * time_scale
    t = start
    own_chunks = None  # KV the session's previous round left (none before its first)
    ends = []
    for k, ((prefix, prompt), rnd) in enumerate(zip(session_prompts(session), session.rounds)):
        t += cost.request_s(prompt)
        chunks = min(prefix // C, (prompt - 1) // C)
        computed = (chunks if own_chunks is None else min(chunks, own_chunks)) * C
        while computed < prompt:
            n = min(prompt - computed, max_num_batched_tokens)
            t += cost.step_s([(n, computed)], np.empty(0, dtype=np.int64), None)
            computed += n
        left = rnd.output_tokens - 1
        while left > 0:
            run = min(left, decode_run_max)
            t += float(cost.decode_steps_s(np.array([computed + 1], dtype=np.int64), run, None).sum())
            computed += run
            left -= run
        own_chunks = computed // C  # prompt + output - 1 tokens hold KV when the round ends
        ends.append(t - start)
        if k + 1 < len(session.rounds):
            t = next_ready_s(session, k, t, time_scale)
    return ends
