"""Session/round schema of a coding-agent workload and its JSONL format.

A session is a list of rounds (model calls). Each round's prompt is a reusable prefix of the
session's context so far plus the tokens it appends (a user message or tool results); after the
round, the context is that prompt plus the round's output. What follows a round (tool calls or
user think time) decides when the next round becomes ready.

File format: JSONL, one session per line, optionally preceded by one header line
``{"coda_workload": 1, "block_tokens": ..., "meta": {...}}``. Files may be gzip-compressed.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from coda.errors import CodaError, reading
from coda.workload.limits import InputLimits, bounded_lines

NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
PosInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0.0)]

FORMAT_VERSION = 1


class ToolCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One tool call issued by a round; ``duration_s`` is its wall latency."""

    name: str
    duration_s: NonNegFloat


#: the most tokens a round may name (assumed: orders of magnitude past any model's context; a larger number is corrupt data)
MAX_ROUND_TOKENS = 2**31 - 1


class Round(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One model call of a session.

    ``prefix_tokens``: tokens of the previous context reused as this prompt's prefix; ``None``
    means all of it (the usual agent loop). On round 0 it is the prefix shared with the other
    sessions of the same ``prefix_group`` (a system prompt). ``tool_duration_s`` and
    ``think_time_s`` are hidden from policies: they only decide when the next round is ready.
    ``at_s``: open-loop ready time (seconds from workload start) for traces with timestamps.
    """

    new_input_tokens: NonNegInt
    output_tokens: PosInt
    kind: Literal["user", "tool_followup"] = "tool_followup"
    prefix_tokens: NonNegInt | None = None
    tool_duration_s: NonNegFloat = 0.0
    think_time_s: NonNegFloat = 0.0
    tools: list[ToolCall] = []
    block_hashes: list[int] | None = None
    at_s: NonNegFloat | None = None


class Session(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A coding-agent session: rounds sent in order, each after the previous one completes."""

    session_id: str
    start_s: NonNegFloat
    rounds: list[Round]
    prefix_group: str | None = None
    tenant: str | None = None

    def __post_init__(self) -> None:
        if not self.rounds:
            raise ValueError("a session needs at least one round (field rounds)")
        first = self.rounds[0]
        if first.prefix_tokens and self.prefix_group is None:
            raise ValueError(
                "rounds[0].prefix_tokens is a prefix shared with other sessions and needs "
                "prefix_group; set prefix_group or drop prefix_tokens"
            )
        context = 0
        for i, rnd in enumerate(self.rounds):
            if i > 0 and rnd.prefix_tokens is not None and rnd.prefix_tokens > context:
                raise ValueError(
                    f"rounds[{i}].prefix_tokens={rnd.prefix_tokens} exceeds the previous "
                    f"context of {context} tokens; it must be <= prompt + output of round {i - 1}"
                )
            context = prompt_tokens_of(rnd, context, i) + rnd.output_tokens


def prompt_tokens_of(rnd: Round, previous_context: int, index: int) -> int:
    """Prompt length of a round given the context left by the previous one."""
    return reused_prefix_of(rnd, previous_context, index) + rnd.new_input_tokens


def reused_prefix_of(rnd: Round, previous_context: int, index: int) -> int:
    """Tokens of this round's prompt that repeat earlier content (session context or group prefix)."""
    if rnd.prefix_tokens is not None:
        return rnd.prefix_tokens
    return previous_context if index > 0 else 0


def next_ready_s(session: Session, k: int, ended_s: float, time_scale: float = 1.0) -> float:
    """When round ``k + 1`` becomes ready if round ``k`` ended at ``ended_s``: after round k's tool
    or think time, or at its own timestamp for open-loop rounds (never before round k ended)."""
    nxt = session.rounds[k + 1]
    if nxt.at_s is not None:
        return max(nxt.at_s * time_scale, ended_s)
    prev = session.rounds[k]
    return ended_s + (prev.tool_duration_s + prev.think_time_s) * time_scale


def unsent_ready_s(session: Session, first: int, ended_s: float, time_scale: float = 1.0) -> Iterator[tuple[int, float]]:
    """Rounds ``first..`` of a session abandoned at ``ended_s``, each with the time it would have
    become ready had every round been served instantly: the earliest its client would have sent
    it. Counting them at those times, not all at once, charges shedding for the demand it turned
    away inside a measurement window and no more."""
    t = ended_s
    for k in range(first, len(session.rounds)):
        t = next_ready_s(session, k - 1, t, time_scale)
        yield k, t


def session_prompts(session: Session) -> Iterator[tuple[int, int]]:
    """Yield ``(reused_prefix_tokens, prompt_tokens)`` for each round of a session."""
    context = 0
    for i, rnd in enumerate(session.rounds):
        prefix = reused_prefix_of(rnd, context, i)
        prompt = prefix + rnd.new_input_tokens
        yield prefix, prompt
        context = prompt + rnd.output_tokens


class Workload(msgspec.Struct):
    """Sessions plus metadata (generator, seed, source) and the block size of any block hashes."""

    sessions: list[Session]
    meta: dict[str, Any] = {}
    block_tokens: int | None = None

    @property
    def num_requests(self) -> int:
        return sum(len(s.rounds) for s in self.sessions)

    def validate_sizes(self, source: str) -> None:
        """No round names more than ``MAX_ROUND_TOKENS`` tokens (a larger count is a corrupt row)."""
        for s in self.sessions:
            for i, rnd in enumerate(s.rounds):
                for name in ("new_input_tokens", "output_tokens", "prefix_tokens"):
                    v = getattr(rnd, name)
                    if v is not None and v > MAX_ROUND_TOKENS:
                        raise CodaError(f"{source}: session {s.session_id} rounds[{i}].{name}={v} is more than {MAX_ROUND_TOKENS} tokens; "
                                        "fix or drop the row")

    def validate_blocks(self, source: str) -> None:
        """Every round with ``block_hashes`` must carry one hash per ``block_tokens`` block."""
        if not any(r.block_hashes is not None for s in self.sessions for r in s.rounds):
            return
        if not self.block_tokens:
            raise CodaError(
                f"{source}: rounds carry block_hashes but the header has no block_tokens; "
                "add block_tokens to the header line"
            )
        for s in self.sessions:
            for i, ((_, prompt), rnd) in enumerate(zip(session_prompts(s), s.rounds)):
                want = math.ceil(prompt / self.block_tokens)
                if rnd.block_hashes is not None and len(rnd.block_hashes) != want:
                    raise CodaError(
                        f"{source}: session {s.session_id} rounds[{i}].block_hashes: has "
                        f"{len(rnd.block_hashes)} hashes, a {prompt}-token prompt needs {want} "
                        f"blocks of {self.block_tokens}"
                    )


class _Header(msgspec.Struct, forbid_unknown_fields=True):
    coda_workload: int
    meta: dict[str, Any] = {}
    block_tokens: PosInt | None = None


_ENCODER = msgspec.json.Encoder()
_SESSION_DECODER = msgspec.json.Decoder(Session)
_HEADER_DECODER = msgspec.json.Decoder(_Header)
_AT_RE = re.compile(r"^(?P<msg>.*?)(?: - at `\$\.?(?P<path>[^`]*)`)?$", re.S)


def describe_decode_error(err: msgspec.DecodeError) -> tuple[str, str]:
    """Split a msgspec error into (field path, problem)."""
    m = _AT_RE.match(str(err))
    assert m is not None
    msg = m.group("msg")
    path = m.group("path") or ("session" if isinstance(err, msgspec.ValidationError) else "json")
    return path, msg[0].lower() + msg[1:] if msg else msg


@contextlib.contextmanager
def open_text(path: Path) -> Iterator[Iterator[str]]:
    """A workload file's lines, transparently decompressing ``.gz``, each line and the whole text
    bounded (``coda.workload.limits``); what goes wrong reading it within the block is one line
    naming the file (``coda.errors.reading``)."""
    limits = InputLimits.from_env()
    with reading(path, "workload"), gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as fh:
        yield bounded_lines(fh, path, limits)


def _check_path(path: Path) -> None:
    if not path.exists():
        raise CodaError(f"{path}: no such workload file; pass a path or a spec such as synth:rate=3,duration=600,seed=0")
    if path.is_dir():
        raise CodaError(f"{path}: is a directory; pass a workload JSONL file")


def read_workload(path: str | Path) -> Workload:
    """Read a Coda workload JSONL file; a bad line raises ``CodaError('file:line: field: problem')``."""
    path = Path(path)
    _check_path(path)
    sessions: list[Session] = []
    header = _Header(coda_workload=FORMAT_VERSION)
    seen: set[str] = set()
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            raw = line.encode()
            if lineno == 1 and b'"coda_workload"' in raw:
                try:
                    header = _HEADER_DECODER.decode(raw)
                except msgspec.DecodeError as err:
                    field, problem = describe_decode_error(err)
                    raise CodaError(f"{path}:{lineno}: header.{field}: {problem}") from None
                if header.coda_workload != FORMAT_VERSION:
                    raise CodaError(
                        f"{path}:{lineno}: header.coda_workload: version {header.coda_workload} "
                        f"is not supported; this Coda reads version {FORMAT_VERSION}"
                    )
                continue
            try:
                session = _SESSION_DECODER.decode(raw)
            except msgspec.DecodeError as err:
                field, problem = describe_decode_error(err)
                raise CodaError(f"{path}:{lineno}: {field}: {problem}") from None
            if session.session_id in seen:
                raise CodaError(f"{path}:{lineno}: session_id: duplicate id {session.session_id!r}; each session must appear on one line")
            seen.add(session.session_id)
            sessions.append(session)
    if not sessions:
        raise CodaError(f"{path}: holds no sessions; a workload needs at least one session line")
    workload = Workload(sessions=sessions, meta=dict(header.meta), block_tokens=header.block_tokens)
    workload.validate_blocks(str(path))
    return workload


def write_workload(workload: Workload, path: str | Path) -> None:
    """Write a workload as JSONL (gzip when the name ends in ``.gz``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = _Header(coda_workload=FORMAT_VERSION, meta=workload.meta, block_tokens=workload.block_tokens)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as fh:  # type: ignore[operator]
        fh.write(_ENCODER.encode(header) + b"\n")
        for s in sorted(workload.sessions, key=lambda s: (s.start_s, s.session_id)):
            fh.write(_ENCODER.encode(s) + b"\n")
