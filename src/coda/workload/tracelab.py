"""TraceLab round traces (``uw-syfi/TraceLab``; ``.jsonl`` or ``.jsonl.gz``) as Coda sessions.

One row is one model round: ``session_id``, ``round_index``, the provider's prompt-cache split
``prefix_tokens`` + ``newly_append_tokens`` (= ``input_tokens_total``), ``output_tokens``,
``timing_events`` and ``tools`` with ``tool_wall_latency_ms``. Rows of a session may be
interleaved with other sessions' rows; they are ordered by ``round_index``.

Mapping (each choice is stated in the workload's ``meta``):
- the prompt is ``prefix_tokens`` reused + ``newly_append_tokens`` appended; on round 0 the
  prefix is the agent's system prompt cached across sessions, so sessions share it through
  ``prefix_group`` = the row's ``provider``;
- a round is a ``user`` round when its timing events hold a ``user_message``, else a tool
  follow-up;
- the pause after a round is its longest tool call (calls of a round run in parallel), and
  before a user round the user's think time: TraceLab's *human input wait* (last model-output
  event of the previous round to the ``user_message``) minus that tool time;
- session *starts* are re-paced: the corpus's real starts span months across 43 developers,
  which is no serving load. Sessions start, in their real order, as a Poisson process sized so
  the whole file offers ``REPLAY_RATE`` requests/s (the Coda paper's densest TraceLab replay, Q3);
  ``coda workload subsample --rate 3|5|7`` then gives Q1-Q3 and ``--fraction 0.25`` M1-M3.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated

import msgspec
import numpy as np

from coda.workload.schema import Round, Session, ToolCall, Workload
from coda.workload.traceio import LoadReport, jsonl_rows, line_error, no_rows

FORMAT = "tracelab"
REPLAY_RATE = 7.0  # requests/s the whole file offers after re-pacing session starts
REPACE_SEED = 0
MODEL_OUTPUT_EVENTS = frozenset({"reasoning", "text", "tool_call"})

NonNeg = Annotated[int, msgspec.Meta(ge=0)]


class _Event(msgspec.Struct):
    event_type: str
    timestamp: str | None = None


class _Tool(msgspec.Struct):
    tool_name: str | None = None
    tool_wall_latency_ms: float | None = None


class _Row(msgspec.Struct):
    session_id: str
    round_index: NonNeg
    prefix_tokens: NonNeg | None
    newly_append_tokens: NonNeg | None
    output_tokens: NonNeg | None
    input_tokens_total: NonNeg | None = None
    provider: str | None = None
    timing_events: list[_Event] = []
    tools: list[_Tool] = []


@dataclass(slots=True)
class _Kept:
    """What a replay needs of one row, until its session is complete."""

    index: int
    line: int
    prefix: int
    append: int
    output: int
    user: bool
    tools: list[ToolCall]
    user_ts: float | None  # its first user_message
    end_ts: float | None  # its last model-output event
    start_ts: float | None  # its first event


def _ts(path: Path, lineno: int, row: _Row, i: int) -> float | None:
    stamp = row.timing_events[i].timestamp
    if stamp is None:
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        raise line_error(path, lineno, f"timing_events[{i}].timestamp", f"{stamp!r} is not an ISO-8601 time", FORMAT) from None


def _keep(path: Path, lineno: int, row: _Row, report: LoadReport) -> _Kept | None:
    """The row's round, or ``None`` (counted in ``report``) when it cannot be replayed."""
    if row.prefix_tokens is None or row.newly_append_tokens is None:
        report.drop("prefix_tokens or newly_append_tokens is null", lineno)
        return None
    if not row.output_tokens:
        report.drop("output_tokens is null or 0 (a replayed round generates at least one token)", lineno)
        return None
    if row.prefix_tokens + row.newly_append_tokens == 0:
        report.drop("empty prompt (prefix_tokens + newly_append_tokens = 0)", lineno)
        return None
    if row.input_tokens_total is not None and row.input_tokens_total != row.prefix_tokens + row.newly_append_tokens:
        report.adjust("input_tokens_total != prefix_tokens + newly_append_tokens: the prompt is their sum", lineno)
    tools = []
    for t in row.tools:
        if t.tool_wall_latency_ms is None or t.tool_wall_latency_ms < 0:
            report.adjust("tool call with a null or negative tool_wall_latency_ms: left out of the round's tools", lineno)
        else:
            tools.append(ToolCall(name=t.tool_name or "unknown", duration_s=t.tool_wall_latency_ms / 1000.0))
    events = row.timing_events
    user_i = next((i for i, e in enumerate(events) if e.event_type == "user_message"), None)
    end_i = next((i for i in range(len(events) - 1, -1, -1) if events[i].event_type in MODEL_OUTPUT_EVENTS), None)
    return _Kept(
        index=row.round_index,
        line=lineno,
        prefix=row.prefix_tokens,
        append=row.newly_append_tokens,
        output=row.output_tokens,
        user=user_i is not None,
        tools=tools,
        user_ts=_ts(path, lineno, row, user_i) if user_i is not None else None,
        end_ts=_ts(path, lineno, row, end_i) if end_i is not None else None,
        start_ts=_ts(path, lineno, row, 0) if events else None,
    )


