"""Mooncake traces (``kvcache-ai/Mooncake``, FAST'25): open-loop requests with 512-token block hashes.

One row is one request: ``timestamp`` (ms from the trace start), ``input_length``,
``output_length`` and ``hash_ids``, one id per 512-token block of the prompt; equal ids mean an
equal prefix, so shared prefixes stay shared as the rounds' ``block_hashes``.

Sessions are reconstructed from the hashes. A request continues the session whose latest
request's full blocks are a prefix of its own, when that prefix ends in a block the session
introduced (its own content, not a prefix it shares with other sessions such as a system
prompt). A request that extends an *earlier* round of a session (a regeneration or branch)
starts a session of its own; it still shares the blocks. The reused prefix of a continuation is
the matched blocks; every request keeps its timestamp as an open-loop ``at_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import msgspec

from coda.workload.schema import Round, Session, Workload
from coda.workload.traceio import LoadReport, jsonl_rows, line_error, no_rows

FORMAT = "mooncake"
BLOCK_TOKENS = 512

NonNeg = Annotated[int, msgspec.Meta(ge=0)]


class _Row(msgspec.Struct):
    timestamp: Annotated[float, msgspec.Meta(ge=0)]
    input_length: NonNeg
    output_length: NonNeg
    hash_ids: list[int]


@dataclass(slots=True)
class _Open:
    """A session being built: its rounds and the last full block of its latest prompt."""

    sid: int
    rounds: list[Round]
    tail_block: int | None


def read_mooncake(path: Path) -> Workload:
    """Read a Mooncake trace, streaming, into sessions of open-loop rounds with block hashes."""
    path = Path(path)
    report = LoadReport(str(path), FORMAT)
    sessions: list[_Open] = []
    introduced: dict[int, int] = {}  # block id -> session whose request first carried it
    ends: dict[int, int] = {}  # last full block of any round -> its session
    branches = hits = blocks = 0
    last_t = -1.0
    for lineno, row in jsonl_rows(path, _Row, FORMAT):
        report.rows += 1
        h = row.hash_ids
        if len(h) != -(-row.input_length // BLOCK_TOKENS):
            raise line_error(path, lineno, "hash_ids", f"has {len(h)} ids but input_length={row.input_length} needs "
                             f"{-(-row.input_length // BLOCK_TOKENS)}, one per {BLOCK_TOKENS}-token block", FORMAT)
        if row.timestamp < last_t:
            raise line_error(path, lineno, "timestamp", f"{row.timestamp:g} ms is earlier than the previous row's {last_t:g} ms; "
                             "rows must be in time order", FORMAT)
        last_t = row.timestamp
        if row.output_length == 0 or row.input_length == 0:
            report.drop("input_length or output_length is 0 (a replayed round reads and generates at least one token)", lineno)
            continue
        blocks += len(h)
        hits += sum(b in introduced for b in h)
        owner, matched = None, 0
        for k in range(len(h), 0, -1):
            cand = ends.get(h[k - 1])
            if cand is None or introduced[h[k - 1]] != cand or k * BLOCK_TOKENS >= row.input_length:
                continue
            if sessions[cand].tail_block == h[k - 1]:
                owner, matched = cand, k
            else:
                branches += 1
            break
        if owner is None:
            owner = len(sessions)
            sessions.append(_Open(owner, [], None))
        sess = sessions[owner]
        sess.rounds.append(
            Round(
                new_input_tokens=row.input_length - matched * BLOCK_TOKENS,
                output_tokens=row.output_length,
                kind="user",
                prefix_tokens=matched * BLOCK_TOKENS if matched else None,
                block_hashes=list(h),
                at_s=row.timestamp / 1000.0,
            )
        )
        for b in h:
            introduced.setdefault(b, owner)
        full = row.input_length // BLOCK_TOKENS
        sess.tail_block = h[full - 1] if full else None
        if sess.tail_block is not None:
            ends[sess.tail_block] = owner
    if not sessions:
        raise no_rows(path, FORMAT, report)
    built = [Session(session_id=f"mooncake-{s.sid}", start_s=s.rounds[0].at_s or 0.0, rounds=s.rounds) for s in sessions]
    meta = {
        "source": FORMAT,
        "file": str(path),
        "duration_s": max(last_t / 1000.0, 1.0),
        "arrivals": "open loop: every request at its timestamp (never before its session's previous request completed)",
        "sessions": "reconstructed: a request continues the session whose latest prompt's full blocks it extends, "
        "when those end in a block the session introduced",
        "multi_turn_sessions": sum(len(s.rounds) > 1 for s in built),
        "branches_started_new_session": branches,
        "block_reuse_infinite_cache": hits / blocks,
        "load": report.as_meta(),
    }
    return Workload(sessions=built, meta=meta, block_tokens=BLOCK_TOKENS)


def looks_like_mooncake(path: Path, first_line: str) -> bool:
    return '"hash_ids"' in first_line and '"input_length"' in first_line