def _rounds(kept: list[_Kept], report: LoadReport) -> list[Round]:
    """A session's rounds in ``round_index`` order, with pacing from the next round's events."""
    kept.sort(key=lambda k: (k.index, k.line))
    unique: list[_Kept] = []
    for k in kept:
        if unique and unique[-1].index == k.index:
            report.drop("duplicate round_index in its session (the first row is kept)", k.line)
        else:
            if unique and k.index != unique[-1].index + 1:
                report.adjust("round_index gap in the session: the round follows the previous kept one", k.line)
            unique.append(k)
    rounds: list[Round] = []
    context = 0
    for i, k in enumerate(unique):
        prefix, append = k.prefix, k.append
        if i > 0 and prefix > context:
            report.adjust("prefix_tokens exceeds the previous prompt + output: clamped, the excess counted as appended", k.line)
            prefix, append = context, append + prefix - context
        tool_s = max((t.duration_s for t in k.tools), default=0.0)
        think_s = 0.0
        nxt = unique[i + 1] if i + 1 < len(unique) else None
        if nxt is not None and nxt.user:
            if nxt.user_ts is None or k.end_ts is None:
                report.adjust("user round without timestamps to measure think time: think time 0", nxt.line)
            else:
                think_s = max(0.0, nxt.user_ts - k.end_ts - tool_s)
        rounds.append(
            Round(
                new_input_tokens=append,
                output_tokens=k.output,
                kind="user" if i == 0 or k.user else "tool_followup",
                prefix_tokens=prefix if (prefix if i == 0 else prefix != context) else None,
                tool_duration_s=tool_s,
                think_time_s=think_s,
                tools=k.tools,
            )
        )
        context = prefix + append + k.output
    return rounds


def read_tracelab(path: Path) -> Workload:
    """Read a TraceLab round trace, streaming; sessions start re-paced (see the module docstring)."""
    path = Path(path)
    report = LoadReport(str(path), FORMAT)
    by_session: dict[str, list[_Kept]] = {}
    provider: dict[str, str] = {}
    for lineno, row in jsonl_rows(path, _Row, FORMAT):
        report.rows += 1
        kept = _keep(path, lineno, row, report)
        if kept is not None:
            by_session.setdefault(row.session_id, []).append(kept)
            provider.setdefault(row.session_id, row.provider or FORMAT)
    if not by_session:
        raise no_rows(path, FORMAT, report)
    order = sorted(by_session, key=lambda sid: min((k.start_ts for k in by_session[sid] if k.start_ts is not None), default=float("inf")))
    built = [(sid, _rounds(by_session[sid], report)) for sid in order]
    total = sum(len(r) for _, r in built)
    duration = total / REPLAY_RATE
    starts = np.sort(np.random.default_rng(REPACE_SEED).uniform(0.0, duration, len(built)))
    sessions = [
        Session(session_id=sid, start_s=float(t), rounds=rounds, prefix_group=provider[sid] if rounds[0].prefix_tokens else None)
        for (sid, rounds), t in zip(built, starts)
    ]
    real = [k.start_ts for ks in by_session.values() for k in ks if k.start_ts is not None]
    meta = {
        "source": FORMAT,
        "file": str(path),
        "duration_s": duration,
        "arrivals": f"session starts re-paced: Poisson (seed {REPACE_SEED}, conditioned on the count) in the trace's start order, "
        f"sized so the file offers {REPLAY_RATE:g} req/s; rounds keep the trace's tool and think intervals",
        "trace_span_s": (max(real) - min(real)) if real else None,
        "prefix": "prefix_tokens is the provider's prompt-cache read; round 0's is the agent prefix shared by its provider's sessions",
        "pacing": "after a round: its longest tool call (wall latency); before a user round: human input wait minus that tool time",
        "load": report.as_meta(),
    }
    return Workload(sessions=sessions, meta=meta)


def looks_like_tracelab(path: Path, first_line: str) -> bool:
    return '"round_index"' in first_line and '"newly_append_tokens"' in first_line
